package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"math"
	"net"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hashicorp/go-msgpack/v2/codec"
	"github.com/tensorwire/tensorwire/collective"
	"github.com/tensorwire/tensorwire/internal/testkit/svctest"
	"github.com/tensorwire/tensorwire/rpc"
)

// goldenFrames reads testdata/collective_pipe.hex: "# NAME: ..." lines,
// each followed by its frame's hex.
func goldenFrames(t *testing.T) map[string][]byte {
	t.Helper()
	text, err := os.ReadFile("testdata/collective_pipe.hex")
	if err != nil {
		t.Fatal(err)
	}
	out := map[string][]byte{}
	name := ""
	for _, line := range strings.Split(string(text), "\n") {
		line = strings.TrimSpace(line)
		switch {
		case strings.HasPrefix(line, "# ") && strings.Contains(line, ":") && !strings.Contains(line[2:strings.Index(line, ":")], " "):
			name = line[2:strings.Index(line, ":")]
		case line == "" || strings.HasPrefix(line, "#"):
		default:
			b, err := hex.DecodeString(line)
			if err != nil {
				t.Fatal(err)
			}
			out[name] = b
		}
	}
	return out
}

func TestCollectivePipe_Golden(t *testing.T) {
	zero, outAt := 0, int64(0)
	golden := goldenFrames(t)
	for _, tc := range []struct {
		name string
		v    any
	}{
		{"req-allreduce", pyReq{ID: 7, Op: "allreduce", Red: 1, Has: true, DType: "float32", Shape: []int{2, 3}, Size: 1 << 20}},
		{"req-scatter", pyReq{ID: 8, Op: "scatter", Has: true, DType: "float64", Shape: []int{6, 2}, Numelem: &zero, Root: 1, Size: 1 << 20, Timeout: 30000}},
		{"req-allreduce-at", pyReq{At: 4096, ID: 10, Op: "allreduce", Red: 1, Has: true, DType: "float32", Shape: []int{2, 3}, Size: 1 << 20}},
		{"req-allgather-room", pyReq{At: 4096, Room: 8192, ID: 11, Op: "allgather", Has: true, DType: "float32", Shape: []int{2, 3}, Size: 1 << 20}},
		{"req-allreduce-out-at", pyReq{At: 4096, ID: 12, Op: "allreduce", OutAt: &outAt, Red: 1, Has: true, DType: "float32", Shape: []int{2, 3}, Size: 1 << 20}},
		{"req-irecv-keep", pyReq{At: 8192, ID: 13, Keep: true, Op: "irecv", Peer: 1, Has: true, DType: "float32", Shape: []int{2, 3}, Size: 1 << 20}},
		{"req-isend-quiet", pyReq{At: 8192, ID: 14, Keep: true, Op: "isend", Peer: 1, Quiet: true, Has: true, DType: "float32", Shape: []int{2, 3}, Size: 1 << 20}},
		{"req-wait", pyReq{ID: 9, Op: "wait", Req: 8, Size: 1 << 20}},
		{"resp-out", pyResp{ID: 7, Out: true, DType: "float32", Shape: []int{2, 3}, Size: 1 << 20}},
		{"resp-out-at", pyResp{ID: 10, Off: 4096, Out: true, DType: "float32", Shape: []int{2, 3}, Size: 1 << 20}},
		{"resp-error", pyResp{ID: 8, Code: 3, Reason: "collective.mismatch", Msg: "collective: ranks disagree: Allreduce: shape [4] on rank 1, [3] on rank 0"}},
		{"resp-hello", pyResp{Rank: 2, World: 4, Transport: "shm", Pipe: pipeVersion}},
	} {
		want, ok := golden[tc.name]
		if !ok {
			t.Fatalf("no %s in testdata/collective_pipe.hex", tc.name)
		}
		got, err := encodeFrame(tc.v)
		if err != nil || !bytes.Equal(got, want) {
			t.Errorf("%s:\n got %x, %v\nwant %x", tc.name, got, err, want)
		}
		body, err := readFrame(bytes.NewReader(want))
		if err != nil {
			t.Fatalf("%s: readFrame: %v", tc.name, err)
		}
		if req, ok := tc.v.(pyReq); ok {
			back, err := decodeReq(body)
			if err != nil || !reflect.DeepEqual(back, req) {
				t.Errorf("%s: decodeReq = %+v, %v; want %+v", tc.name, back, err, req)
			}
		}
	}
}

// TestCollectivePipe_ProtocolDoc: docs/protocol.md shows the golden bytes.
func TestCollectivePipe_ProtocolDoc(t *testing.T) {
	text, err := os.ReadFile("../../docs/protocol.md")
	if err != nil {
		t.Fatal(err)
	}
	_, rest, ok := strings.Cut(string(text), "<!-- begin collective pipe frames -->\n```\n")
	block, _, ok2 := strings.Cut(rest, "```\n<!-- end collective pipe frames -->")
	if !ok || !ok2 {
		t.Fatal("docs/protocol.md has no fenced block of collective pipe frames")
	}
	names, msgs := svctest.ParseGolden(t, block)
	golden := goldenFrames(t)
	if len(names) == 0 {
		t.Fatal("no frames in the block")
	}
	for _, n := range names {
		if !bytes.Equal(msgs[n], golden[n]) {
			t.Errorf("docs/protocol.md shows %s as\n%x\ntestdata holds\n%x", n, msgs[n], golden[n])
		}
	}
}

func TestCollectivePipe_BadFrames(t *testing.T) {
	for name, b := range map[string][]byte{
		"too long":       {0x10, 0, 0, 0},
		"short body":     {0, 0, 0, 5, 0x80},
		"not a map":      {0, 0, 0, 1, 0xc3},
		"trailing bytes": {0, 0, 0, 2, 0x80, 0x80},
		"wrong type":     append([]byte{0, 0, 0, 8, 0x81, 0xa5}, "shape\xc3"...),
	} {
		body, err := readFrame(bytes.NewReader(b))
		if err == nil {
			_, err = decodeReq(body)
		}
		if !errors.Is(err, errFrame) {
			t.Errorf("%s: %v, want errFrame", name, err)
		}
	}
}

// FuzzCollectiveFrame: no input makes the decoder panic, and what it
// accepts encodes back to a request it decodes the same.
func FuzzCollectiveFrame(f *testing.F) {
	for _, b := range map[string][]byte{
		"allreduce": mustHex("0000003d87a56474797065a7666c6f61743332a3686173c3a2696407a26f70a9616c6c726564756365a372656401a57368617065920203a473697a65d200100000"),
		"wait":      mustHex("0000001c84a2696409a26f70a477616974a372657108a473697a65d200100000"),
		"empty":     {0, 0, 0, 1, 0x80},
		"garbage":   {0, 0, 0, 3, 0xde, 0xff, 0xff},
	} {
		f.Add(b)
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		body, err := readFrame(bytes.NewReader(b))
		if err != nil {
			return
		}
		req, err := decodeReq(body)
		if err != nil {
			return
		}
		again, err := encodeFrame(req)
		if err != nil {
			t.Fatalf("encode %+v: %v", req, err)
		}
		body, err = readFrame(bytes.NewReader(again))
		if err != nil {
			t.Fatal(err)
		}
		back, err := decodeReq(body)
		if err != nil || !reflect.DeepEqual(back, req) {
			t.Fatalf("round trip: %+v, %v; want %+v", back, err, req)
		}
	})
}

func mustHex(s string) []byte {
	b, err := hex.DecodeString(s)
	if err != nil {
		panic(err)
	}
	return b
}

// pyRank is the Python side of a sidecar, written in Go for the test: it
// writes inputs into the data file and frames into the sidecar's stdin.
type pyRank struct {
	in   *io.PipeWriter
	out  *bufio.Reader
	f    *os.File
	done chan error
	sc   *sidecar
}

func startSidecar(t *testing.T, addr, shmDir string, rank, size int, tr collective.Transport) *pyRank {
	t.Helper()
	return startSidecarWith(t, addr, shmDir, rank, size, tr, &sidecar{})
}

// startSidecarWith serves sc (its options set) as rank of size.
func startSidecarWith(t *testing.T, addr, shmDir string, rank, size int, tr collective.Transport, sc *sidecar) *pyRank {
	t.Helper()
	path := filepath.Join(t.TempDir(), "data")
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	if err := f.Truncate(1 << 20); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Close() })
	inR, inW := io.Pipe()
	outR, outW := io.Pipe()
	p := &pyRank{in: inW, out: bufio.NewReader(outR), f: f, done: make(chan error, 1), sc: sc}
	cfg := collective.Config{Addr: addr, Rank: rank, Size: size, Transport: tr, ShmDir: shmDir, KeepAlive: 200 * time.Millisecond}
	go func() {
		p.done <- sc.serve(context.Background(), cfg, path, 20*time.Second, inR, outW)
		outW.Close()
	}()
	return p
}

func (p *pyRank) call(t *testing.T, req pyReq) map[string]any {
	t.Helper()
	p.send(t, req)
	return p.read(t)
}

// send writes req (its Size 1 MiB when not set) without reading a reply.
func (p *pyRank) send(t *testing.T, req pyReq) {
	t.Helper()
	if req.Size == 0 {
		req.Size = 1 << 20
	}
	b, err := encodeFrame(req)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := p.in.Write(b); err != nil {
		t.Fatal(err)
	}
}

func (p *pyRank) read(t *testing.T) map[string]any {
	t.Helper()
	body, err := readFrame(p.out)
	if err != nil {
		t.Fatalf("read a reply: %v", err)
	}
	var m map[string]any
	if err := decodeInto(body, &m); err != nil {
		t.Fatal(err)
	}
	return m
}

func decodeInto(b []byte, v any) error {
	return codec.NewDecoderBytes(b, pyHandle).Decode(v)
}

func freeAddr(t *testing.T) string {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().String()
}

func f64bytes(vals ...float64) []byte {
	b := make([]byte, 8*len(vals))
	for i, v := range vals {
		binary.LittleEndian.PutUint64(b[8*i:], math.Float64bits(v))
	}
	return b
}

// eachRank runs f for every rank at once, as the ranks' Python processes
// would call, and returns when all have.
// shmPair starts two sidecars (scs, when given, serve them) of one
// shared-mapping communicator and reads their hellos.
func shmPair(t *testing.T, scs ...*sidecar) []*pyRank {
	t.Helper()
	if scs == nil {
		scs = []*sidecar{{}, {}}
	}
	addr, shm := freeAddr(t), t.TempDir()
	ranks := []*pyRank{startSidecarWith(t, addr, shm, 0, 2, collective.SHM, scs[0]), startSidecarWith(t, addr, shm, 1, 2, collective.SHM, scs[1])}
	for _, p := range ranks {
		p.read(t) // the hello
	}
	return ranks
}

func eachRank(ranks []*pyRank, f func(r int, p *pyRank)) {
	var wg sync.WaitGroup
	for r, p := range ranks {
		wg.Add(1)
		go func() { defer wg.Done(); f(r, p) }()
	}
	wg.Wait()
}

func anyInt(v any) int64 {
	switch x := v.(type) {
	case int64:
		return x
	case uint64:
		return int64(x)
	}
	return -1
}

// Two sidecars, driven as Python drives them: an Allreduce in place, a
// mismatch reported on both with the same reason, the communicator going
// on, and each sidecar ending cleanly when its stdin closes.
func TestCollectiveSidecar_TwoRanks(t *testing.T) {
	for _, tr := range []collective.Transport{collective.SHM, collective.TCP} {
		t.Run(string(tr), func(t *testing.T) {
			addr := freeAddr(t)
			shm := t.TempDir()
			ranks := []*pyRank{startSidecar(t, addr, shm, 0, 2, tr), startSidecar(t, addr, shm, 1, 2, tr)}
			for r, p := range ranks {
				hello := p.read(t)
				if anyInt(hello["world"]) != 2 || anyInt(hello["rank"]) != int64(r) && r != 0 || hello["transport"] != string(tr) {
					t.Fatalf("rank %d hello %v", r, hello)
				}
			}
			parallel := func(f func(r int, p *pyRank)) { eachRank(ranks, f) }
			parallel(func(r int, p *pyRank) {
				p.f.WriteAt(f64bytes(float64(r+1), 10*float64(r+1), -1), 0)
				resp := p.call(t, pyReq{ID: 1, Op: "allreduce", Red: int(collective.Sum), Has: true, DType: "float64", Shape: []int{3}})
				if resp["code"] != nil || resp["out"] != true || resp["off"] != nil {
					t.Errorf("rank %d: %v", r, resp)
					return
				}
				got := make([]byte, 24)
				p.f.ReadAt(got, 0)
				if !bytes.Equal(got, f64bytes(3, 30, -2)) {
					t.Errorf("rank %d: allreduce gave %x", r, got)
				}
			})
			parallel(func(r int, p *pyRank) {
				resp := p.call(t, pyReq{ID: 2, Op: "allreduce", Red: 1, Has: true, DType: "float64", Shape: []int{2 + r}})
				if anyInt(resp["code"]) != 3 || resp["reason"] != "collective.mismatch" || anyInt(resp["id"]) != 2 {
					t.Errorf("rank %d: %v", r, resp)
				}
			})
			parallel(func(r int, p *pyRank) {
				p.f.WriteAt(f64bytes(float64(r), float64(r)), 0)
				resp := p.call(t, pyReq{ID: 3, Op: "allgather", Has: true, DType: "float64", Shape: []int{1, 2}})
				off := anyInt(resp["off"])
				got := make([]byte, 32)
				p.f.ReadAt(got, off)
				if !reflect.DeepEqual(resp["shape"], []any{int64(2), int64(2)}) || off != 64 || !bytes.Equal(got, f64bytes(0, 0, 1, 1)) {
					t.Errorf("rank %d: allgather %v %x", r, resp, got)
				}
			})
			for r, p := range ranks {
				p.in.Close()
				select {
				case err := <-p.done:
					if err != nil {
						t.Errorf("rank %d: serve: %v", r, err)
					}
				case <-time.After(20 * time.Second):
					t.Fatalf("rank %d: the sidecar did not end when its stdin closed", r)
				}
			}
		})
	}
}

// A sidecar whose parent goes away mid-communicator: the other rank's call
// fails (no hang) with a lost or aborted rank.
func TestCollectiveSidecar_ParentGone(t *testing.T) {
	addr := freeAddr(t)
	ranks := []*pyRank{startSidecar(t, addr, "", 0, 2, collective.TCP), startSidecar(t, addr, "", 1, 2, collective.TCP)}
	for _, p := range ranks {
		p.read(t)
	}
	ranks[1].in.Close()
	resp := ranks[0].call(t, pyReq{ID: 1, Op: "barrier", Timeout: 20000})
	if r := resp["reason"]; r != "collective.peer_lost" && r != "collective.aborted" && r != "collective.broken" {
		t.Fatalf("barrier after rank 1's parent left: %v", resp)
	}
}

func TestCollectiveCmd_Usage(t *testing.T) {
	var out, errb bytes.Buffer
	if code := run(context.Background(), []string{"collective"}, &out, &errb); code != 2 {
		t.Fatalf("collective without rank: exit %d, %s", code, errb.String())
	}
	if code := run(context.Background(), []string{"collective", "rank", "--addr", "127.0.0.1:1", "--rank", "0", "--size", "1"}, &out, &errb); code != 2 || !strings.Contains(errb.String(), "--data") {
		t.Fatalf("collective rank without --data: exit %d, %s", code, errb.String())
	}
	errb.Reset()
	if code := run(context.Background(), []string{"collective", "rank", "--addr", "127.0.0.1:1", "--rank", "0", "--size", "1", "--data", "x", "--spin", "2s"}, &out, &errb); code != 2 || !strings.Contains(errb.String(), "--spin") {
		t.Fatalf("collective rank --spin 2s: exit %d, %s", code, errb.String())
	}
	// Before 2026-12-02 a negative join timeout was a join error (exit 1).
	errb.Reset()
	if code := run(context.Background(), []string{"collective", "rank", "--addr", "127.0.0.1:1", "--rank", "0", "--size", "1", "--data", "x", "--join-timeout", "-1s"}, &out, &errb); code != 2 || !strings.Contains(errb.String(), "--join-timeout") {
		t.Fatalf("collective rank --join-timeout -1s: exit %d, %s", code, errb.String())
	}
}

// TestCollectiveSidecar_BadFrameFails: bytes on the pipe that are not a
// frame are answered with collective.sidecar and make serve fail, so that
// "tensorwire collective rank" exits 1, however the frame is malformed: a
// length over 1 MiB, a body cut short by the pipe's close, or a body that
// is not a request. It failed before serve returned the first two's
// cause: it returned nil, and the sidecar exited 0, as for a clean close.
func TestCollectiveSidecar_BadFrameFails(t *testing.T) {
	for name, bad := range map[string][]byte{
		"too long":   {0x10, 0, 0, 0},
		"short body": {0, 0, 0, 5, 0x80},
		"not a map":  {0, 0, 0, 1, 0xc3},
	} {
		t.Run(name, func(t *testing.T) {
			p := startSidecar(t, freeAddr(t), "", 0, 1, collective.TCP)
			p.read(t) // hello
			if _, err := p.in.Write(bad); err != nil {
				t.Fatal(err)
			}
			if name == "short body" {
				p.in.Close()
			}
			if resp := p.read(t); resp["reason"] != "collective.sidecar" {
				t.Fatalf("reply %v", resp)
			}
			select {
			case err := <-p.done:
				if !errors.Is(err, errFrame) {
					t.Fatalf("serve returned %v after a malformed frame; want errFrame (exit 1)", err)
				}
			case <-time.After(20 * time.Second):
				t.Fatal("the sidecar did not stop")
			}
		})
	}
}

// TestCollectiveSidecar_TimeoutPastDuration: a request's timeout past what
// a time.Duration holds in milliseconds (about 292 years; a Python rank's
// timeout=1e10 s, "forever", is 1e13 ms) is no bound, not a deadline
// already past. It failed before callTimeout: the product wrapped
// negative, each rank's barrier failed at once with deadline exceeded, and
// the communicator broke.
func TestCollectiveSidecar_TimeoutPastDuration(t *testing.T) {
	for ms, want := range map[int64]time.Duration{
		0: 0, -1: 0, 1500: 1500 * time.Millisecond, maxTimeoutMs: time.Duration(maxTimeoutMs) * time.Millisecond,
		maxTimeoutMs + 1: 0, 1e13: 0, math.MaxInt64: 0,
	} {
		if got := callTimeout(ms); got != want {
			t.Errorf("callTimeout(%d) = %v, want %v", ms, got, want)
		}
	}
	addr, shm := freeAddr(t), t.TempDir()
	ranks := []*pyRank{startSidecar(t, addr, shm, 0, 2, collective.TCP), startSidecar(t, addr, shm, 1, 2, collective.TCP)}
	for _, p := range ranks {
		p.read(t)
	}
	eachRank(ranks, func(r int, p *pyRank) {
		for id, ms := range []int64{maxTimeoutMs + 1, 1e13} {
			if resp := p.call(t, pyReq{ID: int64(id + 1), Op: "barrier", Timeout: ms}); resp["code"] != nil {
				t.Errorf("rank %d: barrier with timeout %d ms: %v", r, ms, resp)
			}
		}
	})
}

// Requests with an input elsewhere than offset 0 (pipe version 2's at): an
// Allreduce leaves its output there and nothing else of the file changes
// (where the parent keeps outputs that stay); an Allgather's output
// follows its input, or goes to the file's end when it does not fit in
// the request's room; an Irecv's Wait puts what arrived at the wait's at;
// an at or room the sidecar cannot use is an argument error and it goes on.
func TestCollectiveSidecar_At(t *testing.T) {
	addr := freeAddr(t)
	shm := t.TempDir()
	ranks := []*pyRank{startSidecar(t, addr, shm, 0, 2, collective.SHM), startSidecar(t, addr, shm, 1, 2, collective.SHM)}
	for _, p := range ranks {
		if hello := p.read(t); anyInt(hello["pipe"]) != pipeVersion {
			t.Fatalf("hello %v: want pipe %d", hello, pipeVersion)
		}
	}
	parallel := func(f func(r int, p *pyRank)) { eachRank(ranks, f) }
	kept := f64bytes(7, 7, 7) // an earlier output at offset 0 that must stay
	parallel(func(r int, p *pyRank) {
		p.f.WriteAt(kept, 0)
		p.f.WriteAt(f64bytes(float64(r+1), -1), 4096)
		resp := p.call(t, pyReq{ID: 1, At: 4096, Op: "allreduce", Red: int(collective.Sum), Has: true, DType: "float64", Shape: []int{2}})
		got := make([]byte, 16)
		p.f.ReadAt(got, 4096)
		if resp["code"] != nil || anyInt(resp["off"]) != 4096 || !bytes.Equal(got, f64bytes(3, -2)) {
			t.Errorf("rank %d: allreduce at 4096: %v, %x", r, resp, got)
		}
		resp = p.call(t, pyReq{ID: 2, At: 4096, Op: "allgather", Has: true, DType: "float64", Shape: []int{1}})
		got = make([]byte, 16)
		p.f.ReadAt(got, 4096+64)
		if resp["code"] != nil || anyInt(resp["off"]) != 4096+64 || !bytes.Equal(got, f64bytes(3, 3)) {
			t.Errorf("rank %d: allgather at 4096: %v, %x", r, resp, got)
		}
		// The same with room for the input alone: the output goes to the
		// file's end, not over what follows the room.
		p.f.WriteAt(kept, 4096+64)
		resp = p.call(t, pyReq{ID: 2, At: 4096, Room: 64, Op: "allgather", Has: true, DType: "float64", Shape: []int{1}})
		got = make([]byte, 16)
		p.f.ReadAt(got, 1<<20)
		if resp["code"] != nil || anyInt(resp["off"]) != 1<<20 || !bytes.Equal(got, f64bytes(3, 3)) {
			t.Errorf("rank %d: allgather at 4096 in 64 bytes of room: %v, %x", r, resp, got)
		}
		got = make([]byte, 24)
		p.f.ReadAt(got, 4096+64)
		if !bytes.Equal(got, kept) {
			t.Errorf("rank %d: the allgather wrote past its room: %x", r, got)
		}
		// Rank 0 sends rank 1 its row at 8192; rank 1's wait puts it at 12288.
		if r == 0 {
			p.f.WriteAt(f64bytes(5, 6), 8192)
			if resp := p.call(t, pyReq{ID: 3, At: 8192, Op: "isend", Peer: 1, Has: true, DType: "float64", Shape: []int{2}}); resp["code"] != nil {
				t.Errorf("isend: %v", resp)
			}
			if resp := p.call(t, pyReq{ID: 4, At: 4096, Op: "wait", Req: 3}); resp["code"] != nil {
				t.Errorf("wait isend: %v", resp)
			}
		} else {
			if resp := p.call(t, pyReq{ID: 3, At: 8192, Op: "irecv", Peer: 0, Has: true, DType: "float64", Shape: []int{2}}); resp["code"] != nil {
				t.Errorf("irecv: %v", resp)
			}
			resp := p.call(t, pyReq{ID: 4, At: 12288, Op: "wait", Req: 3})
			got := make([]byte, 16)
			p.f.ReadAt(got, 12288)
			if resp["code"] != nil || anyInt(resp["off"]) != 12288 || !bytes.Equal(got, f64bytes(5, 6)) {
				t.Errorf("wait irecv at 12288: %v, %x", resp, got)
			}
		}
		for _, bad := range []pyReq{{At: -64}, {At: 100}, {At: 2 << 20}, {Room: -1}, {Room: 4}} { // the input is 8 bytes
			resp := p.call(t, pyReq{ID: 5, At: bad.At, Room: bad.Room, Op: "allreduce", Red: 1, Has: true, DType: "float64", Shape: []int{1}})
			if anyInt(resp["code"]) != 3 || resp["reason"] != "collective.argument" {
				t.Errorf("rank %d: at %d, room %d: %v", r, bad.At, bad.Room, resp)
			}
		}
		got = make([]byte, 24)
		p.f.ReadAt(got, 0)
		if !bytes.Equal(got, kept) {
			t.Errorf("rank %d: the bytes at offset 0 changed: %x", r, got)
		}
	})
	// Both go on.
	parallel(func(r int, p *pyRank) {
		if resp := p.call(t, pyReq{ID: 6, Op: "barrier"}); resp["code"] != nil {
			t.Errorf("rank %d: barrier after the bad ats: %v", r, resp)
		}
	})
}

// TestCollectiveSidecar_SharedDataFile: the sidecar links its data file
// into the session folder as a shared buffer before its hello, so that the
// parent's unlink after the hello (as the Python rank does) leaves it
// there for the other ranks; an Allreduce above 64 KiB in the files (the
// path that reads them in place) then gives every rank the sum.
func TestCollectiveSidecar_SharedDataFile(t *testing.T) {
	addr := freeAddr(t)
	shm := t.TempDir()
	ranks := []*pyRank{startSidecar(t, addr, shm, 0, 2, collective.SHM), startSidecar(t, addr, shm, 1, 2, collective.SHM)}
	for r, p := range ranks {
		p.read(t) // the hello
		links, _ := filepath.Glob(filepath.Join(shm, "tensorwire-collective-*", fmt.Sprintf("rank-%d.s0", r)))
		if len(links) != 1 {
			t.Fatalf("rank %d: links %v, want one", r, links)
		}
		fi, err := os.Stat(links[0])
		if err != nil {
			t.Fatal(err)
		}
		di, err := p.f.Stat()
		if err != nil {
			t.Fatal(err)
		}
		if !os.SameFile(fi, di) {
			t.Fatalf("rank %d: %s is not the data file", r, links[0])
		}
		if err := os.Remove(p.f.Name()); err != nil {
			t.Fatal(err)
		}
	}
	const n = 20_000 // float64: 160,000 bytes
	eachRank(ranks, func(r int, p *pyRank) {
		vals := make([]float64, n)
		for i := range vals {
			vals[i] = float64(i*(r+1)) + 0.5
		}
		p.f.WriteAt(f64bytes(vals...), 4096)
		resp := p.call(t, pyReq{ID: 1, At: 4096, Op: "allreduce", Red: int(collective.Sum), Has: true, DType: "float64", Shape: []int{n}})
		for i := range vals {
			vals[i] = float64(3*i) + 1
		}
		got := make([]byte, 8*n)
		p.f.ReadAt(got, 4096)
		if resp["code"] != nil || !bytes.Equal(got, f64bytes(vals...)) {
			t.Errorf("rank %d: allreduce of %d float64 at 4096: %v", r, n, resp)
		}
	})
}

// TestCollectiveSidecar_OutAt: pipe 3's out_at puts an Allreduce's,
// Reduce's and Bcast's output there and leaves the input as it was (the
// Python rank's tensor of alloc, read where it is, through the shared
// path above 64 KiB and the data files' below); out_at that is not a
// place for the output, or with another call, is refused on that rank
// before any rank is involved.
func TestCollectiveSidecar_OutAt(t *testing.T) {
	ranks := shmPair(t)
	at := func(v int64) *int64 { return &v }
	for _, n := range []int{20_000, 100} { // float64: 160,000 bytes (shared), 800 (the data files)
		const in, out = 4096, 512 << 10
		inputs := func(r int) []float64 {
			vals := make([]float64, n)
			for i := range vals {
				vals[i] = float64(i*(r+1)) + 0.5
			}
			return vals
		}
		sum, root := make([]float64, n), make([]float64, n)
		for i := range sum {
			sum[i] = float64(3*i) + 1
			root[i] = float64(2*i) + 0.5 // rank 1's
		}
		for _, tc := range []struct {
			op   string
			want func(r int) []float64
		}{
			{"allreduce", func(int) []float64 { return sum }},
			{"reduce", func(r int) []float64 {
				if r == 1 {
					return sum
				}
				return make([]float64, n)
			}},
			{"bcast", func(int) []float64 { return root }},
		} {
			eachRank(ranks, func(r int, p *pyRank) {
				p.f.WriteAt(f64bytes(inputs(r)...), in)
				p.f.WriteAt(make([]byte, 8*n), out)
				resp := p.call(t, pyReq{ID: 1, At: in, OutAt: at(out), Op: tc.op, Red: int(collective.Sum), Root: 1,
					Has: true, DType: "float64", Shape: []int{n}})
				got, kept := make([]byte, 8*n), make([]byte, 8*n)
				p.f.ReadAt(got, out)
				p.f.ReadAt(kept, in)
				switch {
				case resp["code"] != nil || anyInt(resp["off"]) != out:
					t.Errorf("%d float64, %s, rank %d: %v", n, tc.op, r, resp)
				case !bytes.Equal(got, f64bytes(tc.want(r)...)):
					t.Errorf("%d float64, %s, rank %d: not the result at out_at", n, tc.op, r)
				case !bytes.Equal(kept, f64bytes(inputs(r)...)):
					t.Errorf("%d float64, %s, rank %d: the input changed", n, tc.op, r)
				}
			})
		}
	}
	for _, tc := range []struct {
		name string
		req  pyReq
	}{
		{"unaligned", pyReq{At: 4096, OutAt: at(8192 + 8), Op: "allreduce"}},
		{"overlapping", pyReq{At: 4096, OutAt: at(4096 + 64), Op: "allreduce"}},
		{"past the file", pyReq{At: 4096, OutAt: at(1<<20 - 64), Op: "allreduce"}},
		{"negative", pyReq{At: 4096, OutAt: at(-64), Op: "allreduce"}},
		{"another call", pyReq{At: 4096, OutAt: at(8192), Op: "allgather"}},
	} {
		req := tc.req
		req.ID, req.Has, req.DType, req.Shape = 2, true, "float64", []int{100}
		resp := ranks[0].call(t, req)
		if resp["code"] == nil || resp["reason"] != "collective.argument" {
			t.Errorf("%s: %v, want an argument error", tc.name, resp)
		}
	}
	// The refusals involved no other rank: the pair still works.
	eachRank(ranks, func(r int, p *pyRank) {
		if resp := p.call(t, pyReq{ID: 3, Op: "barrier"}); resp["code"] != nil {
			t.Errorf("rank %d: barrier after the refusals: %v", r, resp)
		}
	})
}

// TestCollectiveSidecar_P2PBuffersReused: rounds of Isend and Irecv of
// the same large size, each with other values, reuse the sidecar's
// buffers (p2pBufs) and still deliver each round's values whole, nothing
// of the round before.
func TestCollectiveSidecar_P2PBuffersReused(t *testing.T) {
	scs := []*sidecar{{}, {}}
	ranks := shmPair(t, scs...)
	const n = 20_000 // float64: 160,000 bytes, pooled
	for round := range 4 {
		vals := make([]float64, n)
		for i := range vals {
			vals[i] = float64(round*n + i)
		}
		if round == 3 {
			vals = vals[:n/2] // a smaller message: a kept buffer of twice it may serve it
		}
		want := f64bytes(vals...)
		eachRank(ranks, func(r int, p *pyRank) {
			id := int64(10 * (round + 1))
			if r == 0 {
				p.f.WriteAt(want, 8192)
				if resp := p.call(t, pyReq{ID: id, At: 8192, Op: "isend", Peer: 1, Has: true, DType: "float64", Shape: []int{len(vals)}}); resp["code"] != nil {
					t.Errorf("round %d: isend: %v", round, resp)
				}
				p.f.WriteAt(make([]byte, len(want)), 8192) // the file is the next call's: the send has its own copy
				if resp := p.call(t, pyReq{ID: id + 1, Op: "wait", Req: id}); resp["code"] != nil {
					t.Errorf("round %d: wait isend: %v", round, resp)
				}
				return
			}
			if resp := p.call(t, pyReq{ID: id, At: 8192, Op: "irecv", Peer: 0, Has: true, DType: "float64", Shape: []int{len(vals)}}); resp["code"] != nil {
				t.Errorf("round %d: irecv: %v", round, resp)
			}
			resp := p.call(t, pyReq{ID: id + 1, At: 8192, Op: "wait", Req: id})
			got := make([]byte, len(want))
			p.f.ReadAt(got, 8192)
			if resp["code"] != nil || !bytes.Equal(got, want) {
				t.Errorf("round %d: wait irecv: %v; the values differ: %v", round, resp, !bytes.Equal(got, want))
			}
		})
	}
	// Each sidecar kept the one buffer its rounds took in turn (read after
	// its last reply: the pipe orders it).
	for r, sc := range scs {
		if len(sc.bufs.free) != 1 || cap(sc.bufs.free[0]) != 8*n {
			t.Errorf("rank %d kept %d buffers, want the one of %d bytes", r, len(sc.bufs.free), 8*n)
		}
	}
}

// TestCollectiveSidecar_KeptP2P: an Isend and an Irecv with keep (pipe 4)
// use the data file's bytes where they are: the Irecv's tensor arrives at
// its at, and the Wait says so; a remap while they run (the file grown by
// a call between) keeps the old mapping their tensors point into until
// their Waits, then lets it go.
func TestCollectiveSidecar_KeptP2P(t *testing.T) {
	scs := []*sidecar{{}, {}}
	ranks := shmPair(t, scs...)
	const n = 20_000 // float64: 160,000 bytes
	vals := make([]float64, n)
	for i := range vals {
		vals[i] = float64(i) + 0.25
	}
	want := f64bytes(vals...)
	const sendAt, recvAt = 8192, 512 << 10
	eachRank(ranks, func(r int, p *pyRank) {
		start := pyReq{ID: 1, Keep: true, Peer: 1 - r, Has: true, DType: "float64", Shape: []int{n}}
		if r == 0 {
			p.f.WriteAt(want, sendAt)
			start.Op, start.At = "isend", sendAt
		} else {
			start.Op, start.At = "irecv", recvAt
		}
		if resp := p.call(t, start); resp["code"] != nil {
			t.Errorf("rank %d: %s: %v", r, start.Op, resp)
		}
		if err := p.f.Truncate(2 << 20); err != nil {
			t.Error(err)
		}
		if resp := p.call(t, pyReq{ID: 2, Op: "barrier", Size: 2 << 20}); resp["code"] != nil {
			t.Errorf("rank %d: barrier: %v", r, resp)
		}
		if got := len(scs[r].d.old); got != 1 {
			t.Errorf("rank %d: %d old mappings kept while its request runs, want 1", r, got)
		}
		resp := p.call(t, pyReq{ID: 3, Op: "wait", Req: 1, Size: 2 << 20})
		if resp["code"] != nil {
			t.Errorf("rank %d: wait: %v", r, resp)
		}
		if len(scs[r].d.old) != 0 || scs[r].d.holds != 0 {
			t.Errorf("rank %d: after the wait, %d old mappings and %d holds", r, len(scs[r].d.old), scs[r].d.holds)
		}
		if r == 1 {
			got := make([]byte, len(want))
			p.f.ReadAt(got, recvAt)
			if anyInt(resp["off"]) != recvAt || !bytes.Equal(got, want) {
				t.Errorf("the Irecv's tensor: off %v, the values right: %v", resp["off"], bytes.Equal(got, want))
			}
		}
	})
}

// TestCollectiveSidecar_QuietP2P: an Irecv and a kept Isend marked quiet
// (pipe 5) get no reply, and their Waits complete them; a quiet request
// that is refused (quiet on an Allreduce, or on an Isend of the scratch,
// whose input the next call may overwrite) gets its error reply, with its
// id, before the reply of the next request.
func TestCollectiveSidecar_QuietP2P(t *testing.T) {
	scs := []*sidecar{{}, {}}
	ranks := shmPair(t, scs...)
	want := f64bytes(1.5, 2.5, 3.5, 4.5)
	eachRank(ranks, func(r int, p *pyRank) {
		send := func(req pyReq) { p.send(t, req) }
		if r == 0 {
			// The replies are read as they come (the test's pipe holds
			// nothing: a reply not read holds the sidecar back).
			// (Not p.read, whose t.Fatal must not run off the test's
			// goroutine: a reply that does not come is a nil map here.)
			replies := make(chan map[string]any, 3)
			go func() {
				defer close(replies)
				for range 3 {
					body, err := readFrame(p.out)
					var m map[string]any
					if err != nil || decodeInto(body, &m) != nil {
						return
					}
					replies <- m
				}
			}()
			p.f.WriteAt(want, 8192)
			send(pyReq{ID: 1, Op: "isend", Keep: true, Quiet: true, At: 8192, Peer: 1, Has: true, DType: "float64", Shape: []int{4}})
			send(pyReq{ID: 2, Op: "allreduce", Quiet: true, Red: 1, Has: true, DType: "float64", Shape: []int{4}})
			send(pyReq{ID: 3, Op: "isend", Quiet: true, Peer: 1, Tag: 1, Has: true, DType: "float64", Shape: []int{4}})
			send(pyReq{ID: 4, Op: "wait", Req: 1})
			for _, id := range []int64{2, 3} {
				if resp := <-replies; anyInt(resp["id"]) != id || anyInt(resp["code"]) != int64(rpc.InvalidArgument) {
					t.Errorf("quiet request %d refused: reply %v, want InvalidArgument with its id", id, resp)
				}
			}
			if resp := <-replies; anyInt(resp["id"]) != 4 || resp["code"] != nil {
				t.Errorf("the Isend's wait: %v", resp)
			}
			return
		}
		send(pyReq{ID: 1, Op: "irecv", Quiet: true, At: 65536, Peer: 0, Has: true, DType: "float64", Shape: []int{4}})
		resp := p.call(t, pyReq{ID: 2, Op: "wait", Req: 1, At: 65536})
		got := make([]byte, len(want))
		p.f.ReadAt(got, anyInt(resp["off"]))
		if anyInt(resp["id"]) != 2 || resp["code"] != nil || !bytes.Equal(got, want) {
			t.Errorf("the Irecv's wait: %v, the values right: %v", resp, bytes.Equal(got, want))
		}
	})
}
