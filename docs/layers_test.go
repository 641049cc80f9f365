package docs_test

import (
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"testing"
)

// module is the import path the tree's packages start with.
const module = "github.com/tensorwire/tensorwire/"

// layers is docs/architecture.md's "Imports point one way", as data: for each
// package of the library (a folder), the folders of this module its
// non-test files may import. A package not listed here is checked only by
// the rules of TestLayers_Floors.
var layers = map[string][]string{
	"memmap":                   {"internal/atomicfile", "internal/rowcopy"},
	"tensordict":               {"memmap", "internal/atomicfile", "internal/rowcopy"},
	"rpc":                      {"memmap", "tensordict"},
	"importer":                 {"memmap", "tensordict", "internal/atomicfile", "internal/idx", "internal/npy", "internal/progress"},
	"replay":                   serviceFloor("replay/internal/selector"),
	"store":                    serviceFloor(),
	"serve":                    serviceFloor("store"), // weights follow a store's parameters
	"serve/mlp":                {"memmap", "tensordict"},
	"collective":               serviceFloor(),
	"loader":                   serviceFloor(),
	"internal/shm":             {"memmap"},
	"internal/slots":           {"memmap", "internal/shm"},
	"internal/service":         {"rpc", "tensordict", "internal/backoff"}, // tensordict: Call's into (rpc.CallInto)
	"replay/internal/selector": {},
}

// serviceFloor is what a service may import: the layers below it and the
// library's helpers, and the extra folders given. Never another service,
// never internal/metrics or internal/nodeproc (which import services).
func serviceFloor(extra ...string) []string {
	return append([]string{"memmap", "tensordict", "rpc",
		"internal/atomicfile", "internal/backoff", "internal/lockfile", "internal/progress",
		"internal/service", "internal/shm", "internal/slots"}, extra...)
}

// goFiles returns, for each folder of the tree (relative to its root, with
// forward slashes), the module packages its non-test Go files import, and
// the names of those files.
func goFiles(t *testing.T) (imports map[string]map[string]bool, files map[string][]string) {
	t.Helper()
	root, err := filepath.Abs("..")
	if err != nil {
		t.Fatal(err)
	}
	imports, files = map[string]map[string]bool{}, map[string][]string{}
	fset := token.NewFileSet()
	err = filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			if n := d.Name(); p != root && (strings.HasPrefix(n, ".") || n == "testdata" || n == "python") {
				return filepath.SkipDir
			}
			return nil
		}
		if !strings.HasSuffix(p, ".go") || strings.HasSuffix(p, "_test.go") {
			return nil
		}
		rel, _ := filepath.Rel(root, filepath.Dir(p))
		dir := filepath.ToSlash(rel)
		f, err := parser.ParseFile(fset, p, nil, parser.ImportsOnly)
		if err != nil {
			return err
		}
		if imports[dir] == nil {
			imports[dir] = map[string]bool{}
		}
		files[dir] = append(files[dir], p)
		for _, im := range f.Imports {
			path, _ := strconv.Unquote(im.Path.Value)
			if strings.HasPrefix(path, module) {
				imports[dir][strings.TrimPrefix(path, module)] = true
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return imports, files
}

// TestLayers_ImportsPointOneWay checks the arrows of docs/architecture.md
// ("Imports point one way"): each package of the library imports only the
// layers below it, and no service imports another (serve's weights read a
// store: the one arrow between services).
func TestLayers_ImportsPointOneWay(t *testing.T) {
	imports, _ := goFiles(t)
	for pkg, allowed := range layers {
		got, ok := imports[pkg]
		if !ok {
			t.Errorf("%s: no such package; update the layers table with docs/architecture.md", pkg)
			continue
		}
		ok2 := map[string]bool{}
		for _, a := range allowed {
			ok2[a] = true
		}
		for _, im := range sorted(got) {
			if !ok2[im] {
				t.Errorf("%s imports %s, which docs/architecture.md's arrows do not allow", pkg, im)
			}
		}
	}
}

// TestLayers_Floors checks the three floors of internal/: the library's
// helpers (internal/*), the test rigs (internal/testkit/*) and the
// benchmarks (internal/bench/*). Only tests, the fault suite, the
// benchmarks and the command import the rigs and the benchmarks; the
// examples, which are the code users copy, import no internal package.
func TestLayers_Floors(t *testing.T) {
	imports, _ := goFiles(t)
	above := func(dir string) bool { // the folders that sit on top of the library
		for _, p := range []string{"cmd/", "benchmarks/", "faulttest", "internal/bench", "internal/testkit"} {
			if strings.HasPrefix(dir, p) {
				return true
			}
		}
		return false
	}
	for _, dir := range sorted(imports) {
		for _, im := range sorted(imports[dir]) {
			rig := strings.HasPrefix(im, "internal/testkit") || strings.HasPrefix(im, "internal/bench")
			switch {
			case strings.HasPrefix(dir, "examples/") && strings.HasPrefix(im, "internal/"):
				t.Errorf("%s imports %s: examples import no internal package", dir, im)
			case rig && !above(dir):
				t.Errorf("%s imports %s: the library's packages import no test rig and no benchmark outside their tests", dir, im)
			}
		}
	}
}

// TestLayers_OneOwnerOfSharedWords checks that only memmap and internal/shm
// map memory or wait on a futex: every other package's shared files go
// through them (docs/architecture.md, the paragraph under the arrows).
func TestLayers_OneOwnerOfSharedWords(t *testing.T) {
	_, files := goFiles(t)
	for _, dir := range sorted(files) {
		if dir == "memmap" || dir == "internal/shm" {
			continue
		}
		for _, p := range files[dir] {
			b, err := os.ReadFile(p)
			if err != nil {
				t.Fatal(err)
			}
			for _, call := range []string{"unix.Mmap(", "syscall.Mmap(", "SYS_FUTEX", "mmap.Map(", "mmap.MapRegion("} {
				if strings.Contains(string(b), call) {
					t.Errorf("%s calls %s: map files and wait on words through memmap or internal/shm", p, call)
				}
			}
		}
	}
}

func sorted[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}
