package replay

import (
	"errors"
	"os"
	"path/filepath"
	"slices"
	"testing"

	"github.com/tensorwire/tensorwire/memmap"
	"github.com/tensorwire/tensorwire/rpc"
)

// TestBuffer_StorageLost: once a buffer's files are deleted, replaced or
// truncated under it, it acknowledges nothing more: Extend, Sample,
// UpdatePriority and Checkpoint fail with ErrStorageLost, Stats says why,
// and neither Checkpoint nor Close writes anything where the buffer was.
func TestBuffer_StorageLost(t *testing.T) {
	for _, tc := range []struct {
		name string
		do   func(prefix string) error
		gone bool // the prefix no longer exists
	}{
		{"folder deleted", os.RemoveAll, true},
		{"folder renamed", func(p string) error { return os.Rename(p, p+".old") }, true},
		{"storage deleted", func(p string) error { return os.RemoveAll(filepath.Join(p, StorageDir)) }, false},
		{"slot table replaced", func(p string) error {
			data, err := os.ReadFile(filepath.Join(p, SlotsFile))
			if err != nil {
				return err
			}
			os.Remove(filepath.Join(p, SlotsFile))
			return os.WriteFile(filepath.Join(p, SlotsFile), data, 0o644)
		}, false},
		{"storage truncated", func(p string) error { return os.Truncate(filepath.Join(p, StorageDir, "obs.memmap"), 0) }, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			prefix := filepath.Join(t.TempDir(), "buf")
			b, err := Create(prefix, Config{Capacity: 8, Schema: testSchema})
			if err != nil {
				t.Fatal(err)
			}
			defer b.Close()
			extend(t, b, 0, 1, 2, 3)
			_, info, err := b.Sample(ctxT(t), 2)
			if err != nil {
				t.Fatal(err)
			}
			if err := tc.do(prefix); err != nil {
				t.Fatal(err)
			}
			if tc.gone {
				// The folder gone is found by the next call, whatever it is.
				if _, err := b.Extend(ctxT(t), transitions(t, 4)); !errors.Is(err, ErrStorageLost) {
					t.Fatalf("Extend into a deleted buffer: %v; want ErrStorageLost", err)
				}
			}
			st := stats(t, b)
			if st.StorageLost == "" {
				t.Fatalf("Stats after the files were lost: %+v; want StorageLost to say why", st)
			}
			t.Logf("StorageLost: %s", st.StorageLost)
			if _, err := b.Extend(ctxT(t), transitions(t, 5)); !errors.Is(err, ErrStorageLost) {
				t.Errorf("Extend: %v; want ErrStorageLost", err)
			}
			if _, _, err := b.Sample(ctxT(t), 1); !errors.Is(err, ErrStorageLost) {
				t.Errorf("Sample: %v; want ErrStorageLost", err)
			}
			if _, err := b.UpdatePriority(ctxT(t), info, []float64{1, 1}); !errors.Is(err, ErrStorageLost) {
				t.Errorf("UpdatePriority: %v; want ErrStorageLost", err)
			}
			if err := b.Checkpoint(ctxT(t)); !errors.Is(err, ErrStorageLost) {
				t.Errorf("Checkpoint: %v; want ErrStorageLost", err)
			}
			if st := stats(t, b); st.Inserted != 4 {
				t.Errorf("Inserted = %d after the loss, want the 4 acknowledged before", st.Inserted)
			}
			b.Close()
			if _, err := os.Stat(prefix); tc.gone && !errors.Is(err, os.ErrNotExist) {
				t.Errorf("after Checkpoint and Close, %s exists again (%v)", prefix, err)
			}
		})
	}
}

// TestRemote_StorageLost: a served buffer whose folder is deleted fails
// every call after with ErrStorageLost, DataLoss on the wire, and its Stats
// say so; a truncated storage file is reported as that data loss however
// often the writer retries, never as "every slot is reserved". (A writer
// by reference faults on its own mapping first: it reports that fault,
// until the node finds the loss.)
func TestRemote_StorageLost(t *testing.T) {
	for _, mode := range modes {
		for _, how := range []string{"folder deleted", "storage truncated"} {
			t.Run(mode+"/"+how, func(t *testing.T) {
				root := t.TempDir()
				n := serveBuffer(t, root, "buf", Config{Capacity: 8, Schema: testSchema})
				c := dialBuffer(t, n.addr, "buf", root, mode)
				extend(t, c, 0, 1, 2, 3)
				prefix := filepath.Join(root, "buf")
				var err error
				if how == "folder deleted" {
					err = os.RemoveAll(prefix)
				} else {
					err = os.Truncate(filepath.Join(prefix, StorageDir, "obs.memmap"), 0)
				}
				if err != nil {
					t.Fatal(err)
				}
				var seen []string
				for i := range 6 { // more than the buffer has slots for
					_, err := c.Extend(ctxT(t), transitions(t, 10+4*i, 11+4*i, 12+4*i, 13+4*i))
					lost := errors.Is(err, ErrStorageLost) && errors.Is(err, rpc.ErrDataLoss)
					ownFault := mode == "ref" && how == "storage truncated" && errors.Is(err, memmap.ErrFault)
					if !lost && !(ownFault && i < 2) {
						t.Fatalf("Extend %d after the storage was lost: %v; want ErrStorageLost (DataLoss)", i, err)
					}
					if !slices.Contains(seen, err.Error()) {
						seen = append(seen, err.Error())
					}
				}
				t.Logf("the errors: %q", seen)
				st, err := c.Stats(ctxT(t))
				if err != nil || st.StorageLost == "" {
					t.Fatalf("Stats: %+v, %v; want StorageLost to say why", st, err)
				}
				if _, _, err := c.Sample(ctxT(t), 1); !errors.Is(err, ErrStorageLost) || !errors.Is(err, rpc.ErrDataLoss) {
					t.Errorf("Sample: %v; want ErrStorageLost and DataLoss", err)
				}
			})
		}
	}
}
