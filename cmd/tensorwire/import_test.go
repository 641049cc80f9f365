package main

import (
	"bytes"
	"errors"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/tensorwire/tensorwire/internal/npy"
	"github.com/tensorwire/tensorwire/memmap"
)

// writeNPY writes an int32 .npy file of n rows (values 0..n-1) and returns
// its path.
func writeNPY(t *testing.T, dir, name string, n int) string {
	t.Helper()
	var b bytes.Buffer
	if err := npy.WriteHeader(&b, npy.Header{DType: memmap.Int32, Shape: []int{n}}); err != nil {
		t.Fatal(err)
	}
	for i := range n {
		b.Write([]byte{byte(i), 0, 0, 0})
	}
	path := filepath.Join(dir, name)
	if err := os.WriteFile(path, b.Bytes(), 0o644); err != nil {
		t.Fatal(err)
	}
	return path
}

func mustWrite(t *testing.T, path, content string) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
}

func mustRead(t *testing.T, path, want string) {
	t.Helper()
	if b, err := os.ReadFile(path); err != nil || string(b) != want {
		t.Errorf("%s: %q, %v; want %q, untouched", path, b, err, want)
	}
}

// TestImport_ForceOnlyWhereItWorks checks what import says about a prefix
// that exists: it suggests --force for a dataset (or an empty folder) and
// replaces it with --force; for a file or a folder of other files it names
// the path and why, suggests nothing, and leaves them alone with --force too.
func TestImport_ForceOnlyWhereItWorks(t *testing.T) {
	dir := t.TempDir()
	obs := "obs=" + writeNPY(t, t.TempDir(), "obs.npy", 4)
	hostname := filepath.Join(dir, "hostname")
	mustWrite(t, hostname, "myhost\n")
	home := filepath.Join(dir, "home")
	mustWrite(t, filepath.Join(home, "thesis.tex"), "chapter 1")
	ds := filepath.Join(dir, "ds")
	if code, _, errOut := runCLI(t, "import", "npy", obs, ds); code != 0 {
		t.Fatalf("first import: exit %d: %s", code, errOut)
	}

	for _, tc := range []struct {
		name   string
		prefix string
		code   int
		want   []string // in stderr
		forbid string   // not in stderr
	}{
		{"file, no --force", hostname, 1, []string{hostname, "file"}, "--force"},
		{"file, --force", hostname, 1, []string{hostname, "file"}, "--force"},
		{"folder of other files, no --force", home, 1, []string{home, "thesis.tex"}, "--force"},
		{"folder of other files, --force", home, 1, []string{home, "thesis.tex"}, "--force"},
		{"dataset, no --force", ds, 1, []string{ds, "--force"}, ""},
		{"dataset, --force", ds, 0, nil, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			args := []string{"import", "npy", obs, tc.prefix}
			if strings.HasSuffix(tc.name, ", --force") {
				args = []string{"import", "npy", "--force", obs, tc.prefix}
			}
			code, _, errOut := runCLI(t, args...)
			if code != tc.code {
				t.Errorf("exit %d, want %d: %s", code, tc.code, errOut)
			}
			for _, w := range tc.want {
				if !strings.Contains(errOut, w) {
					t.Errorf("stderr lacks %q: %s", w, errOut)
				}
			}
			if tc.forbid != "" && strings.Contains(errOut, tc.forbid) {
				t.Errorf("stderr suggests %s, which would not work: %s", tc.forbid, errOut)
			}
			mustRead(t, hostname, "myhost\n")
			mustRead(t, filepath.Join(home, "thesis.tex"), "chapter 1")
		})
	}
}

// TestBinary_ImportForceParent runs the built command with --force onto
// "../" from a folder: the parent and everything in it must survive.
func TestBinary_ImportForceParent(t *testing.T) {
	bin := cliBinary(t)
	obs := "obs=" + writeNPY(t, t.TempDir(), "obs.npy", 4)
	base := t.TempDir()
	work := filepath.Join(base, "work")
	mustWrite(t, filepath.Join(work, "notes.txt"), "mine")
	mustWrite(t, filepath.Join(base, "keep.txt"), "keep")
	for _, prefix := range []string{"../", "..", ".", "./"} {
		cmd := exec.Command(bin, "import", "npy", "--force", obs, prefix)
		cmd.Dir = work
		out, err := cmd.CombinedOutput()
		var exit *exec.ExitError
		if !errors.As(err, &exit) || exit.ExitCode() != 1 {
			t.Errorf("import --force %s: %v, want exit status 1\n%s", prefix, err, out)
		}
		if !strings.Contains(string(out), "current directory") || !strings.Contains(string(out), prefix) {
			t.Errorf("import --force %s: the error does not say why:\n%s", prefix, out)
		}
		mustRead(t, filepath.Join(base, "keep.txt"), "keep")
		mustRead(t, filepath.Join(work, "notes.txt"), "mine")
	}
	entries, _ := os.ReadDir(base)
	if len(entries) != 2 {
		t.Errorf("left beside work: %v", entries)
	}
}

// TestImport_NPYKeyGivenTwice checks that a key given twice, or as both a
// tensor and a folder of tensors, is an error naming it, not a dataset
// missing one of the files.
func TestImport_NPYKeyGivenTwice(t *testing.T) {
	dir := t.TempDir()
	a := writeNPY(t, dir, "a.npy", 4)
	b := writeNPY(t, dir, "b.npy", 4)
	for _, tc := range []struct {
		name string
		args []string
		key  string
	}{
		{"same key", []string{"obs=" + a, "obs=" + b}, `"obs"`},
		{"same nested key", []string{"next/obs=" + a, "x=" + a, "next/obs=" + b}, `"next/obs"`},
		{"tensor and folder", []string{"obs=" + a, "obs/x=" + b}, `"obs"`},
		{"folder and tensor", []string{"obs/x=" + a, "obs=" + b}, `"obs"`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			prefix := filepath.Join(t.TempDir(), "ds")
			code, _, errOut := runCLI(t, append(append([]string{"import", "npy"}, tc.args...), prefix)...)
			if code == 0 || !strings.Contains(errOut, tc.key) {
				t.Errorf("exit %d, stderr %q; want an error naming %s", code, errOut, tc.key)
			}
			if _, err := os.Stat(prefix); !errors.Is(err, fs.ErrNotExist) {
				t.Errorf("a refused import left %s (%v)", prefix, err)
			}
		})
	}
}
