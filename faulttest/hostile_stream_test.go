package faulttest

import (
	"bufio"
	"bytes"
	"cmp"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hashicorp/go-msgpack/v2/codec"
	"github.com/hashicorp/yamux"
	"github.com/pierrec/lz4/v4"

	"github.com/tensorwire/tensorwire/internal/nodeproc"
	"github.com/tensorwire/tensorwire/memmap"
	"github.com/tensorwire/tensorwire/rpc"
	"github.com/tensorwire/tensorwire/tensordict"
)

// ---- message streams ----
//
// The node under attack serves message streams: a test node (the role
// "stream-node": package rpc's Server with its default limits, as
// `tensorwire node` runs it) with these methods:
//
//	hostile.echo   answers each message {n, data} with {n}, a message that
//	               does not decode with {n: -3} (InvalidArgument), and goes on
//	hostile.sink   sends {n: 0}, then never receives, until its context ends
//	hostile.flood  sends 64 KiB messages until a Send fails
//	hostile.report (a call) what the sink and flood handlers did, and the
//	               process's heap and resident memory
//
// The hostile peer below speaks to it from docs/protocol.md ("Streams"),
// with maps it packs by hand on hashicorp/yamux streams (peer_test.go).

const (
	streamEcho   = "hostile.echo"
	streamSink   = "hostile.sink"
	streamFlood  = "hostile.flood"
	streamReport = "hostile.report"
	floodMsg     = 64 << 10
)

type hsMsg struct {
	N    int64  `codec:"n"`
	Data rpc.TD `codec:"data"`
}

// hsReport is what hostile.report answers.
type hsReport struct {
	FloodActive  int64  `codec:"flood_active"`   // flood handlers running
	FloodCtxEnds int64  `codec:"flood_ctx_ends"` // flood handlers whose Send ended with their context
	FloodMaxSent int64  `codec:"flood_max_sent"` // the most bytes one flood handler sent
	SinkActive   int64  `codec:"sink_active"`    // sink handlers running
	SinkEnds     int64  `codec:"sink_ends"`      // sink handlers that returned
	Heap         uint64 `codec:"heap"`           // runtime.MemStats.HeapInuse
	RSS          uint64 `codec:"rss"`            // VmRSS of /proc/self/status
}

// vmRSS returns the process's resident memory, or 0 where /proc has none.
func vmRSS() uint64 {
	b, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return 0
	}
	for line := range strings.SplitSeq(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "VmRSS:"); ok {
			kb, _ := strconv.ParseUint(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
			return kb << 10
		}
	}
	return 0
}

func init() {
	// roles["stream-node"] ADDR ROOT TOKENFILE: serves the stream methods
	// above and prints nodeproc.ListeningPrefix. It collects garbage every
	// half second, so that its heap figure is what it holds, not what
	// awaits collection.
	roles["stream-node"] = runStreamNode
	// roles["stream-peer"] ADDR TOKENFILE K: a hostile peer that opens K
	// sink streams and K flood streams it never reads, prints "open" once
	// every sink handler has sent its first message, and waits to be killed.
	roles["stream-peer"] = runStreamPeer
}

func runStreamNode(ctx context.Context, args []string) error {
	if len(args) != 3 {
		return fmt.Errorf("want ADDR ROOT TOKENFILE, got %q", args)
	}
	token, err := nodeproc.ReadToken(args[2])
	if err != nil {
		return err
	}
	s, err := rpc.NewServer(rpc.WithRoot(args[1]), rpc.WithToken(token))
	if err != nil {
		return err
	}
	var rep struct{ floodActive, floodCtxEnds, floodMaxSent, sinkActive, sinkEnds atomic.Int64 }
	if err := rpc.RegisterStream(s, streamEcho, func(ctx context.Context, _ rpc.Empty, st *rpc.ServerStream[hsMsg, hsMsg]) error {
		for {
			m, err := st.Recv(ctx)
			switch {
			case err == io.EOF:
				return nil
			case errors.Is(err, rpc.ErrInvalidArgument):
				m = hsMsg{N: -int64(rpc.InvalidArgument)}
			case err != nil:
				return err
			}
			if err := st.Send(ctx, hsMsg{N: m.N}); err != nil {
				return err
			}
		}
	}); err != nil {
		return err
	}
	if err := rpc.RegisterStream(s, streamSink, func(ctx context.Context, _ rpc.Empty, st *rpc.ServerStream[hsMsg, hsMsg]) error {
		rep.sinkActive.Add(1)
		defer rep.sinkEnds.Add(1)
		defer rep.sinkActive.Add(-1)
		if err := st.Send(ctx, hsMsg{}); err != nil {
			return err
		}
		<-ctx.Done()
		return ctx.Err()
	}); err != nil {
		return err
	}
	// Random: zeros would cross lz4-compressed, a few hundred bytes each.
	payload, err := tensordict.FromBytes(memmap.Uint8, []int{floodMsg}, randBytes(floodMsg))
	if err != nil {
		return err
	}
	td, err := tensordict.New(floodMsg)
	if err != nil {
		return err
	}
	if err := td.Set("x", payload); err != nil {
		return err
	}
	if err := rpc.RegisterStream(s, streamFlood, func(ctx context.Context, _ rpc.Empty, st *rpc.ServerStream[hsMsg, hsMsg]) error {
		rep.floodActive.Add(1)
		defer rep.floodActive.Add(-1)
		var sent int64
		for {
			err := st.Send(ctx, hsMsg{N: sent, Data: rpc.Ref(td)})
			if err != nil {
				for m := rep.floodMaxSent.Load(); sent > m && !rep.floodMaxSent.CompareAndSwap(m, sent); m = rep.floodMaxSent.Load() {
				}
				if ctx.Err() != nil {
					rep.floodCtxEnds.Add(1)
				}
				return err
			}
			sent += floodMsg
		}
	}); err != nil {
		return err
	}
	if err := rpc.Register(s, streamReport, func(context.Context, rpc.Empty) (hsReport, error) {
		var ms runtime.MemStats
		runtime.ReadMemStats(&ms)
		return hsReport{FloodActive: rep.floodActive.Load(), FloodCtxEnds: rep.floodCtxEnds.Load(), FloodMaxSent: rep.floodMaxSent.Load(),
			SinkActive: rep.sinkActive.Load(), SinkEnds: rep.sinkEnds.Load(), Heap: ms.HeapInuse, RSS: vmRSS()}, nil
	}); err != nil {
		return err
	}
	ln, err := net.Listen("tcp", args[0])
	if err != nil {
		return err
	}
	fmt.Println(nodeproc.ListeningPrefix + ln.Addr().String())
	go func() {
		t := time.NewTicker(500 * time.Millisecond)
		defer t.Stop()
		for {
			select {
			case <-t.C:
				runtime.GC()
			case <-ctx.Done():
				return
			}
		}
	}()
	stop := context.AfterFunc(ctx, func() { s.Close() })
	defer stop()
	return s.Serve(ln)
}

func runStreamPeer(ctx context.Context, args []string) error {
	if len(args) != 3 {
		return fmt.Errorf("want ADDR TOKENFILE K, got %q", args)
	}
	token, err := nodeproc.ReadToken(args[1])
	if err != nil {
		return err
	}
	k, err := strconv.Atoi(args[2])
	if err != nil {
		return err
	}
	s, err := sessionVersion(ctx, args[0], 2, token, nil)
	if err != nil {
		return err
	}
	defer s.Close()
	for i := range 2 * k {
		st, err := s.OpenStream()
		if err != nil {
			return err
		}
		method := streamSink
		if i%2 == 1 {
			method = streamFlood
		}
		if _, err := st.Write(streamOpen(method, 0)); err != nil { // no deadline: until the peer dies
			return err
		}
		if method == streamSink {
			st.SetReadDeadline(time.Now().Add(30 * time.Second))
			if f, err := readNodeFrame(st); err != nil || f.end {
				return fmt.Errorf("sink stream %d: %+v, %v", i, f, err)
			}
		}
	}
	fmt.Println("open")
	<-ctx.Done()
	return nil
}

// streamOpen is the request that opens a message stream of method, with the
// handler's deadline timeoutUS and an empty argument.
func streamOpen(method string, timeoutUS int64) []byte {
	a := pack(map[string]any{})
	return frame(map[string]any{"method": method, "timeout_us": timeoutUS, "arg_len": len(a), "body_len": 0, "stream": true}, a, nil)
}

// frame is a length-prefixed header map, an argument and a body.
func frame(hdr map[string]any, arg, body []byte) []byte {
	h := pack(hdr)
	b := binary.BigEndian.AppendUint32(nil, uint32(len(h)))
	b = append(b, h...)
	b = append(b, arg...)
	return append(b, body...)
}

// streamMessage is a message frame carrying arg (packed) and body.
func streamMessage(arg any, body []byte) []byte {
	a := pack(arg)
	return frame(map[string]any{"arg_len": len(a), "body_len": len(body)}, a, body)
}

// streamEnd is the caller's end frame.
func streamEnd() []byte {
	return frame(map[string]any{"code": 0, "end": true, "message": ""}, nil, nil)
}

// bytesTD is a TD map of one uint8 tensor of n bytes, by bytes.
func bytesTD(n int) map[string]any {
	return map[string]any{"batch": []int{n}, "rows": nil, "gathered": false, "out": false,
		"entries": []any{map[string]any{"key": []string{"x"}, "kind": "tensor", "dtype": "torch.uint8", "shape": []int{n}, "ref": nil, "data": nil}}}
}

// lz4Frame returns raw as an LZ4 frame (docs/protocol.md, "Compression").
func lz4Frame(raw []byte) []byte {
	var b bytes.Buffer
	w := lz4.NewWriter(&b)
	w.Write(raw)
	w.Close()
	return b.Bytes()
}

// nodeFrame is a frame from the node: a message (its n) or an end.
type nodeFrame struct {
	end  bool
	code int
	msg  string
	n    int64
}

// readNodeFrame reads one frame of a message stream from r.
func readNodeFrame(r io.Reader) (nodeFrame, error) {
	var size uint32
	if err := binary.Read(r, binary.BigEndian, &size); err != nil {
		return nodeFrame{}, err
	}
	if size == 0 || size > 1<<16 {
		return nodeFrame{}, fmt.Errorf("frame header of %d bytes", size)
	}
	hb := make([]byte, size)
	if _, err := io.ReadFull(r, hb); err != nil {
		return nodeFrame{}, err
	}
	var h struct {
		Code    int    `codec:"code"`
		End     bool   `codec:"end"`
		Message string `codec:"message"`
		ArgLen  int64  `codec:"arg_len"`
		BodyLen int64  `codec:"body_len"`
	}
	if err := codec.NewDecoderBytes(hb, mh).Decode(&h); err != nil {
		return nodeFrame{}, err
	}
	if h.End {
		return nodeFrame{end: true, code: h.Code, msg: h.Message}, nil
	}
	if h.ArgLen < 0 || h.ArgLen > 1<<20 || h.BodyLen < 0 {
		return nodeFrame{}, fmt.Errorf("message of %d + %d bytes", h.ArgLen, h.BodyLen)
	}
	arg := make([]byte, h.ArgLen)
	if _, err := io.ReadFull(r, arg); err != nil {
		return nodeFrame{}, err
	}
	if _, err := io.CopyN(io.Discard, r, h.BodyLen); err != nil {
		return nodeFrame{}, err
	}
	var m struct {
		N int64 `codec:"n"`
	}
	if err := codec.NewDecoderBytes(arg, mh).Decode(&m); err != nil {
		return nodeFrame{}, fmt.Errorf("message argument: %w", err)
	}
	return nodeFrame{n: m.N}, nil
}

// honestStreams opens echo streams on c without pause until ctx ends, each
// carrying three messages, and counts them and their failures in h.
func honestStreams(ctx context.Context, c *rpc.Client, h *honest) {
	for ctx.Err() == nil {
		start := time.Now()
		err := func() error {
			sctx, cancel := context.WithTimeout(ctx, 5*time.Second)
			defer cancel()
			st, err := rpc.OpenStream[hsMsg, hsMsg](sctx, c, streamEcho, rpc.Empty{})
			if err != nil {
				return err
			}
			defer st.Close()
			for i := range int64(3) {
				if err := st.Send(sctx, hsMsg{N: i + 1}); err != nil {
					return err
				}
				m, err := st.Recv(sctx)
				if err != nil {
					return err
				}
				if m.N != i+1 {
					return fmt.Errorf("echo of %d: %d", i+1, m.N)
				}
			}
			if err := st.CloseSend(sctx); err != nil {
				return err
			}
			if _, err := st.Recv(sctx); err != io.EOF {
				return fmt.Errorf("after the echoes: %v, want EOF", err)
			}
			return nil
		}()
		took := time.Since(start)
		if ctx.Err() != nil {
			return
		}
		h.calls.Add(1)
		if int64(took) > h.slow.Load() {
			h.slow.Store(int64(took))
		}
		if err != nil {
			h.fails.Add(1)
			h.mu.Lock()
			h.errs = append(h.errs, "stream: "+err.Error())
			h.mu.Unlock()
		}
		time.Sleep(2 * time.Millisecond)
	}
}

// streamAttackEnv is what the stream attacks need: the node's address and
// token, a client to watch the node with, and the figures they report.
type streamAttackEnv struct {
	c     *cluster
	addr  string
	token []byte
	watch *rpc.Client // an honest client, for the node's report
	base  hsReport    // the node's report before the attacks

	mu   sync.Mutex
	figs []any // figure name, value, ...
}

func (a *streamAttackEnv) figure(name string, v any) {
	a.mu.Lock()
	a.figs = append(a.figs, name, v)
	a.mu.Unlock()
}

func (a *streamAttackEnv) session(ctx context.Context) (*yamux.Session, error) {
	return sessionVersion(ctx, a.addr, 2, a.token, nil)
}

func (a *streamAttackEnv) report(ctx context.Context) (hsReport, error) {
	cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	return rpc.Call[hsReport](cctx, a.watch, streamReport, rpc.Empty{})
}

// peak samples the node's heap and resident memory every 100 ms until the
// returned function is called, which returns the highest of each.
func (a *streamAttackEnv) peak(ctx context.Context) func() (heap, rss uint64) {
	ctx, cancel := context.WithCancel(ctx)
	var heap, rss uint64
	done := make(chan struct{})
	go func() {
		defer close(done)
		for ctx.Err() == nil {
			if r, err := a.report(ctx); err == nil {
				heap, rss = max(heap, r.Heap), max(rss, r.RSS)
			}
			select {
			case <-ctx.Done():
			case <-time.After(100 * time.Millisecond):
			}
		}
	}()
	return func() (uint64, uint64) {
		cancel()
		<-done
		return heap, rss
	}
}

// heapWithin checks the node's heap against the baseline.
func (a *streamAttackEnv) heapWithin(ctx context.Context, what string, extra uint64) error {
	r, err := a.report(ctx)
	if err != nil {
		return err
	}
	if r.Heap > a.base.Heap+extra {
		return fmt.Errorf("%s: node heap %s, baseline %s: grew by more than %d MiB", what, mb(r.Heap), mb(a.base.Heap), extra>>20)
	}
	return nil
}

func mb(n uint64) string { return fmt.Sprintf("%.1fMB", float64(n)/1e6) }

// pollReport polls the node's report every 100 ms, for at most 60 s, until
// ok holds, and returns the last report.
func (a *streamAttackEnv) pollReport(ctx context.Context, what string, ok func(hsReport) bool) (hsReport, error) {
	deadline := time.Now().Add(60 * time.Second)
	for {
		r, err := a.report(ctx)
		if err != nil {
			return r, err
		}
		if ok(r) {
			return r, nil
		}
		if time.Now().After(deadline) {
			return r, fmt.Errorf("60 s on, still not %s: %+v", what, r)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

type streamAttack struct {
	name string
	run  func(ctx context.Context, a *streamAttackEnv) (int, error)
}

func streamAttacks() []streamAttack {
	return []streamAttack{
		{"thousands of message streams on one connection", streamsFlood},
		{"thousands of silent streams on one connection", silentStreams},
		{"a caller that stops reading", stopsReading},
		{"a caller that writes to a handler that does not read", writesUnread},
		{"garbage stream frames", garbageFrames},
		{"kill -9 of the peer mid-stream", killedPeer},
	}
}

// streamsFlood opens 2000 sink streams on one connection at once: the node
// serves MaxMessageStreams of them and refuses the rest.
func streamsFlood(ctx context.Context, a *streamAttackEnv) (int, error) {
	const n = 2000
	s, err := a.session(ctx)
	if err != nil {
		return 0, err
	}
	defer s.Close()
	before, err := a.report(ctx)
	if err != nil {
		return 0, err
	}
	peak := a.peak(ctx)
	var served, refused, reset atomic.Int64
	var keep sync.Mutex
	var open []*yamux.Stream // the served ones, closed after the check
	defer func() {
		for _, st := range open {
			st.Close()
		}
	}()
	_, err = parallel(ctx, n, n, func(int) error {
		st, err := s.OpenStream()
		if err != nil {
			return err
		}
		st.SetDeadline(time.Now().Add(60 * time.Second))
		if _, err := st.Write(streamOpen(streamSink, 120_000_000)); err != nil {
			st.Close()
			if errors.Is(err, yamux.ErrConnectionReset) || errors.Is(err, yamux.ErrStreamClosed) {
				reset.Add(1) // over the node's accept backlog
				return nil
			}
			return err
		}
		f, err := readNodeFrame(st)
		if err == nil && !f.end {
			keep.Lock()
			open = append(open, st)
			keep.Unlock()
		} else {
			defer st.Close()
		}
		switch {
		case errors.Is(err, yamux.ErrConnectionReset) || err == io.EOF:
			reset.Add(1)
		case err != nil:
			return fmt.Errorf("the node neither served nor refused a stream: %w", err)
		case f.end && f.code == int(rpc.ResourceExhausted):
			refused.Add(1)
		case f.end:
			return fmt.Errorf("a stream refused with code %d %q, want ResourceExhausted", f.code, f.msg)
		default:
			served.Add(1)
		}
		return nil
	})
	if err != nil {
		peak()
		return n, err
	}
	rep, err := a.report(ctx)
	if err != nil {
		peak()
		return n, err
	}
	heapPeak, rssPeak := peak()
	heapPeak, rssPeak = max(heapPeak, rep.Heap), max(rssPeak, rep.RSS) // with the served streams open
	a.figure("streams_served_refused_reset", fmt.Sprintf("%d/%d/%d", served.Load(), refused.Load(), reset.Load()))
	a.figure("streams_heap_rss_peak", mb(heapPeak)+"/"+mb(rssPeak))
	limit := int64(rpc.DefaultLimits().MaxMessageStreams)
	if served.Load() == 0 || served.Load() > limit || served.Load()+refused.Load()+reset.Load() != n || rep.SinkActive-before.SinkActive != served.Load() {
		return n, fmt.Errorf("%d streams served (%d handlers running), %d refused and %d reset, want at most %d served and the rest refused",
			served.Load(), rep.SinkActive-before.SinkActive, refused.Load(), reset.Load(), limit)
	}
	// Twice MaxStreamsPerPeer streams at a time, about 150 KB each with
	// the garbage of those refused (silentStreams).
	if heapPeak > a.base.Heap+96<<20 {
		return n, fmt.Errorf("the node's heap reached %s (baseline %s)", mb(heapPeak), mb(a.base.Heap))
	}
	return n, nil
}

// silentStreams opens 4000 streams on one connection that send nothing:
// each the node takes costs it a goroutine and buffers until TransferGrace
// (those past MaxStreamsPerPeer) or IdleTimeout, so it takes twice
// MaxStreamsPerPeer and yamux resets the rest past its accept backlog.
func silentStreams(ctx context.Context, a *streamAttackEnv) (int, error) {
	const n = 4000
	s, err := a.session(ctx)
	if err != nil {
		return 0, err
	}
	defer s.Close()
	peak := a.peak(ctx)
	var mu sync.Mutex
	var open []*yamux.Stream
	_, err = parallel(ctx, n, 64, func(int) error {
		st, err := s.OpenStream()
		if err != nil {
			return err
		}
		// One byte, so that the node's accept of it is not lazy.
		st.Write([]byte{0})
		mu.Lock()
		open = append(open, st)
		mu.Unlock()
		return nil
	})
	time.Sleep(2 * time.Second) // the node takes them in
	st, serr := a.watch.Stats(ctx)
	heapPeak, rssPeak := peak()
	a.figure("silent_streams_served", st.Streams)
	a.figure("silent_streams_heap_rss_peak", mb(heapPeak)+"/"+mb(rssPeak))
	s.Close()
	if err != nil || serr != nil {
		return n, cmp.Or(err, serr)
	}
	// The node serves twice MaxStreamsPerPeer of one peer's streams (the
	// limit's and as many refusals), the honest client's besides.
	if limit := 2*rpc.DefaultLimits().MaxStreamsPerPeer + 8; st.Streams > limit {
		return n, fmt.Errorf("%d silent streams: the node serves %d streams, want at most %d", n, st.Streams, limit)
	}
	// About 150 KB each: a goroutine's buffers, yamux's stream.
	if heapPeak > a.base.Heap+96<<20 {
		return n, fmt.Errorf("%d silent streams: the node's heap reached %s (baseline %s)", n, mb(heapPeak), mb(a.base.Heap))
	}
	return n, nil
}

// stopsReading opens flood streams and reads nothing: each handler blocks
// on the stream's window (hashicorp/yamux's default, 256 KiB, on this side)
// until its context ends (3 s), and the node holds nothing meanwhile.
func stopsReading(ctx context.Context, a *streamAttackEnv) (int, error) {
	const k = 8
	s, err := a.session(ctx)
	if err != nil {
		return 0, err
	}
	defer s.Close()
	before, err := a.report(ctx)
	if err != nil {
		return 0, err
	}
	peak := a.peak(ctx)
	for range k {
		st, err := s.OpenStream()
		if err != nil {
			peak()
			return 0, err
		}
		defer st.Close()
		if _, err := st.Write(streamOpen(streamFlood, 3_000_000)); err != nil {
			peak()
			return 0, err
		}
	}
	rep, err := a.pollReport(ctx, "every flood handler ended with its context", func(r hsReport) bool {
		return r.FloodCtxEnds-before.FloodCtxEnds == k && r.FloodActive == 0
	})
	heapPeak, _ := peak()
	a.figure("unread_flood_max_sent_kb", rep.FloodMaxSent>>10)
	a.figure("unread_flood_heap_peak", mb(heapPeak))
	if err != nil {
		return k, err
	}
	if rep.FloodMaxSent > 1<<20 {
		return k, fmt.Errorf("a flood handler sent %d bytes to a caller that reads nothing, past a 256 KiB window", rep.FloodMaxSent)
	}
	if heapPeak > a.base.Heap+32<<20 {
		return k, fmt.Errorf("the node's heap reached %s while its handlers waited on the window (baseline %s)", mb(heapPeak), mb(a.base.Heap))
	}
	return k, nil
}

// writesUnread writes 1 MiB messages to sink handlers, which never
// receive: the node reads ahead MaxStreamBuffer (8 MiB) and its window
// (16 MiB) holds the rest; then the writes block.
func writesUnread(ctx context.Context, a *streamAttackEnv) (int, error) {
	const k = 2
	s, err := a.session(ctx)
	if err != nil {
		return 0, err
	}
	defer s.Close()
	body := randBytes(1 << 20)
	big := streamMessage(map[string]any{"n": 2, "data": bytesTD(len(body))}, body)
	lim := rpc.DefaultLimits()
	bound := lim.MaxStreamBuffer + 16<<20 + int64(len(big)) + 64<<10 // read-ahead, window, the message read past the buffer, bufio
	peak := a.peak(ctx)
	var most int64
	for range k {
		st, err := s.OpenStream()
		if err != nil {
			peak()
			return 0, err
		}
		defer st.Close()
		st.Write(streamOpen(streamSink, 120_000_000))
		var sent int64
		for {
			// A write that waits 2 s has met the window; under load one
			// may wait that long earlier, which can only undercount.
			st.SetWriteDeadline(time.Now().Add(2 * time.Second))
			n, err := st.Write(big)
			sent += int64(n)
			if err != nil {
				break
			}
			if sent > 2*bound {
				peak()
				return k, fmt.Errorf("the node took %d MB from a stream its handler does not read", sent>>20)
			}
		}
		most = max(most, sent)
	}
	heapPeak, rssPeak := peak()
	a.figure("unread_writes_most_taken_mb", most>>20)
	a.figure("unread_writes_heap_rss_peak", mb(heapPeak)+"/"+mb(rssPeak))
	if most > bound {
		return k, fmt.Errorf("the node took %d bytes from a stream its handler does not read, past read-ahead and window (%d)", most, bound)
	}
	// Per stream: the read-ahead, and yamux's receive buffer, a
	// bytes.Buffer that may grow to twice the window.
	if heapPeak > a.base.Heap+uint64(k)*uint64(lim.MaxStreamBuffer+3*16<<20) {
		return k, fmt.Errorf("the node's heap reached %s (baseline %s)", mb(heapPeak), mb(a.base.Heap))
	}
	return k, nil
}

// garbageFrames sends messages that do not decode (a Recv error for the
// handler; the stream goes on) and frames that break the protocol (the node
// closes the connection), decompression bombs among both.
func garbageFrames(ctx context.Context, a *streamAttackEnv) (int, error) {
	s, err := a.session(ctx)
	if err != nil {
		return 0, err
	}
	defer s.Close()
	st, err := s.OpenStream()
	if err != nil {
		return 0, err
	}
	st.SetDeadline(time.Now().Add(60 * time.Second))
	zeros := lz4Frame(make([]byte, 4<<20)) // 4 MiB of zeros in a few KiB
	lz := func(arg any, rawLen int, z []byte) []byte {
		p := pack(arg)
		return frame(map[string]any{"arg_len": len(p), "body_len": len(z), "raw_len": rawLen}, p, z)
	}
	bad := []struct {
		what string
		msg  []byte
	}{
		{"not msgpack", frame(map[string]any{"arg_len": 3, "body_len": 0}, []byte{0xc1, 0xc1, 0xc1}, nil)},
		{"a TD of 100 bytes, 10 in the body", streamMessage(map[string]any{"n": 7, "data": bytesTD(100)}, make([]byte, 10))},
		{"a TD that is not one", streamMessage(map[string]any{"n": 7, "data": map[string]any{"batch": "x"}}, nil)},
		{"lz4 that is not", lz(map[string]any{"n": 7, "data": bytesTD(100)}, 100, randBytes(12))},
		{"lz4 inflating past its raw_len (a bomb)", lz(map[string]any{"n": 7, "data": bytesTD(100)}, 100, zeros)},
		{"lz4 short of its raw_len", lz(map[string]any{"n": 7, "data": bytesTD(4<<20 + 4096)}, 4<<20+4096, zeros)},
		{"lz4 followed by other bytes", lz(map[string]any{"n": 7, "data": bytesTD(4 << 20)}, 4<<20, append(slicesClone(zeros), 1, 2, 3))},
	}
	st.Write(streamOpen(streamEcho, 60_000_000))
	tried := 0
	br := bufio.NewReader(st)
	for _, b := range bad {
		tried++
		if _, err := st.Write(b.msg); err != nil {
			return tried, fmt.Errorf("%s: %w", b.what, err)
		}
		f, err := readNodeFrame(br)
		if err != nil || f.end || f.n != -int64(rpc.InvalidArgument) {
			return tried, fmt.Errorf("%s: %+v, %v; want the handler's InvalidArgument from Recv", b.what, f, err)
		}
	}
	if _, err := st.Write(lz(map[string]any{"n": 42, "data": bytesTD(4 << 20)}, 4<<20, zeros)); err != nil {
		return tried, err
	}
	if f, err := readNodeFrame(br); err != nil || f.n != 42 {
		return tried, fmt.Errorf("a good message after the bad ones: %+v, %v", f, err)
	}
	st.Write(streamEnd())
	if f, err := readNodeFrame(br); err != nil || !f.end || f.code != 0 {
		return tried, fmt.Errorf("the handler's end: %+v, %v", f, err)
	}
	st.Close()

	// Frames that break the protocol: the node closes the connection.
	breaking := []struct {
		what string
		b    []byte
	}{
		{"a header of 0 bytes", binary.BigEndian.AppendUint32(nil, 0)},
		{"a header over MaxHeaderBytes", binary.BigEndian.AppendUint32(nil, 1<<16+1)},
		{"a header that is not a map", frame(nil, nil, nil)},
		{"an argument of 1 TB", frame(map[string]any{"arg_len": int64(1) << 40, "body_len": 0}, nil, nil)},
		{"a body of 1 EB", frame(map[string]any{"arg_len": 0, "body_len": int64(1) << 60}, nil, nil)},
		{"an end with an argument", frame(map[string]any{"code": 0, "end": true, "message": "", "arg_len": 5}, nil, nil)},
		{"a message with a code", frame(map[string]any{"arg_len": 0, "body_len": 0, "code": 3}, nil, nil)},
		{"10 bytes inflating to 1 GB (a bomb)", frame(map[string]any{"arg_len": 0, "body_len": 10, "raw_len": 1 << 30}, nil, randBytes(10))},
		{"1 GB inflating past MaxBodyBytes (a bomb)", frame(map[string]any{"arg_len": 0, "body_len": 1 << 30, "raw_len": int64(5) << 30}, nil, nil)},
		{"a negative raw_len", frame(map[string]any{"arg_len": 0, "body_len": 10, "raw_len": -1}, nil, randBytes(10))},
	}
	for _, b := range breaking {
		tried++
		s, err := a.session(ctx)
		if err != nil {
			return tried, err
		}
		if st, err := s.OpenStream(); err == nil {
			st.Write(append(streamOpen(streamEcho, 60_000_000), b.b...))
		}
		select {
		case <-s.CloseChan():
		case <-time.After(60 * time.Second):
			s.Close()
			return tried, fmt.Errorf("%s: the node kept the connection", b.what)
		}
		s.Close()
	}
	// A message stream on a version 1 connection.
	tried++
	s1, err := session(ctx, a.addr, a.token, nil)
	if err != nil {
		return tried, err
	}
	defer s1.Close()
	if st, err := s1.OpenStream(); err == nil {
		st.Write(streamOpen(streamEcho, 60_000_000))
	}
	select {
	case <-s1.CloseChan():
	case <-time.After(60 * time.Second):
		return tried, errors.New("the node kept a version 1 connection that opened a message stream")
	}
	return tried, a.heapWithin(ctx, "after the garbage", 32<<20)
}

func slicesClone(b []byte) []byte { return append([]byte(nil), b...) }

// killedPeer runs a hostile peer process that holds sink and flood streams
// open (the flood handlers blocked on its window), kills it with SIGKILL,
// and waits for every handler's context to end.
func killedPeer(ctx context.Context, a *streamAttackEnv) (int, error) {
	const k = 16
	before, err := a.report(ctx)
	if err != nil {
		return 0, err
	}
	h := a.c.host("stream-peer")
	p := a.c.helper(h, "stream-peer", "stream peer", a.addr, a.c.token, strconv.Itoa(k))
	if _, err := p.Line("open", 60*time.Second); err != nil {
		return 0, fmt.Errorf("the stream peer: %w; stderr: %s", err, p.Stderr())
	}
	if _, err := a.pollReport(ctx, "every handler of the peer running", func(r hsReport) bool {
		return r.SinkActive-before.SinkActive == k && r.FloodActive-before.FloodActive == k
	}); err != nil {
		return k, err
	}
	killed := p.Kill()
	_, err = a.pollReport(ctx, "every handler of the killed peer ended", func(r hsReport) bool {
		return r.SinkActive == before.SinkActive && r.FloodActive == before.FloodActive && r.SinkEnds-before.SinkEnds == k
	})
	a.figure("killed_peer_handlers_ended_within", time.Since(killed).Round(time.Millisecond))
	return 2 * k, err
}

// Hostile peers against a node's message streams, while honest clients
// call it and stream to it without pause: thousands of streams opened on
// one connection (past the limit they are refused), thousands of silent
// ones, a caller that stops reading (the handlers block on the window until
// their context ends; the node holds nothing meanwhile), a caller that
// writes to a handler that does not read (the node buffers its read-ahead
// and window and no more), garbage frames and decompression bombs (a
// message that does not decode is the handler's Recv error and the stream
// goes on; a frame that breaks the protocol closes the connection), and a
// peer killed with SIGKILL mid-stream (its handlers' contexts end). The
// honest clients are served throughout, and the node returns to its
// baseline afterwards.
func TestHostileStreams(t *testing.T) {
	c := newCluster(t)
	h := c.host("node")
	td, err := tensordict.Create(filepath.Join(c.shared, "honest"), []int{16},
		tensordict.Field{Key: []string{"x"}, DType: memmap.Uint8, Shape: []int{16}})
	if err != nil {
		t.Fatal(err)
	}
	td.Close()
	node := c.helper(h, "stream-node", "stream node", addr(h), c.shared, c.token)
	node.Expect(t, nodeproc.ListeningPrefix)
	token, err := nodeproc.ReadToken(c.token)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 8*time.Minute)
	defer cancel()
	hc, err := rpc.Dial(ctx, addr(h), rpc.WithRoot(c.shared), rpc.WithToken(token))
	if err != nil {
		t.Fatal(err)
	}
	defer hc.Close()
	good, goodStreams := &honest{c: hc}, &honest{c: hc}
	hctx, stopHonest := context.WithCancel(ctx)
	var honestDone sync.WaitGroup
	honestDone.Go(func() { good.run(hctx, "honest") })
	honestDone.Go(func() { honestStreams(hctx, hc, goodStreams) })
	time.Sleep(500 * time.Millisecond)
	env := &streamAttackEnv{c: c, addr: addr(h), token: token, watch: hc}
	base, err := hc.Stats(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if env.base, err = env.report(ctx); err != nil {
		t.Fatal(err)
	}
	t.Logf("baseline: %+v; %+v", base, env.base)
	tried := map[string]int{}
	for _, a := range streamAttacks() {
		n, err := a.run(ctx, env)
		tried[a.name] += n
		if err != nil {
			t.Errorf("%s: %v", a.name, err)
		}
		// Each attack starts from the baseline, so its figures are its own.
		if _, err := env.pollReport(ctx, "back to the baseline", func(r hsReport) bool {
			return r.SinkActive == 0 && r.FloodActive == 0 && r.Heap <= env.base.Heap+16<<20
		}); err != nil {
			t.Errorf("after %s: %v", a.name, err)
		}
	}
	stopHonest()
	honestDone.Wait()
	for _, g := range []*honest{good, goodStreams} {
		if f := g.fails.Load(); f > 0 || g.calls.Load() == 0 {
			t.Errorf("an honest client: %d of %d calls or streams failed: %v", f, g.calls.Load(), g.errs[:min(len(g.errs), 5)])
		}
	}
	if !node.Alive() {
		t.Fatal("the node died")
	}
	var after rpc.Stats
	var afterRep hsReport
	deadline := time.Now().Add(60 * time.Second)
	for {
		if after, err = hc.Stats(ctx); err != nil {
			t.Fatal(err)
		}
		if afterRep, err = env.report(ctx); err != nil {
			t.Fatal(err)
		}
		if after.Handshakes == 0 && after.Peers == base.Peers && after.Streams <= base.Streams+2 && after.Goroutines <= base.Goroutines+4 &&
			after.OpenFiles <= base.OpenFiles+2 && after.HeapBytes <= base.HeapBytes+16<<20 && afterRep.SinkActive == 0 && afterRep.FloodActive == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the node did not return to its baseline:\n before %+v\n after  %+v", base, after)
		}
		time.Sleep(200 * time.Millisecond)
	}
	t.Logf("after: %+v; %+v", after, afterRep)
	var kinds []string
	for k, n := range tried {
		kinds = append(kinds, fmt.Sprintf("%s: %d", k, n))
	}
	t.Logf("tried: %s", strings.Join(kinds, "; "))
	figs := append([]any{"load", load.Name, "honest_calls", good.calls.Load(), "honest_streams", goodStreams.calls.Load(),
		"honest_slowest_call", time.Duration(good.slow.Load()).Round(time.Millisecond),
		"honest_slowest_stream", time.Duration(goodStreams.slow.Load()).Round(time.Millisecond)}, env.figs...)
	figs = append(figs, "goroutines_before_after", fmt.Sprintf("%d/%d", base.Goroutines, after.Goroutines),
		"heap_before_after", mb(env.base.Heap)+"/"+mb(afterRep.Heap), "rss_before_after", mb(env.base.RSS)+"/"+mb(afterRep.RSS))
	figures(t, figs...)
}
