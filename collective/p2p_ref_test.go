package collective

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/tensorwire/tensorwire/memmap"
	"github.com/tensorwire/tensorwire/rpc"
	"github.com/tensorwire/tensorwire/tensordict"
)

// p2pLayouts are the communicators point-to-point by reference is tested
// on: every pair shares a folder (SHM), none does (TCP), and a hierarchy
// whose host-mates share one (hosts 0 0 1 1).
type p2pLayout struct {
	name  string
	hosts []int // nil: flat
	tr    Transport
}

var p2pLayouts = []p2pLayout{{"shm", nil, SHM}, {"tcp", nil, TCP}, {"hier2x2", []int{0, 0, 1, 1}, Hier}}

func (l p2pLayout) form(t *testing.T, opt func(*Config)) []*Comm {
	t.Helper()
	if l.hosts != nil {
		return hierGroupWith(t, l.hosts, l.tr, opt)
	}
	if l.tr != TCP && runtime.GOOS != "linux" {
		t.Skip("shared mappings need Linux")
	}
	return groupWith(t, 4, l.tr, t.TempDir(), opt)
}

// shares reports whether ranks a and b of the layout share a folder.
func (l p2pLayout) shares(a, b int) bool {
	switch {
	case l.tr == TCP:
		return false
	case l.hosts == nil:
		return true
	}
	return l.hosts[a] == l.hosts[b]
}

// liveRegions counts c's regions handed out and arenas kept.
func liveRegions(c *Comm) (regions, arenas int) {
	c.p2pOut.mu.Lock()
	defer c.p2pOut.mu.Unlock()
	for a := range c.p2pOut.all {
		regions += a.live
		arenas++
	}
	return regions, arenas
}

// TestP2P_ByReference: every rank sends every other a message of each
// size, and receives them bit for bit. Between ranks that share a folder
// (all on SHM, host-mates in a hierarchy) every message goes by reference
// with its note through the receiver's inbox (Config.ShmSendMin 0), or
// those of at least ShmSendMin (min 4 KiB), counted on both sides; the
// others, and every message with ShmSendMin -1 or over TCP, go inline,
// those of 1 byte to 64 KiB whole (one call), counted. No region stays in
// use.
func TestP2P_ByReference(t *testing.T) {
	sizes := []int{0, 100, ShmSendMinDefault - 8, ShmSendMinDefault, 1<<20 + 24, 3 << 20}
	for _, l := range p2pLayouts {
		for _, least := range []int{0, -1, ShmSendMinDefault} {
			if least != 0 && l.tr == TCP {
				continue
			}
			off := least < 0
			t.Run(fmt.Sprintf("%s/min=%d", l.name, least), func(t *testing.T) {
				comms := l.form(t, func(c *Config) { c.ShmSendMin = least })
				n := len(comms)
				// msg returns the bytes rank src sends rank dst at size i.
				msg := func(src, dst, i int) *tensordict.Tensor {
					var seed [32]byte
					seed[0], seed[1], seed[2] = byte(src), byte(dst), byte(i)
					b := make([]byte, sizes[i])
					rand.NewChaCha8(seed).Read(b) // a loop of rng calls took most of the test under the race detector
					x, _ := tensordict.FromBytes(memmap.Uint8, []int{len(b)}, b)
					return x
				}
				all(t, comms, func(ctx context.Context, c *Comm) (int, error) {
					me := c.Rank()
					var reqs []*Request
					var bufs []*tensordict.Tensor
					var from []int
					for i := range sizes {
						for peer := range n {
							if peer == me {
								continue
							}
							reqs = append(reqs, c.Isend(ctx, msg(me, peer, i), peer, i))
							buf, _ := tensordict.Zeros(memmap.Uint8, sizes[i])
							bufs = append(bufs, buf)
							from = append(from, peer, i)
							reqs = append(reqs, c.Irecv(ctx, buf, peer, i))
						}
					}
					for _, r := range reqs {
						if err := r.Wait(ctx); err != nil {
							return 0, err
						}
					}
					for j, buf := range bufs {
						got, _ := buf.Bytes()
						want, _ := msg(from[2*j], me, from[2*j+1]).Bytes()
						if !bytes.Equal(got, want) {
							t.Errorf("rank %d: the %d bytes from rank %d differ", me, len(want), from[2*j])
						}
					}
					return 0, nil
				})
				for r, c := range comms {
					want, whole := 0, 0
					for peer := range n {
						if peer == r {
							continue
						}
						for _, s := range sizes {
							switch {
							case !off && l.shares(r, peer) && s >= least:
								want++
							case s > 0 && s <= wholeMax:
								whole++ // inline, in one call (protocol 10)
							}
						}
					}
					if got := int(c.p2pStat.whole.Load()); got != whole {
						t.Errorf("rank %d: %d messages sent whole, want %d", r, got, whole)
					}
					if s, g := int(c.p2pStat.sent.Load()), int(c.p2pStat.received.Load()); s != want || g != want {
						t.Errorf("rank %d: %d messages sent and %d received by reference, want %d each", r, s, g, want)
					}
					if rung := int(c.p2pStat.rung.Load()); rung != want {
						t.Errorf("rank %d: %d messages announced through an inbox, want %d (every one by reference)", r, rung, want)
					}
					if regions, _ := liveRegions(c); regions != 0 {
						t.Errorf("rank %d: %d regions still in use", r, regions)
					}
				}
			})
		}
	}
}

// TestP2P_ManyInFlight: every rank has many Isends and Irecvs in flight
// with every other, on four tags, of sizes inline and by reference mixed
// within a tag, the receives posted tag by tag in reverse: each message
// lands in the receive of its pair and tag in send order
// (non-overtaking), whatever its size.
func TestP2P_ManyInFlight(t *testing.T) {
	const tags, per = 4, 6
	size := func(k int) int { return []int{8, 200 << 10, 16, 1 << 20, 64 << 10, 24}[k%6] } // bytes, multiples of 8
	for _, l := range p2pLayouts {
		t.Run(l.name, func(t *testing.T) {
			comms := l.form(t, nil)
			n := len(comms)
			all(t, comms, func(ctx context.Context, c *Comm) (int, error) {
				me := c.Rank()
				var sends []*Request
				for k := range per {
					for tag := range tags {
						for peer := range n {
							if peer != me {
								v := make([]int64, size(k)/8)
								for i := range v {
									v[i] = int64(me<<24 | peer<<16 | tag<<8 | k)
								}
								x, _ := tensordict.FromSlice(v)
								sends = append(sends, c.Isend(ctx, x, peer, tag))
							}
						}
					}
				}
				type recv struct {
					r            *Request
					peer, tag, k int
				}
				var recvs []recv
				for tag := tags - 1; tag >= 0; tag-- {
					for peer := range n {
						for k := range per {
							if peer != me {
								buf, _ := tensordict.Zeros(memmap.Int64, size(k)/8)
								recvs = append(recvs, recv{c.Irecv(ctx, buf, peer, tag), peer, tag, k})
							}
						}
					}
				}
				for _, r := range append(sends, nil) {
					if r == nil {
						break
					}
					if err := r.Wait(ctx); err != nil {
						return 0, err
					}
				}
				for _, r := range recvs {
					if err := r.r.Wait(ctx); err != nil {
						return 0, err
					}
					v, _ := tensordict.Values[int64](r.r.Tensor())
					want := int64(r.peer<<24 | me<<16 | r.tag<<8 | r.k)
					for i := range v {
						if v[i] != want {
							t.Errorf("rank %d: message %d with tag %d from rank %d holds %x at %d, want %x", me, r.k, r.tag, r.peer, v[i], i, want)
							break
						}
					}
				}
				return 0, nil
			})
			for r, c := range comms {
				if regions, _ := liveRegions(c); regions != 0 {
					t.Errorf("rank %d: %d regions still in use", r, regions)
				}
				if l.tr != TCP && c.p2pStat.sent.Load() == 0 {
					t.Errorf("rank %d sent nothing by reference", r)
				}
			}
		})
	}
}

// TestP2P_TruncatedReference: the sender's p2p file truncated (by hand)
// as the reference goes: after the bytes are in it (1 MiB, one chunk: the
// receiver faults) or before the first chunk of a pipelined message (3
// MiB: the sender faults copying in, the receiver on the file). An error
// on both sides, never a SIGBUS, whether the receiver had mapped the file
// (a fault: memmap.ErrFault) or maps it then (too short). The
// communicator goes on: the next message goes through a new file, and
// after Close nothing is left in the folder.
func TestP2P_TruncatedReference(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("shared mappings need Linux")
	}
	for _, tc := range []struct {
		mapped bool
		elems  int
	}{{true, 1 << 17}, {false, 1 << 17}, {true, 3 << 17}, {false, 3 << 17}} {
		mapped := tc.mapped
		t.Run(fmt.Sprintf("mapped=%v/%dMiB", mapped, tc.elems>>17), func(t *testing.T) {
			dir := t.TempDir()
			comms := groupWith(t, 2, SHM, dir, nil)
			x := func(v float64) *tensordict.Tensor {
				s := make([]float64, tc.elems)
				for i := range s {
					s[i] = v + float64(i)
				}
				t, _ := tensordict.FromSlice(s)
				return t
			}
			pass := func(v float64) []error {
				_, errs := onAll(t, comms, func(ctx context.Context, c *Comm) (int, error) {
					if c.Rank() == 0 {
						return 0, c.Send(ctx, x(v), 1, 0)
					}
					buf := f64(t, tc.elems)
					if err := c.Recv(ctx, buf, 0, 0); err != nil {
						return 0, err
					}
					got, _ := buf.Bytes()
					want, _ := x(v).Bytes()
					if !bytes.Equal(got, want) {
						return 0, fmt.Errorf("the message received differs")
					}
					return 0, nil
				})
				return errs
			}
			if mapped {
				if errs := pass(1); errs[0] != nil || errs[1] != nil {
					t.Fatalf("first message: %v", errs)
				}
			}
			p2pRefHook = func(path string) {
				if err := os.Truncate(path, 0); err != nil {
					t.Error(err)
				}
			}
			errs := pass(2)
			p2pRefHook = nil
			if errs[0] == nil || errs[1] == nil {
				t.Fatalf("truncated: sender %v, receiver %v; want an error on both", errs[0], errs[1])
			}
			if mapped && !errors.Is(errs[1], memmap.ErrFault) {
				t.Errorf("receiver: %v, want memmap.ErrFault", errs[1])
			}
			if !mapped && !errors.Is(errs[1], memmap.ErrShortFile) {
				t.Errorf("receiver: %v, want memmap.ErrShortFile", errs[1])
			}
			if tc.elems > refChunk && !errors.Is(errs[0], memmap.ErrFault) {
				t.Errorf("sender of a pipelined message: %v, want memmap.ErrFault", errs[0])
			}
			t.Logf("sender: %v; receiver: %v", errs[0], errs[1])
			if errs := pass(3); errs[0] != nil || errs[1] != nil {
				t.Fatalf("the message after: %v", errs)
			}
			if regions, arenas := liveRegions(comms[0]); regions != 0 || arenas != 1 {
				t.Errorf("sender: %d regions in use, %d arenas; want 0 and 1 (the truncated one dropped)", regions, arenas)
			}
			for _, c := range comms {
				c.Close()
			}
			if ents, _ := os.ReadDir(dir); len(ents) != 0 {
				t.Errorf("left in the folder after Close: %v", ents)
			}
		})
	}
}

// TestP2P_FailuresByReference: a message by reference that fails (another
// dtype at the receiver, the sender's context ending before the receiver
// posts, the receiver closing) fails as inline ones do, frees its region,
// and leaves nothing in the folder after Close.
func TestP2P_FailuresByReference(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("shared mappings need Linux")
	}
	dir := t.TempDir()
	comms := groupWith(t, 3, SHM, dir, nil)
	big := func() *tensordict.Tensor { return f64(t, 1<<17) }

	// Another dtype: ErrMismatch on both sides, before any byte moves.
	_, errs := onAll(t, comms[:2], func(ctx context.Context, c *Comm) (int, error) {
		if c.Rank() == 0 {
			return 0, c.Send(ctx, big(), 1, 0)
		}
		y, _ := tensordict.Zeros(memmap.Int64, 1<<17)
		return 0, c.Recv(ctx, y, 0, 0)
	})
	for r, err := range errs {
		if !errors.Is(err, ErrMismatch) {
			t.Errorf("mismatch: rank %d: %v, want ErrMismatch", r, err)
		}
	}

	// The sender's context ends before the receiver posts: the sender
	// fails with it and withdraws the region; a receive posted later
	// fails (or waits for its own context), never reading a reused region.
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	r := comms[0].Isend(ctx, big(), 1, 1)
	if err := r.Wait(context.Background()); !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("withdrawn: sender: %v, want its deadline", err)
	}
	cancel()
	ctx, cancel = context.WithTimeout(context.Background(), 300*time.Millisecond)
	if err := comms[1].Recv(ctx, big(), 0, 1); err == nil {
		t.Errorf("withdrawn: the receive posted after succeeded")
	}
	cancel()

	// Still usable, both ways.
	all(t, comms[:2], func(ctx context.Context, c *Comm) (int, error) {
		if c.Rank() == 0 {
			return 0, c.Send(ctx, big(), 1, 2)
		}
		return 0, c.Recv(ctx, big(), 0, 2)
	})
	if regions, _ := liveRegions(comms[0]); regions != 0 {
		t.Errorf("rank 0: %d regions in use", regions)
	}

	// The receiver closes while the sender waits: ErrPeerLost.
	done := make(chan error, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		done <- comms[2].Send(ctx, big(), 1, 3)
	}()
	// Close once the send holds its region (it holds it until rank 1
	// answers, which it does not before closing).
	var err error
	for waiting := true; waiting; {
		select {
		case err = <-done:
			t.Fatalf("the send ended before rank 1 closed: %v", err)
		default:
		}
		regions, _ := liveRegions(comms[2])
		waiting = regions == 0
		runtime.Gosched()
	}
	comms[1].Close()
	if err = <-done; !errors.Is(err, ErrPeerLost) {
		t.Errorf("receiver closed: sender: %v, want ErrPeerLost", err)
	}
	if regions, _ := liveRegions(comms[2]); regions != 0 {
		t.Errorf("rank 2: %d regions in use after its failed send", regions)
	}
	for _, c := range comms {
		c.Close()
	}
	if ents, _ := os.ReadDir(dir); len(ents) != 0 {
		t.Errorf("left in the folder after Close: %v", ents)
	}
}

// TestP2P_AdjointByReference: the dot-product test of Send/Recv and
// Isend/Irecv with every message by reference (ShmSendMin 1), on shared
// mappings and a hierarchy's host-mates.
func TestP2P_AdjointByReference(t *testing.T) {
	for _, l := range p2pLayouts {
		if l.tr == TCP {
			continue
		}
		t.Run(l.name, func(t *testing.T) {
			comms := l.form(t, func(c *Config) { c.ShmSendMin = 1 })
			var cases []adjCase
			for _, ac := range adjCases(len(comms)) {
				if strings.Contains(ac.name, "send") || strings.Contains(ac.name, "Send") {
					cases = append(cases, ac)
				}
			}
			dotProductCases(t, comms, cases)
			var sent uint64
			for _, c := range comms {
				sent += c.p2pStat.sent.Load()
			}
			if sent == 0 {
				t.Errorf("no message went by reference")
			}
		})
	}
}

// TestP2P_FaultOnTensors: a sender's tensor or a receiver's that is a
// mapping whose file was truncated, sent by reference (one chunk, and
// pipelined): the rank whose tensor faulted fails with memmap.ErrFault,
// the other with an error too, never a SIGBUS; the communicator goes on
// and no region stays in use.
func TestP2P_FaultOnTensors(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("shared mappings need Linux")
	}
	comms := group(t, 2, SHM)
	for _, elems := range []int{1 << 17, 3 << 17} {
		for _, bad := range []int{0, 1} { // the sender's tensor, the receiver's
			t.Run(fmt.Sprintf("%dMiB/rank%d", elems>>17, bad), func(t *testing.T) {
				path := filepath.Join(t.TempDir(), "t")
				mm, err := memmap.Create(path, memmap.Float64, elems)
				if err != nil {
					t.Fatal(err)
				}
				t.Cleanup(func() { mm.Close() })
				badT, err := tensordict.View(mm, 0, elems)
				if err != nil {
					t.Fatal(err)
				}
				if err := os.Truncate(path, 0); err != nil {
					t.Fatal(err)
				}
				_, errs := onAll(t, comms, func(ctx context.Context, c *Comm) (int, error) {
					x := f64(t, elems)
					if c.Rank() == bad {
						x = badT
					}
					if c.Rank() == 0 {
						return 0, c.Send(ctx, x, 1, 0)
					}
					return 0, c.Recv(ctx, x, 0, 0)
				})
				t.Logf("errors: %v", errs)
				if !errors.Is(errs[bad], memmap.ErrFault) {
					t.Errorf("rank %d, whose tensor faulted: %v, want memmap.ErrFault", bad, errs[bad])
				}
				if errs[1-bad] == nil {
					t.Errorf("rank %d: no error", 1-bad)
				}
				all(t, comms, func(ctx context.Context, c *Comm) (int, error) {
					if c.Rank() == 0 {
						return 0, c.Send(ctx, f64(t, elems), 1, 0)
					}
					return 0, c.Recv(ctx, f64(t, elems), 0, 0)
				})
				if regions, _ := liveRegions(comms[0]); regions != 0 {
					t.Errorf("rank 0: %d regions in use", regions)
				}
			})
		}
	}
}

// TestP2P_MalformedReference: references a sender that lost count, or a
// stranger, could send, handed to a receiver's handler directly: each
// fails the receive and the sender's call with an error (never a fault or
// a panic), and the communicator goes on.
func TestP2P_MalformedReference(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("shared mappings need Linux")
	}
	comms := group(t, 2, SHM)
	// A real arena of rank 0's, so that only the reference is wrong.
	sendOne(t, comms, 0)
	c := comms[1]
	size := uint64(arenaMin)
	for i, ref := range []p2pRef{
		{Gen: 1, ID: 99, Len: 8 << 10, Off: 0, Size: size},            // another message's id
		{Gen: 1, ID: 1, Len: size, Off: 0, Size: size},                // past the arena
		{Gen: 1, ID: 1, Len: 8, Off: 100, Size: size},                 // not a region's offset
		{Gen: 1, ID: 1, Len: 8, Off: size, Size: size},                // at the end
		{Gen: 7, ID: 1, Len: 8 << 10, Off: 0, Size: size},             // no such arena
		{Gen: 1, ID: 1, Len: 8 << 10, Off: 0, Size: 2 * size},         // larger than the file
		{Gen: 1, ID: 1, Len: 8 << 10, Off: 0, Size: refHeader - 1},    // smaller than a header
		{Gen: 1, ID: 1, Len: 8 << 10, Off: 0, Size: refMaxBytes << 1}, // absurd
		// A shared buffer's (protocol 8): a region with bytes of its own,
		// an absurd length or offset in the buffer.
		{Buf: &p2pBuf{Idx: 0, Len: 8 << 10}, Gen: 1, ID: 1, Len: 8 << 10, Off: 0, Size: size},
		{Buf: &p2pBuf{Idx: 0, Len: refMaxBytes << 1}, Gen: 1, ID: 1, Off: 0, Size: size},
		{Buf: &p2pBuf{Idx: 0, Len: 8 << 10, Off: refMaxBytes << 1}, Gen: 1, ID: 1, Off: 0, Size: size},
	} {
		herr, rerr := forgeRef(t, c, 100+i, ref)
		if herr == nil || rerr == nil {
			t.Errorf("reference %+v (buf %+v): the sender's answer %v, the receive's %v; want errors", ref, ref.Buf, herr, rerr)
		}
		if errors.Is(rerr, memmap.ErrFault) {
			t.Errorf("reference %+v: %v, a fault", ref, rerr)
		}
		if ref.Buf != nil && !strings.Contains(fmt.Sprint(herr), "malformed") {
			t.Errorf("reference %+v (buf %+v): %v, want it refused as malformed", ref, ref.Buf, herr)
		}
	}
	sendOne(t, comms, 1)
}

// TestP2P_SenderGaveUpIsAborted: a message whose sender gave up on it
// (withdrew it before the receiver claimed it, or failed part-way through
// its pipeline) fails its receive with ErrAborted naming the sender, as
// the communicator's failures do, so that a receiver learns the peer
// abandoned the exchange, not of an unclassified error. A kill test
// (TestProcess_P2PRankKilled) found a survivor failing with the plain
// error when its sender withdrew on its own communicator failing.
func TestP2P_SenderGaveUpIsAborted(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("shared mappings need Linux")
	}
	comms := group(t, 2, SHM)
	sendOne(t, comms, 0)
	c, a := comms[1], comms[0].p2pOut.cur
	for i, tc := range []struct {
		name  string
		state uint64
		fill  uint32
		want  string
	}{
		{"withdrawn", stateWord(1000, refWithdrawn), 0, "rank 0 withdrew its message"},
		{"failed part-way", stateWord(1001, refReady), fillFailed, "rank 0 gave up on its message part-way"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			a.m.Uint64(0).Store(tc.state)
			a.m.Uint32(refFill).Store(tc.fill)
			ref := p2pRef{Gen: a.gen, ID: tc.state >> 2, Len: 8 << 10, Off: 0, Size: uint64(a.size)}
			herr, err := forgeRef(t, c, 200+i, ref)
			if !errors.Is(err, ErrAborted) || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("the receive: %v, want ErrAborted saying %q", err, tc.want)
			}
			if herr == nil {
				t.Errorf("the sender's answer: nil, want the receive's error")
			}
		})
	}
	// The pair still exchanges messages.
	sendOne(t, comms, 1)
}

// sendOne has rank 0 of comms send rank 1 a message of 1 KiB with tag.
func sendOne(t *testing.T, comms []*Comm, tag int) {
	t.Helper()
	all(t, comms, func(ctx context.Context, c *Comm) (int, error) {
		if c.Rank() == 0 {
			return 0, c.Send(ctx, f64(t, 1<<10), 1, tag)
		}
		return 0, c.Recv(ctx, f64(t, 1<<10), 0, tag)
	})
}

// forgeRef delivers to c, as its handler would, a message from rank 0
// with tag whose bytes are said to be at ref, c having posted a receive
// of 1 KiB of float64 for it: the handler's answer to the sender, and
// the receive's error.
func forgeRef(t *testing.T, c *Comm, tag int, ref p2pRef) (answer, recv error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	r := c.Irecv(ctx, f64(t, 1<<10), 0, tag)
	m := meta(memmap.Float64, []int{1 << 10})
	td, _ := tensordict.New()
	mt, _ := tensordict.FromBytes(memmap.Uint8, []int{len(m)}, m)
	if err := td.Set("b", mt); err != nil {
		t.Fatal(err)
	}
	seq := c.recvSeq[p2pKey{0, tag}] - 1
	_, answer = c.box.handle(ctx, msgReq{Session: c.session, Src: 0, Space: spaceP2P, Seq: seq, Tag: int64(tag), Data: rpc.Ref(td), Ref: &ref})
	return answer, r.Wait(ctx)
}

// TestP2P_ArenasGrowAndGo: messages larger than the sender's arena, and
// more in flight than it holds, make new arenas (larger ones); the old
// are removed from the folder once their messages are done, and the
// receiver unmaps them.
func TestP2P_ArenasGrowAndGo(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("shared mappings need Linux")
	}
	comms := group(t, 2, SHM)
	dir := comms[0].shm.folder()
	pass := func(sizes ...int) {
		all(t, comms, func(ctx context.Context, c *Comm) (int, error) {
			var rs []*Request
			for i, n := range sizes {
				if c.Rank() == 0 {
					rs = append(rs, c.Isend(ctx, f64(t, n), 1, i))
				} else {
					rs = append(rs, c.Irecv(ctx, f64(t, n), 0, i))
				}
			}
			for _, r := range rs {
				if err := r.Wait(ctx); err != nil {
					return 0, err
				}
			}
			return 0, nil
		})
	}
	arenas := func() []string {
		m, _ := filepath.Glob(filepath.Join(dir, "p2p-0-*"))
		return m
	}
	pass(1 << 10) // 8 KiB: the first arena, 4 MiB
	if a := arenas(); len(a) != 1 || comms[0].p2pOut.cur.size != arenaMin {
		t.Fatalf("after a small message: %v", a)
	}
	pass(1 << 20) // 8 MiB: a new arena of 17 MiB, the first removed
	if a := arenas(); len(a) != 1 || !strings.HasSuffix(a[0], "-2") || comms[0].p2pOut.cur.size != 17<<20 {
		t.Fatalf("after an 8 MiB message: %v (%d bytes)", a, comms[0].p2pOut.cur.size)
	}
	pass(1<<20, 1<<20, 1<<20) // three in flight: at least one more arena
	if a := arenas(); len(a) != 1 {
		t.Fatalf("after three 8 MiB messages: %v, want one arena left", a)
	}
	if regions, _ := liveRegions(comms[0]); regions != 0 {
		t.Errorf("%d regions in use", regions)
	}
	comms[1].p2pIn.mu.Lock()
	mapped := len(comms[1].p2pIn.maps)
	comms[1].p2pIn.mu.Unlock()
	if mapped != 1 {
		t.Errorf("the receiver maps %d of rank 0's arenas, want 1", mapped)
	}
	// Small messages only from now on: the large arena serves shrinkAfter
	// of them, then goes for one of the smallest size, and the receiver
	// drops its mapping of the old one.
	big := arenas()[0]
	for range shrinkAfter - 1 {
		pass(1 << 10)
	}
	if a := arenas(); len(a) != 1 || a[0] != big {
		t.Fatalf("after %d small messages: %v, want %s still", shrinkAfter-1, a, big)
	}
	pass(1 << 10)
	pass(1 << 10) // the receiver sees the new generation, and the old one idle
	if a := arenas(); len(a) != 1 || a[0] == big || comms[0].p2pOut.cur.size != arenaMin {
		t.Fatalf("after %d small messages: %v (%d bytes), want one arena of %d in place of %s", shrinkAfter+1, a, comms[0].p2pOut.cur.size, arenaMin, big)
	}
	comms[1].p2pIn.mu.Lock()
	mapped = len(comms[1].p2pIn.maps)
	comms[1].p2pIn.mu.Unlock()
	if mapped != 1 {
		t.Errorf("after the shrink the receiver maps %d of rank 0's arenas, want 1", mapped)
	}
	// A large message again: the arena grows back.
	pass(1 << 20)
	if comms[0].p2pOut.cur.size != 17<<20 {
		t.Errorf("an 8 MiB message after the shrink: arena of %d bytes, want %d", comms[0].p2pOut.cur.size, 17<<20)
	}
}
