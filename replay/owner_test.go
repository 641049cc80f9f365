package replay

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestOpen_InUseInThisProcess: a buffer has one owner, even within a
// process: a second Open or Create of its prefix is refused with ErrInUse
// naming this process, and after Close it opens again.
func TestOpen_InUseInThisProcess(t *testing.T) {
	prefix := filepath.Join(t.TempDir(), "buf")
	b, err := Create(prefix, Config{Capacity: 4, Schema: testSchema})
	if err != nil {
		t.Fatal(err)
	}
	want := fmt.Sprintf("in use by pid %d", os.Getpid())
	if again, err := Open(prefix); !errors.Is(err, ErrInUse) || !strings.Contains(err.Error(), want) {
		if err == nil {
			again.Close()
		}
		b.Close()
		t.Fatalf("a second Open: %v; want ErrInUse naming %q", err, want)
	}
	if err := b.Close(); err != nil {
		t.Fatal(err)
	}
	b, err = Open(prefix)
	if err != nil {
		t.Fatalf("Open after Close: %v", err)
	}
	b.Close()
}
