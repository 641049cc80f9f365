package nodeproc

import (
	"os"
	"path/filepath"
	"testing"
)

// TestWriteRandomToken_RefusesAnExistingFile: WriteRandomToken writes a new file
// readable by its owner only. Given a path that exists with mode 0644 it
// used to write the secret into it, readable by every user.
func TestWriteRandomToken_RefusesAnExistingFile(t *testing.T) {
	path := filepath.Join(t.TempDir(), "token")
	if err := os.WriteFile(path, []byte("old\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(path, 0o644); err != nil {
		t.Fatal(err)
	}
	err := WriteRandomToken(path)
	fi, serr := os.Stat(path)
	if serr != nil {
		t.Fatal(serr)
	}
	b, _ := os.ReadFile(path)
	if err == nil && fi.Mode().Perm()&0o077 != 0 {
		t.Errorf("WriteRandomToken wrote the token (%d bytes) into a file of mode %#o", len(b), fi.Mode().Perm())
	}
	if err != nil && string(b) != "old\n" {
		t.Errorf("WriteRandomToken failed (%v) but changed the file", err)
	}
}
