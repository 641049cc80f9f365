package netns

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// run runs a command and returns its combined output; its error holds the
// command line and the output.
func run(name string, args ...string) (string, error) {
	out, err := exec.Command(name, args...).CombinedOutput()
	if err != nil {
		return string(out), fmt.Errorf("%s %s: %w: %s", name, strings.Join(args, " "), err, bytes.TrimSpace(out))
	}
	return string(out), nil
}

// runAll runs commands in turn until one fails.
func runAll(cmds [][]string) error {
	for _, c := range cmds {
		if _, err := run(c[0], c[1:]...); err != nil {
			return err
		}
	}
	return nil
}

func linkExists(name string) bool {
	_, err := run("ip", "link", "show", "dev", name)
	return err == nil
}

func nsExists(name string) bool {
	_, err := os.Stat(filepath.Join(runDir, name))
	return err == nil
}

// deleteLink deletes a link (both ends of a veth pair) unless it is gone.
func deleteLink(name string) error {
	if _, err := run("ip", "link", "del", "dev", name); err != nil && linkExists(name) {
		return err
	}
	setLive(name, false)
	return nil
}

// deleteNS deletes a named namespace unless it is gone. A namespace lives
// on, nameless, as long as a process or socket is in it.
func deleteNS(name string) error {
	if _, err := run("ip", "netns", "del", name); err != nil && nsExists(name) {
		return err
	}
	setLive(name, false)
	return nil
}

// pidsIn returns the processes in namespace ns (ip netns pids).
func pidsIn(ns string) ([]int, error) {
	out, err := run("ip", "netns", "pids", ns)
	if err != nil {
		return nil, err
	}
	var pids []int
	for _, f := range strings.Fields(out) {
		if p, err := strconv.Atoi(f); err == nil {
			pids = append(pids, p)
		}
	}
	return pids, nil
}

// killAll SIGKILLs every process in a namespace, again and again, until
// none is left (a zombie has left its namespaces). This process is spared:
// its main thread is only ever there while Host.in runs on it.
func killAll(ns string) error {
	deadline := time.Now().Add(killTimeout)
	for {
		pids, err := pidsIn(ns)
		if err != nil {
			if !nsExists(ns) {
				return nil
			}
			return err
		}
		pids = slices.DeleteFunc(pids, func(p int) bool { return p == pid })
		if len(pids) == 0 {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("processes %v of namespace %s still there %v after SIGKILL", pids, ns, killTimeout)
		}
		for _, p := range pids {
			syscall.Kill(p, syscall.SIGKILL)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

var (
	nsPattern     = regexp.MustCompile(`^tw-([0-9]+)-[0-9]+$`)
	linkPattern   = regexp.MustCompile(`^tw([0-9]+)h[0-9]+$`)
	bridgePattern = regexp.MustCompile(`^twb([0-9]+)n[0-9]+$`)
)

// stale reports whether an object named with the given match of one of
// the patterns was left by a process that is gone: its PID is dead, or is
// this process's own though this process did not make it (it is live).
func stale(m []string) bool {
	if m == nil {
		return false
	}
	p, err := strconv.Atoi(m[1])
	if err != nil || p <= 1 {
		return false
	}
	if p == pid {
		return !isLive(m[0])
	}
	return errors.Is(syscall.Kill(p, 0), syscall.ESRCH)
}

// sweep removes the namespaces, veths and bridges that dead processes
// left: it kills the processes in the namespaces, then deletes the veths,
// the namespaces and the bridges. It returns what it could not do; what
// vanished under it (another process sweeping too) is no error. It returns
// the names of what it found.
func sweep() (found []string, errs []error) {
	unlock := lockSweeps()
	defer unlock()
	var nss, veths, bridges []string
	out, err := run("ip", "netns", "list")
	if err != nil {
		return nil, []error{err}
	}
	for line := range strings.Lines(out) {
		if f := strings.Fields(line); len(f) > 0 && stale(nsPattern.FindStringSubmatch(f[0])) {
			nss = append(nss, f[0])
		}
	}
	out, err = run("ip", "-o", "link", "show")
	if err != nil {
		return nil, []error{err}
	}
	for line := range strings.Lines(out) {
		f := strings.Fields(line)
		if len(f) < 2 {
			continue
		}
		name, _, _ := strings.Cut(strings.TrimSuffix(f[1], ":"), "@")
		if stale(linkPattern.FindStringSubmatch(name)) {
			veths = append(veths, name)
		} else if stale(bridgePattern.FindStringSubmatch(name)) {
			bridges = append(bridges, name)
		}
	}
	for _, ns := range nss {
		if err := killAll(ns); err != nil {
			errs = append(errs, err)
		}
	}
	for _, name := range veths {
		if err := deleteLink(name); err != nil {
			errs = append(errs, err)
		}
	}
	for _, ns := range nss {
		if err := deleteNS(ns); err != nil {
			errs = append(errs, err)
		}
	}
	for _, name := range bridges {
		if err := deleteLink(name); err != nil {
			errs = append(errs, err)
		}
	}
	return append(append(nss, veths...), bridges...), errs
}

// lockSweeps takes the machine-wide lock that sweeps hold, so that what a
// sweep is about to remove is never half made by a test that stages a
// leftover (TestSweep) in another process; it returns the unlock. Without
// the lock file (no temporary folder), sweeps are not serialized.
func lockSweeps() (unlock func()) {
	f, err := os.OpenFile(filepath.Join(os.TempDir(), "tensorwire-netns-sweep.lock"), os.O_CREATE|os.O_RDWR, 0o600)
	if err != nil {
		return func() {}
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX); err != nil {
		f.Close()
		return func() {}
	}
	return func() { f.Close() } // closing the file drops the lock
}
