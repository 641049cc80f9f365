package store

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/tensorwire/tensorwire/rpc"
)

// TestStore_LockedInThisProcess: a second Open of a folder this process
// has open says so, instead of blaming another process.
func TestStore_LockedInThisProcess(t *testing.T) {
	dir := t.TempDir()
	s := openT(t, dir, Options{})
	_, err := Open(dir, Options{})
	if !errors.Is(err, ErrLocked) || !strings.Contains(err.Error(), "already open in this process") ||
		strings.Contains(err.Error(), "another process") {
		t.Fatalf("second Open in one process = %v, want ErrLocked saying already open in this process", err)
	}
	s.Close()
	s2, err := Open(dir, Options{})
	if err != nil {
		t.Fatalf("Open after Close = %v", err)
	}
	s2.Close()
}

// TestClient_ClosedIsErrClosed: a closed client's calls fail with the
// package's ErrClosed, as a closed Store's do, not with Unavailable.
func TestClient_ClosedIsErrClosed(t *testing.T) {
	ctx := ctxT(t)
	root := t.TempDir()
	n := serveStore(t, root, "st", Options{})
	c := dialT(t, n.addr, "st", root, "ref")
	c.Close()
	if _, err := c.Append(ctx, "b", itemTD(t, 1, 1)); !errors.Is(err, ErrClosed) || errors.Is(err, rpc.ErrUnavailable) {
		t.Errorf("Append after Close = %v, want ErrClosed", err)
	}
	if _, _, err := c.List(ctx); !errors.Is(err, ErrClosed) {
		t.Errorf("List after Close = %v, want ErrClosed", err)
	}
	for _, err := range c.Watch(ctx, "", 0) {
		if !errors.Is(err, ErrClosed) {
			t.Errorf("Watch after Close = %v, want ErrClosed", err)
		}
		break
	}
}

// TestStore_RefusesFolderThatIsNotAStore: Open of a folder that holds files
// but no store log refuses and touches nothing, even files named as a
// store names its own (docs/store.md: "left alone").
func TestStore_RefusesFolderThatIsNotAStore(t *testing.T) {
	dir := t.TempDir()
	files := []string{
		"notes.txt",
		"trash/a.txt",
		"values/00000000000000ab/x.memmap",
		"staging/n-0000000000000001/meta.json",
		"staging/0123456789abcdef0123456789abcdef/meta.json",
	}
	for _, f := range files {
		p := filepath.Join(dir, f)
		os.MkdirAll(filepath.Dir(p), 0o755)
		os.WriteFile(p, []byte("mine"), 0o644)
	}
	_, err := Open(dir, Options{})
	if !errors.Is(err, ErrExists) || !strings.Contains(err.Error(), dir) {
		t.Fatalf("Open of a folder of other files = %v, want ErrExists naming it", err)
	}
	for _, f := range files {
		if b, err := os.ReadFile(filepath.Join(dir, f)); err != nil || string(b) != "mine" {
			t.Errorf("%s: %q, %v after the refused Open", f, b, err)
		}
	}
	if _, err := os.Lstat(filepath.Join(dir, logName)); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("the refused Open made a log: %v", err)
	}
	// An empty folder, or one a crash left before its log, is a new store.
	for _, pre := range [][]string{nil, {lockName}, {valuesDir + "/", stagingDir + "/", trashDir + "/", lockName}} {
		d := t.TempDir()
		for _, f := range pre {
			if strings.HasSuffix(f, "/") {
				os.Mkdir(filepath.Join(d, f), 0o755)
			} else {
				os.WriteFile(filepath.Join(d, f), nil, 0o644)
			}
		}
		s, err := Open(d, Options{})
		if err != nil {
			t.Fatalf("Open of a folder holding %v = %v", pre, err)
		}
		s.Close()
	}
}

// TestStore_RefusesLinks: a store's own folders (values/, staging/,
// trash/) or files that are symbolic links make Open refuse, naming the
// link; nothing outside the store's folder is touched.
func TestStore_RefusesLinks(t *testing.T) {
	for _, sub := range []string{valuesDir, stagingDir, trashDir, logName} {
		t.Run(sub, func(t *testing.T) {
			ctx := ctxT(t)
			dir := filepath.Join(t.TempDir(), "st")
			s := openT(t, dir, Options{InlineBytes: 64})
			if _, err := s.Append(ctx, "b", itemTD(t, 1, 100)); err != nil {
				t.Fatal(err)
			}
			s.Close()
			// Elsewhere: a copy of the folder, holding what Open would delete.
			outside := filepath.Join(t.TempDir(), sub)
			if err := os.Rename(filepath.Join(dir, sub), outside); err != nil {
				t.Fatal(err)
			}
			victims := []string{"00000000000000ff/x", "n-0000000000000009/x", "0000000000000009/x"}
			if sub != logName {
				for _, v := range victims {
					os.MkdirAll(filepath.Join(outside, filepath.Dir(v)), 0o755)
					os.WriteFile(filepath.Join(outside, v), []byte("mine"), 0o644)
				}
			}
			link := filepath.Join(dir, sub)
			if err := os.Symlink(outside, link); err != nil {
				t.Fatal(err)
			}
			_, err := Open(dir, Options{})
			if !errors.Is(err, ErrExists) || !strings.Contains(err.Error(), link) {
				t.Fatalf("Open with %s a link = %v, want ErrExists naming %s", sub, err, link)
			}
			if sub != logName {
				for _, v := range victims {
					if _, err := os.Stat(filepath.Join(outside, v)); err != nil {
						t.Errorf("%s outside the store: %v", v, err)
					}
				}
			}
		})
	}
}

// TestStore_LogRemovedRefusesToOpen: a store whose log was deleted is not
// opened as a new, empty store (which dropped every value): Open refuses
// with ErrLost naming the log, and the values stay.
func TestStore_LogRemovedRefusesToOpen(t *testing.T) {
	ctx := ctxT(t)
	dir := t.TempDir()
	s := openT(t, dir, Options{InlineBytes: 64})
	if _, err := s.Append(ctx, "b", itemTD(t, 1, 100)); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Publish(ctx, "p", itemTD(t, 2, 100)); err != nil {
		t.Fatal(err)
	}
	s.Close()
	if err := os.Remove(filepath.Join(dir, logName)); err != nil {
		t.Fatal(err)
	}
	before, _ := os.ReadDir(filepath.Join(dir, valuesDir))
	_, err := Open(dir, Options{})
	if !errors.Is(err, ErrLost) || !strings.Contains(err.Error(), filepath.Join(dir, logName)) {
		t.Fatalf("Open of a store without its log = %v, want ErrLost naming the log", err)
	}
	after, _ := os.ReadDir(filepath.Join(dir, valuesDir))
	if len(before) != 2 || len(after) != len(before) {
		t.Fatalf("%d values before the refused Open, %d after", len(before), len(after))
	}
}

// TestStore_ValueLinkIsNotFollowed: a value's folder replaced by a link to
// a TensorDict elsewhere is not read through: the store reads its values
// through its os.Root.
func TestStore_ValueLinkIsNotFollowed(t *testing.T) {
	ctx := ctxT(t)
	dir := t.TempDir()
	s := openT(t, dir, Options{InlineBytes: 64})
	if _, err := s.Append(ctx, "b", itemTD(t, 1, 100)); err != nil {
		t.Fatal(err)
	}
	v := filepath.Join(dir, relValue(prefixIDs(s, "b")[0]))
	outside := filepath.Join(t.TempDir(), "td")
	if err := os.Rename(v, outside); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(outside, v); err != nil {
		t.Fatal(err)
	}
	if got, err := s.Peek(ctx, "b"); err == nil {
		closeAll(got)
		t.Fatal("Peek read a value through a link out of the store's folder")
	}
}

// TestOpen_AfterACrashCreatingTheLog: a process killed inside createLog
// (atomicfile.WriteFile's temporary file made, not yet renamed to
// store.log) leaves LOCK, the three empty folders and .store.log.tmp-*.
// Nothing was acknowledged: the next Open starts the store and removes the
// temporary file. Before the fix Open refused with ErrLost ("its log was
// removed").
func TestOpen_AfterACrashCreatingTheLog(t *testing.T) {
	dir := t.TempDir()
	// What a kill -9 inside createLog leaves.
	for _, sub := range []string{valuesDir, stagingDir, trashDir} {
		if err := os.Mkdir(filepath.Join(dir, sub), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.WriteFile(filepath.Join(dir, lockName), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "."+logName+".tmp-123456"), []byte(logMagic), 0o644); err != nil {
		t.Fatal(err)
	}
	s, err := Open(dir, Options{})
	if err != nil {
		t.Fatalf("Open after a crash while the store was being created: %v", err)
	}
	s.Close()
	if _, err := os.Stat(filepath.Join(dir, "."+logName+".tmp-123456")); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("the dead process's temporary log is still there: %v", err)
	}
}
