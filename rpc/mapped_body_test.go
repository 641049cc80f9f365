package rpc

import (
	"bytes"
	"context"
	"crypto/tls"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/tensorwire/tensorwire/internal/testkit/testcert"
	"github.com/tensorwire/tensorwire/memmap"
	"github.com/tensorwire/tensorwire/tensordict"
)

// TestSide_MappedBody: a handler's mapped TensorDict reaches a caller that
// does not share the node's files as bytes on a side connection, whole or
// some rows in their order: straight from the mapping on a plain
// connection, through a guarded copy under TLS. A mapped TensorDict whose
// file was truncated is refused before any header commits to its length,
// as DataLoss naming the file: by the node for an answer (it serves the
// next call, on the same side connection), by the client for a request
// (nothing sent). Before, the answer broke off midway and the caller saw
// the connection close (Unavailable).
func TestSide_MappedBody(t *testing.T) {
	cert, pool := testcert.New(t)
	for _, tc := range []struct {
		name       string
		node, dial []Option
	}{
		{"plain", nil, nil},
		{"tls", []Option{WithTLS(&tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12})},
			[]Option{WithTLS(&tls.Config{RootCAs: pool, ServerName: "127.0.0.1"})}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			n := startStreamNode(t, tc.node...)
			dir := t.TempDir()
			const rows, width = 64, 16 << 10 // 1 MiB: a side connection's body
			mapped := func(name string) (*tensordict.TensorDict, []byte) {
				td, err := tensordict.Create(filepath.Join(dir, name), []int{rows},
					tensordict.Field{Key: []string{"x"}, DType: memmap.Uint8, Shape: []int{rows, width}})
				must(t, err)
				t.Cleanup(func() { td.Close() })
				x := firstLeaf(t, td)
				b, err := x.Bytes()
				must(t, err)
				for i := range b {
					b[i] = byte(i/width*3 + i)
				}
				return td, bytes.Clone(b)
			}
			good, data := mapped("good")
			cut, _ := mapped("cut")
			must(t, os.Truncate(firstLeaf(t, cut).Path(), 4096))
			must(t, Register(n.s, "test.mappedtd", func(ctx context.Context, req sinkReq) (genResp, error) {
				switch req.S {
				case "rows":
					return genResp{X: TD{TensorDict: good, Rows: []int{63, 0, 5, 6, 7, 0}}}, nil
				case "cut":
					return genResp{X: Ref(cut)}, nil
				}
				return genResp{X: Ref(good)}, nil
			}))
			c := dial(t, n.addr, tc.dial...)
			ctx := Uncompressed(testCtx(t))
			row := func(r int) []byte { return data[r*width : (r+1)*width] }
			for _, call := range []struct {
				s    string
				want []byte
			}{
				{"all", data},
				{"rows", bytes.Join([][]byte{row(63), row(0), row(5), row(6), row(7), row(0)}, nil)},
			} {
				before := sideWritten.Load()
				got, err := Call[genResp](ctx, c, "test.mappedtd", sinkReq{S: call.s})
				must(t, err)
				b, err := firstLeaf(t, got.X.TensorDict).Bytes()
				must(t, err)
				if !bytes.Equal(b, call.want) {
					t.Fatalf("%s: %d bytes came unlike the %d mapped", call.s, len(b), len(call.want))
				}
				if moved := sideWritten.Load() - before; moved < int64(len(call.want)) {
					t.Fatalf("%s: %d bytes went on side connections, want the body's %d", call.s, moved, len(call.want))
				}
			}
			sides := n.s.Stats().SideConns
			if _, err := Call[genResp](ctx, c, "test.mappedtd", sinkReq{S: "cut"}); !errors.Is(err, ErrDataLoss) || !strings.Contains(err.Error(), "truncated") {
				t.Fatalf("an answer from a truncated mapping: %v, want DataLoss saying so", err)
			}
			if _, err := Call[Empty](ctx, c, methodSinkTD, sinkReq{X: Ref(cut)}); !errors.Is(err, ErrDataLoss) || !errors.Is(err, memmap.ErrFault) {
				t.Fatalf("a request from a truncated mapping: %v, want DataLoss wrapping memmap.ErrFault", err)
			}
			got, err := Call[genResp](ctx, c, "test.mappedtd", sinkReq{S: "all"})
			must(t, err)
			if b, _ := firstLeaf(t, got.X.TensorDict).Bytes(); !bytes.Equal(b, data) {
				t.Fatal("the call after the fault came back wrong")
			}
			echo(t, c)
			if got := n.s.Stats().SideConns; got < sides {
				t.Fatalf("the node has %d side connections after the refusals, had %d: one was dropped", got, sides)
			}
		})
	}
}
