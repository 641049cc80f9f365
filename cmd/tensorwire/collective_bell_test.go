package main

import (
	"bytes"
	"os"
	"path/filepath"
	"runtime"
	"testing"
	"time"

	"github.com/tensorwire/tensorwire/collective"
)

// newBellFile makes a bell file as the Python rank does.
func newBellFile(t *testing.T) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "bell")
	if err := os.WriteFile(path, make([]byte, bellSize), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// The bell's layout is the golden one (the Python client writes the same
// words at the same offsets: tests/test_collective_golden.py).
func TestCollectiveBell_Golden(t *testing.T) {
	b, err := openBell(newBellFile(t), 0)
	if err != nil {
		t.Fatal(err)
	}
	defer b.close()
	b.req.Store(7)
	b.rung(7)
	want := goldenFrames(t)["bell-7"]
	if got := b.m.Bytes()[:len(want)]; len(want) != 68 || !bytes.Equal(got, want) {
		t.Fatalf("bell after request and reply 7:\n got %x\nwant %x", got, want)
	}
}

// await returns once the parent's word moves past the last request, however
// long its spin; and, the word unchanged, once its spin is over.
func TestCollectiveBell_Await(t *testing.T) {
	b, err := openBell(newBellFile(t), time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	defer b.close()
	done := make(chan struct{})
	go func() { b.await(0); close(done) }()
	b.req.Store(1)
	select {
	case <-done:
	case <-time.After(30 * time.Second):
		t.Fatal("await did not return when the request word changed")
	}
	b.spin = time.Millisecond
	over := make(chan struct{})
	go func() { b.await(1); close(over) }()
	select {
	case <-over:
	case <-time.After(30 * time.Second):
		t.Fatal("await outlived its spin")
	}
	var nilBell *bell
	nilBell.await(0) // the pipe alone: returns at once
	nilBell.rung(1)
}

// A sidecar with a bell answers as without one, and says each reply's id
// in its resp word.
func TestCollectiveSidecar_Bell(t *testing.T) {
	addr := freeAddr(t)
	p := startSidecarWith(t, addr, "", 0, 1, collective.SHM, &sidecar{bellPath: newBellFile(t), spin: 50 * time.Microsecond})
	p.read(t) // hello
	for id := int64(1); id <= 3; id++ {
		p.f.WriteAt(f64bytes(2, 3), 0)
		resp := p.call(t, pyReq{ID: id, Op: "allreduce", Red: int(collective.Sum), Has: true, DType: "float64", Shape: []int{2}})
		if resp["code"] != nil || anyInt(resp["id"]) != id {
			t.Fatalf("call %d: %v", id, resp)
		}
	}
	// The word is stored just after the reply's write: wait for it.
	deadline := time.Now().Add(30 * time.Second)
	for p.sc.bell == nil || p.sc.bell.resp.Load() != 3 {
		if time.Now().After(deadline) {
			t.Fatal("the resp word never said reply 3")
		}
		runtime.Gosched()
	}
	p.in.Close()
	if err := <-p.done; err != nil {
		t.Fatal(err)
	}
}
