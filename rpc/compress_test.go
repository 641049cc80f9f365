package rpc

import (
	"bufio"
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"io"
	"math"
	"math/rand/v2"
	"runtime"
	"sync/atomic"
	"testing"
	"time"

	"github.com/pierrec/lz4/v4"

	"github.com/tensorwire/tensorwire/internal/testkit/proctest"
	"github.com/tensorwire/tensorwire/memmap"
	"github.com/tensorwire/tensorwire/tensordict"
)

// Calls with TDs that the compression tests register.
const (
	methodSinkTD = "test.sinktd" // takes a TD, returns nothing
	methodIncTD  = "test.inctd"  // adds 1 to every byte of its TD, which comes back (Out)
	methodGenTD  = "test.gentd"  // returns n Atari-like frames (req.N), or random floats when req.S is "random"
)

type sinkReq struct {
	X TD     `codec:"x"`
	N int    `codec:"n"`
	S string `codec:"s"`
}

type genResp struct {
	X TD `codec:"x"`
}

func registerTDCalls(t testing.TB, s *Server) {
	t.Helper()
	for _, err := range []error{
		Register(s, methodSinkTD, func(ctx context.Context, req sinkReq) (Empty, error) { return Empty{}, nil }),
		Register(s, methodIncTD, func(ctx context.Context, req sinkReq) (Empty, error) {
			for _, x := range req.X.Leaves() {
				b, err := x.Bytes()
				if err != nil {
					return Empty{}, err
				}
				for i := range b {
					b[i]++
				}
			}
			return Empty{}, nil
		}),
		Register(s, methodGenTD, func(ctx context.Context, req sinkReq) (genResp, error) {
			if req.S == "random" {
				return genResp{X: Ref(randomFloatTD(req.N))}, nil
			}
			return genResp{X: Ref(atariTD(req.N))}, nil
		}),
	} {
		if err != nil {
			t.Fatal(err)
		}
	}
}

// atariFrames returns n observations as Atari agents see them after the
// usual preprocessing: uint8 [n, 84, 84, 4], four stacked grayscale frames
// a step apart, a constant background with a darker band (the score area)
// and two walls, and a few small objects (paddles, a ball) that move
// between frames.
func atariFrames(n int) []byte {
	const h, w, k = 84, 84, 4
	b := make([]byte, n*h*w*k)
	for i := range n {
		obs := b[i*h*w*k : (i+1)*h*w*k]
		for f := range k {
			step := i + f
			px := func(y, x int, v byte) {
				if y >= 0 && y < h && x >= 0 && x < w {
					obs[(y*w+x)*k+f] = v
				}
			}
			for y := range h {
				for x := range w {
					v := byte(87)
					switch {
					case y < 10:
						v = 52 // the score band
					case y < 12 || y > 80:
						v = 236 // walls
					}
					px(y, x, v)
				}
			}
			for d := range 3 { // score digits
				for y := 2; y < 8; y++ {
					px(y, 20+d*5+(step/50+d)%3, 200)
				}
			}
			for dy := range 8 { // paddles
				px(30+(step*3)%40+dy, 8, 147)
				px(30+(step*3)%40+dy, 9, 147)
				px(50-(step*2)%30+dy, 74, 92)
				px(50-(step*2)%30+dy, 75, 92)
			}
			bx, by := 12+(step*5)%60, 14+(step*3)%60 // the ball
			for dy := range 2 {
				for dx := range 2 {
					px(by+dy, bx+dx, 236)
				}
			}
		}
	}
	return b
}

func atariTD(n int) *tensordict.TensorDict {
	x, err := tensordict.FromBytes(memmap.Uint8, []int{n, 84, 84, 4}, atariFrames(n))
	if err != nil {
		panic(err)
	}
	td, _ := tensordict.New(n)
	if err := td.Set("obs", x); err != nil {
		panic(err)
	}
	return td
}

// randomFloatTD returns n rows of 1024 normal float32s.
func randomFloatTD(n int) *tensordict.TensorDict {
	r := rand.New(rand.NewPCG(uint64(n), 7))
	b := make([]byte, n*1024*4)
	for i := 0; i < len(b); i += 4 {
		binary.LittleEndian.PutUint32(b[i:], math.Float32bits(float32(r.NormFloat64())))
	}
	x, err := tensordict.FromBytes(memmap.Float32, []int{n, 1024}, b)
	if err != nil {
		panic(err)
	}
	td, _ := tensordict.New(n)
	if err := td.Set("x", x); err != nil {
		panic(err)
	}
	return td
}

// firstLeaf returns td's first tensor.
func firstLeaf(t testing.TB, td *tensordict.TensorDict) *tensordict.Tensor {
	t.Helper()
	for _, x := range td.Leaves() {
		return x
	}
	t.Fatal("a TensorDict without tensors")
	return nil
}

// TestCompression_Calls sends compressible and incompressible TDs both
// ways with compression on and off on each side, and counts what crosses.
func TestCompression_Calls(t *testing.T) {
	const frames = 32 // 903 KB
	for _, tc := range []struct {
		name             string
		server, client   []Option
		ctx              func(context.Context) context.Context
		data             string
		upSmall, dnSmall bool // compressed each way
	}{
		{"atari, on", nil, nil, nil, "atari", true, true},
		{"atari, client off", nil, []Option{WithCompression(false)}, nil, "atari", false, false},
		{"atari, server off", []Option{WithCompression(false)}, nil, nil, "atari", true, false},
		{"atari, Uncompressed call", nil, nil, Uncompressed, "atari", false, false},
		{"random floats, on", nil, nil, nil, "random", false, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			n := startStreamNode(t, tc.server...)
			f := proctest.StartProxy(t, n.addr)
			c := dial(t, f.Addr, tc.client...)
			ctx := testCtx(t)
			if tc.ctx != nil {
				ctx = tc.ctx(ctx)
			}
			var td *tensordict.TensorDict
			if tc.data == "atari" {
				td = atariTD(frames)
			} else {
				td = randomFloatTD(220) // 901 KB
			}
			x := firstLeaf(t, td)
			want, _ := x.Bytes()
			want = bytes.Clone(want)
			raw := int64(len(want))
			up0, dn0 := f.Up.Load(), f.Down.Load()
			if _, err := Call[Empty](ctx, c, methodIncTD, sinkReq{X: TD{TensorDict: td, Out: true}}); err != nil {
				t.Fatal(err)
			}
			got, _ := x.Bytes()
			for i := range want {
				if got[i] != want[i]+1 {
					t.Fatalf("byte %d came back as %d, want %d", i, got[i], want[i]+1)
				}
			}
			// The proxy counts a chunk after passing it on: wait for what
			// an uncompressed message must come to; a compressed one only
			// gets smaller by waiting less.
			check := func(dir string, n *atomic.Int64, n0 int64, small bool) {
				if !small {
					waitFor(t, dir+" to cross uncompressed", func() bool { return n.Load()-n0 >= raw })
				} else if got := n.Load() - n0; got > raw/4 {
					t.Errorf("%s: %d bytes crossed for %d, want it compressed", dir, got, raw)
				}
			}
			check("the request", &f.Up, up0, tc.upSmall)
			check("the response", &f.Down, dn0, tc.dnSmall)
			t.Logf("%d bytes: %d up, %d down", raw, f.Up.Load()-up0, f.Down.Load()-dn0)
		})
	}
}

// TestCompression_Results: a handler's result TD comes back compressed
// when it pays, and intact.
func TestCompression_Results(t *testing.T) {
	n := startStreamNode(t)
	f := proctest.StartProxy(t, n.addr)
	c := dial(t, f.Addr)
	ctx := testCtx(t)
	for _, tc := range []struct {
		kind string
		n    int
		want []byte
	}{
		{"atari", 16, atariFrames(16)},
		{"random", 64, nil},
	} {
		dn0 := f.Down.Load()
		resp, err := Call[genResp](ctx, c, methodGenTD, sinkReq{N: tc.n, S: tc.kind})
		must(t, err)
		x := firstLeaf(t, resp.X.TensorDict)
		got, _ := x.Bytes()
		if tc.want == nil {
			want, _ := firstLeaf(t, randomFloatTD(tc.n)).Bytes()
			tc.want = want
		}
		if !bytes.Equal(got, tc.want) {
			t.Fatalf("%s: the result differs", tc.kind)
		}
		// The proxy counts a chunk after passing it on: wait for what an
		// uncompressed result must come to.
		if tc.kind == "random" {
			waitFor(t, "the uncompressed result", func() bool { return f.Down.Load()-dn0 >= int64(len(got)) })
		} else if dn := f.Down.Load() - dn0; dn > int64(len(got))/4 {
			t.Errorf("%s: %d bytes crossed for %d", tc.kind, dn, len(got))
		}
		t.Logf("%s: %d bytes for %d", tc.kind, f.Down.Load()-dn0, len(got))
	}
}

// lz4Frame compresses b as this package does.
func lz4Frame(t testing.TB, b []byte) []byte {
	var buf bytes.Buffer
	w := lz4.NewWriter(&buf)
	if err := w.Apply(lz4Options...); err != nil {
		t.Fatal(err)
	}
	w.Write(b)
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

// rawCompressed sends a request to methodSinkTD whose TD needs rawLen bytes
// and whose body is body, marked compressed, on a new stream of p, and
// returns the response header, or the error reading it.
func rawCompressed(t *testing.T, p *rawPeer, rawLen int64, body []byte) (responseHeader, error) {
	t.Helper()
	w := &wireTD{Batch: []int{1}, Entries: []wireEntry{{Key: []string{"x"}, Kind: kindTensor, DType: "uint8", Shape: []int{1, int(rawLen)}}}}
	args, err := encodeMsgpack(&sinkReq{X: TD{wire: w}})
	must(t, err)
	st := p.stream(t)
	defer st.Close()
	st.SetDeadline(time.Now().Add(5 * time.Second))
	bw := bufio.NewWriter(st)
	must(t, writeFrame(bw, &requestHeader{Method: methodSinkTD, ArgLen: int64(len(args)), BodyLen: int64(len(body)), RawLen: rawLen}, args))
	bw.Write(body)
	must(t, bw.Flush())
	var rh responseHeader
	err = readHeader(bufio.NewReader(st), 64<<10, &rh)
	return rh, err
}

// TestCompression_CorruptBody sends compressed bodies that are not what
// they claim: InvalidArgument, and the connection goes on.
func TestCompression_CorruptBody(t *testing.T) {
	n := startStreamNode(t)
	p := dialRaw(t, n.addr, nil)
	plain := atariFrames(1)
	frame := lz4Frame(t, plain)
	longer := lz4Frame(t, append(bytes.Clone(plain), 1, 2, 3))
	garbage := make([]byte, 200)
	rand.NewChaCha8([32]byte{1}).Read(garbage)
	for _, tc := range []struct {
		name string
		raw  int64
		body []byte
		want Code
	}{
		{"valid", int64(len(plain)), frame, OK},
		{"garbage", 4096, garbage, InvalidArgument},
		{"truncated", int64(len(plain)), frame[:len(frame)/2], InvalidArgument},
		{"inflates short of raw_len", int64(len(plain)) + 10, frame, InvalidArgument},
		{"inflates past raw_len", int64(len(plain)), longer, InvalidArgument},
		{"a frame, then bytes", int64(len(plain)), append(bytes.Clone(frame), 0xde, 0xad), InvalidArgument},
	} {
		rh, err := rawCompressed(t, p, tc.raw, tc.body)
		if err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		if Code(rh.Code) != tc.want {
			t.Errorf("%s: %v %q, want %v", tc.name, Code(rh.Code), rh.Message, tc.want)
		}
	}
	if Code(p.rawCall(t, methodEcho, echoMsg{N: 1}, nil).Code) != OK {
		t.Fatal("the connection does not serve calls after corrupt bodies")
	}
}

// TestCompression_Bomb sends headers whose compressed bodies claim to
// inflate past what they can, or past MaxBodyBytes: the connection is
// closed before anything is allocated for the claim.
func TestCompression_Bomb(t *testing.T) {
	l := hostileLimits()
	l.MaxBodyBytes = 2 << 30
	n := startStreamNode(t, WithLimits(l))
	for _, tc := range []struct {
		name      string
		raw, body int64
	}{
		{"past the ratio LZ4 can reach", 1 << 30, 100},
		{"past MaxBodyBytes", 3 << 30, 20 << 20},
		{"negative", -5, 100},
		{"no body", 100, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := dialRaw(t, n.addr, nil)
			var before, after runtime.MemStats
			runtime.ReadMemStats(&before)
			st := p.stream(t)
			bw := bufio.NewWriter(st)
			must(t, writeFrame(bw, &requestHeader{Method: methodSinkTD, ArgLen: 1, BodyLen: tc.body, RawLen: tc.raw}, []byte{0x80}))
			bw.Flush()
			p.expectSessionClosed(t, 5*time.Second)
			runtime.ReadMemStats(&after)
			if grew := after.TotalAlloc - before.TotalAlloc; grew > 64<<20 {
				t.Fatalf("%d bytes allocated for a refused claim of %d", grew, tc.raw)
			}
		})
	}
	echo(t, dial(t, n.addr))
}

// TestCompression_Version1Refused: a version 1 connection carries no
// compressed bodies; one that comes anyway closes it.
func TestCompression_Version1Refused(t *testing.T) {
	n := startStreamNode(t)
	p, err := newRawPeerVersion(n.addr, nil, 1)
	must(t, err)
	t.Cleanup(func() { p.sess.Close(); p.conn.Close() })
	st := p.stream(t)
	body := lz4Frame(t, make([]byte, 4096))
	bw := bufio.NewWriter(st)
	must(t, writeFrame(bw, &requestHeader{Method: methodSinkTD, ArgLen: 1, BodyLen: int64(len(body)), RawLen: 4096}, []byte{0x80}))
	bw.Write(body)
	bw.Flush()
	p.expectSessionClosed(t, 5*time.Second)
	echo(t, dial(t, n.addr))
}

// FuzzLZ4Body reads arbitrary bytes as a compressed body into a tensor:
// nothing panics, corrupt data is an *Error with the code asked for and
// never a failure of the stream, nothing is read past the body, and a
// valid frame of the tensor's size reads back exactly.
func FuzzLZ4Body(f *testing.F) {
	plain := atariFrames(1)[:8192]
	frame := lz4Frame(f, plain)
	f.Add(frame, int64(len(plain)))
	f.Add(frame[:len(frame)-3], int64(len(plain)))
	f.Add(append(bytes.Clone(frame), 7), int64(len(plain)))
	f.Add(lz4Frame(f, make([]byte, 100)), int64(100))
	f.Add([]byte{0x04, 0x22, 0x4d, 0x18, 0x60, 0x70, 0x73, 0xff, 0xff, 0xff, 0x7f}, int64(1<<20))
	f.Add([]byte{}, int64(16))
	f.Fuzz(func(t *testing.T, body []byte, raw int64) {
		lim := Limits{MaxBodyBytes: 1 << 20}
		if checkRaw(int64(len(body)), raw, &lim, true) != nil || raw <= 0 {
			return
		}
		tail := []byte("TAIL")
		src := bufio.NewReader(bytes.NewReader(append(bytes.Clone(body), tail...)))
		br := newBodyReader(src, int64(len(body)), raw).corruptCode(Internal)
		x, err := tensordict.Zeros(memmap.Uint8, int(raw))
		if err != nil {
			t.Fatal(err)
		}
		ferr := br.fill(x)
		if ferr != nil {
			var e *Error
			if !errors.As(ferr, &e) || e.Code != Internal {
				t.Fatalf("fill: %v, want an Internal *Error", ferr)
			}
		}
		if err := br.drain(); err != nil {
			t.Fatalf("drain: %v", err)
		}
		rest, _ := io.ReadAll(src)
		if !bytes.Equal(rest, tail) {
			t.Fatalf("read into what follows the body: %q left", rest)
		}
		if bytes.Equal(body, frame) && raw == int64(len(plain)) {
			got, _ := x.Bytes()
			if ferr != nil || !bytes.Equal(got, plain) {
				t.Fatalf("a valid frame: %v", ferr)
			}
		}
	})
}
