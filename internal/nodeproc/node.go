// Package nodeproc runs a tensorwire node: an rpc.Server serving the
// TensorDicts under a shared root. "tensorwire node" runs one with Run; the
// fill benchmark runs one through the same Run in a child process (node B
// of the seed scenario), itself re-executed by Spawn. Start re-executes a
// program that calls MaybeRunChild as a node. Spawn runs any server that
// prints "listening on HOST:PORT" and stops on SIGTERM (node B, the RPC
// benchmark's servers, the built command in its tests) as a child process,
// and ChildContext is the child's side of that.
package nodeproc

import (
	"bytes"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"

	"github.com/tensorwire/tensorwire/rpc"
)

// Config says how to run a node.
type Config struct {
	Listen    string // TCP address to listen on, "host:port"; port 0 picks a free one
	Root      string // the shared root; "" serves only TensorDicts sent as bytes
	TokenFile string // file holding the shared secret (see ReadToken); "" for none
	TLSCert   string // PEM certificate and key files: both or neither
	TLSKey    string
	Log       *slog.Logger // where the node logs; nil: slog.Default()
	// CoherentStorage has the node take a client whose filesystem passes
	// the coherence probe for one page cache (rpc.WithCoherentStorage).
	CoherentStorage bool

	// Register, when set, adds methods to the server before it serves.
	Register func(*rpc.Server) error
	// Options are more options of the server (rpc.WithObserver, say).
	Options []rpc.Option
	// Listener, when set, is what the node serves on instead of listening
	// on Listen itself: a caller that must know the address is taken
	// before it makes anything (tensorwire node's services) listens first.
	// Run closes it.
	Listener net.Listener
}

// Run serves a node configured by cfg until ctx ends, then closes it: the
// listener stops, calls in flight see their context end, and Run returns
// nil once every handler has returned. ready, when not nil, is called with
// the address the node listens on (the real port, for port 0) before the
// first connection is accepted. A configuration error (a bad token file,
// TLS files, root) is returned before anything listens.
func Run(ctx context.Context, cfg Config, ready func(addr string)) error {
	if cfg.Listener != nil {
		defer cfg.Listener.Close() // on every path; closing it again is harmless
	}
	log := cfg.Log
	if log == nil {
		log = slog.Default()
	}
	opts, err := serverOptions(cfg)
	if err != nil {
		return err
	}
	opts = append(opts, rpc.WithLogger(log))
	srv, err := rpc.NewServer(append(opts, cfg.Options...)...)
	if err != nil {
		return err
	}
	if cfg.Register != nil {
		if err := cfg.Register(srv); err != nil {
			srv.Close()
			return err
		}
	}
	ln := cfg.Listener
	if ln == nil {
		if ln, err = net.Listen("tcp", cfg.Listen); err != nil {
			srv.Close()
			return err
		}
	}
	addr := ln.Addr().String()
	log.Info("node listening", "addr", addr, "root", cfg.Root, "fsid", srv.FSID(),
		"token", cfg.TokenFile != "", "tls", cfg.TLSCert != "", "pid", os.Getpid())
	if ready != nil {
		ready(addr)
	}
	served := make(chan error, 1)
	go func() { served <- srv.Serve(ln) }()
	select {
	case err = <-served:
		srv.Close()
		ln.Close() // Serve gave it up when Accept failed
		return fmt.Errorf("serve %s: %w", addr, err)
	case <-ctx.Done():
	}
	log.Info("node stopping", "addr", addr)
	err = srv.Close()
	// A Close that came before Serve began makes Serve return
	// ErrServerClosed at once, without the listener, which is then still
	// open: the node is stopped all the same.
	if serr := <-served; serr != nil && !errors.Is(serr, rpc.ErrServerClosed) && err == nil {
		err = serr
	}
	ln.Close()
	if err != nil {
		return fmt.Errorf("closing the node: %w", err)
	}
	log.Info("node stopped", "addr", addr)
	return nil
}

// ReadToken reads a shared secret from path: the file's bytes without
// trailing newlines (CR or LF). It refuses a file that others (not the
// owner, not the group) may read or write, as ssh refuses such keys, and a
// token that is empty.
func ReadToken(path string) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("token file: %w", err)
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return nil, fmt.Errorf("token file: %w", err)
	}
	if perm := fi.Mode().Perm(); perm&0o007 != 0 {
		return nil, fmt.Errorf("token file %s is accessible to other users (mode %#o): chmod o= %s", path, perm, path)
	}
	b, err := io.ReadAll(f)
	if err != nil {
		return nil, fmt.Errorf("token file %s: %w", path, err)
	}
	token := bytes.TrimRight(b, "\r\n")
	if len(token) == 0 {
		return nil, fmt.Errorf("token file %s is empty", path)
	}
	return token, nil
}

// Check checks what Run checks before it listens (the root, the token file,
// the TLS pair) without starting anything: a caller that makes files for
// the node's services checks first, so that a bad configuration leaves
// nothing behind.
func Check(cfg Config) error {
	_, err := serverOptions(cfg)
	return err
}

// serverOptions checks cfg's root, token file and TLS pair and returns the
// server options they give.
func serverOptions(cfg Config) ([]rpc.Option, error) {
	if cfg.Root != "" {
		if fi, err := os.Stat(cfg.Root); err != nil {
			return nil, fmt.Errorf("--root: %w", err)
		} else if !fi.IsDir() {
			return nil, fmt.Errorf("--root %s is not a directory", cfg.Root)
		}
	}
	var opts []rpc.Option
	if cfg.Root != "" {
		opts = append(opts, rpc.WithRoot(cfg.Root))
	}
	if cfg.CoherentStorage {
		opts = append(opts, rpc.WithCoherentStorage())
	}
	if cfg.TokenFile != "" {
		token, err := ReadToken(cfg.TokenFile)
		if err != nil {
			return nil, err
		}
		opts = append(opts, rpc.WithToken(token))
	}
	if cfg.TLSCert != "" || cfg.TLSKey != "" {
		if cfg.TLSCert == "" || cfg.TLSKey == "" {
			return nil, errors.New("TLS needs both a certificate and a key file")
		}
		cert, err := tls.LoadX509KeyPair(cfg.TLSCert, cfg.TLSKey)
		if err != nil {
			return nil, fmt.Errorf("TLS: %w", err)
		}
		opts = append(opts, rpc.WithTLS(&tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12}))
	}
	return opts, nil
}
