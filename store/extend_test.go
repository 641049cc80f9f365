package store

import (
	"errors"
	"os"
	"path/filepath"
	"slices"
	"testing"

	"github.com/tensorwire/tensorwire/rpc"
	"github.com/tensorwire/tensorwire/tensordict"
)

// extendTargets are the ways to reach one store: in process, and from a
// client by reference and by bytes. Each returns the API and the Store
// behind it.
func extendTargets(t *testing.T, o Options) map[string]func() (API, *Store) {
	return map[string]func() (API, *Store){
		"local": func() (API, *Store) {
			s := openT(t, filepath.Join(t.TempDir(), "st"), o)
			return s, s
		},
		"ref": func() (API, *Store) {
			root := t.TempDir()
			n := serveStore(t, root, "st", o)
			return dialT(t, n.addr, "st", root, "ref"), n.s
		},
		"bytes": func() (API, *Store) {
			root := t.TempDir()
			n := serveStore(t, root, "st", o)
			return dialT(t, n.addr, "st", root, "bytes"), n.s
		},
	}
}

func itemTDs(t *testing.T, sizes map[int64]int, order ...int64) []*tensordict.TensorDict {
	var tds []*tensordict.TensorDict
	for _, id := range order {
		tds = append(tds, itemTD(t, id, sizes[id]))
	}
	return tds
}

// TestExtend: the values land in order, after what the bin held, as one
// revision and one append event, small ones in the log and large ones as
// prefixes, and survive a restart.
func TestExtend(t *testing.T) {
	for name, open := range extendTargets(t, Options{InlineBytes: 512}) {
		t.Run(name, func(t *testing.T) {
			ctx := ctxT(t)
			api, s := open()
			rev0, err := api.Append(ctx, "b", itemTD(t, 0, 4))
			if err != nil {
				t.Fatal(err)
			}
			sizes := map[int64]int{1: 4, 2: 100, 3: 8, 4: 200} // 2 and 4: prefixes (over 512 bytes)
			rev, err := api.Extend(ctx, "b", itemTDs(t, sizes, 1, 2, 3, 4))
			if err != nil {
				t.Fatal(err)
			}
			if rev != rev0+1 {
				t.Errorf("Extend's revision %d after the Append's %d, want one more", rev, rev0)
			}
			peek, err := api.Peek(ctx, "b")
			if err != nil {
				t.Fatal(err)
			}
			if got := ids(t, peek); !slices.Equal(got, []int64{0, 1, 2, 3, 4}) {
				t.Fatalf("Peek after Extend = %v", got)
			}
			var events []Event
			for e, err := range api.Watch(ctx, "b", rev0) {
				if err != nil {
					t.Fatal(err)
				}
				events = append(events, e)
				break // the first after the Append: nothing follows it
			}
			if want := (Event{Revision: rev, Op: OpAppend, Name: "b", Items: 5}); len(events) != 1 || events[0] != want {
				t.Errorf("events after the Append = %+v, want %+v", events, want)
			}
			if vals, _ := os.ReadDir(filepath.Join(s.Dir(), valuesDir)); len(vals) != 2 {
				t.Errorf("%d prefixes under values/, want 2", len(vals))
			}
			// The log holds them: a reopened store has them all.
			dir := s.Dir()
			if name != "local" {
				return
			}
			s.Close()
			s2 := openT(t, dir, Options{InlineBytes: 512})
			peek, err = s2.Peek(ctx, "b")
			if err != nil {
				t.Fatal(err)
			}
			if got := ids(t, peek); !slices.Equal(got, []int64{0, 1, 2, 3, 4}) {
				t.Fatalf("Peek after reopening = %v", got)
			}
		})
	}
}

// TestExtend_AllOrNothing: an Extend refused for one of its values, or for
// their number, changes nothing and leaves no file behind.
func TestExtend_AllOrNothing(t *testing.T) {
	for name, open := range extendTargets(t, Options{InlineBytes: 512, MaxValueBytes: 1000}) {
		t.Run(name, func(t *testing.T) {
			ctx := ctxT(t)
			api, s := open()
			sizes := map[int64]int{1: 4, 2: 100, 3: 200} // 3: 1,600 bytes, over MaxValueBytes
			if _, err := api.Extend(ctx, "b", itemTDs(t, sizes, 1, 2, 3)); !errors.Is(err, ErrTooLarge) {
				t.Errorf("Extend with a value too large = %v, want ErrTooLarge", err)
			}
			if _, err := api.Extend(ctx, "b", nil); !errors.Is(err, ErrFormat) {
				t.Errorf("Extend with no values = %v, want ErrFormat", err)
			}
			many := make([]*tensordict.TensorDict, maxExtend+1)
			for i := range many {
				many[i] = itemTD(t, int64(i), 1)
			}
			if _, err := api.Extend(ctx, "b", many); !errors.Is(err, ErrFormat) {
				t.Errorf("Extend with %d values = %v, want ErrFormat", len(many), err)
			}
			if _, err := api.Extend(ctx, "b", []*tensordict.TensorDict{itemTD(t, 1, 1), nil}); !errors.Is(err, ErrFormat) {
				t.Errorf("Extend with a nil value = %v, want ErrFormat", err)
			}
			if _, err := api.Extend(ctx, "a/b", itemTDs(t, sizes, 1)); !errors.Is(err, ErrName) {
				t.Errorf("Extend of a/b = %v, want ErrName", err)
			}
			if st := s.Stats(); st.Revision != 0 || st.Items != 0 {
				t.Errorf("revision %d and %d items after refused Extends", st.Revision, st.Items)
			}
			for _, d := range []string{valuesDir, stagingDir} {
				if left, _ := os.ReadDir(filepath.Join(s.Dir(), d)); len(left) != 0 {
					t.Errorf("%d entries left in %s/", len(left), d)
				}
			}
		})
	}
}

// TestExtend_NodeChecksEveryValue: the node refuses an extend with one bad
// value (a staged name that is not one, past the client's checks), applies
// none of the others and keeps none of their files.
func TestExtend_NodeChecksEveryValue(t *testing.T) {
	ctx := ctxT(t)
	root := t.TempDir()
	n := serveStore(t, root, "st", Options{InlineBytes: 512})
	c := dialT(t, n.addr, "st", root, "ref")
	big := valueMsg{TD: &rpc.TD{TensorDict: itemTD(t, 1, 100)}} // a prefix on the node
	small := valueMsg{TD: &rpc.TD{TensorDict: itemTD(t, 2, 1)}}
	bad := valueMsg{Staged: "staging/" + newStagedName()}
	_, err := rpc.Call[revResponse](ctx, c.rc, MethodExtend, extendRequest{Store: "st", Bin: "b",
		Values: []valueMsg{big, small, bad}, Req: c.nextReq()})
	if !errors.Is(err, ErrNotStaged) {
		t.Fatalf("extend with a bad staged name = %v, want ErrNotStaged", err)
	}
	if st := n.s.Stats(); st.Revision != 0 || st.Items != 0 {
		t.Errorf("revision %d and %d items after a refused extend", st.Revision, st.Items)
	}
	if left, _ := os.ReadDir(filepath.Join(n.s.Dir(), valuesDir)); len(left) != 0 {
		t.Errorf("%d prefixes left under values/", len(left))
	}
}

// TestExtend_RetriedOnce: an extend sent again with its request id (the
// connection broke before its answer) is answered as the first, not
// applied twice.
func TestExtend_RetriedOnce(t *testing.T) {
	ctx := ctxT(t)
	root := t.TempDir()
	n := serveStore(t, root, "st", Options{})
	c := dialT(t, n.addr, "st", root, "bytes")
	req := extendRequest{Store: "st", Bin: "b", Req: c.nextReq(), Values: []valueMsg{
		{TD: &rpc.TD{TensorDict: itemTD(t, 1, 4)}}, {TD: &rpc.TD{TensorDict: itemTD(t, 2, 4)}}}}
	first, err := rpc.Call[revResponse](ctx, c.rc, MethodExtend, req)
	if err != nil {
		t.Fatal(err)
	}
	again, err := rpc.Call[revResponse](ctx, c.rc, MethodExtend, req)
	if err != nil || again != first {
		t.Fatalf("the extend sent again = %+v, %v; first %+v", again, err, first)
	}
	got, err := c.Get(ctx, "b")
	if err != nil {
		t.Fatal(err)
	}
	if ids := ids(t, got); !slices.Equal(ids, []int64{1, 2}) {
		t.Fatalf("the bin after one extend sent twice = %v", ids)
	}
}

// TestExtend_LoggedTooLarge: values that would make one log record too
// large together are refused before any is sent or staged.
func TestExtend_LoggedTooLarge(t *testing.T) {
	defer func(m int64) { maxLogged = m }(maxLogged)
	maxLogged = 1000
	for name, open := range extendTargets(t, Options{InlineBytes: 4096}) {
		t.Run(name, func(t *testing.T) {
			ctx := ctxT(t)
			api, s := open()
			sizes := map[int64]int{1: 100, 2: 100, 3: 1000} // 800 bytes each in the log; 3: a prefix
			if _, err := api.Extend(ctx, "b", itemTDs(t, sizes, 1, 2)); !errors.Is(err, ErrTooLarge) {
				t.Errorf("Extend of 1,600 bytes to log = %v, want ErrTooLarge", err)
			}
			if st := s.Stats(); st.Revision != 0 {
				t.Errorf("revision %d after a refused Extend", st.Revision)
			}
			if _, err := api.Extend(ctx, "b", itemTDs(t, sizes, 1, 3)); err != nil {
				t.Errorf("Extend of 800 bytes to log and a prefix: %v", err)
			}
		})
	}
}

// BenchmarkExtend: one Extend of 4,096 inline values of 1 KiB (4 MiB in
// one log record) into a store without fsync, per op.
func BenchmarkExtend(b *testing.B) {
	s := openT(b, filepath.Join(b.TempDir(), "st"), Options{NoSync: true})
	tds := make([]*tensordict.TensorDict, maxExtend)
	for i := range tds {
		tds[i] = itemTD(b, int64(i), 128)
	}
	ctx := ctxT(b)
	b.SetBytes(int64(len(tds)) * 128 * 8)
	for b.Loop() {
		if _, err := s.Extend(ctx, "b", tds); err != nil {
			b.Fatal(err)
		}
		if _, err := s.Get(ctx, "b"); err != nil {
			b.Fatal(err)
		}
	}
}
