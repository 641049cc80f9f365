package importer

import (
	"context"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/tensorwire/tensorwire/memmap"
	"github.com/tensorwire/tensorwire/tensordict"
)

// tree returns every path under dir (relative, slash-separated) with the
// content of each regular file, so a test can tell that nothing changed.
func tree(t *testing.T, dir string) map[string]string {
	t.Helper()
	m := map[string]string{}
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(dir, p)
		switch {
		case d.Type()&fs.ModeSymlink != 0:
			target, _ := os.Readlink(p)
			m[filepath.ToSlash(rel)] = "-> " + target
		case d.Type().IsRegular():
			b, err := os.ReadFile(p)
			if err != nil {
				return err
			}
			m[filepath.ToSlash(rel)] = string(b)
		default:
			m[filepath.ToSlash(rel)+"/"] = ""
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return m
}

func writeFile(t *testing.T, path, content string) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
}

// dataset writes a small TensorDict at prefix with a nested key and a
// NonTensorData entry: every kind of entry the format writes.
func dataset(t *testing.T, prefix string) {
	t.Helper()
	td, err := tensordict.New(2)
	if err != nil {
		t.Fatal(err)
	}
	x, _ := tensordict.FromSlice([]float32{1, 2, 3, 4}, 2, 2)
	y, _ := tensordict.FromSlice([]int64{5, 6}, 2)
	if err := td.SetPath([]string{"x"}, x); err != nil {
		t.Fatal(err)
	}
	if err := td.SetPath([]string{"next", "y"}, y); err != nil {
		t.Fatal(err)
	}
	if err := td.Set("note", &tensordict.NonTensor{Data: "hello"}); err != nil {
		t.Fatal(err)
	}
	m, err := td.Memmap(prefix)
	if err != nil {
		t.Fatal(err)
	}
	m.Close()
}

// TestIDX_ForceRefusesWhatIsNotADataset imports with Force onto paths that
// hold something other than a dataset: each import must fail with
// ErrNotReplaceable, naming the path, and leave every file as it was.
func TestIDX_ForceRefusesWhatIsNotADataset(t *testing.T) {
	for _, tc := range []struct {
		name  string
		setup func(t *testing.T, dir string) string // returns the prefix
		why   string                                // in the error
	}{
		{"regular file", func(t *testing.T, dir string) string {
			writeFile(t, filepath.Join(dir, "hostname"), "myhost\n")
			return filepath.Join(dir, "hostname")
		}, "a file"},
		{"folder of other files", func(t *testing.T, dir string) string {
			writeFile(t, filepath.Join(dir, "home", "thesis.tex"), "chapter 1")
			writeFile(t, filepath.Join(dir, "home", "data", "run1.csv"), "1,2,3")
			return filepath.Join(dir, "home")
		}, "thesis.tex"},
		{"dataset with a file of the user's beside it", func(t *testing.T, dir string) string {
			dataset(t, filepath.Join(dir, "ds"))
			writeFile(t, filepath.Join(dir, "ds", "NOTES.md"), "keep me")
			return filepath.Join(dir, "ds")
		}, "NOTES.md"},
		{"dataset with a foreign folder nested in it", func(t *testing.T, dir string) string {
			dataset(t, filepath.Join(dir, "ds"))
			writeFile(t, filepath.Join(dir, "ds", "next", "plots", "loss.png"), "png")
			return filepath.Join(dir, "ds")
		}, "plots"},
		{"folder of .memmap files without meta.json", func(t *testing.T, dir string) string {
			writeFile(t, filepath.Join(dir, "raw", "x.memmap"), "0000")
			return filepath.Join(dir, "raw")
		}, "meta.json"},
		{"symbolic link to a dataset", func(t *testing.T, dir string) string {
			dataset(t, filepath.Join(dir, "ds"))
			if err := os.Symlink("ds", filepath.Join(dir, "link")); err != nil {
				t.Fatal(err)
			}
			return filepath.Join(dir, "link")
		}, "symbolic link"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			p := idxPair(t, t.TempDir(), "a", 2, 0, false)
			prefix := tc.setup(t, dir)
			before := tree(t, dir)
			_, err := IDX(context.Background(), prefix, []Pair{p}, Options{Force: true})
			if !errors.Is(err, ErrNotReplaceable) || !strings.Contains(err.Error(), prefix) || !strings.Contains(err.Error(), tc.why) {
				t.Errorf("err = %v; want ErrNotReplaceable naming %s and %q", err, prefix, tc.why)
			}
			if after := tree(t, dir); !mapsEqual(before, after) {
				t.Errorf("the import changed %s:\nbefore %v\nafter  %v", dir, before, after)
			}
			// Without Force the error is the same: Force would not help.
			if _, err := IDX(context.Background(), prefix, []Pair{p}, Options{}); !errors.Is(err, ErrNotReplaceable) || errors.Is(err, ErrExists) {
				t.Errorf("without Force: err = %v; want ErrNotReplaceable, not ErrExists", err)
			}
		})
	}
}

func mapsEqual(a, b map[string]string) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if w, ok := b[k]; !ok || w != v {
			return false
		}
	}
	return true
}

// TestIDX_ForceRefusesTheWorkingDirectoryAndItsParents runs imports with
// Force onto the current directory and its parents, spelled in the ways a
// shell user would: nothing may be removed.
func TestIDX_ForceRefusesTheWorkingDirectoryAndItsParents(t *testing.T) {
	base := t.TempDir()
	// The working directory is itself a dataset, so that only the rule
	// about the working directory can refuse it.
	work := filepath.Join(base, "work")
	dataset(t, work)
	writeFile(t, filepath.Join(base, "keep.txt"), "keep")
	p := idxPair(t, t.TempDir(), "a", 2, 0, false)
	up := filepath.Join(t.TempDir(), "up") // a symbolic link to base
	if err := os.Symlink(base, up); err != nil {
		t.Fatal(err)
	}
	t.Chdir(work)
	before := tree(t, base)
	for _, prefix := range []string{".", "./", "..", "../", "../work", "next/..", work, base, filepath.Join(work, "..") + "/", up, up + "/work"} {
		t.Run(prefix, func(t *testing.T) {
			_, err := IDX(context.Background(), prefix, []Pair{p}, Options{Force: true})
			if !errors.Is(err, ErrNotReplaceable) || !strings.Contains(err.Error(), "current directory") {
				t.Errorf("err = %v; want ErrNotReplaceable about the current directory", err)
			}
			if after := tree(t, base); !mapsEqual(before, after) {
				t.Fatalf("the import changed %s:\nbefore %v\nafter  %v", base, before, after)
			}
		})
	}
}

// TestCheckPrefix_Root checks the refusal of the filesystem root without
// running an import there.
func TestCheckPrefix_Root(t *testing.T) {
	for _, prefix := range []string{"/", "//", "/.", "/tmp/.."} {
		if _, err := checkPrefix(prefix); !errors.Is(err, ErrNotReplaceable) {
			t.Errorf("checkPrefix(%q) = %v; want ErrNotReplaceable", prefix, err)
		}
	}
	// Without Force, an import there fails with the same error, not with
	// one that suggests Force.
	p := idxPair(t, t.TempDir(), "a", 2, 0, false)
	if _, err := IDX(context.Background(), "/", []Pair{p}, Options{}); !errors.Is(err, ErrNotReplaceable) || errors.Is(err, ErrExists) {
		t.Errorf("import to / without Force: %v; want ErrNotReplaceable", err)
	}
}

// TestIDX_ForceReplacesADataset replaces datasets of every shape the
// format writes (nested folders, NonTensorData, and leftovers of an
// interrupted write) and an empty folder, and leaves nothing beside them.
func TestIDX_ForceReplacesADataset(t *testing.T) {
	for _, tc := range []struct {
		name  string
		setup func(t *testing.T, prefix string)
	}{
		{"dataset", func(t *testing.T, prefix string) { dataset(t, prefix) }},
		{"dataset with leftovers of an interrupted write", func(t *testing.T, prefix string) {
			dataset(t, prefix)
			writeFile(t, filepath.Join(prefix, ".meta.json.tmp-123"), "{")
			writeFile(t, filepath.Join(prefix, "next", ".y.memmap.tmp-456"), "")
		}},
		{"empty folder", func(t *testing.T, prefix string) { os.Mkdir(prefix, 0o755) }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			prefix := filepath.Join(dir, "ds")
			tc.setup(t, prefix)
			p := idxPair(t, t.TempDir(), "a", 3, 7, false)
			if _, err := IDX(context.Background(), prefix, []Pair{p}, Options{}); !errors.Is(err, ErrExists) {
				t.Errorf("without Force: err = %v; want ErrExists", err)
			}
			if _, err := IDX(context.Background(), prefix, []Pair{p}, Options{Force: true}); err != nil {
				t.Fatal(err)
			}
			if got := load(t, prefix).Keys(); !slices.Equal(got, []string{"images", "labels"}) {
				t.Errorf("keys after Force: %v", got)
			}
			entries, _ := os.ReadDir(dir)
			if len(entries) != 1 {
				t.Errorf("beside the prefix: %v; want only ds", entries)
			}
		})
	}
}

// TestIDX_ForceKeepsTheOldDatasetUntilTheNewIsIn makes the rename of the
// new dataset into place fail: the old one must be back at the prefix,
// whole, and nothing else left beside it.
func TestIDX_ForceKeepsTheOldDatasetUntilTheNewIsIn(t *testing.T) {
	dir := t.TempDir()
	prefix := filepath.Join(dir, "ds")
	dataset(t, prefix)
	before := tree(t, dir)
	boom := errors.New("injected rename failure")
	rename = func(from, to string) error {
		if strings.Contains(filepath.Base(from), ".importing-") && !strings.HasSuffix(from, ".old") && to == prefix {
			return boom
		}
		return os.Rename(from, to)
	}
	t.Cleanup(func() { rename = os.Rename })
	p := idxPair(t, t.TempDir(), "a", 3, 7, false)
	if _, err := IDX(context.Background(), prefix, []Pair{p}, Options{Force: true}); !errors.Is(err, boom) {
		t.Errorf("err = %v; want the rename's", err)
	}
	if after := tree(t, dir); !mapsEqual(before, after) {
		t.Errorf("a failed replacement changed %s:\nbefore %v\nafter  %v", dir, before, after)
	}
	x, err := load(t, prefix).Tensor("x")
	if err != nil || x.DType() != memmap.Float32 {
		t.Errorf("the old dataset does not load: %v", err)
	}
}
