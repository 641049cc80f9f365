//go:build linux

package faulttest

import (
	"bytes"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
)

// mountTmpfs mounts a tmpfs of size bytes on a new folder under the test's
// temporary directory and returns the folder: a small disk to fill. It is
// unmounted when the test ends, passed or failed (lazily if something still
// holds it). The test is skipped when it cannot mount (not root, no tmpfs),
// and under -short.
//
// Processes a test starts on the mount must be stopped by cleanups
// registered after this call: cleanups run last-in first-out, so they stop
// before the unmount.
func mountTmpfs(t *testing.T, size int64) string {
	t.Helper()
	skipShort(t)
	if os.Geteuid() != 0 {
		t.Skip("needs root to mount a small tmpfs to fill")
	}
	dir := filepath.Join(t.TempDir(), "disk")
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command("mount", "-t", "tmpfs", "-o", "size="+strconv.FormatInt(size, 10), "tmpfs", dir).CombinedOutput()
	if err != nil {
		t.Skipf("cannot mount a %d-byte tmpfs on %s: %v: %s", size, dir, err, bytes.TrimSpace(out))
	}
	t.Cleanup(func() {
		out, err := exec.Command("umount", dir).CombinedOutput()
		if err == nil {
			return
		}
		if lout, lerr := exec.Command("umount", "-l", dir).CombinedOutput(); lerr != nil {
			t.Errorf("cannot unmount the tmpfs at %s: %v: %s; lazily: %v: %s", dir, err, out, lerr, lout)
		} else {
			t.Errorf("the tmpfs at %s was busy when the test ended (%s): unmounted lazily", dir, bytes.TrimSpace(out))
		}
	})
	if got := diskFree(t, dir); got != size {
		t.Fatalf("a fresh %d-byte tmpfs has %d bytes free", size, got)
	}
	return dir
}

// diskFree returns the bytes an unprivileged write can still allocate on
// the filesystem of dir.
func diskFree(t testing.TB, dir string) int64 {
	t.Helper()
	var st syscall.Statfs_t
	if err := syscall.Statfs(dir, &st); err != nil {
		t.Fatal(err)
	}
	return int64(st.Bavail) * st.Bsize
}

// fillDisk writes a file in dir until the filesystem has not one byte
// left, and returns its path: remove it to free the space.
func fillDisk(t testing.TB, dir string) string {
	t.Helper()
	f, err := os.CreateTemp(dir, "filler-")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	for _, size := range []int{1 << 20, 4096, 1} {
		buf := bytes.Repeat([]byte{0xAB}, size) // not zeros: nothing may keep them sparse
		for {
			if _, err := f.Write(buf); err != nil {
				if !errors.Is(err, syscall.ENOSPC) {
					t.Fatalf("filling the disk: %v", err)
				}
				break
			}
		}
	}
	if free := diskFree(t, dir); free != 0 {
		t.Fatalf("the disk is not full after writing until ENOSPC: %d bytes free", free)
	}
	return f.Name()
}

// diskEntries returns the paths under dir, relative to it and sorted, with
// a "/" after folders.
func diskEntries(t testing.TB, dir string) []string {
	t.Helper()
	var out []string
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(dir, p)
		if rel == "." {
			return nil
		}
		if d.IsDir() {
			rel += "/"
		}
		out = append(out, rel)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// diskAllocated returns the bytes of disk blocks the file at path holds, and
// its size.
func diskAllocated(t testing.TB, path string) (blocks, size int64) {
	t.Helper()
	var st syscall.Stat_t
	if err := syscall.Stat(path, &st); err != nil {
		t.Fatal(err)
	}
	return st.Blocks * 512, st.Size
}

// makeSparse replaces the file at path by a copy that holds no blocks where
// the original has pages of zeros, as "cp --sparse=always", "rsync -S" or
// a tar extraction leave it, and PyTorch's tensordict leaves every file it
// creates. The copy is renamed over the original. It returns the bytes of
// blocks the copy holds.
func makeSparse(t testing.TB, path string) int64 {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	tmp := path + ".sparse"
	f, err := os.Create(tmp)
	if err != nil {
		t.Fatal(err)
	}
	if err := f.Truncate(int64(len(data))); err != nil {
		t.Fatal(err)
	}
	const page = 4096
	zero := make([]byte, page)
	for off := 0; off < len(data); off += page {
		p := data[off:min(off+page, len(data))]
		if bytes.Equal(p, zero[:len(p)]) {
			continue
		}
		if _, err := f.WriteAt(p, int64(off)); err != nil {
			t.Fatal(err)
		}
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, path); err != nil {
		t.Fatal(err)
	}
	blocks, _ := diskAllocated(t, path)
	return blocks
}

// diskExitStatus describes how a finished command ended: its exit code, and
// whether a signal killed it (and which).
func diskExitStatus(err error) (code int, signaled bool, sig syscall.Signal) {
	if err == nil {
		return 0, false, 0
	}
	var ee *exec.ExitError
	if !errors.As(err, &ee) {
		return -1, false, 0
	}
	ws, ok := ee.Sys().(syscall.WaitStatus)
	if !ok {
		return ee.ExitCode(), false, 0
	}
	if ws.Signaled() {
		return -1, true, ws.Signal()
	}
	return ws.ExitStatus(), false, 0
}

// diskDeath says how a process died of a fault, from how it exited and its
// stderr, or returns "" if it did not: killed by a signal, or (what a Go
// program does on a SIGBUS or SIGSEGV outside a fault guard) "fatal error:
// fault" and exit status 2, which WaitStatus.Signaled does not report. The
// description holds the signal line and the functions of the goroutine
// that faulted.
func diskDeath(err error, stderr string) string {
	if _, signaled, sig := diskExitStatus(err); signaled {
		return fmt.Sprintf("killed by %v", sig)
	}
	i := strings.Index(stderr, "[signal SIG")
	if i < 0 {
		if strings.Contains(stderr, "fatal error: fault") {
			return "fatal error: fault"
		}
		return ""
	}
	trace := stderr[i:]
	lines := strings.Split(trace, "\n")
	out := []string{fmt.Sprintf("died of a fault (%v): %s", err, lines[0])}
	inFaulting := false
	for _, l := range lines[1:] {
		switch {
		case strings.HasPrefix(l, "goroutine ") && !inFaulting:
			inFaulting = true
		case inFaulting && strings.TrimSpace(l) == "":
			return strings.Join(out, "\n")
		case inFaulting && !strings.HasPrefix(l, "\t") && !strings.HasPrefix(l, "runtime."):
			out = append(out, "  "+l)
		}
	}
	return strings.Join(out, "\n")
}
