// Package twoview gives tests two page caches over one folder on one
// machine, as two machines mounting one NFS export have: two bindfs (FUSE)
// views of the same folder. What a process stores through a mapping of a
// file in one view is not seen by a mapping of that file, nor by read(2),
// in the other view, even after msync; the file in the folder itself has
// the bytes. So tensorwire's reference mode, which assumes that whoever maps
// a file under the shared root sees every store into it at once, gives
// wrong rows across the views, as across machines (issue 23).
//
// What was found with bindfs 1.14.7 (Debian, fuse3) on Linux 6.x, as root;
// TestViews_SeparatePageCaches checks the first point on every run and logs
// the others:
//
//   - A store through a MAP_SHARED mapping of VIEW_A/f, then msync(MS_SYNC),
//     reaches SRC/f (bindfs writes it through), but an existing mapping of
//     VIEW_B/f keeps its old bytes, for seconds and after a stat, and so
//     does pread through a descriptor opened on VIEW_B before the store.
//     The same holds the other way.
//   - A new open(2) of the file through VIEW_B drops B's cached pages of it,
//     mapped ones included: after it, B's mappings and reads see the store.
//     That is NFS's close-to-open consistency, which is why New mounts with
//     bindfs's defaults: a fix that opens (or maps) per call, as issue 23
//     allows for write-once data, passes here as on NFS.
//   - With -o kernel_cache even a new open keeps the stale pages (stricter
//     than NFS: it would fail correct fixes), so New does not use it.
//     --multithreaded behaves as the defaults. -o direct_io makes mmap fail
//     with ENODEV.
//   - A file deleted through VIEW_A while mapped through VIEW_B stays
//     readable through that mapping, untouched pages included: bindfs
//     keeps the file it opened for B open until B's mapping goes
//     (TestViews_DeleteWhileMapped logs it). On NFS the other client gets
//     SIGBUS there; these views do not reproduce that. Stateless mounts a
//     view that does (TestStateless_DeleteFaults).
//   - A file deleted through the view that has it open is renamed
//     .fuse_hiddenNNN until its last close (as NFS renames it .nfsNNN), so
//     removing its folder meanwhile fails with ENOTEMPTY: a node holding a
//     client's file open through the same view makes the client's
//     os.RemoveAll fail. -o hard_remove removes it at once, but then that
//     view's own mappings of the file fault (SIGBUS) on untouched pages,
//     which neither a local filesystem nor NFS does; New does not use it.
//
// Each view is its own mount, with its own device number: a test that
// checks "one mount" by device and inode tells the views apart, which is
// what rpc's coherence decision (issue 23) must do.
package twoview

import (
	_ "embed"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// pathfs is a FUSE view that holds no file open (pathfs.py).
//
//go:embed pathfs.py
var pathfs []byte

// Stateless mounts a third view of src whose open files go stale when
// they are unlinked, as NFS files do (pathfs.py, with python3-fusepy): it
// reads and writes an open file through the descriptor it opened, so a
// rename through another view does not matter (an NFS handle survives a
// rename on the server), but it fails every read once the file's link
// count is zero, so a page that a mapping through it has not read yet
// cannot be read once the file was deleted through another view; the
// mapping faults there (SIGBUS), as on a host whose NFS server lost the
// file. bindfs views cannot show that (the package doc). It has a page
// cache of its own, as the bindfs views do. It is unmounted when t ends,
// and skips (fails where CI is set) as New does, also without
// python3-fusepy.
func Stateless(t testing.TB, src string) string {
	t.Helper()
	_, fusermount := Available(t)
	python := "/usr/bin/python3" // Debian's, which python3-fusepy is for
	if out, err := exec.Command(python, "-c", "import fusepy").CombinedOutput(); err != nil {
		msg := fmt.Sprintf("twoview: %s cannot import fusepy (%v: %s); apt-get install python3-fusepy", python, err, strings.TrimSpace(string(out)))
		if os.Getenv("CI") != "" {
			t.Fatal(msg + "; CI must run the two-page-cache tests")
		}
		t.Skip(msg)
	}
	dir := t.TempDir()
	script, view := filepath.Join(dir, "pathfs.py"), filepath.Join(dir, "stateless")
	if err := os.WriteFile(script, pathfs, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Mkdir(view, 0o755); err != nil {
		t.Fatal(err)
	}
	// pathfs.py returns once the mount is up (it daemonizes).
	if out, err := exec.Command(python, script, src, view).CombinedOutput(); err != nil {
		t.Fatalf("twoview: pathfs.py %s %s: %v\n%s", src, view, err, out)
	}
	t.Cleanup(func() {
		if err := Unmount(fusermount, view); err != nil {
			t.Errorf("twoview: %v", err)
		}
	})
	if !isMount(view) {
		t.Fatalf("twoview: pathfs.py returned but %s is not a mount point", view)
	}
	return view
}

// New mounts two bindfs views of a new, empty temporary folder and returns
// the folder (src) and the two views (a, b). They are unmounted when the
// test ends (fusermount -u, lazily if the mount is busy), before t's
// temporary folders are removed.
//
// New skips the test, saying why, when it cannot mount: not root, no
// /dev/fuse, no bindfs or fusermount. Where the environment variable CI is
// set, a missing bindfs or fusermount fails the test instead: CI installs
// them (.ci/run) and must run these tests.
func New(t testing.TB) (src, a, b string) {
	t.Helper()
	bindfs, fusermount := Available(t)
	dir := t.TempDir()
	src, a, b = filepath.Join(dir, "src"), filepath.Join(dir, "a"), filepath.Join(dir, "b")
	for _, d := range []string{src, a, b} {
		if err := os.Mkdir(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	// Registered after t.TempDir, so it runs before the folder is removed
	// (cleanups run last in, first out).
	for _, view := range []string{a, b} {
		mount(t, bindfs, fusermount, src, view)
	}
	return src, a, b
}

// Available returns the paths of bindfs and fusermount, or skips (fails,
// where CI is set, for a missing program) as New does.
func Available(t testing.TB) (bindfs, fusermount string) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("twoview: two bindfs views need root (FUSE mounts)")
	}
	if _, err := os.Stat("/dev/fuse"); err != nil {
		t.Skipf("twoview: no FUSE device: %v", err)
	}
	missing := func(prog string, err error) {
		t.Helper()
		msg := fmt.Sprintf("twoview: %s not found (%v); apt-get install bindfs fuse3", prog, err)
		if os.Getenv("CI") != "" {
			t.Fatal(msg + "; CI must run the two-page-cache tests")
		}
		t.Skip(msg)
	}
	bindfs, err := exec.LookPath("bindfs")
	if err != nil {
		missing("bindfs", err)
	}
	for _, name := range []string{"fusermount3", "fusermount"} {
		if fusermount, err = exec.LookPath(name); err == nil {
			break
		}
	}
	if err != nil {
		missing("fusermount", err)
	}
	return bindfs, fusermount
}

// mount mounts a bindfs view of src at view and unmounts it when t ends.
func mount(t testing.TB, bindfs, fusermount, src, view string) {
	t.Helper()
	out, err := exec.Command(bindfs, src, view).CombinedOutput()
	if err != nil {
		t.Fatalf("twoview: bindfs %s %s: %v\n%s", src, view, err, out)
	}
	t.Cleanup(func() {
		if err := Unmount(fusermount, view); err != nil {
			t.Errorf("twoview: %v", err)
		}
	})
	// bindfs daemonizes once the mount is up; check it is a mount.
	if !isMount(view) {
		t.Fatalf("twoview: bindfs returned but %s is not a mount point", view)
	}
}

// Unmount unmounts the FUSE mount at view with fusermount -u, trying for a
// few seconds while it is busy (a process of the test may still be exiting),
// then lazily (-z), so that no test leaves a mount behind.
func Unmount(fusermount, view string) error {
	var last []byte
	for range 20 {
		out, err := exec.Command(fusermount, "-u", view).CombinedOutput()
		if err == nil || !isMount(view) {
			return nil
		}
		last = out
		time.Sleep(100 * time.Millisecond)
	}
	out, err := exec.Command(fusermount, "-u", "-z", view).CombinedOutput()
	if err != nil && isMount(view) {
		return fmt.Errorf("fusermount -u -z %s: %v\n%s (before: %s)", view, err, out, last)
	}
	return nil
}

// isMount reports whether path is a mount point, by /proc/self/mountinfo.
func isMount(path string) bool {
	b, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		return false
	}
	for _, line := range strings.Split(string(b), "\n") {
		f := strings.Fields(line)
		if len(f) > 4 && unescapeMount(f[4]) == path {
			return true
		}
	}
	return false
}

// unescapeMount undoes mountinfo's octal escapes (\040 for a space, ...).
func unescapeMount(s string) string {
	if !strings.Contains(s, `\`) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+3 < len(s) {
			var c byte
			if _, err := fmt.Sscanf(s[i+1:i+4], "%03o", &c); err == nil {
				b.WriteByte(c)
				i += 3
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}
