package atomicfile

import (
	"os"
	"path/filepath"
	"testing"
)

func TestWriteFile_Replaces(t *testing.T) {
	for _, w := range []struct {
		name  string
		write func(string, []byte, os.FileMode) error
	}{{"synced", WriteFile}, {"unsynced", WriteFileUnsynced}} {
		t.Run(w.name, func(t *testing.T) {
			dir := t.TempDir()
			path := filepath.Join(dir, "meta.json")
			for _, data := range []string{"old", "new content"} {
				if err := w.write(path, []byte(data), 0o640); err != nil {
					t.Fatal(err)
				}
				if got, err := os.ReadFile(path); err != nil || string(got) != data {
					t.Errorf("file holds %q, %v; want %q", got, err, data)
				}
			}
			if fi, _ := os.Stat(path); fi.Mode().Perm() != 0o640 {
				t.Errorf("mode %v, want 0640", fi.Mode().Perm())
			}
			if entries, _ := os.ReadDir(dir); len(entries) != 1 {
				t.Errorf("directory holds %d entries, want only the file (no temporary one)", len(entries))
			}
		})
	}
}

func TestWriteFile_FailureLeavesTargetAsItWas(t *testing.T) {
	dir := t.TempDir()
	// A directory in the way of the rename: the write fails at the rename,
	// and leaves the directory as it was.
	blocked := filepath.Join(dir, "d")
	if err := os.Mkdir(blocked, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(blocked, "x"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := WriteFile(blocked, []byte("new"), 0o644); err == nil {
		t.Fatal("replacing a non-empty directory succeeded")
	}
	if entries, err := os.ReadDir(blocked); err != nil || len(entries) != 1 {
		t.Errorf("the target of the failed write changed: %v, %v", entries, err)
	}
	if err := WriteFile(filepath.Join(dir, "missing", "f"), []byte("new"), 0o644); err == nil {
		t.Error("writing into a missing directory succeeded")
	}
	if entries, _ := os.ReadDir(dir); len(entries) != 1 {
		t.Errorf("directory holds %d entries, want only d (no temporary files)", len(entries))
	}
	if err := SyncDir(filepath.Join(dir, "missing")); err == nil {
		t.Error("SyncDir of a missing directory succeeded")
	}
}

// TestMkdirAll makes missing folders, leaves a folder that exists, and
// refuses a path that is a file (a crash's durability is not observable
// here: the test checks what os.MkdirAll's callers rely on).
func TestMkdirAll(t *testing.T) {
	base := t.TempDir()
	dir := filepath.Join(base, "a", "b", "c")
	if err := MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	if fi, err := os.Stat(dir); err != nil || !fi.IsDir() {
		t.Fatalf("%s not made: %v", dir, err)
	}
	if err := MkdirAll(dir, 0o755); err != nil {
		t.Fatalf("again: %v", err)
	}
	file := filepath.Join(base, "f")
	if err := os.WriteFile(file, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := MkdirAll(filepath.Join(file, "x"), 0o755); err == nil {
		t.Fatal("a folder under a file was made")
	}
}
