package lockfile

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/tensorwire/tensorwire/internal/testkit/proctest"
)

const envHelper = "TENSORWIRE_LOCKFILE_HELPER" // the path to lock

// TestHelperProcess is not a test: it is the body of the helper process,
// which takes the lock at $TENSORWIRE_LOCKFILE_HELPER, prints "LOCKED" and
// holds it until killed. It skips unless run as one.
func TestHelperProcess(t *testing.T) {
	path := os.Getenv(envHelper)
	if path == "" {
		t.Skip("the body of a helper process")
	}
	if _, err := Acquire(path); err != nil {
		fmt.Fprintln(os.Stderr, "helper:", err)
		os.Exit(3)
	}
	fmt.Println("LOCKED")
	select {}
}

func acquire(t *testing.T, path string) *Lock {
	t.Helper()
	l, err := Acquire(path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Release() })
	return l
}

// TestAcquire_AcrossProcesses: a lock held by another process is refused
// with that process's pid and host, and is free once the process is killed
// with SIGKILL: the kernel dropped it, nothing was cleaned up.
func TestAcquire_AcrossProcesses(t *testing.T) {
	path := filepath.Join(t.TempDir(), "x.lock")
	holder := proctest.Start(t, envHelper+"="+path)
	holder.Expect(t, "LOCKED")

	_, err := Acquire(path)
	var held *HeldError
	if !errors.As(err, &held) || !errors.Is(err, ErrLocked) {
		t.Fatalf("Acquire of a lock another process holds: %v; want a HeldError matching ErrLocked", err)
	}
	host, _ := os.Hostname()
	if held.PID != holder.Pid() || held.Host != host || held.Path != path {
		t.Errorf("HeldError %+v; want pid %d on %s", held, holder.Pid(), host)
	}
	if want := "pid " + strconv.Itoa(holder.Pid()); !strings.Contains(err.Error(), want) || !strings.Contains(err.Error(), host) {
		t.Errorf("%q does not name %s on %s", err, want, host)
	}

	holder.Kill()
	l := acquire(t, path)
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if want := fmt.Sprintf("pid %d\n", os.Getpid()); !strings.HasPrefix(string(data), want) {
		t.Errorf("the lock file holds %q after this process took it; want it to start %q", data, want)
	}
	if err := l.Check(); err != nil {
		t.Errorf("Check of a lock in place: %v", err)
	}
}

// TestAcquire_SameProcess: the lock belongs to the open file, so a second
// Acquire in the process holding it fails too; after Release it succeeds,
// and Release twice is harmless.
func TestAcquire_SameProcess(t *testing.T) {
	path := filepath.Join(t.TempDir(), "x.lock")
	l := acquire(t, path)
	_, err := Acquire(path)
	var held *HeldError
	if !errors.As(err, &held) || held.PID != os.Getpid() {
		t.Fatalf("a second Acquire in the holder: %v; want a HeldError naming pid %d", err, os.Getpid())
	}
	if err := l.Release(); err != nil {
		t.Fatal(err)
	}
	if err := l.Release(); err != nil {
		t.Fatalf("Release again: %v", err)
	}
	acquire(t, path)
}

func TestAcquire_Errors(t *testing.T) {
	_, err := Acquire(filepath.Join(t.TempDir(), "missing", "x.lock"))
	if err == nil || errors.Is(err, ErrLocked) || !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("Acquire in a missing folder: %v; want a not-exist error", err)
	}
}

// TestCheck_Lost: Check fails with ErrLost once the lock file is deleted,
// replaced by another file, or its folder renamed.
func TestCheck_Lost(t *testing.T) {
	for _, tc := range []struct {
		name string
		do   func(dir, path string) error
	}{
		{"deleted", func(dir, path string) error { return os.Remove(path) }},
		{"folder deleted", func(dir, path string) error { return os.RemoveAll(dir) }},
		{"folder renamed", func(dir, path string) error { return os.Rename(dir, dir+".old") }},
		{"replaced", func(dir, path string) error {
			if err := os.Remove(path); err != nil {
				return err
			}
			return os.WriteFile(path, nil, 0o644)
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := filepath.Join(t.TempDir(), "d")
			if err := os.Mkdir(dir, 0o755); err != nil {
				t.Fatal(err)
			}
			path := filepath.Join(dir, "x.lock")
			l := acquire(t, path)
			if err := tc.do(dir, path); err != nil {
				t.Fatal(err)
			}
			if err := l.Check(); !errors.Is(err, ErrLost) {
				t.Fatalf("Check: %v; want ErrLost", err)
			}
		})
	}
}

func TestHeldError_Holder(t *testing.T) {
	for _, tc := range []struct {
		data string
		want string
	}{
		{"pid 12\nhost a\nprogram tensorwire\n", "pid 12 (tensorwire) on a"},
		{"pid 12\n", "pid 12"},
		{"", "another process"},
		{"pid x\nhost a\n", "another process"},
	} {
		e := &HeldError{Path: "p"}
		parseHolder([]byte(tc.data), e)
		if got := e.Holder(); !strings.HasPrefix(got, tc.want) {
			t.Errorf("%q: Holder() = %q, want %q", tc.data, got, tc.want)
		}
	}
}

// TestHeldError_NamesNoDeadHolder: a holder killed with SIGKILL leaves its
// record ("pid ...") in the lock file; a new holder that has taken the
// lock but not written its own yet is reported as not recorded (PID 0, as
// HeldError's doc says), not as the dead one, whose pid may be another
// process's by now (an operator told it might kill that). And Release
// leaves no record behind. It failed before take cleared the record and
// Release did: the dead holder was named, and a released file kept its
// holder's pid.
func TestHeldError_NamesNoDeadHolder(t *testing.T) {
	path := filepath.Join(t.TempDir(), "x.lock")
	// What a holder killed with SIGKILL leaves behind.
	if err := os.WriteFile(path, []byte("pid 999999\nhost deadhost\nprogram old\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	// A new holder between taking the lock and writeHolder.
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if err := take(f); err != nil {
		t.Fatal(err)
	}
	_, err = Acquire(path)
	var held *HeldError
	if !errors.As(err, &held) {
		t.Fatalf("Acquire: %v, want a HeldError", err)
	}
	if held.PID != 0 {
		t.Fatalf("HeldError names %q, a holder that no longer holds the lock; want PID 0 (not recorded yet)", held.Holder())
	}
	if err := unlock(f); err != nil {
		t.Fatal(err)
	}
	l := acquire(t, path)
	if err := l.Release(); err != nil {
		t.Fatal(err)
	}
	if data, err := os.ReadFile(path); err != nil || len(data) != 0 {
		t.Fatalf("the lock file after Release holds %q (%v); want it empty", data, err)
	}
}

// TestAcquire_RefusesLink: a lock file that is a symbolic link is not
// followed: the file it points to is neither created nor truncated, and
// the error names the link.
func TestAcquire_RefusesLink(t *testing.T) {
	outside := filepath.Join(t.TempDir(), "victim")
	if err := os.WriteFile(outside, []byte("mine"), 0o644); err != nil {
		t.Fatal(err)
	}
	link := filepath.Join(t.TempDir(), "lock")
	if err := os.Symlink(outside, link); err != nil {
		t.Fatal(err)
	}
	l, err := Acquire(link)
	if err == nil {
		l.Release()
	}
	if !errors.Is(err, ErrLink) || !strings.Contains(err.Error(), link) {
		t.Fatalf("Acquire of a link = %v, want ErrLink naming %s", err, link)
	}
	if b, _ := os.ReadFile(outside); string(b) != "mine" {
		t.Fatalf("the file the link points to holds %q, want it untouched", b)
	}
}

// TestAcquireIn_RefusesLinks: AcquireIn opens the lock through the root:
// a link at its name, or a folder on the way that links out of the root,
// is not followed, and nothing is created where it points.
func TestAcquireIn_RefusesLinks(t *testing.T) {
	dir := t.TempDir()
	outside := t.TempDir()
	os.Symlink(outside, filepath.Join(dir, "sub"))
	os.Symlink(filepath.Join(outside, "lock"), filepath.Join(dir, "lock"))
	root, err := os.OpenRoot(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer root.Close()
	for _, name := range []string{"lock", "sub/lock"} {
		if l, err := AcquireIn(root, name); err == nil {
			l.Release()
			t.Errorf("AcquireIn(%s) through a link: no error", name)
		}
	}
	if l, err := AcquireIn(root, "lock"); !errors.Is(err, ErrLink) || !strings.Contains(err.Error(), filepath.Join(dir, "lock")) {
		if err == nil {
			l.Release()
		}
		t.Errorf("AcquireIn of a link: %v, want ErrLink naming it", err)
	}
	if entries, _ := os.ReadDir(outside); len(entries) != 0 {
		t.Errorf("%d files made outside the root", len(entries))
	}
	l, err := AcquireIn(root, "mine")
	if err != nil {
		t.Fatal(err)
	}
	if err := l.Check(); err != nil {
		t.Error(err)
	}
	l.Release()
}
