package service

import (
	"context"
	"net"
	"testing"
	"time"

	"github.com/tensorwire/tensorwire/rpc"
)

// TestDialing_Mode checks the one rule every service client follows: by
// reference only with a root, for an object under the node's root, at the
// sharing level the service needs, and without Bytes; and that Sharing
// reports the connection's level whether or not Bytes was given.
func TestDialing_Mode(t *testing.T) {
	root := t.TempDir()
	srv, err := rpc.NewServer(rpc.WithRoot(root))
	if err != nil {
		t.Fatal(err)
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go srv.Serve(l)
	t.Cleanup(func() { srv.Close() })
	addr := l.Addr().String()

	cases := []struct {
		name      string
		d         Dialing
		underRoot bool
		need      rpc.Sharing
		level     rpc.Sharing
		byRef     bool
	}{
		{"no root", Dialing{}, true, rpc.Coherent, rpc.None, false},
		{"the object is not under the node's root", Dialing{Root: root}, false, rpc.Storage, rpc.None, false},
		{"coherent, needs coherent", Dialing{Root: root}, true, rpc.Coherent, rpc.Coherent, true},
		{"coherent, needs storage", Dialing{Root: root}, true, rpc.Storage, rpc.Coherent, true},
		{"bytes asked for", Dialing{Root: root, Bytes: true}, true, rpc.Storage, rpc.Coherent, false},
		{"another root", Dialing{Root: t.TempDir()}, true, rpc.Storage, rpc.None, false},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			rc, err := tc.d.Dial(ctx, addr)
			if err != nil {
				t.Fatal(err)
			}
			defer rc.Close()
			level, byRef, err := tc.d.Mode(ctx, rc, tc.underRoot, tc.need)
			if err != nil {
				t.Fatal(err)
			}
			if level != tc.level || byRef != tc.byRef {
				t.Errorf("Mode = %v, by reference %v; want %v, %v", level, byRef, tc.level, tc.byRef)
			}
		})
	}
}

// TestDialing_DialLeavesOptionsAlone checks that Dial does not append the
// root to the caller's slice of rpc options, which a second Dial with
// another root would then share.
func TestDialing_DialLeavesOptionsAlone(t *testing.T) {
	opts := make([]rpc.Option, 1, 4)
	opts[0] = rpc.WithToken([]byte("secret"))
	d := Dialing{Root: t.TempDir(), RPC: opts}
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	if rc, err := d.Dial(ctx, "127.0.0.1:1"); err == nil {
		rc.Close()
	}
	if got := opts[:cap(opts)][1]; got != nil {
		t.Errorf("Dial wrote the root into the caller's options' spare room")
	}
}
