package progress

import (
	"bytes"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestBytes(t *testing.T) {
	for _, tc := range []struct {
		v    float64
		want string
	}{{0, "0 B"}, {1023, "1023 B"}, {1024, "1.0 KiB"}, {1.5 * 1024 * 1024, "1.5 MiB"}, {3 << 40, "3.0 TiB"}} {
		if got := Bytes(tc.v); got != tc.want {
			t.Errorf("Bytes(%v) = %q, want %q", tc.v, got, tc.want)
		}
	}
}

func TestBar_PlainOutputCountsEverything(t *testing.T) {
	var out bytes.Buffer
	b := New(&out, "copy", "B", 4096)
	if _, err := io.Copy(io.Discard, b.Reader(strings.NewReader(strings.Repeat("x", 4096)))); err != nil {
		t.Fatal(err)
	}
	b.Done()
	last := strings.TrimSpace(out.String()[strings.LastIndex(strings.TrimSpace(out.String()), "\n")+1:])
	if !strings.HasPrefix(last, "copy 100% 4.0 KiB/4.0 KiB") {
		t.Errorf("final line %q", last)
	}
	if strings.Contains(out.String(), "\r") {
		t.Error("redraws (\\r) written to a non-terminal")
	}
	var nilBar *Bar
	nilBar.Add(1) // a nil bar is a no-op, not a crash
	nilBar.Done()
}

func TestNew_RegularFileIsNotATerminal(t *testing.T) {
	f, err := os.Create(filepath.Join(t.TempDir(), "log"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Close() })
	if b := New(f, "copy", "B", 1); b.terminal {
		t.Error("a regular file was taken for a terminal")
	}
}
