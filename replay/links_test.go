package replay

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// outsideFolder makes a folder outside the buffer's, holding a file that
// must stay as it is, and returns it.
func outsideFolder(t *testing.T) string {
	t.Helper()
	outside := filepath.Join(t.TempDir(), "outside")
	os.Mkdir(outside, 0o755)
	if err := os.WriteFile(filepath.Join(outside, "keep.txt"), []byte("mine"), 0o644); err != nil {
		t.Fatal(err)
	}
	return outside
}

func checkOutside(t *testing.T, outside string, want int) {
	t.Helper()
	if b, err := os.ReadFile(filepath.Join(outside, "keep.txt")); err != nil || string(b) != "mine" {
		t.Errorf("keep.txt outside the buffer: %q, %v; want it untouched", b, err)
	}
	if entries, _ := os.ReadDir(outside); len(entries) != want {
		var names []string
		for _, e := range entries {
			names = append(names, e.Name())
		}
		t.Errorf("the folder outside holds %v, want %d entries", names, want)
	}
}

func wantLinkRefused(t *testing.T, err, sentinel error, link string) {
	t.Helper()
	if !errors.Is(err, sentinel) || !strings.Contains(err.Error(), link) || !strings.Contains(err.Error(), "symbolic link") {
		t.Fatalf("%v; want %v naming %s as a symbolic link", err, sentinel, link)
	}
}

// TestCreate_RefusesLinks: a folder given to Create whose storage/ or
// slot table is a link to elsewhere is refused, naming the link, and
// nothing is written where it points (the storage was created there).
func TestCreate_RefusesLinks(t *testing.T) {
	for _, name := range []string{StorageDir, SlotsFile, LockFile} {
		t.Run(name, func(t *testing.T) {
			prefix := filepath.Join(t.TempDir(), "buf")
			os.Mkdir(prefix, 0o755)
			outside := outsideFolder(t)
			target := outside
			if name != StorageDir {
				target = filepath.Join(outside, "keep.txt")
			}
			link := filepath.Join(prefix, name)
			if err := os.Symlink(target, link); err != nil {
				t.Fatal(err)
			}
			b, err := Create(prefix, Config{Capacity: 8, Schema: testSchema})
			if err == nil {
				b.Close()
			}
			wantLinkRefused(t, err, ErrExists, link)
			checkOutside(t, outside, 1)
		})
	}
}

// TestOpen_RefusesLinks: a buffer whose slot table, storage/, meta file or
// lock was replaced by a link to a copy elsewhere is not opened (it was
// mapped read-write, and written, there): OpenWith fails with ErrConfig
// naming the link, and the copy is left as it was.
func TestOpen_RefusesLinks(t *testing.T) {
	for _, name := range []string{SlotsFile, StorageDir, MetaFile, LockFile} {
		t.Run(name, func(t *testing.T) {
			prefix := filepath.Join(t.TempDir(), "buf")
			b, err := Create(prefix, Config{Capacity: 8, Schema: testSchema})
			if err != nil {
				t.Fatal(err)
			}
			b.Close()
			outside := outsideFolder(t)
			moved := filepath.Join(outside, name)
			if err := os.Rename(filepath.Join(prefix, name), moved); err != nil {
				t.Fatal(err)
			}
			before := snapshot(t, moved)
			link := filepath.Join(prefix, name)
			if err := os.Symlink(moved, link); err != nil {
				t.Fatal(err)
			}
			b, err = Open(prefix)
			if err == nil {
				b.Close()
			}
			wantLinkRefused(t, err, ErrConfig, link)
			checkOutside(t, outside, 2)
			if after := snapshot(t, moved); after != before {
				t.Errorf("%s, where the link points, changed", moved)
			}
		})
	}
}

// TestOpen_StorageLeafLinkIsNotFollowed: a file inside storage/ that is a
// link out of the buffer's folder is not mapped.
func TestOpen_StorageLeafLinkIsNotFollowed(t *testing.T) {
	prefix := filepath.Join(t.TempDir(), "buf")
	b, err := Create(prefix, Config{Capacity: 8, Schema: testSchema})
	if err != nil {
		t.Fatal(err)
	}
	b.Close()
	leaf := filepath.Join(prefix, StorageDir, "reward.memmap")
	if _, err := os.Stat(leaf); err != nil {
		t.Fatal(err)
	}
	outside := outsideFolder(t)
	moved := filepath.Join(outside, "reward.memmap")
	if err := os.Rename(leaf, moved); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(moved, leaf); err != nil {
		t.Fatal(err)
	}
	b, err = Open(prefix)
	if err == nil {
		b.Close()
		t.Fatal("a buffer whose storage holds a link out of its folder was opened")
	}
	if !strings.Contains(err.Error(), "reward.memmap") {
		t.Errorf("%v does not name reward.memmap", err)
	}
}

// snapshot returns what path holds, as one string: a file's bytes, or a
// folder's files' names and bytes.
func snapshot(t *testing.T, path string) string {
	t.Helper()
	var sb strings.Builder
	filepath.WalkDir(path, func(p string, d os.DirEntry, err error) error {
		if err == nil && !d.IsDir() {
			b, _ := os.ReadFile(p)
			sb.WriteString(p + "\x00" + string(b) + "\x00")
		}
		return nil
	})
	return sb.String()
}

// TestClient_RefusesLinks: a client by reference maps the buffer's slot
// table and storage read-write through its root and writes rows there;
// one of them a link out of the buffer's folder is not mapped: Dial fails
// naming the link, and nothing is written where it points.
func TestClient_RefusesLinks(t *testing.T) {
	for _, name := range []string{SlotsFile, StorageDir} {
		t.Run(name, func(t *testing.T) {
			root := t.TempDir()
			n := serveBuffer(t, root, "buf", Config{Capacity: 8, Schema: testSchema})
			outside := outsideFolder(t)
			moved := filepath.Join(outside, name)
			link := filepath.Join(root, "buf", name)
			if err := os.Rename(link, moved); err != nil {
				t.Fatal(err)
			}
			if err := os.Symlink(moved, link); err != nil {
				t.Fatal(err)
			}
			c, err := Dial(ctxT(t), n.addr, "buf", WithRoot(root))
			if err == nil {
				c.Close()
			}
			wantLinkRefused(t, err, ErrConfig, link)
		})
	}
}
