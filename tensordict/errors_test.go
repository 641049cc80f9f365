package tensordict

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/tensorwire/tensorwire/memmap"
)

// TestLoadMemmap_BadInput damages a copy of a fixture in one way each and
// checks the error: its kind, and that it names the file at fault.
func TestLoadMemmap_BadInput(t *testing.T) {
	for _, tc := range []struct {
		name   string
		damage func(dir string) error
		want   error
		names  string // a file name the message must contain
	}{
		{"missing meta.json", func(d string) error { return os.Remove(filepath.Join(d, metaFile)) }, ErrFormat, metaFile},
		{"corrupt meta.json", func(d string) error { return truncate(filepath.Join(d, metaFile), 40) }, ErrFormat, metaFile},
		{"meta.json not an object", func(d string) error { return os.WriteFile(filepath.Join(d, metaFile), []byte(`[1,2]`), 0o644) }, ErrFormat, metaFile},
		{"trailing garbage", func(d string) error { return appendTo(filepath.Join(d, metaFile), "}") }, ErrFormat, metaFile},
		{"unknown dtype", func(d string) error { return replaceIn(filepath.Join(d, metaFile), "torch.int64", "torch.int65") }, memmap.ErrDType, metaFile},
		{"alias dtype name", func(d string) error { return replaceIn(filepath.Join(d, metaFile), "torch.int64", "torch.long") }, memmap.ErrDType, metaFile},
		{"missing leaf file", func(d string) error { return os.Remove(filepath.Join(d, "obs.memmap")) }, ErrFormat, "obs.memmap"},
		{"short leaf file", func(d string) error { return truncate(filepath.Join(d, "obs.memmap"), 47) }, memmap.ErrShortFile, "obs.memmap"},
		{"missing nested folder", func(d string) error { return os.RemoveAll(filepath.Join(d, "next")) }, ErrFormat, "next"},
		{"nested meta.json missing", func(d string) error { return os.Remove(filepath.Join(d, "next", metaFile)) }, ErrFormat, filepath.Join("next", metaFile)},
		{"leaf shape outside batch", func(d string) error {
			return replaceIn(filepath.Join(d, metaFile), `"shape":[4],"device":"cpu","_type"`, `"shape":[5],"device":"cpu","_type"`)
		}, ErrBatchSize, metaFile},
		{"negative dimension", func(d string) error { return replaceIn(filepath.Join(d, metaFile), `"shape":[4,3]`, `"shape":[4,-3]`) }, memmap.ErrShape, metaFile},
		{"nested tensor", func(d string) error {
			return replaceIn(filepath.Join(d, metaFile), `"is_nested":false`, `"is_nested":true`)
		}, ErrUnsupported, metaFile},
		{"lazy stack", func(d string) error {
			return replaceIn(filepath.Join(d, "next", metaFile), "tensordict._td.TensorDict", "tensordict._lazy.LazyStackedTensorDict")
		}, ErrUnsupported, "LazyStackedTensorDict"},
		{"entry of no kind", func(d string) error { return replaceIn(filepath.Join(d, metaFile), `{"type":"TensorDict"}`, `{"x":1}`) }, ErrFormat, metaFile},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := copyFixture(t, "basic_orjson")
			if err := tc.damage(dir); err != nil {
				t.Fatal(err)
			}
			td, err := LoadMemmap(dir)
			if err == nil {
				td.Close()
				t.Fatal("damaged fixture loaded without error")
			}
			if !errors.Is(err, tc.want) {
				t.Errorf("err = %v, want %v", err, tc.want)
			}
			if !strings.Contains(err.Error(), tc.names) {
				t.Errorf("error %q does not name %q", err, tc.names)
			}
		})
	}
}

func truncate(path string, n int64) error { return os.Truncate(path, n) }

func appendTo(path, s string) error {
	b, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	return os.WriteFile(path, append(b, s...), 0o644)
}

func replaceIn(path, old, new string) error {
	b, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	if !strings.Contains(string(b), old) {
		return errors.New("fixture does not contain " + old)
	}
	return os.WriteFile(path, []byte(strings.Replace(string(b), old, new, 1)), 0o644)
}

func TestMemmap_RefusesKeysItCannotStore(t *testing.T) {
	x, _ := Zeros(memmap.Float32, 2)
	for _, tc := range []struct {
		name string
		key  string
		v    Value
	}{
		{"leaf named shape", "shape", x},
		{"leaf named _type", "_type", x},
		{"invalid UTF-8", "a\xffb", x},
	} {
		t.Run(tc.name, func(t *testing.T) {
			td := mustNew(t, 2)
			if err := td.Set(tc.key, tc.v); err != nil {
				t.Fatal(err)
			}
			ok, _ := Zeros(memmap.Int8, 2)
			td.SetPath([]string{"nested", "fine"}, ok) // written before the bad key, were it not checked first
			dir := filepath.Join(t.TempDir(), "p")
			if _, err := td.Memmap(dir); !errors.Is(err, ErrKey) {
				t.Fatalf("err = %v, want ErrKey", err)
			}
			if _, err := os.Stat(dir); err == nil {
				t.Error("a refused write created the prefix")
			}
		})
	}
}

func TestMemmap_FailedWriteLeavesNoMeta(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "p")
	good := mustNew(t, 2)
	x, _ := Zeros(memmap.Int32, 2)
	good.Set("x", x)
	m, err := good.Memmap(dir)
	if err != nil {
		t.Fatal(err)
	}
	m.Close()

	// A refused write (a reserved key) changes nothing: the old dataset loads.
	bad := mustNew(t, 2)
	bad.Set("y", x)
	bad.Set("shape", x)
	if _, err := bad.Memmap(dir); !errors.Is(err, ErrKey) {
		t.Fatalf("err = %v, want ErrKey", err)
	}
	old, err := LoadMemmap(dir)
	if err != nil {
		t.Fatalf("a refused rewrite broke the old dataset: %v", err)
	}
	old.Close()

	// A write that fails midway (its source is a closed mapping) leaves no
	// meta.json: the prefix does not load as half old, half new.
	src, err := good.Memmap(filepath.Join(t.TempDir(), "src"))
	if err != nil {
		t.Fatal(err)
	}
	src.Close()
	if _, err := src.Memmap(dir); !errors.Is(err, memmap.ErrClosed) {
		t.Fatalf("writing from a closed source: err = %v, want ErrClosed", err)
	}
	if _, err := LoadMemmap(dir); !errors.Is(err, ErrFormat) {
		t.Errorf("after a failed rewrite LoadMemmap err = %v, want ErrFormat (no meta.json)", err)
	}
}

func TestLoadMemmap_LegacyRawNames(t *testing.T) {
	// Before tensordict 0.13 files were named by the raw key.
	dir := copyFixture(t, "escaped_keys")
	if err := os.Rename(filepath.Join(dir, "x%20y.memmap"), filepath.Join(dir, "x y.memmap")); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(filepath.Join(dir, "sub%20dir"), filepath.Join(dir, "sub dir")); err != nil {
		t.Fatal(err)
	}
	td, err := LoadMemmap(dir, ReadOnly())
	if err != nil {
		t.Fatal(err)
	}
	defer td.Close()
	checkAgainst(t, td, readExpected(t, "escaped_keys"))
}

func TestTensorDict_ClosedMappingIsAnError(t *testing.T) {
	td, err := LoadMemmap(copyFixture(t, "basic_orjson"))
	if err != nil {
		t.Fatal(err)
	}
	obs, _ := td.Tensor("obs")
	row, _ := td.Index(1)
	td.Close()
	if _, err := obs.Gather([]int{0}); !errors.Is(err, memmap.ErrClosed) {
		t.Errorf("Gather after Close: err = %v, want ErrClosed", err)
	}
	if err := row.Fill(nil, 1); err == nil {
		t.Error("Fill on a row view after Close succeeded")
	}
	if _, err := row.Clone(); !errors.Is(err, memmap.ErrClosed) {
		t.Errorf("Clone of a view after Close: err = %v, want ErrClosed", err)
	}
}

func TestLoadMemmap_ReadOnly(t *testing.T) {
	dir := copyFixture(t, "basic_orjson")
	td, err := LoadMemmap(dir, ReadOnly())
	if err != nil {
		t.Fatal(err)
	}
	defer td.Close()
	if err := td.Fill([]int{0}, 9); !errors.Is(err, memmap.ErrReadOnly) {
		t.Errorf("Fill on read-only: err = %v, want ErrReadOnly", err)
	}
	if err := td.Set("z", mustNew(t, 4)); !errors.Is(err, ErrLocked) {
		t.Errorf("Set on a memory-mapped TensorDict: err = %v, want ErrLocked", err)
	}
}

func mustNew(t *testing.T, batch ...int) *TensorDict {
	t.Helper()
	td, err := New(batch...)
	if err != nil {
		t.Fatal(err)
	}
	return td
}

func TestLoadMemmap_FoldersThatAreNotSubfolders(t *testing.T) {
	for _, tc := range []struct {
		name   string
		damage func(dir string) error
	}{
		{"empty key", func(d string) error { return replaceIn(filepath.Join(d, metaFile), `"next":`, `"":`) }},
		{"dot key", func(d string) error { return replaceIn(filepath.Join(d, metaFile), `"next":`, `".":`) }},
		{"dot-dot key", func(d string) error { return replaceIn(filepath.Join(d, metaFile), `"next":`, `"..":`) }},
		{"symlink loop", func(d string) error {
			if err := os.RemoveAll(filepath.Join(d, "next")); err != nil {
				return err
			}
			return os.Symlink(".", filepath.Join(d, "next"))
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := copyFixture(t, "basic_orjson")
			if err := tc.damage(dir); err != nil {
				t.Fatal(err)
			}
			if _, err := LoadMemmap(dir); !errors.Is(err, ErrFormat) {
				t.Errorf("err = %v, want ErrFormat", err)
			}
		})
	}
}

// TestLoadMemmap_RefusesRepeatedNames loads a meta.json that names the leaf
// "obs" twice: JSON allows it (Python keeps the last), no tensordict
// writes it, and a repeated nested key is loaded once per repeat (see
// TestLoadMemmap_RepeatedKeysDoNotFanOut), so it is ErrFormat naming the
// file and the key. Before the fix it loaded, keeping the last.
func TestLoadMemmap_RefusesRepeatedNames(t *testing.T) {
	dir := copyFixture(t, "basic_orjson")
	meta := filepath.Join(dir, metaFile)
	b, err := os.ReadFile(meta)
	noErr(t, err)
	i := strings.Index(string(b), `"obs":{`)
	n := strings.Index(string(b[max(i, 0):]), "},")
	if i < 0 || n < 0 {
		t.Fatalf("no obs entry in %s", b)
	}
	j := i + n + 2
	noErr(t, os.WriteFile(meta, append(b[:j:j], b[i:]...), 0o644)) // "obs":{...},"obs":{...},...
	td, err := LoadMemmap(dir)
	if err == nil {
		td.Close()
	}
	if !errors.Is(err, ErrFormat) || !strings.Contains(err.Error(), metaFile) || !strings.Contains(err.Error(), `"obs"`) {
		t.Errorf("meta.json naming \"obs\" twice: err = %v, want ErrFormat naming meta.json and \"obs\"", err)
	}
}

// loadsQuickly loads prefix with opts and fails the test unless it returns
// within 5 seconds with an error wrapping ErrFormat.
func loadsQuickly(t *testing.T, prefix, what string, opts ...LoadOption) {
	t.Helper()
	done := make(chan error, 1)
	go func() {
		td, err := LoadMemmap(prefix, opts...)
		if err == nil {
			td.Close()
		}
		done <- err
	}()
	select {
	case err := <-done:
		if !errors.Is(err, ErrFormat) {
			t.Errorf("LoadMemmap of %s: err = %v, want ErrFormat", what, err)
		}
	case <-time.After(5 * time.Second):
		t.Fatalf("LoadMemmap of %s has not returned after 5s", what)
	}
}

// TestLoadMemmap_RepeatedKeysDoNotFanOut loads a chain of 8 nested
// folders, 8 tiny files in all, whose meta.json each name the nested key
// "a" 20 times: refused at once with ErrFormat, where every repeat was
// loaded (20^7 TensorDicts), hanging even a loader confined by InRoot to
// what a remote peer may name. The depth limit (64) bounds nesting, not
// the total. Refusing repeated names (TestLoadMemmap_RefusesRepeatedNames)
// and refusing a folder read twice (TestLoadMemmap_LinkedFoldersDoNotFanOut)
// each stop it; it failed with both undone.
func TestLoadMemmap_RepeatedKeysDoNotFanOut(t *testing.T) {
	root := t.TempDir()
	const levels, fan = 7, 20
	dir := filepath.Join(root, "td")
	for i := 0; i <= levels; i++ {
		noErr(t, os.MkdirAll(dir, 0o755))
		var b strings.Builder
		b.WriteString("{")
		if i < levels {
			for range fan {
				b.WriteString(`"a":{"type":"TensorDict"},`)
			}
		}
		b.WriteString(`"shape":[],"device":"cpu","_type":"` + typeTensorDict + `"}`)
		noErr(t, os.WriteFile(filepath.Join(dir, metaFile), []byte(b.String()), 0o644))
		dir = filepath.Join(dir, "a")
	}
	r, err := os.OpenRoot(root)
	noErr(t, err)
	defer r.Close()
	loadsQuickly(t, filepath.Join(root, "td"), fmt.Sprintf("%d nested meta.json naming \"a\" %d times each", levels+1, fan), ReadOnly(), InRoot(r))
}

// TestLoadMemmap_LinkedFoldersDoNotFanOut does the same without repeated
// names: in a chain of 9 folders, each but the last names 8 keys, each a
// symlink to the next folder. A folder reached a second time in one load
// is ErrFormat, so it returns at once, with InRoot or without; before the
// fix it loaded the last folder 8^8 times. (8 links deep, as os.Root
// follows at most 8 symlinks in one path and fails the whole load past
// that; the kernel follows 40.)
func TestLoadMemmap_LinkedFoldersDoNotFanOut(t *testing.T) {
	root := t.TempDir()
	const levels = 8
	keys := []string{"a", "b", "c", "d", "e", "f", "g", "h"}
	for i := 0; i <= levels; i++ {
		dir := filepath.Join(root, fmt.Sprint("d", i))
		noErr(t, os.Mkdir(dir, 0o755))
		var b strings.Builder
		b.WriteString("{")
		for _, k := range keys {
			if i == levels {
				break
			}
			b.WriteString(`"` + k + `":{"type":"TensorDict"},`)
			if err := os.Symlink(filepath.Join("..", fmt.Sprint("d", i+1)), filepath.Join(dir, k)); err != nil {
				t.Skipf("symlink: %v", err)
			}
		}
		b.WriteString(`"shape":[],"device":"cpu","_type":"` + typeTensorDict + `"}`)
		noErr(t, os.WriteFile(filepath.Join(dir, metaFile), []byte(b.String()), 0o644))
	}
	r, err := os.OpenRoot(root)
	noErr(t, err)
	defer r.Close()
	what := fmt.Sprintf("%d folders, each linked from %d keys of the one before", levels+1, len(keys))
	t.Run("plain", func(t *testing.T) { loadsQuickly(t, filepath.Join(root, "d0"), what) })
	t.Run("InRoot", func(t *testing.T) { loadsQuickly(t, filepath.Join(root, "d0"), what, InRoot(r)) })
}
