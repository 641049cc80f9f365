package rpc

import (
	"cmp"
	"context"
	"crypto/rand"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"path"
	"path/filepath"
	"strings"
	"time"

	"github.com/tensorwire/tensorwire/memmap"
)

// The coherence probe (docs/protocol.md, "Coherence probe").
//
// The handshake calls two sides Coherent only when they run on one kernel
// and their roots are one mount: one page cache. Some filesystems keep
// mappings coherent across machines all the same (Lustre says it does);
// most do not (NFS, CephFS, GPFS, FUSE). A setting alone cannot tell them
// apart, and a wrong one loses rows without an error, so both sides opt in
// (WithCoherentStorage) and the client then checks the filesystem at each
// Dial: a store through one side's mapping must show in the other side's
// existing mapping, both ways, within coherenceWait. Only then is a
// Storage connection taken for Coherent.

// coherenceRequest is MethodCoherence's request.
type coherenceRequest struct {
	// Step is 1 (the node maps the probe file and stores a word at offset
	// 0) or 2 (the node looks for the client's word at offset 8).
	Step int `codec:"step"`
	// Name is the probe file's name: 32 lower-case hex digits; the file is
	// ProbeDir/<name>.map under the root, coherenceSize bytes.
	Name string `codec:"name"`
	// Seen, step 2: the client saw the node's word of step 1 in its own
	// mapping.
	Seen bool `codec:"seen"`
	// Word, step 2: the nonzero word the client stored at offset 8.
	Word uint64 `codec:"word"`
}

// coherenceResponse is MethodCoherence's response.
type coherenceResponse struct {
	// Word, step 1: the nonzero word the node stored at offset 0.
	Word uint64 `codec:"word"`
	// Coherent, step 2: the node saw the client's word and, the client
	// having seen its own, now takes the peer for Coherent.
	Coherent bool `codec:"coherent"`
	// Why, step 2 when not Coherent: what failed, for a person.
	Why string `codec:"why"`
}

const (
	// coherenceSize is the probe file's size: one page.
	coherenceSize = 4096
	// coherenceWait is how long a side looks for the other's store in its
	// own mapping. A coherent filesystem shows it at once, or after the
	// lock traffic of a few round trips; one that does not shows it late
	// (at writeback, at a reopen) or never.
	coherenceWait = 50 * time.Millisecond
	// coherencePoll is how often it looks meanwhile.
	coherencePoll = 100 * time.Microsecond
)

// heldProbe is the node's mapping of a client's probe file, from step 1
// to step 2 or the session's end.
type heldProbe struct {
	name string // the probe's name (hex)
	t    *memmap.Tensor
	word uint64 // what the node stored at offset 0
}

// probeFileName returns the probe file of name, relative to the root,
// slash-separated.
func probeFileName(name string) string { return path.Join(ProbeDir, name+".map") }

// validProbeName reports whether name is 32 lower-case hex digits.
func validProbeName(name string) bool {
	b, err := hex.DecodeString(name)
	return err == nil && len(b) == 16 && hex.EncodeToString(b) == name
}

// randomWord returns a random word other than zero (what a new probe file
// holds) and other than not.
func randomWord(not uint64) uint64 {
	var b [8]byte
	for {
		rand.Read(b[:]) // never fails (crypto/rand)
		if w := binary.LittleEndian.Uint64(b[:]); w != 0 && w != not {
			return w
		}
	}
}

// storeWord stores w at off through t's mapping (8 bytes, far below the
// size at which memmap writes with pwrite instead).
func storeWord(t *memmap.Tensor, off int64, w uint64) error {
	var b [8]byte
	binary.LittleEndian.PutUint64(b[:], w)
	_, err := t.WriteAt(b[:], off)
	return err
}

// loadWord reads the word at off through t's mapping.
func loadWord(t *memmap.Tensor, off int64) (uint64, error) {
	var b [8]byte
	if _, err := t.ReadAt(b[:], off); err != nil {
		return 0, err
	}
	return binary.LittleEndian.Uint64(b[:]), nil
}

// awaitWord reports whether w shows at off in t's mapping within
// coherenceWait (or before ctx ends). It only reads the mapping: no system
// call that could revalidate the file's pages.
func awaitWord(ctx context.Context, t *memmap.Tensor, off int64, w uint64) (bool, error) {
	deadline := time.Now().Add(coherenceWait)
	for {
		got, err := loadWord(t, off)
		if err != nil || got == w {
			return err == nil, err
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			return false, nil
		}
		time.Sleep(coherencePoll)
	}
}

// setProbe holds p for step 2, dropping a probe held before; after the
// session's end (dropProbe) it drops p at once.
func (l *peerLevel) setProbe(p *heldProbe) {
	l.mu.Lock()
	old := l.probe
	if l.ended {
		old, p = p, nil
	}
	l.probe = p
	l.mu.Unlock()
	if old != nil {
		old.t.Close()
	}
}

// takeProbe returns the probe held as name, no longer held, or nil.
func (l *peerLevel) takeProbe(name string) *heldProbe {
	l.mu.Lock()
	defer l.mu.Unlock()
	p := l.probe
	if p == nil || p.name != name {
		return nil
	}
	l.probe = nil
	return p
}

// dropProbe drops the probe held, at the session's end.
func (l *peerLevel) dropProbe() {
	l.mu.Lock()
	p := l.probe
	l.probe, l.ended = nil, true
	l.mu.Unlock()
	if p != nil {
		p.t.Close()
	}
}

// coherence serves MethodCoherence.
func (s *Server) coherence(ctx context.Context, req coherenceRequest) (coherenceResponse, error) {
	l, _ := ctx.Value(peerSharingKey{}).(*peerLevel)
	switch {
	case !s.o.coherentStorage:
		return coherenceResponse{}, Errorf(FailedPrecondition, "%s: this node does not take filesystems for coherent (start it with rpc.WithCoherentStorage, tensorwire node --coherent-storage)", MethodCoherence)
	case l == nil || s.res == nil:
		return coherenceResponse{}, Errorf(FailedPrecondition, "%s: only a connected peer that shares the node's root probes it", MethodCoherence)
	case l.get() != Storage:
		return coherenceResponse{}, Errorf(FailedPrecondition, "%s: the peer's sharing is %q; only a peer at %q probes", MethodCoherence, l.get(), Storage)
	case !validProbeName(req.Name):
		return coherenceResponse{}, Errorf(InvalidArgument, "%s: probe name %q is not 32 lower-case hex digits", MethodCoherence, req.Name)
	}
	file := probeFileName(req.Name)
	switch req.Step {
	case 1:
		f, err := s.res.root.OpenFile(file, os.O_RDWR, 0)
		if err != nil {
			return coherenceResponse{}, Errorf(FailedPrecondition, "%s: the node cannot open the probe file: %v", MethodCoherence, err)
		}
		t, err := memmap.OpenFile(f, memmap.Uint8, []int{coherenceSize}, memmap.ReadWrite)
		if err != nil {
			f.Close()
			return coherenceResponse{}, Errorf(FailedPrecondition, "%s: the node cannot map the probe file: %v", MethodCoherence, err)
		}
		// Read offset 8 now, so that the page is in the node's mapping
		// before the client stores there.
		p := &heldProbe{name: req.Name, t: t, word: randomWord(0)}
		if _, err := loadWord(t, 8); err != nil {
			t.Close()
			return coherenceResponse{}, Errorf(FailedPrecondition, "%s: %v", MethodCoherence, err)
		}
		if err := storeWord(t, 0, p.word); err != nil {
			t.Close()
			return coherenceResponse{}, Errorf(FailedPrecondition, "%s: %v", MethodCoherence, err)
		}
		l.setProbe(p)
		return coherenceResponse{Word: p.word}, nil
	case 2:
		if req.Word == 0 {
			return coherenceResponse{}, Errorf(InvalidArgument, "%s: step 2 with a zero word", MethodCoherence)
		}
		p := l.takeProbe(req.Name)
		if p == nil {
			return coherenceResponse{}, Errorf(FailedPrecondition, "%s: no step 1 of probe %s in this session", MethodCoherence, req.Name)
		}
		seen, err := awaitWord(ctx, p.t, 8, req.Word)
		p.t.Close()
		s.res.root.Remove(file) // the client removes it too
		var failed []string
		switch {
		case err != nil:
			failed = append(failed, fmt.Sprintf("the node could not read its mapping of the probe file: %v", err))
		case !seen:
			failed = append(failed, fmt.Sprintf("a store through the client's mapping did not show in the node's within %v", coherenceWait))
		}
		if !req.Seen {
			failed = append(failed, fmt.Sprintf("a store through the node's mapping did not show in the client's within %v", coherenceWait))
		}
		if why := strings.Join(failed, "; "); why != "" {
			l.log.Info("rpc: the peer's filesystem failed the coherence probe; it stays at storage, so what changes in place travels as bytes", "why", why)
			return coherenceResponse{Why: why}, nil
		}
		l.set(Coherent)
		l.log.Info("rpc: the peer's filesystem passed the coherence probe (--coherent-storage): it is coherent from now on", "sharing", Coherent)
		return coherenceResponse{Coherent: true}, nil
	}
	return coherenceResponse{}, Errorf(InvalidArgument, "%s: step %d (1 or 2)", MethodCoherence, req.Step)
}

// probeCoherence runs the coherence probe on cc, a connection being
// dialled at Storage, and reports whether the filesystem passed (the node
// then takes the peer for Coherent too) and otherwise why not.
func (c *Client) probeCoherence(ctx context.Context, cc *clientConn) (bool, string) {
	ctx, cancel := context.WithTimeout(ctx, c.o.limits.HandshakeTimeout)
	defer cancel()
	var nb [16]byte
	rand.Read(nb[:]) // never fails (crypto/rand)
	name := hex.EncodeToString(nb[:])
	dir := filepath.Join(c.root, ProbeDir)
	if err := os.Mkdir(dir, 0o755); err != nil && !errors.Is(err, os.ErrExist) {
		return false, fmt.Sprintf("the client could not make %s: %v", ProbeDir, err)
	}
	file := filepath.Join(c.root, filepath.FromSlash(probeFileName(name)))
	t, err := memmap.Create(file, memmap.Uint8, coherenceSize)
	if err != nil {
		return false, fmt.Sprintf("the client could not make its probe file: %v", err)
	}
	defer os.Remove(file)
	defer t.Close() // before the removal
	// Fault the page into this side's mapping before the node stores: the
	// probe is of an existing mapping, as a service's are.
	if _, err := loadWord(t, 0); err != nil {
		return false, fmt.Sprintf("the client could not read its probe file: %v", err)
	}
	var r1 coherenceResponse
	if err := c.callOn(ctx, cc, MethodCoherence, &coherenceRequest{Step: 1, Name: name}, &r1); err != nil {
		return false, fmt.Sprintf("the node took no probe: %v", err)
	}
	seen, err := awaitWord(ctx, t, 0, r1.Word)
	if err != nil {
		return false, fmt.Sprintf("the client could not read its probe file: %v", err)
	}
	// Step 2 runs either way: it tells the node the result and lets it
	// drop its mapping and the file.
	w := randomWord(r1.Word)
	if err := storeWord(t, 8, w); err != nil {
		return false, fmt.Sprintf("the client could not write its probe file: %v", err)
	}
	var r2 coherenceResponse
	if err := c.callOn(ctx, cc, MethodCoherence, &coherenceRequest{Step: 2, Name: name, Seen: seen, Word: w}, &r2); err != nil {
		return false, fmt.Sprintf("the node's probe failed: %v", err)
	}
	if seen && r2.Coherent {
		return true, ""
	}
	// The node's reason names both directions that failed.
	return false, cmp.Or(r2.Why, fmt.Sprintf("a store through the node's mapping did not show in the client's within %v", coherenceWait))
}

// callOn runs a call without TensorDicts on cc, a connection being dialled
// (Call would wait for the dial it is part of), bounded by ctx's deadline.
func (c *Client) callOn(ctx context.Context, cc *clientConn, method string, req, resp any) error {
	argBuf, err := encodeArgs(req)
	if err != nil {
		return Errorf(InvalidArgument, "%s: %w", method, err)
	}
	defer putArgs(argBuf)
	hdr := requestHeader{Method: method, ArgLen: int64(len(*argBuf))}
	deadline, ok := ctx.Deadline()
	if ok {
		hdr.TimeoutUS = max(int64(time.Until(deadline)/time.Microsecond), 1)
	}
	cs, err := cc.stream()
	if err != nil {
		return transportError(ctx, method, err)
	}
	cs.setDeadline(deadline)
	var body outBody
	if ok, err = cs.roundTrip(&hdr, *argBuf, &body, nil, resp, nil, &c.o.limits, cc.version); ok {
		cs.setDeadline(time.Time{})
		cs.idle = time.Now()
		cc.put(cs)
	} else {
		cs.st.Close()
	}
	return cc.callError(ctx, method, err)
}
