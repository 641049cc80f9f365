package netns

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"github.com/tensorwire/tensorwire/internal/testkit/proctest"
	"io"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// helperEnv tells the test binary, run again, which helper to be:
//
//	echo ADDR          listen on ADDR, print "listening PID", and answer
//	                   each line received with the line and the peer's IP
//	dial ADDR TIMEOUT  send "ping" to ADDR, print "reply REPLY" and exit 0,
//	                   or print the error and exit 1
//	spawn              start a block helper, print "child PID", block
//	block              block
const helperEnv = "NETNS_TEST_HELPER"

// patience bounds every wait for something that must happen (a helper's
// line, its death, a round trip): generous, so that the tests pass with
// the machine's other cores busy. Waits for what must not happen (a dial
// across a partition) stay short.
const patience = 30 * time.Second

// helperEnviron returns the environment of a helper that is to be what
// spec says. A binary built with -race sleeps a second on exit unless
// GORACE says otherwise.
func helperEnviron(spec string) []string {
	return append(os.Environ(), helperEnv+"="+spec, "GORACE="+os.Getenv("GORACE")+" atexit_sleep_ms=0")
}

func TestHelperProcess(t *testing.T) {
	args := strings.Fields(os.Getenv(helperEnv))
	if len(args) == 0 {
		t.Skip("not a helper process")
	}
	fail := func(err error) {
		fmt.Println("error", err)
		os.Exit(1)
	}
	switch args[0] {
	case "echo":
		l, err := net.Listen("tcp", args[1])
		if err != nil {
			fail(err)
		}
		fmt.Println("listening", os.Getpid())
		for {
			c, err := l.Accept()
			if err != nil {
				fail(err)
			}
			go echo(c)
		}
	case "dial":
		timeout, err := time.ParseDuration(args[2])
		if err != nil {
			fail(err)
		}
		c, err := net.DialTimeout("tcp", args[1], timeout)
		if err != nil {
			fail(err)
		}
		c.SetDeadline(time.Now().Add(timeout))
		if _, err := io.WriteString(c, "ping\n"); err != nil {
			fail(err)
		}
		reply, err := bufio.NewReader(c).ReadString('\n')
		if err != nil {
			fail(err)
		}
		fmt.Print("reply ", reply)
		os.Exit(0)
	case "spawn":
		child := exec.Command(os.Args[0], "-test.run=^TestHelperProcess$")
		child.Env = helperEnviron("block")
		if err := child.Start(); err != nil {
			fail(err)
		}
		fmt.Println("child", child.Process.Pid)
		time.Sleep(time.Hour)
	case "block":
		time.Sleep(time.Hour)
	}
	fail(fmt.Errorf("bad %s %q", helperEnv, args))
}

// echo answers each line received on c with the line and c's remote IP.
func echo(c net.Conn) {
	defer c.Close()
	peer := c.RemoteAddr().(*net.TCPAddr).AddrPort().Addr().Unmap()
	r := bufio.NewReader(c)
	for {
		line, err := r.ReadString('\n')
		if err != nil {
			return
		}
		fmt.Fprintf(c, "%s %s\n", strings.TrimSpace(line), peer)
	}
}

// helper is a running helper process.
type helper struct {
	cmd    *exec.Cmd
	lines  chan string   // its standard output, line by line
	done   chan struct{} // closed once it has been waited for
	stderr proctest.LockedBuffer
}

// start runs cmd as the helper spec says (see helperEnv). Unless keep, it
// is killed when the test ends; either way its stderr is logged if the
// test failed.
func start(t *testing.T, cmd *exec.Cmd, spec string, keep bool) *helper {
	t.Helper()
	cmd.Env = helperEnviron(spec)
	p := &helper{cmd: cmd, lines: make(chan string, 16), done: make(chan struct{})}
	cmd.Stderr = &p.stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() {
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			p.lines <- sc.Text()
		}
		close(p.lines)
		cmd.Wait()
		close(p.done)
	}()
	t.Cleanup(func() {
		if !keep {
			cmd.Process.Kill()
			<-p.done
		}
		if t.Failed() {
			t.Logf("helper %q stderr:\n%s", spec, p.stderr.String())
		}
	})
	return p
}

// expect returns the rest of the helper's next line, which must start with
// prefix.
func (p *helper) expect(t *testing.T, prefix string) string {
	t.Helper()
	select {
	case line, ok := <-p.lines:
		if !ok {
			t.Fatalf("helper exited before printing %q: %s", prefix, p.stderr.String())
		}
		rest, found := strings.CutPrefix(line, prefix+" ")
		if !found {
			t.Fatalf("helper printed %q, want %q...", line, prefix)
		}
		return rest
	case <-time.After(patience):
		t.Fatalf("helper printed no %q in %v", prefix, patience)
	}
	return ""
}

// killed fails the test unless the helper is gone, killed by SIGKILL. It
// waits up to patience for the kill to be seen: a loaded machine may take
// more than a second to reap a process.
// waitInNS waits until process want is in namespace ns.
func waitInNS(t *testing.T, ns string, want int) {
	t.Helper()
	deadline := time.Now().Add(patience)
	for {
		pids, err := pidsIn(ns)
		if err != nil {
			t.Fatal(err)
		}
		if slices.Contains(pids, want) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("pid %d not in namespace %s after %v (its processes: %v)", want, ns, patience, pids)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func (p *helper) killed(t *testing.T, what string) {
	t.Helper()
	select {
	case <-p.done:
	case <-time.After(patience):
		t.Errorf("%s (pid %d) still running %v after its namespace was cleaned up", what, p.cmd.Process.Pid, patience)
		p.cmd.Process.Kill()
		return
	}
	if ws, ok := p.cmd.ProcessState.Sys().(syscall.WaitStatus); !ok || ws.Signal() != syscall.SIGKILL {
		t.Errorf("%s ended with %v, want killed by SIGKILL", what, p.cmd.ProcessState)
	}
}

// startEcho starts an echo helper listening on port of h's address.
func startEcho(t *testing.T, h *Host, port uint16, keep bool) (*helper, string) {
	t.Helper()
	addr := netip.AddrPortFrom(h.Addr(), port).String()
	p := start(t, h.Command(os.Args[0], "-test.run=^TestHelperProcess$"), "echo "+addr, keep)
	if got, want := p.expect(t, "listening"), strconv.Itoa(p.cmd.Process.Pid); got != want {
		t.Fatalf("echo helper in %s says its pid is %s, but Process.Pid is %s", h, got, want)
	}
	return p, addr
}

// dialFrom has a helper in h send "ping" to addr and returns its reply.
func dialFrom(h *Host, addr string, timeout time.Duration) (string, error) {
	cmd := h.Command(os.Args[0], "-test.run=^TestHelperProcess$")
	cmd.Env = helperEnviron(fmt.Sprintf("dial %s %v", addr, timeout))
	out, err := cmd.Output()
	if err != nil {
		return "", fmt.Errorf("dial from %s to %s: %w: %s", h, addr, err, bytes.TrimSpace(out))
	}
	reply, ok := strings.CutPrefix(strings.TrimSpace(string(out)), "reply ")
	if !ok {
		return "", fmt.Errorf("dial from %s to %s: helper printed %q", h, addr, out)
	}
	return reply, nil
}

// roundTrip sends line on c and returns the reply, waiting at most timeout.
func roundTrip(c net.Conn, r *bufio.Reader, line string, timeout time.Duration) (string, error) {
	c.SetDeadline(time.Now().Add(timeout))
	if _, err := io.WriteString(c, line+"\n"); err != nil {
		return "", err
	}
	reply, err := r.ReadString('\n')
	return strings.TrimSpace(reply), err
}

// dialEcho dials an echo server from the test process and checks a round
// trip, whose reply must show the server saw the connection come from.
func dialEcho(t *testing.T, dial func() (net.Conn, error), from netip.Addr) (net.Conn, *bufio.Reader) {
	t.Helper()
	c, err := dial()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	r := bufio.NewReader(c)
	reply, err := roundTrip(c, r, "hello", patience)
	if want := "hello " + from.String(); err != nil || reply != want {
		t.Fatalf("echo over %v replied %q, %v; want %q", c.LocalAddr(), reply, err, want)
	}
	return c, r
}

func newHosts(t *testing.T, names ...string) (*Net, []*Host) {
	t.Helper()
	n := New(t)
	var hosts []*Host
	for _, name := range names {
		h, err := n.Host(name)
		if err != nil {
			t.Fatal(err)
		}
		hosts = append(hosts, h)
	}
	return n, hosts
}

func TestHostsTalk(t *testing.T) {
	t.Parallel()
	n, hosts := newHosts(t, "a", "b")
	a, b := hosts[0], hosts[1]
	gw := n.Gateway()
	if !n.Subnet().Contains(gw) || !n.Subnet().Contains(a.Addr()) || !n.Subnet().Contains(b.Addr()) ||
		a.Addr() == b.Addr() || a.Addr() == gw || b.Addr() == gw || a.Namespace() == b.Namespace() {
		t.Fatalf("subnet %s, gateway %s, hosts %s in %s and %s in %s: want distinct addresses in the subnet and distinct namespaces",
			n.Subnet(), gw, a, a.Namespace(), b, b.Namespace())
	}
	if a.Name() != "a" {
		t.Errorf("Name() = %q, want a", a.Name())
	}
	if out, err := a.Run("ip", "-4", "-o", "addr", "show", "dev", "eth0"); err != nil || !strings.Contains(out, " "+a.Addr().String()+"/24 ") {
		t.Errorf("eth0 in %s: %q, %v; want address %s", a, out, err, a.Addr())
	}

	_, addr := startEcho(t, a, 7000, false)
	// B's connection comes from B's own address, over the bridge.
	if reply, err := dialFrom(b, addr, patience); err != nil || reply != "ping "+b.Addr().String() {
		t.Errorf("from b: %q, %v; want ping %s", reply, err, b.Addr())
	}
	// The test process's comes from the gateway.
	dialEcho(t, func() (net.Conn, error) { return net.DialTimeout("tcp", addr, patience) }, gw)
	// A host reaches the gateway, too.
	l, err := net.Listen("tcp", netip.AddrPortFrom(gw, 0).String())
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	go serveEcho(l)
	if reply, err := dialFrom(b, l.Addr().String(), patience); err != nil || reply != "ping "+b.Addr().String() {
		t.Errorf("from b to the gateway: %q, %v; want ping %s", reply, err, b.Addr())
	}
}

func TestDisconnect(t *testing.T) {
	t.Parallel()
	n, hosts := newHosts(t, "a", "b")
	a, b := hosts[0], hosts[1]
	_, addr := startEcho(t, a, 7000, false)
	if _, err := dialFrom(b, addr, patience); err != nil {
		t.Fatal(err)
	}
	held, r := dialEcho(t, func() (net.Conn, error) { return net.DialTimeout("tcp", addr, patience) }, n.Gateway())
	// b, not disconnected, serves the test process.
	_, addrB := startEcho(t, b, 7000, false)

	if err := a.Reconnect(); err != nil {
		t.Errorf("Reconnect of a connected host: %v", err)
	}
	if err := a.Disconnect(); err != nil {
		t.Fatal(err)
	}
	if err := a.Disconnect(); err != nil {
		t.Errorf("second Disconnect: %v", err)
	}
	fromB := make(chan error, 1)
	go func() {
		reply, err := dialFrom(b, addr, 500*time.Millisecond)
		if err == nil {
			err = fmt.Errorf("from b to disconnected a: %q, want an error", reply)
		} else {
			err = nil
		}
		fromB <- err
	}()
	if out, err := a.Run("ip", "-o", "link", "show", "dev", "eth0"); err != nil || !strings.Contains(out, ",LOWER_UP>") || !strings.Contains(out, " state UP ") {
		t.Errorf("disconnected host's eth0: %q, %v; want it up with its carrier", out, err)
	}
	if c, err := net.DialTimeout("tcp", addr, 300*time.Millisecond); err == nil {
		c.Close()
		t.Error("the test process dialled disconnected a")
	}
	if reply, err := roundTrip(held, r, "partitioned", 300*time.Millisecond); !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Errorf("echo across the partition: %q, %v; want a timeout", reply, err)
	}
	if c, err := net.DialTimeout("tcp", addrB, patience); err != nil {
		t.Errorf("b is cut off too: %v", err)
	} else {
		c.Close()
	}

	if err := <-fromB; err != nil {
		t.Error(err)
	}
	if err := a.Reconnect(); err != nil {
		t.Fatal(err)
	}
	// The connection survived: the line sent during the partition gets
	// through, and its echo back.
	held.SetDeadline(time.Now().Add(patience))
	if reply, err := r.ReadString('\n'); err != nil || strings.TrimSpace(reply) != "partitioned "+n.Gateway().String() {
		t.Errorf("after Reconnect, the held connection got %q, %v", reply, err)
	}
	if _, err := dialFrom(b, addr, patience); err != nil {
		t.Errorf("after Reconnect: %v", err)
	}
}

// names lists the namespaces and links of the machine.
func names(t *testing.T) string {
	t.Helper()
	nss, err := run("ip", "netns", "list")
	if err != nil {
		t.Fatal(err)
	}
	links, err := run("ip", "-o", "link", "show")
	if err != nil {
		t.Fatal(err)
	}
	var all []string
	for line := range strings.Lines(nss) {
		if f := strings.Fields(line); len(f) > 0 {
			all = append(all, f[0])
		}
	}
	for line := range strings.Lines(links) {
		if f := strings.Fields(line); len(f) > 1 {
			name, _, _ := strings.Cut(strings.TrimSuffix(f[1], ":"), "@")
			all = append(all, name)
		}
	}
	return " " + strings.Join(all, " ") + " "
}

// running reports whether process pid runs (is neither gone nor a zombie).
func running(pid int) bool {
	stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return false
	}
	_, rest, _ := strings.Cut(string(stat), ") ")
	return !strings.HasPrefix(rest, "Z") && !strings.HasPrefix(rest, "X")
}

func TestCleanup(t *testing.T) {
	var (
		made       []string
		echoes     []*helper
		grandchild int
	)
	t.Run("net", func(t *testing.T) {
		n, hosts := newHosts(t, "a", "b", "c")
		made = append(made, n.bridge)
		for _, h := range hosts {
			made = append(made, h.ns, h.veth)
		}
		for _, h := range hosts[:2] {
			p, _ := startEcho(t, h, 7000, true)
			echoes = append(echoes, p)
		}
		// c's helper starts one of its own, which outlives it, orphaned.
		spawner := start(t, hosts[2].Command(os.Args[0], "-test.run=^TestHelperProcess$"), "spawn", true)
		echoes = append(echoes, spawner)
		grandchild, _ = strconv.Atoi(spawner.expect(t, "child"))
		if !running(grandchild) {
			t.Fatalf("grandchild %d not running", grandchild)
		}
		if err := hosts[1].Disconnect(); err != nil {
			t.Fatal(err)
		}
		got := names(t)
		for _, name := range made {
			if !strings.Contains(got, " "+name+" ") {
				t.Errorf("%s missing before the cleanup", name)
			}
		}
	})
	got := names(t)
	for _, name := range made {
		if strings.Contains(got, " "+name+" ") {
			t.Errorf("%s left after the cleanup", name)
		}
		if isLive(name) {
			t.Errorf("%s still counted as live", name)
		}
	}
	for i, p := range echoes {
		p.killed(t, fmt.Sprintf("helper %d", i))
	}
	if running(grandchild) {
		t.Errorf("grandchild %d still running after the cleanup", grandchild)
		syscall.Kill(grandchild, syscall.SIGKILL)
	}
}

func TestSweep(t *testing.T) {
	if err := Available(); err != nil {
		t.Skipf("network namespaces unavailable: %v", err)
	}
	gone := exec.Command("true")
	if err := gone.Run(); err != nil {
		t.Fatal(err)
	}
	dead := gone.Process.Pid
	if !errors.Is(syscall.Kill(dead, 0), syscall.ESRCH) {
		t.Skipf("pid %d reused already", dead)
	}
	alive := start(t, exec.Command(os.Args[0], "-test.run=^TestHelperProcess$"), "block", false).cmd.Process.Pid

	// A leftover of each: a dead process, a live one, and an earlier
	// process that had this one's pid (9999 is a counter this test never
	// reaches).
	type leftover struct{ ns, veth, bridge string }
	mk := func(pid, k int) leftover {
		l := leftover{fmt.Sprintf("tw-%d-%d", pid, k), fmt.Sprintf("tw%dh%d", pid, k), fmt.Sprintf("twb%dn%d", pid, k)}
		t.Cleanup(func() {
			killAll(l.ns)
			deleteLink(l.veth)
			deleteNS(l.ns)
			deleteLink(l.bridge)
		})
		err := runAll([][]string{
			{"ip", "netns", "add", l.ns},
			{"ip", "link", "add", l.bridge, "type", "bridge"},
			{"ip", "link", "add", l.veth, "type", "veth", "peer", "name", "eth0", "netns", l.ns},
			{"ip", "link", "set", l.veth, "master", l.bridge, "up"},
		})
		if err != nil {
			t.Fatal(err)
		}
		return l
	}
	// Hold off other processes' sweeps (faulttest's, running beside this
	// package in go test ./...) while the leftovers are staged: one would
	// remove ofDead before the orphan is in it.
	unlock := lockSweeps()
	ofDead, ofAlive, ofSelf := mk(dead, 1), mk(alive, 1), mk(pid, 9999)
	orphan := start(t, exec.Command("ip", "netns", "exec", ofDead.ns, os.Args[0], "-test.run=^TestHelperProcess$"), "block", true)
	// Only once the orphan is in the namespace (ip netns exec has entered
	// it and exec'd the helper) is it a leftover's process: a sweep that
	// lists the namespace's processes before then finds none, and the
	// orphan entering just after survives it (seen under load in CI).
	waitInNS(t, ofDead.ns, orphan.cmd.Process.Pid)
	unlock()

	n := New(t)
	got := names(t)
	for _, l := range []leftover{ofDead, ofSelf} {
		for _, name := range []string{l.ns, l.veth, l.bridge} {
			if strings.Contains(got, " "+name+" ") {
				t.Errorf("leftover %s not swept", name)
			}
		}
	}
	for _, name := range []string{ofAlive.ns, ofAlive.veth, ofAlive.bridge, n.bridge} {
		if !strings.Contains(got, " "+name+" ") {
			t.Errorf("%s, of a live process, swept", name)
		}
	}
	orphan.killed(t, "process in a leftover namespace")
}

func TestSkipsWhenNotRoot(t *testing.T) {
	if os.Geteuid() != 0 {
		if err := Available(); err == nil || !strings.Contains(err.Error(), "root") {
			t.Errorf("Available() = %v as euid %d, want an error about root", err, os.Geteuid())
		}
		return
	}
	// Run this test binary again as nobody, from where nobody can read it.
	dir, err := os.MkdirTemp("", "netns")
	if err != nil {
		t.Fatal(err)
	}
	defer os.RemoveAll(dir)
	bin, err := os.ReadFile(os.Args[0])
	if err != nil {
		t.Fatal(err)
	}
	exe := filepath.Join(dir, "netns.test")
	if err := os.WriteFile(exe, bin, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(exe, "-test.run=^TestHostsTalk$", "-test.v")
	cmd.Dir = dir
	cmd.Env = helperEnviron("")
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: 65534, Gid: 65534}}
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("%v: %s", err, out)
	}
	for _, want := range []string{"network namespaces unavailable: not running as root", "--- SKIP: TestHostsTalk"} {
		if !bytes.Contains(out, []byte(want)) {
			t.Errorf("as nobody, the output lacks %q:\n%s", want, out)
		}
	}
}

// serveEcho echoes on every connection l accepts, until l is closed.
func serveEcho(l net.Listener) {
	for {
		c, err := l.Accept()
		if err != nil {
			return
		}
		go echo(c)
	}
}
