package store

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"testing"

	"github.com/tensorwire/tensorwire/tensordict"
)

// TestDiscardStaged_RacesTheNodesRename: a client that gives up on a call
// discards its staged prefix while the node may be renaming it under
// values/. Whichever wins, what the node took is whole: every file there,
// meta.json first. os.RemoveAll alone deleted the files of the folder
// the node had just moved (a bin item without its meta.json, every Get of
// the bin failing after).
func TestDiscardStaged_RacesTheNodesRename(t *testing.T) {
	dir := t.TempDir()
	staging, values := filepath.Join(dir, stagingDir), filepath.Join(dir, valuesDir)
	for _, d := range []string{staging, values} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	td, err := tensordict.New()
	if err != nil {
		t.Fatal(err)
	}
	const leaves = 32 // files enough that a removal takes a while
	for k := range leaves {
		x, err := tensordict.FromSlice([]int64{int64(k)})
		if err != nil {
			t.Fatal(err)
		}
		if err := td.Set(fmt.Sprintf("x%02d", k), x); err != nil {
			t.Fatal(err)
		}
	}
	// Each round's prefix is the template's files, hard-linked: made in
	// no time, its files as many.
	tmpl := filepath.Join(dir, "template")
	if err := writePrefix(td, tmpl, true); err != nil {
		t.Fatal(err)
	}
	files, err := os.ReadDir(tmpl)
	if err != nil {
		t.Fatal(err)
	}
	taken := 0
	for i := range 400 {
		from := filepath.Join(staging, newStagedName())
		if err := os.Mkdir(from, 0o755); err != nil {
			t.Fatal(err)
		}
		for _, f := range files {
			if err := os.Link(filepath.Join(tmpl, f.Name()), filepath.Join(from, f.Name())); err != nil {
				t.Fatal(err)
			}
		}
		to := filepath.Join(values, fmt.Sprintf("%016x", i))
		var wg sync.WaitGroup
		start := make(chan struct{})
		wg.Add(2)
		go func() { defer wg.Done(); <-start; discardStaged(from) }()
		go func() { defer wg.Done(); <-start; os.Rename(from, to) }() // the node taking it
		close(start)
		wg.Wait()
		if _, err := os.Lstat(to); err != nil {
			continue // the client's discard came first
		}
		taken++
		got, err := tensordict.LoadMemmap(to, tensordict.ReadOnly())
		if err != nil {
			t.Fatalf("round %d: the value the node took is damaged: %v", i, err)
		}
		n := 0
		for range got.Leaves() {
			n++
		}
		got.Close()
		if n != leaves {
			t.Fatalf("round %d: the value the node took has %d tensors, want %d", i, n, leaves)
		}
	}
	if ents, _ := os.ReadDir(staging); len(ents) != 0 {
		t.Errorf("%d folders left in staging/, want none", len(ents))
	}
	t.Logf("the node took %d of 400 prefixes whole; the client discarded the rest", taken)
}

// A staged prefix that goes away between the node's check and its rename
// (its client gave up on the call and claimed it back) is ErrNotStaged,
// not an internal error, and nothing is stored.
func TestIngestStaged_PrefixClaimedBackMeanwhile(t *testing.T) {
	root := t.TempDir()
	n := serveStore(t, root, "st", Options{InlineBytes: 512})
	c := dialT(t, n.addr, "st", root, "ref")
	testBeforeTakeStaged = func(dir string) {
		testBeforeTakeStaged = nil
		discardStaged(dir)
	}
	t.Cleanup(func() { testBeforeTakeStaged = nil })
	_, err := c.Append(ctxT(t), "b", itemTD(t, 1, 2000))
	if !errors.Is(err, ErrNotStaged) {
		t.Fatalf("Append whose prefix went away before the node took it: %v, want ErrNotStaged", err)
	}
	if got, err := c.Peek(ctxT(t), "b"); err != nil || len(got) != 0 {
		t.Fatalf("the bin after: %d items, %v; want none", len(got), err)
	}
	for _, sub := range []string{valuesDir, stagingDir} {
		if ents, _ := os.ReadDir(filepath.Join(root, "st", sub)); len(ents) != 0 {
			t.Errorf("%s/ holds %d entries, want none", sub, len(ents))
		}
	}
}
