//go:build unix

package tensordict

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/tensorwire/tensorwire/memmap"
)

// LoadMemmap with InRoot loads what lies in the root and refuses, at the
// file that leaves it, anything reached through a link out, or a FIFO.
func TestLoadMemmap_InRoot(t *testing.T) {
	dir := t.TempDir()
	root, outside := filepath.Join(dir, "root"), filepath.Join(dir, "outside")
	for _, d := range []string{root, outside} {
		if err := os.Mkdir(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	mkTD := func(prefix string) {
		td, err := Create(prefix, []int{2}, Field{Key: []string{"a"}, DType: memmap.Uint8, Shape: []int{2, 3}},
			Field{Key: []string{"n", "b"}, DType: memmap.Float32, Shape: []int{2}})
		if err != nil {
			t.Fatal(err)
		}
		td.Close()
	}
	mkTD(filepath.Join(root, "good"))
	mkTD(filepath.Join(outside, "td"))
	// A TensorDict whose leaf, and one whose nested folder, link out.
	mkTD(filepath.Join(root, "leafout"))
	os.Remove(filepath.Join(root, "leafout", "a.memmap"))
	noErr(t, os.Symlink(filepath.Join(outside, "td", "a.memmap"), filepath.Join(root, "leafout", "a.memmap")))
	mkTD(filepath.Join(root, "dirout"))
	os.RemoveAll(filepath.Join(root, "dirout", "n"))
	noErr(t, os.Symlink(filepath.Join(outside, "td", "n"), filepath.Join(root, "dirout", "n")))
	noErr(t, os.Symlink(filepath.Join(outside, "td"), filepath.Join(root, "whole")))
	mkTD(filepath.Join(root, "fifo"))
	os.Remove(filepath.Join(root, "fifo", "a.memmap"))
	noErr(t, syscall.Mkfifo(filepath.Join(root, "fifo", "a.memmap"), 0o644))
	// A link that stays inside is followed.
	noErr(t, os.Symlink("good", filepath.Join(root, "alias")))

	r, err := os.OpenRoot(root)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	for _, tc := range []struct {
		prefix string
		want   string // "" loads
	}{
		{"good", ""},
		{"alias", ""},
		{"leafout", "escapes"},
		{"dirout", "escapes"},
		{"whole", "escapes"},
		{"../outside/td", "escapes"},
		{"fifo", "not a regular file"},
	} {
		td, err := LoadMemmap(filepath.Join(root, tc.prefix), ReadOnly(), InRoot(r))
		switch {
		case tc.want == "" && err != nil:
			t.Errorf("%s: %v", tc.prefix, err)
		case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)):
			t.Errorf("%s: %v, want an error about %q", tc.prefix, err, tc.want)
		case tc.want == "not a regular file" && !errors.Is(err, ErrFormat):
			t.Errorf("%s: %v, want ErrFormat", tc.prefix, err)
		}
		if td != nil {
			td.Close()
		}
	}
	// Without InRoot the same links are followed, as before.
	td, err := LoadMemmap(filepath.Join(root, "dirout"), ReadOnly())
	if err != nil {
		t.Fatalf("dirout without InRoot: %v", err)
	}
	td.Close()
}
