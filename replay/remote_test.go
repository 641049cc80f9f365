package replay

import (
	"context"
	"net"
	"path/filepath"
	"testing"
	"time"

	"github.com/tensorwire/tensorwire/rpc"
)

// serveBuffer creates a buffer at root/name, serves it on a new server
// with that root, and returns the buffer and the server's address.
func serveBuffer(t testing.TB, root, name string, cfg Config) (*Buffer, string) {
	t.Helper()
	b, err := Create(filepath.Join(root, name), cfg)
	if err != nil {
		t.Fatal(err)
	}
	s, err := rpc.NewServer(rpc.WithRoot(root))
	if err != nil {
		t.Fatal(err)
	}
	svc, err := Register(s)
	if err != nil {
		t.Fatal(err)
	}
	if err := svc.Add(name, b); err != nil {
		t.Fatal(err)
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- s.Serve(l) }()
	t.Cleanup(func() {
		s.Close()
		if err := <-done; err != nil {
			t.Errorf("Serve: %v", err)
		}
		if err := b.Close(); err != nil {
			t.Errorf("closing the buffer: %v", err)
		}
	})
	return b, l.Addr().String()
}

func TestRemoteSmoke(t *testing.T) {
	for _, mode := range []string{"ref", "bytes"} {
		t.Run(mode, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			root := t.TempDir()
			_, addr := serveBuffer(t, root, "buf", Config{Capacity: 8})
			opts := []DialOption{WithRoot(root)}
			if mode == "bytes" {
				opts = append(opts, WithBytes())
			}
			c, err := Dial(ctx, addr, "buf", opts...)
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			if c.Mode() != mode {
				t.Fatalf("mode %s", c.Mode())
			}
			idx, err := c.Extend(ctx, transitions(t, 1, 2, 3))
			if err != nil {
				t.Fatal(err)
			}
			t.Log(idx)
			td, info, err := c.Sample(ctx, 5)
			if err != nil {
				t.Fatal(err)
			}
			t.Log(info, td)
		})
	}
}
