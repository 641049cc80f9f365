package benchkit

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"strings"
)

// FindPython returns interp, or when it is "" the first of python3 and
// /usr/bin/python3, if it imports modules (as Python's import statement
// lists them: "numpy, msgpack"); otherwise an error saying what each one
// tried answered, for the caller's usage error.
func FindPython(interp, modules string) (string, error) {
	candidates := []string{"python3", "/usr/bin/python3"}
	if interp != "" {
		candidates = []string{interp}
	}
	var tried []string
	for _, c := range candidates {
		out, err := exec.Command(c, "-c", "import "+modules).CombinedOutput()
		if err == nil {
			return c, nil
		}
		out = bytes.TrimSpace(out)
		if i := bytes.LastIndexByte(out, '\n'); i >= 0 {
			out = out[i+1:] // the traceback's last line says what is missing
		}
		tried = append(tried, fmt.Sprintf("%s: %v %s", c, err, out))
	}
	return "", fmt.Errorf("tried %s", strings.Join(tried, "; "))
}

// PythonEnv returns this process's environment for a Python process that
// imports this build's client, extracted into dir (python.Extract): dir
// first on PYTHONPATH, the caller's PYTHONPATH after it (where a package
// built outside site-packages may be), and no bytecode written.
func PythonEnv(dir string) []string {
	pp := dir
	if old := os.Getenv("PYTHONPATH"); old != "" {
		pp += string(os.PathListSeparator) + old
	}
	return append(os.Environ(), "PYTHONPATH="+pp, "PYTHONDONTWRITEBYTECODE=1")
}
