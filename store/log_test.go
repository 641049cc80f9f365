package store

import (
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/tensorwire/tensorwire/memmap"
	"github.com/tensorwire/tensorwire/tensordict"
)

// TestLogWriter_SyncerOutlivesWriter: a record the writer writes after the
// log was closed is still synced, so its waiter returns. (The syncer used
// to stop as soon as the log was closed and everything written so far was
// synced, though the writer still had queued records to write.)
func TestLogWriter_SyncerOutlivesWriter(t *testing.T) {
	f, err := os.Create(filepath.Join(t.TempDir(), logName))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	w := newLogWriter(f, 0, 0, false)
	synced := make(chan struct{})
	go func() {
		defer close(synced)
		w.syncLoop()
	}()
	p, err := prepare(&record{Op: recDelete, Name: "b"})
	if err != nil {
		t.Fatal(err)
	}
	w.enqueue(p.seal(1), 1)
	w.close() // closed with a record queued and nothing written yet
	// Give a syncer that would stop now the chance to (it must not): this
	// wait makes the old behaviour show, it is no condition of the new.
	select {
	case <-synced:
	case <-time.After(100 * time.Millisecond):
	}
	// The writer, late: it takes the queue and writes it.
	batch, ok := w.next()
	if !ok {
		t.Fatal("next after close with a record queued: nothing")
	}
	var frames [][]byte
	var buf []byte
	if err := w.write(batch, &frames, &buf); err != nil {
		t.Fatal(err)
	}
	w.writerDone()
	waited := make(chan error, 1)
	go func() { waited <- w.wait(1) }()
	select {
	case err := <-waited:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("the record written after close was never synced: its waiter still waits after 30 s")
	}
	select {
	case <-synced:
	case <-time.After(30 * time.Second):
		t.Fatal("the syncer did not stop after the writer did")
	}
}

// TestOpen_TornRecordHoldingAFrame: a last record torn by a crash (never
// acknowledged) is cut off, even when its payload, a value's bytes, holds a
// whole checksummed frame: good records are looked for past the torn
// record's claimed end, not inside it. Before the fix Open took the frame
// for a record after the damage and refused the store with ErrCorrupt.
func TestOpen_TornRecordHoldingAFrame(t *testing.T) {
	ctx := ctxT(t)
	dir := t.TempDir()
	s, err := Open(dir, Options{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.Append(ctx, "b", itemTD(t, 1, 10)); err != nil {
		t.Fatal(err)
	}
	// A value whose bytes hold a frame, then padding.
	p, err := prepare(&record{Op: recDelete, Name: "x"})
	if err != nil {
		t.Fatal(err)
	}
	data := append(append([]byte(nil), p.seal(7)...), make([]byte, 8192)...)
	x, err := tensordict.FromBytes(memmap.Uint8, []int{len(data)}, data)
	if err != nil {
		t.Fatal(err)
	}
	td, _ := tensordict.New()
	if err := td.Set("x", x); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Append(ctx, "b", td); err != nil {
		t.Fatal(err)
	}
	s.Close()
	path := filepath.Join(dir, logName)
	fi, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	// The last record's write cut short, inside its padding.
	if err := os.Truncate(path, fi.Size()-1000); err != nil {
		t.Fatal(err)
	}
	s, err = Open(dir, Options{})
	if err != nil {
		t.Fatalf("Open after a torn last record: %v", err)
	}
	defer s.Close()
	if st := s.Stats(); st.Items != 1 {
		t.Fatalf("%d items, want 1", st.Items)
	}
}
