package rpc

import (
	"os"
	"path/filepath"
	"testing"
)

// TestServer_Rel: paths inside the root (also reached through a symlink
// to the root, or through one inside it) are named relative to it; paths
// outside, or inside only lexically through a symlink that leads out, are
// not. A server without a root names nothing.
func TestServer_Rel(t *testing.T) {
	base := t.TempDir()
	root := filepath.Join(base, "root")
	outside := filepath.Join(base, "outside")
	for _, d := range []string{filepath.Join(root, "a", "b"), outside} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	for link, target := range map[string]string{
		filepath.Join(base, "alias"): root,                     // the root by another name
		filepath.Join(root, "out"):   outside,                  // leads out of the root
		filepath.Join(root, "in"):    filepath.Join(root, "a"), // stays inside
	} {
		if err := os.Symlink(target, link); err != nil {
			t.Fatal(err)
		}
	}
	s, err := NewServer(WithRoot(root))
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	for _, tc := range []struct {
		path string
		rel  string
		ok   bool
	}{
		{root, ".", true},
		{filepath.Join(root, "a", "b"), "a/b", true},
		{filepath.Join(base, "alias", "a"), "a", true},
		{filepath.Join(root, "in", "b"), "a/b", true},
		{filepath.Join(root, "out"), "", false},
		{outside, "", false},
		{base, "", false},
		{filepath.Join(root, "missing"), "", false},
	} {
		rel, ok := s.Rel(tc.path)
		if rel != tc.rel || ok != tc.ok {
			t.Errorf("Rel(%s) = %q, %v; want %q, %v", tc.path, rel, ok, tc.rel, tc.ok)
		}
	}

	bare, err := NewServer()
	if err != nil {
		t.Fatal(err)
	}
	defer bare.Close()
	if rel, ok := bare.Rel(root); ok || rel != "" {
		t.Errorf("Rel without a root = %q, %v", rel, ok)
	}
}
