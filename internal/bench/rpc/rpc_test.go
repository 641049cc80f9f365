package rpc

import (
	"bytes"
	"context"
	"errors"
	"maps"
	"net"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/tensorwire/tensorwire/internal/bench"
	"github.com/tensorwire/tensorwire/internal/bench/benchtest"
)

// TestMain lets startChild re-execute the test binary as a server:
// bench.Env.Self is empty in these tests, so a server's arguments start
// with --serve.
func TestMain(m *testing.M) { benchtest.MainFlag(m, Run, "--serve") }

// jsonKeys are the keys of the --json file, as the benchmark wrote them
// (go run ./benchmarks/rpc --json, 2026-11-24), for a system: one object
// per system that ran. docs/benchmarks.md and scripts read them: they keep
// their names.
var jsonKeys = []string{
	"bulk_request", "bulk_request.MB_per_s", "bulk_request.p50_ms", "small", "small.calls_per_s", "small.p50_us",
	"small.p99_us", "stream", "stream.GB_per_s",
}

// TestRun_JSONKeys runs the benchmark, briefly, with every system's server
// a child process, and checks its table and that its JSON has exactly the
// keys it always had.
func TestRun_JSONKeys(t *testing.T) {
	jsonFile := filepath.Join(t.TempDir(), "rpc.json")
	out := benchtest.RunJSON(t, Run, nil, []string{"--duration", "200ms", "--bulk-iters", "2",
		"--stream-bytes", strconv.Itoa(8 << 20), "--json", jsonFile}, jsonFile)
	for _, s := range []string{"small calls/s", "bulk vs tcp", "stream vs tcp", "tensorwire", "grpc"} {
		if !strings.Contains(out.Stdout, s) {
			t.Errorf("the table lacks %q:\n%s", s, out.Stdout)
		}
	}
	if systems := slices.Sorted(maps.Keys(out.JSON)); !slices.Equal(systems, []string{"grpc", "tcp", "tensorwire"}) {
		t.Errorf("systems %q in %s", systems, out.Data)
	}
	for sys, v := range out.JSON {
		obj, _ := v.(map[string]any)
		if keys := benchtest.KeyPaths(obj); !slices.Equal(keys, jsonKeys) {
			t.Errorf("%s: JSON keys\n%q\nwant\n%q", sys, keys, jsonKeys)
		}
		if small, _ := obj["small"].(map[string]any); small == nil || small["calls_per_s"].(float64) <= 0 {
			t.Errorf("%s: %v", sys, obj)
		}
	}
}

func TestRun_Usage(t *testing.T) {
	for _, args := range [][]string{{"--systems", "tcp,pigeon"}, {"--systems", "tcp,tcp"}, {"--duration", "0s"},
		{"--bulk-iters", "0"}, {"--stream-bytes", "0"}, {"--rounds", "0"}, {"--nope"}, {"extra"}} {
		var out bytes.Buffer
		if err := Run(context.Background(), bench.Env{Stdout: &out, Stderr: &out}, args); !errors.Is(err, bench.ErrUsage) {
			t.Errorf("%q: %v, want a usage error", args, err)
		}
	}
	var out bytes.Buffer
	if err := Run(context.Background(), bench.Env{Stdout: &out, Stderr: &out}, []string{"-h"}); !strings.Contains(out.String(), "--systems") ||
		strings.Contains(out.String(), "--serve") {
		t.Errorf("-h: %v\n%s", err, out.String())
	}
}

// serveInProcess serves sys on a loopback listener in a goroutine until the
// test ends, and returns its address.
func serveInProcess(t *testing.T, sys system) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- sys.serve(ctx, ln) }()
	t.Cleanup(func() {
		cancel()
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("serve: %v", err)
			}
		case <-time.After(30 * time.Second):
			t.Error("serve did not return 30 s after its context was cancelled")
		}
	})
	return ln.Addr().String()
}

func dialInProcess(t *testing.T, name string) client {
	t.Helper()
	sys := registry[name]
	addr := serveInProcess(t, sys)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c, err := sys.dial(ctx, addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// TestSystems runs every registered system through every workload, small.
func TestSystems(t *testing.T) {
	for _, name := range registered() {
		t.Run(name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			c := dialInProcess(t, name)

			small, err := runSmall(ctx, c, smallCallers, 100*time.Millisecond)
			if err != nil {
				t.Fatalf("small: %v", err)
			}
			if small.calls == 0 || small.lat.Count() != int64(small.calls) || small.callsPerS() <= 0 {
				t.Errorf("small: %d calls, %d latencies, %.0f calls/s", small.calls, small.lat.Count(), small.callsPerS())
			}
			if small.elapsed < 100*time.Millisecond {
				t.Errorf("small ran for %v, less than asked", small.elapsed)
			}

			payload := newBulkPayload(bulkBytes)
			times, err := runBulk(ctx, []target{{name, c}}, payload, 1, 2)
			if err != nil {
				t.Fatalf("bulk: %v", err)
			}
			if len(times) != 1 || times[0].Count() != 2 || times[0].Quantile(0) <= 0 {
				t.Errorf("bulk times %+v, want 2 positive", times)
			}

			for _, total := range []int64{8 << 20, 3<<20 + 12345, 100} {
				if d, err := runStream(ctx, c, total, streamMsgSize, true); err != nil || d <= 0 {
					t.Errorf("stream of %d bytes: %v, %v", total, d, err)
				}
			}

			// The server verifies bulk payloads: wrong lengths and
			// corrupted bytes fail, and the next good call succeeds.
			corrupt := newBulkPayload(bulkBytes)
			corrupt[3*sampleStride]++
			for what, p := range map[string][]byte{
				"one byte short":  payload[:bulkBytes-1],
				"one byte long":   append(newBulkPayload(bulkBytes), 0),
				"half":            payload[:bulkBytes/2],
				"corrupted bytes": corrupt,
			} {
				err := c.bulk(ctx, p)
				if err == nil {
					t.Errorf("bulk of a payload %s: no error", what)
				} else if !strings.Contains(err.Error(), errVerify.Error()) {
					t.Errorf("bulk of a payload %s: %v, want a verification error from the server", what, err)
				}
			}
			setBulkID(payload, 999)
			if err := c.bulk(ctx, payload); err != nil {
				t.Errorf("bulk after failed ones: %v", err)
			}
		})
	}
}

func TestCheckBulk(t *testing.T) {
	p := newBulkPayload(bulkBytes)
	setBulkID(p, 42)
	if id, err := checkBulk(p); err != nil || id != 42 {
		t.Fatalf("checkBulk = %d, %v; want 42, nil", id, err)
	}
	if err := checkBulkAck(p, 42); err != nil {
		t.Error(err)
	}
	if err := checkBulkAck(p, 41); !errors.Is(err, errVerify) {
		t.Errorf("checkBulkAck of a wrong id: %v", err)
	}
	for _, n := range []int{0, 8, bulkBytes - 1} {
		if _, err := checkBulk(p[:n]); !errors.Is(err, errVerify) {
			t.Errorf("checkBulk of %d bytes: %v", n, err)
		}
	}
	for _, i := range []int{sampleStride, 1000 * sampleStride, bulkBytes - 1} {
		q := newBulkPayload(bulkBytes)
		q[i] ^= 0xff
		if _, err := checkBulk(q); !errors.Is(err, errVerify) {
			t.Errorf("checkBulk with byte %d changed: %v", i, err)
		}
	}
}

func TestStreamCheck(t *testing.T) {
	ring := streamRing(4 * sampleStride)
	var s streamCheck
	for k := range 6 {
		if err := s.add(ring[k%streamRingLen]); err != nil {
			t.Fatal(err)
		}
	}
	if err := s.add(ring[6%streamRingLen][:5]); err != nil { // short: the last
		t.Fatal(err)
	}
	if s.total() != 6*4*sampleStride+5 {
		t.Errorf("total %d", s.total())
	}
	if err := s.add(ring[7%streamRingLen]); !errors.Is(err, errVerify) {
		t.Errorf("a message after a short one: %v", err)
	}

	for what, msgs := range map[string][][]byte{
		"out of order": {ring[0], ring[2]},
		"longer":       {ring[0][:10], ring[1]},
		"empty":        {ring[0], ring[1][:0]},
		"corrupted":    {append([]byte{9}, ring[0][1:]...)},
	} {
		var s streamCheck
		var err error
		for _, m := range msgs {
			if err = s.add(m); err != nil {
				break
			}
		}
		if !errors.Is(err, errVerify) {
			t.Errorf("%s: %v", what, err)
		}
	}
	if err := checkStreamAck(10, 9); !errors.Is(err, errVerify) {
		t.Errorf("checkStreamAck(10, 9) = %v", err)
	}
}

func TestSmallReply(t *testing.T) {
	req := []byte("0123456789abcdef")
	if err := checkSmallReply(req, smallReply(req)); err != nil {
		t.Error(err)
	}
	if err := checkSmallReply(req, req); !errors.Is(err, errVerify) {
		t.Errorf("an echo passed: %v", err)
	}
	if err := checkSmallReply(req, smallReply(req)[:15]); !errors.Is(err, errVerify) {
		t.Errorf("a short response passed: %v", err)
	}
}

// TestChild runs a server the way the benchmark does: in a child process,
// which Stop stops (SIGTERM, then a clean exit) and waits for.
func TestChild(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	ch, err := startChild(ctx, config{}, "tcp")
	if err != nil {
		t.Fatal(err)
	}
	c, err := registry["tcp"].dial(ctx, ch.Addr)
	if err != nil {
		ch.Stop()
		t.Fatal(err)
	}
	req := []byte("abcdefghijklmnop")
	resp, err := c.small(ctx, req)
	if err == nil {
		err = checkSmallReply(req, resp)
	}
	if err != nil {
		t.Error(err)
	}
	c.Close()
	if err := ch.Stop(); err != nil {
		t.Errorf("stop: %v", err)
	}
	if err := syscall.Kill(ch.Pid(), 0); !errors.Is(err, syscall.ESRCH) {
		t.Errorf("the child is still running after stop: kill -0: %v", err)
	}
	if _, err := startChild(ctx, config{}, "no-such-system"); err == nil {
		t.Error("a child for an unknown system started")
	}
}
