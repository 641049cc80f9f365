package rpc

import (
	"context"
	"errors"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/tensorwire/tensorwire/tensordict"
)

// TestWithLimits_PartialLimits sets one limit on each side: the others keep
// their defaults, so calls, which a zero MaxStreamsPerPeer (server) or
// MaxArgBytes (client) would refuse, go through.
func TestWithLimits_PartialLimits(t *testing.T) {
	one := Limits{MaxHeaderBytes: 1 << 20}
	_, addr := startServer(t, WithLimits(one))
	c := dial(t, addr, WithLimits(one))
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for range 3 {
		if _, err := c.Stats(ctx); err != nil {
			t.Fatalf("a call with one limit set on each side: %v", err)
		}
	}
}

func TestLimits_ValidateFillsZeroFields(t *testing.T) {
	d := DefaultLimits()
	for _, tc := range []struct {
		name string
		in   Limits
		want func(*Limits)
	}{
		{"zero", Limits{}, func(*Limits) {}},
		{"defaults", DefaultLimits(), func(*Limits) {}},
		{"one field", Limits{MaxHeaderBytes: 1 << 20}, func(l *Limits) { l.MaxHeaderBytes = 1 << 20 }},
		{"transfer", Limits{MinTransferRate: 10, TransferGrace: time.Second}, func(l *Limits) {
			l.MinTransferRate, l.TransferGrace = 10, time.Second
		}},
		{"every field", Limits{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11}, func(l *Limits) { *l = Limits{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11} }},
		{"streams", Limits{MaxMessageStreams: 3, MaxStreamBuffer: 1 << 10}, func(l *Limits) {
			l.MaxMessageStreams, l.MaxStreamBuffer = 3, 1<<10
		}},
		{"side connections", Limits{MaxSideConns: 2}, func(l *Limits) { l.MaxSideConns = 2 }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			want := d
			tc.want(&want)
			got, err := tc.in.validate()
			if err != nil || got != want {
				t.Fatalf("validate(%+v) = %+v, %v; want %+v", tc.in, got, err, want)
			}
		})
	}
}

func TestLimits_ValidateRefusesNegative(t *testing.T) {
	for _, tc := range []struct {
		field string
		set   func(*Limits)
	}{
		{"MaxHeaderBytes", func(l *Limits) { l.MaxHeaderBytes = -1 }},
		{"MaxArgBytes", func(l *Limits) { l.MaxArgBytes = -1 }},
		{"MaxBodyBytes", func(l *Limits) { l.MaxBodyBytes = -1 }},
		{"MaxStreamsPerPeer", func(l *Limits) { l.MaxStreamsPerPeer = -1 }},
		{"HandshakeTimeout", func(l *Limits) { l.HandshakeTimeout = -time.Second }},
		{"IdleTimeout", func(l *Limits) { l.IdleTimeout = -1 }},
		{"MaxMessageStreams", func(l *Limits) { l.MaxMessageStreams = -1 }},
		{"MaxStreamBuffer", func(l *Limits) { l.MaxStreamBuffer = -1 }},
		{"MaxSideConns", func(l *Limits) { l.MaxSideConns = -1 }},
		{"MinTransferRate", func(l *Limits) { l.MinTransferRate = math.MinInt64 }},
		{"TransferGrace", func(l *Limits) { l.TransferGrace = -1 }},
	} {
		t.Run(tc.field, func(t *testing.T) {
			var l Limits
			tc.set(&l)
			if _, err := l.validate(); !errors.Is(err, ErrInvalidArgument) || !strings.Contains(err.Error(), "Limits."+tc.field+" ") {
				t.Fatalf("validate: %v; want InvalidArgument naming %s", err, tc.field)
			}
			if s, err := NewServer(WithLimits(l)); !errors.Is(err, ErrInvalidArgument) {
				if s != nil {
					s.Close()
				}
				t.Fatalf("NewServer: %v; want InvalidArgument", err)
			}
			// Refused before dialling: nothing listens on this address.
			if c, err := Dial(context.Background(), "127.0.0.1:1", WithLimits(l)); !errors.Is(err, ErrInvalidArgument) {
				if c != nil {
					c.Close()
				}
				t.Fatalf("Dial: %v; want InvalidArgument", err)
			}
		})
	}
}

func TestLimits_TransferDeadline(t *testing.T) {
	now := time.Date(2025, 1, 2, 3, 4, 5, 0, time.UTC)
	d := DefaultLimits()
	slow := Limits{MinTransferRate: 3, TransferGrace: time.Second}
	for _, tc := range []struct {
		name string
		l    Limits
		n    int64
		want time.Duration // after now
	}{
		{"nothing", d, 0, 10 * time.Second},
		{"negative", d, -5, 10 * time.Second},
		{"one byte at 1 MB/s", d, 1, 10*time.Second + time.Microsecond},
		{"one second's bytes", d, 1_000_000, 11 * time.Second},
		{"4 GiB", d, 4 << 30, 10*time.Second + 4294967296*time.Microsecond},
		{"a third of a second", slow, 1, time.Second + time.Second/3},
		{"past 9.2 GB (n·1e9 overflows int64)", d, 10 << 30, 10*time.Second + 10737418240*time.Microsecond},
		{"saturates", slow, math.MaxInt64, math.MaxInt64},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := tc.l.transferDeadline(now, tc.n).Sub(now)
			if diff := got - tc.want; diff < -time.Microsecond || diff > time.Microsecond {
				t.Fatalf("transferDeadline(now, %d) = now + %v; want now + %v", tc.n, got, tc.want)
			}
		})
	}
}

// TestWithWindow_Config: WithWindow sets yamux's per-stream receive window
// on both sides, at least 256 KiB; 16 MiB without it.
func TestWithWindow_Config(t *testing.T) {
	for _, tc := range []struct {
		opts []Option
		want uint32
	}{
		{nil, 16 << 20},
		{[]Option{WithWindow(1 << 20)}, 1 << 20},
		{[]Option{WithWindow(64 << 20)}, 64 << 20},
		{[]Option{WithWindow(1)}, 256 << 10},
		{[]Option{WithWindow(0)}, 256 << 10},
	} {
		o := newOptions(tc.opts)
		for _, client := range []bool{false, true} {
			if got := o.yamuxConfig(client).MaxStreamWindowSize; got != tc.want {
				t.Errorf("window with %d options (client %v): %d, want %d", len(tc.opts), client, got, tc.want)
			}
		}
	}
}

// TestWithWindow_SmallWindowMovesBulk: with the smallest window on both
// sides, a body 16 times the window crosses whole, both ways.
func TestWithWindow_SmallWindowMovesBulk(t *testing.T) {
	const n = 4 << 20
	s, addr := startServer(t, WithWindow(1))
	must(t, Register(s, "test.double", func(_ context.Context, p benchPayload) (benchPayload, error) {
		x, err := p.Data.Tensor("x")
		if err != nil {
			return benchPayload{}, err
		}
		b, err := x.Bytes()
		if err != nil {
			return benchPayload{}, err
		}
		out := make([]byte, len(b))
		for i, v := range b {
			out[i] = 2 * v
		}
		y, err := tensordict.FromSlice(out, len(out))
		if err != nil {
			return benchPayload{}, err
		}
		td, _ := tensordict.New()
		if err := td.Set("x", y); err != nil {
			return benchPayload{}, err
		}
		return benchPayload{Data: Ref(td)}, nil
	}))
	c := dial(t, addr, WithWindow(1))
	in := make([]byte, n)
	for i := range in {
		in[i] = byte(i % 101)
	}
	x, err := tensordict.FromSlice(in, n)
	if err != nil {
		t.Fatal(err)
	}
	td, _ := tensordict.New()
	must(t, td.Set("x", x))
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	got, err := Call[benchPayload](ctx, c, "test.double", benchPayload{Data: Ref(td)})
	if err != nil {
		t.Fatal(err)
	}
	y, err := got.Data.Tensor("x")
	if err != nil {
		t.Fatal(err)
	}
	b, err := y.Bytes()
	if err != nil || len(b) != n {
		t.Fatalf("%d bytes back, %v; want %d", len(b), err, n)
	}
	for i, v := range b {
		if v != 2*byte(i%101) {
			t.Fatalf("byte %d is %d, want %d", i, v, 2*byte(i%101))
		}
	}
}
