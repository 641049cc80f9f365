package rpc

import (
	"bufio"
	"context"
	"runtime/metrics"
	"sync"
	"testing"
	"time"

	"github.com/tensorwire/tensorwire/memmap"
	"github.com/tensorwire/tensorwire/tensordict"
)

type claimReq struct {
	X TD `codec:"x"`
}

// heapBytes is the bytes of heap objects, live or not yet swept.
func heapBytes() uint64 {
	s := []metrics.Sample{{Name: "/memory/classes/heap/objects:bytes"}}
	metrics.Read(s)
	return s[0].Value.Uint64()
}

// TestServer_BodiesClaimedAndNotSentAreBounded: a peer whose requests claim
// large bytes-mode bodies and send none of them makes the node allocate at
// most MaxBodyBytes for them (before: every claim was allocated, 40 x 256
// MiB here), and the node serves others meanwhile.
func TestServer_BodiesClaimedAndNotSentAreBounded(t *testing.T) {
	l := DefaultLimits()
	l.MaxBodyBytes = 256 << 20
	l.TransferGrace = time.Minute
	s, addr := startServer(t, WithLimits(l))
	must(t, Register(s, "test.claim", func(ctx context.Context, m claimReq) (Empty, error) { return Empty{}, nil }))
	must(t, Register(s, methodEcho, func(ctx context.Context, m echoMsg) (echoMsg, error) { return m, nil }))
	p := dialRaw(t, addr, nil)
	before := heapBytes()
	const claims = 40
	size := l.MaxBodyBytes
	for range claims {
		w := &wireTD{Batch: []int{int(size / 4)}, Entries: []wireEntry{{Key: []string{"x"}, Kind: kindTensor, DType: "torch.float32", Shape: []int{int(size / 4)}}}}
		args, err := encodeMsgpack(&claimReq{X: TD{wire: w}})
		must(t, err)
		st := p.stream(t)
		bw := bufio.NewWriter(st)
		must(t, writeFrame(bw, &requestHeader{Method: "test.claim", ArgLen: int64(len(args)), BodyLen: size, RawLen: size}, args))
		bw.Write(make([]byte, 4096)) // a little of the body, then nothing
		must(t, bw.Flush())
	}
	// Every claim has reached the node: its streams are being served.
	deadline := time.Now().Add(30 * time.Second)
	for s.Stats().Streams < claims {
		if time.Now().After(deadline) {
			t.Fatalf("the node serves %d streams, want %d", s.Stats().Streams, claims)
		}
		time.Sleep(10 * time.Millisecond)
	}
	echo(t, dial(t, addr)) // served meanwhile; and the claims have had time to allocate
	if grown := int64(heapBytes()) - int64(before); grown > 4*l.MaxBodyBytes {
		t.Fatalf("the node's heap grew by %d MB for %d claims of %d MB sent no further; want at most %d MB (4 x MaxBodyBytes)", grown>>20, claims, size>>20, 4*l.MaxBodyBytes>>20)
	}
}

// TestServer_BodiesLargerTogetherThanTheBudget: calls of one client whose
// bodies together pass MaxBodyBytes all succeed, one after another (each
// holds its body's share until its handler returns), whichever connection
// their bodies come on (side connections or yamux).
func TestServer_BodiesLargerTogetherThanTheBudget(t *testing.T) {
	for _, side := range []bool{true, false} {
		t.Run(map[bool]string{true: "side", false: "yamux"}[side], func(t *testing.T) { bodiesOverBudget(t, side) })
	}
}

func bodiesOverBudget(t *testing.T, side bool) {
	l := DefaultLimits()
	l.MaxBodyBytes = 8 << 20
	s, addr := startServer(t, WithLimits(l))
	type sumReq struct {
		X TD `codec:"x"`
	}
	var mu sync.Mutex
	inside, most := 0, 0
	must(t, Register(s, "test.sum", func(ctx context.Context, m sumReq) (int64, error) {
		mu.Lock()
		inside++
		most = max(most, inside)
		mu.Unlock()
		defer func() {
			mu.Lock()
			inside--
			mu.Unlock()
		}()
		time.Sleep(time.Millisecond)
		v, err := m.X.Get("x")
		if err != nil {
			return 0, err
		}
		b, err := v.(*tensordict.Tensor).Bytes()
		if err != nil {
			return 0, err
		}
		var sum int64
		for _, x := range b {
			sum += int64(x)
		}
		return sum, nil
	}))
	c := dial(t, addr, WithLimits(l), WithCompression(false), WithSideConnections(side))
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	const calls = 6
	errs := make(chan error, calls)
	for i := range calls {
		go func() {
			x, err := tensordict.Zeros(memmap.Uint8, 5<<20)
			if err != nil {
				errs <- err
				return
			}
			b, _ := x.Bytes()
			for j := range b {
				b[j] = byte(i)
			}
			td, err := tensordict.New(5 << 20)
			if err == nil {
				err = td.Set("x", x)
			}
			if err != nil {
				errs <- err
				return
			}
			got, err := Call[int64](ctx, c, "test.sum", sumReq{X: Ref(td)})
			if err == nil && got != int64(i)*5<<20 {
				t.Errorf("call %d: sum %d", i, got)
			}
			errs <- err
		}()
	}
	for range calls {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
	if most != 1 {
		t.Errorf("%d handlers held 5 MiB bodies at once under a budget of 8 MiB, want 1", most)
	}
}
