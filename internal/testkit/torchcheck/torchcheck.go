// Package torchcheck runs scripts/torch_load.py, which loads a memory-mapped
// TensorDict folder with PyTorch the way tensordict's load_memmap does, so
// that tests can check what real torch reads from files written here.
package torchcheck

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"

	"github.com/tensorwire/tensorwire/internal/testkit/proctest"
)

// Field is what torch read for one tensor. Values, when asked for, is in the
// format of the golden fixtures' expected.json.
type Field struct {
	DType  string            `json:"dtype"`
	Shape  []int             `json:"shape"`
	Sum    json.RawMessage   `json:"sum"`
	Values []json.RawMessage `json:"values"`
}

// Result is the script's output for one folder.
type Result struct {
	BatchSize []int             `json:"batch_size"`
	Fields    map[string]Field  `json:"fields"`
	NonTensor map[string]any    `json:"nontensor"`
	Skipped   map[string]string `json:"skipped"`
}

// python returns an interpreter that can import torch: $TENSORWIRE_PYTHON
// when set (CI's venv with PyPI's torch; an error if it cannot), else the
// first of python3 and /usr/bin/python3 that can (Debian's python3-torch
// installs it for /usr/bin/python3, which may not be the python3 first on
// PATH).
// The answer is found once per process: each try imports torch, seconds of
// a core with PyPI's.
var python = sync.OnceValues(func() (string, error) {
	if p := os.Getenv("TENSORWIRE_PYTHON"); p != "" {
		if out, err := exec.Command(p, "-c", "import torch").CombinedOutput(); err != nil {
			return "", fmt.Errorf("TENSORWIRE_PYTHON=%s cannot import torch: %v\n%s", p, err, out)
		}
		return p, nil
	}
	for _, p := range []string{"python3", "/usr/bin/python3"} {
		if exec.Command(p, "-c", "import torch").Run() == nil {
			return p, nil
		}
	}
	return "", fmt.Errorf("no python3 with torch (apt-get install python3-torch; .ci/run installs it)")
})

// Python returns the interpreter Load runs, one that can import torch
// ($TENSORWIRE_PYTHON when set), or why there is none.
func Python() (string, error) { return python() }

// Available returns nil if torch can be run, or why not.
func Available() error {
	_, err := python()
	return err
}

// script is scripts/torch_load.py under the module's root (from the
// working directory: a test's is its package's folder). It is stat'ed here,
// in the test's process, so that go test's cache counts it as an input of
// the test: it runs in a child process, outside the test binary.
func script() (string, error) {
	root, err := proctest.ModuleRoot()
	if err != nil {
		return "", fmt.Errorf("torchcheck: finding scripts/torch_load.py: %w", err)
	}
	p := filepath.Join(root, "scripts", "torch_load.py")
	if _, err := os.Stat(p); err != nil {
		return "", fmt.Errorf("torchcheck: %w", err)
	}
	return p, nil
}

// Load runs the script on prefix, with every element's value if values is
// set.
func Load(prefix string, values bool) (*Result, error) {
	rs, err := LoadAll([]string{prefix}, values)
	if err != nil {
		return nil, err
	}
	return rs[0], nil
}

// LoadAll is Load for several prefixes in one Python process (one import
// of torch): their results in order.
func LoadAll(prefixes []string, values bool) ([]*Result, error) {
	py, err := python()
	if err != nil {
		return nil, err
	}
	sc, err := script()
	if err != nil {
		return nil, err
	}
	args := append([]string{sc}, prefixes...)
	if values {
		args = append(args, "--values")
	}
	var stderr bytes.Buffer
	cmd := exec.Command(py, args...)
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return nil, fmt.Errorf("torch_load.py %s: %w\n%s", strings.Join(prefixes, " "), err, stderr.Bytes())
	}
	dec := json.NewDecoder(bytes.NewReader(out))
	rs := make([]*Result, len(prefixes))
	for i := range rs {
		rs[i] = new(Result)
		if err := dec.Decode(rs[i]); err != nil {
			return nil, fmt.Errorf("torch_load.py output for %s: %w", prefixes[i], err)
		}
	}
	return rs, nil
}
