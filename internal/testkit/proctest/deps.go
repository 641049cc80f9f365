package proctest

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// DependOnModule makes every file of the module that holds the test's
// working directory an input of the running test, as go test's cache
// sees inputs, and returns the module's root. A test that builds one of
// the module's programs with `go build`, or runs its Python files in a
// child process, reads them outside the test binary, where go test does
// not look: without this, a change to them (a Go package the program
// imports and the test binary does not, a test module of the Python
// suite) left the package's last result standing, "ok (cached)", for code
// it never ran. go test records each directory this lists and, before
// reusing a result, compares its entries' names, sizes, modes and times,
// so an edit anywhere in the module runs the test again. Directories whose
// names start with a dot (.git, ignored build folders) and __pycache__
// are left out. It fails the test where ModuleRoot finds no module.
func DependOnModule(t testing.TB) string {
	t.Helper()
	dir, err := ModuleRoot()
	if err != nil {
		t.Fatalf("proctest.DependOnModule: %v", err)
	}
	err = filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && path != dir && (strings.HasPrefix(d.Name(), ".") || d.Name() == "__pycache__") {
			return filepath.SkipDir
		}
		return nil
	})
	if err != nil {
		t.Fatalf("proctest.DependOnModule: %v", err)
	}
	return dir
}

// ModuleRoot returns the folder of the go.mod at or above the working
// directory (a test's is its package's folder). Tests find the module's
// scripts from it, not from their source file's path (runtime.Caller),
// which -trimpath makes a module path.
func ModuleRoot() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			return dir, nil
		}
		up := filepath.Dir(dir)
		if up == dir {
			return "", errors.New("no go.mod at or above the working directory")
		}
		dir = up
	}
}
