package rpc

// Failure tests (failure_test.go): authentication with tokens, and TLS.

import (
	"bufio"
	"bytes"
	"context"
	"crypto/tls"
	"encoding/binary"
	"errors"
	"io"
	"net"
	"testing"
	"time"

	"github.com/tensorwire/tensorwire/internal/testkit/testcert"
)

// ---- authentication ----

func TestServer_WrongToken(t *testing.T) {
	for _, tc := range []struct {
		name           string
		server, client string
		ok             bool
	}{
		{"no token either side", "", "", true},
		{"same token", "s3cret", "s3cret", true},
		{"wrong token", "s3cret", "guess", false},
		{"client without token", "s3cret", "", false},
		{"client with token, server without", "", "s3cret", false},
		{"token differs by a byte", "s3cret", "s3creT", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			n := startTestNode(t, tokenOpt(tc.server)...)
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			c, err := Dial(ctx, n.addr, tokenOpt(tc.client)...)
			if tc.ok {
				if err != nil {
					t.Fatalf("Dial: %v", err)
				}
				defer c.Close()
				if _, err := Call[echoMsg](ctx, c, methodRecord, echoMsg{}); err != nil {
					t.Fatal(err)
				}
				if got := n.calls.Load(); got != 1 {
					t.Fatalf("handler ran %d times, want 1", got)
				}
				return
			}
			if err == nil {
				c.Close()
				t.Fatal("Dial succeeded")
			}
			if !errors.Is(err, ErrUnauthenticated) {
				t.Fatalf("Dial: %v, want Unauthenticated", err)
			}
			if tc.server != "" {
				// A peer that skips the proof and goes straight to a call
				// gets nowhere either.
				rawSkipAuth(t, n.addr, methodRecord)
			}
			if got := n.calls.Load(); got != 0 {
				t.Fatalf("a handler ran %d times for an unauthenticated peer", got)
			}
		})
	}
}

func tokenOpt(tok string) []Option {
	if tok == "" {
		return nil
	}
	return []Option{WithToken([]byte(tok))}
}

// rawSkipAuth sends a hello without a token, ignores the verdict, and sends
// a call as if yamux had started: the server must close the connection
// without running anything.
func rawSkipAuth(t *testing.T, addr, method string) {
	t.Helper()
	conn, err := net.Dial("tcp", addr)
	must(t, err)
	defer conn.Close()
	h, err := newHello(FSID{}, nil)
	must(t, err)
	args, err := encodeMsgpack(echoMsg{})
	must(t, err)
	var req bytes.Buffer
	bw := bufio.NewWriter(&req)
	must(t, writeFrame(bw, &requestHeader{Method: method, ArgLen: int64(len(args))}, args))
	must(t, bw.Flush())
	// A yamux SYN data frame for stream 1 carrying the call, so that a server
	// that skipped its checks would run it.
	frame := make([]byte, 12)                // version 0, type 0 (data)
	binary.BigEndian.PutUint16(frame[2:], 1) // flags: SYN
	binary.BigEndian.PutUint32(frame[4:], 1) // stream 1
	binary.BigEndian.PutUint32(frame[8:], uint32(req.Len()))
	out := append(h.marshal(), make([]byte, proofSize)...) // a proof of zeros
	out = append(out, frame...)
	out = append(out, req.Bytes()...)
	conn.Write(out)
	expectClosed(t, conn, 30*time.Second)
}

// expectClosed reads conn until it fails and checks it failed because the
// peer closed it, within d.
func expectClosed(t *testing.T, conn net.Conn, d time.Duration) {
	t.Helper()
	conn.SetReadDeadline(time.Now().Add(d))
	_, err := io.Copy(io.Discard, conn)
	var ne net.Error
	if errors.As(err, &ne) && ne.Timeout() {
		t.Fatalf("connection still open after %v", d)
	}
}

// ---- TLS ----

func TestServer_TLS(t *testing.T) {
	cert, pool := testcert.New(t)
	_, otherPool := testcert.New(t)
	serverTLS := &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12}
	for _, tc := range []struct {
		name           string
		clientTLS      *tls.Config // nil: plain TCP
		server, client string      // tokens
		wantCode       Code        // OK: the call succeeds
	}{
		{"trusted, no token", &tls.Config{RootCAs: pool, ServerName: "127.0.0.1"}, "", "", OK},
		{"trusted, token", &tls.Config{RootCAs: pool, ServerName: "127.0.0.1"}, "tok", "tok", OK},
		{"trusted, no ServerName", &tls.Config{RootCAs: pool}, "tok", "tok", OK},
		{"trusted, wrong token", &tls.Config{RootCAs: pool, ServerName: "127.0.0.1"}, "tok", "bad", Unauthenticated},
		{"trusted, no client token", &tls.Config{RootCAs: pool, ServerName: "127.0.0.1"}, "tok", "", Unauthenticated},
		{"untrusted certificate", &tls.Config{RootCAs: otherPool, ServerName: "127.0.0.1"}, "", "", Unauthenticated},
		{"untrusted certificate, token", &tls.Config{RootCAs: otherPool, ServerName: "127.0.0.1"}, "tok", "tok", Unauthenticated},
		{"wrong name", &tls.Config{RootCAs: pool, ServerName: "example.com"}, "", "", Unauthenticated},
		{"plain client", nil, "", "", Unavailable},
	} {
		t.Run(tc.name, func(t *testing.T) {
			n := startTestNode(t, append(tokenOpt(tc.server), WithTLS(serverTLS))...)
			opts := tokenOpt(tc.client)
			if tc.clientTLS != nil {
				opts = append(opts, WithTLS(tc.clientTLS))
			}
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			c, err := Dial(ctx, n.addr, opts...)
			if err == nil {
				defer c.Close()
				_, err = Call[echoMsg](ctx, c, methodRecord, echoMsg{})
			}
			if tc.wantCode == OK {
				if err != nil {
					t.Fatal(err)
				}
				if n.calls.Load() != 1 {
					t.Fatalf("handler ran %d times, want 1", n.calls.Load())
				}
				return
			}
			if CodeOf(err) != tc.wantCode {
				t.Fatalf("err = %v, want code %v", err, tc.wantCode)
			}
			if n.calls.Load() != 0 {
				t.Fatalf("handler ran %d times for a refused peer", n.calls.Load())
			}
		})
	}
	t.Run("TLS client, plain server", func(t *testing.T) {
		n := startTestNode(t)
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		c, err := Dial(ctx, n.addr, WithTLS(&tls.Config{RootCAs: pool, ServerName: "127.0.0.1"}))
		if err == nil {
			c.Close()
			t.Fatal("Dial succeeded")
		}
	})
}
