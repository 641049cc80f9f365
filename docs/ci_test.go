package docs_test

import (
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// TestCI_FuzzesEveryTarget: every fuzz target of the tree (a func FuzzX in
// a _test.go file) is fuzzed by .ci/run, a line "fuzz ./PKG FuzzX COUNTx",
// and the run's fuzz binaries are built for its package (fuzzpkgs). A
// target left out still runs its seed corpus in go test ./..., but is
// never fuzzed: six were, until 2026-12-02.
func TestCI_FuzzesEveryTarget(t *testing.T) {
	ci, err := os.ReadFile("../.ci/run")
	if err != nil {
		t.Fatal(err)
	}
	pkgs := regexp.MustCompile(`(?m)^fuzzpkgs=\(([^)]*)\)`).FindSubmatch(ci)
	if pkgs == nil {
		t.Fatal(".ci/run has no fuzzpkgs=( ... ) line")
	}
	built := map[string]bool{}
	for _, p := range strings.Fields(string(pkgs[1])) {
		built[p] = true
	}
	target := regexp.MustCompile(`(?m)^func (Fuzz\w+)\(`)
	n := 0
	err = filepath.WalkDir("..", func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && (strings.HasPrefix(d.Name(), ".") && path != ".." || d.Name() == "testdata") {
			return filepath.SkipDir
		}
		if d.IsDir() || !strings.HasSuffix(path, "_test.go") {
			return nil
		}
		src, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		pkg := "./" + filepath.ToSlash(filepath.Dir(strings.TrimPrefix(path, "../")))
		for _, m := range target.FindAllSubmatch(src, -1) {
			n++
			line := regexp.MustCompile(`(?m)^fuzz ` + regexp.QuoteMeta(pkg) + ` +` + string(m[1]) + ` +\d+x`)
			if !line.Match(ci) {
				t.Errorf("%s: %s is not fuzzed by .ci/run (want a line \"fuzz %s %s COUNTx\")", path, m[1], pkg, m[1])
			}
			if !built[pkg] {
				t.Errorf("%s: .ci/run's fuzzpkgs lacks %s, whose fuzz binary %s needs", path, pkg, m[1])
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if n == 0 {
		t.Fatal("no fuzz target found: the walk is wrong")
	}
}
