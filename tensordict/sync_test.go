package tensordict

import (
	"bytes"
	"io/fs"
	"os"
	"path/filepath"
	"testing"
)

// tree returns every file under dir (relative path to contents; folders
// as "/"), temporary files included, so that two writes can be compared
// whole.
func tree(t *testing.T, dir string) map[string][]byte {
	t.Helper()
	out := map[string][]byte{}
	err := filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(dir, path)
		if d.IsDir() {
			out[rel] = []byte("/")
			return nil
		}
		b, err := os.ReadFile(path)
		out[rel] = b
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// TestWrite_Unsynced: Memmap and MemmapLike with Unsynced write exactly the
// files the synced forms write (nested folders, a non-tensor, a tensor
// without elements), which load back, and SyncPrefix then succeeds.
func TestWrite_Unsynced(t *testing.T) {
	src := sample(t, 4)
	src.SetPath([]string{"empty"}, must[*Tensor](t)(Zeros(4, 0)))
	for _, w := range []struct {
		name  string
		write func(td *TensorDict, prefix string, opts ...WriteOption) (*TensorDict, error)
	}{
		{"Memmap", (*TensorDict).Memmap},
		{"MemmapLike", (*TensorDict).MemmapLike},
	} {
		t.Run(w.name, func(t *testing.T) {
			dir := t.TempDir()
			synced, unsynced := filepath.Join(dir, "synced"), filepath.Join(dir, "unsynced")
			a := must[*TensorDict](t)(w.write(src, synced))
			a.Close()
			b := must[*TensorDict](t)(w.write(src, unsynced, Unsynced()))
			b.Close()
			ta, tb := tree(t, synced), tree(t, unsynced)
			if len(ta) != len(tb) {
				t.Fatalf("synced wrote %d entries, unsynced %d", len(ta), len(tb))
			}
			for k, v := range ta {
				if !bytes.Equal(v, tb[k]) {
					t.Errorf("%s differs: %q unsynced against %q", k, tb[k], v)
				}
			}
			if err := SyncPrefix(unsynced); err != nil {
				t.Fatal(err)
			}
			back := must[*TensorDict](t)(LoadMemmap(unsynced))
			defer back.Close()
			if w.name == "Memmap" && !back.Equal(src) {
				t.Errorf("loaded %v, want %v", back, src)
			}
		})
	}
}
