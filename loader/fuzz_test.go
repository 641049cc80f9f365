package loader

// Fuzz targets of what the loader decodes: loader.json when a producer
// reopens its ring folder, and (fuzz_consumer_test.go) what a consumer
// takes from a node and from the ring it maps.

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io/fs"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"testing"
	"time"
)

// datasetVar in a fuzzed loader.json stands for the dataset's absolute
// path, which differs from run to run: the fuzzer can then reach a file
// written for this dataset.
const datasetVar = "$DATASET"

// FuzzReopen makes a producer for a ring folder whose loader.json is
// arbitrary bytes (a file a crash, a disk, an older or newer version or
// another program left): NewProducer fails with one of the loader's
// errors, or it serves: a consumer joins an epoch of 0 or more, the one
// after the epoch the file says was last begun when the file was written
// for this dataset and seed, and gets its batches whole. Nothing outside
// the folder changes, and the folder is left a loader's.
func FuzzReopen(f *testing.F) {
	dir := f.TempDir()
	dataset := filepath.Join(dir, "data")
	makeDataset(f, dataset, 6)
	before := listTree(f, dir)

	meta := func(epoch int64) []byte {
		b, _ := json.Marshal(ringMeta{Version: 1, Dataset: datasetVar, Seed: 7, Epoch: epoch, Ring: "ring-0123456789abcdef"})
		return b
	}
	f.Add(meta(-1))
	f.Add(meta(3))
	f.Add(meta(math.MaxInt64))
	f.Add(meta(math.MinInt64))
	f.Add([]byte(`{"version":1,"dataset":"/elsewhere","seed":7,"epoch":5}`))
	f.Add([]byte(`{"version":2,"dataset":"$DATASET","seed":7,"epoch":5}`))
	f.Add([]byte(`{"version":1,"dataset":"$DATASET","seed":7,"epoch":1e30}`))
	f.Add([]byte(`not json`))
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, meta []byte) {
		parent := t.TempDir()
		ringDir := filepath.Join(parent, "ring")
		if err := os.Mkdir(ringDir, 0o755); err != nil {
			t.Fatal(err)
		}
		meta = bytes.ReplaceAll(meta, []byte(datasetVar), []byte(dataset))
		if err := os.WriteFile(filepath.Join(ringDir, MetaFile), meta, 0o644); err != nil {
			t.Fatal(err)
		}
		// An earlier producer's ring, which a new one removes.
		if err := os.MkdirAll(filepath.Join(ringDir, "ring-0123456789abcdef", StorageDir), 0o755); err != nil {
			t.Fatal(err)
		}
		defer func() {
			if got := listTree(t, dir); !slices.Equal(got, before) {
				t.Fatalf("the dataset's folder changed: %v, was %v", got, before)
			}
			entries, _ := os.ReadDir(parent)
			if len(entries) != 1 || entries[0].Name() != "ring" {
				t.Fatalf("the ring folder's parent holds %v", entries)
			}
		}()

		cfg := Config{Dataset: dataset, Dir: ringDir, Batch: 4, Slots: 2, Seed: 7, Heartbeat: time.Hour, MaxWait: time.Hour}
		p, err := NewProducer(cfg)
		if err != nil {
			if !errors.Is(err, ErrExists) && !errors.Is(err, ErrConfig) {
				t.Fatalf("NewProducer: %v, want ErrExists or ErrConfig", err)
			}
			return
		}
		defer p.Close()
		want := int64(0)
		var old ringMeta
		if json.Unmarshal(meta, &old) == nil && old.Dataset == dataset && old.Seed == cfg.Seed &&
			old.Epoch >= -1 && old.Epoch < math.MaxInt64 {
			want = old.Epoch + 1
		}
		ji, err := p.join(cfg.Batch)
		if err != nil {
			t.Fatalf("join: %v", err)
		}
		if ji.epoch < 0 || ji.epoch != want {
			t.Fatalf("a consumer of a producer reopened after %q joins epoch %d, want %d", meta, ji.epoch, want)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		epoch, index := ji.epoch, 0
		var ids []int
		for len(ids) < p.Len() {
			as, err := p.push(ctx, ji.id, &epoch, &index)
			if err != nil {
				t.Fatalf("push: %v", err)
			}
			for _, a := range as {
				if a.Epoch != ji.epoch {
					t.Fatalf("batch %d of epoch %d, want epoch %d", a.Index, a.Epoch, ji.epoch)
				}
				td, err := p.copyBatch(a, ringBatchBuf(t, p))
				if err != nil {
					t.Fatal(err)
				}
				got, err := sampleIDs(td)
				if err != nil {
					t.Fatal(err)
				}
				ids = append(ids, got...)
				if err := p.release(ji.id, a.Epoch, a.Index+1); err != nil {
					t.Fatal(err)
				}
			}
		}
		if w := wantOrder(p.Len(), cfg.Seed, ji.epoch); !slices.Equal(ids, w) {
			t.Fatalf("epoch %d: samples %v, want %v", ji.epoch, ids, w)
		}
		if m, err := readMeta(ringDir); err != nil || m.Epoch < ji.epoch {
			t.Fatalf("%s after epoch %d began: %+v, %v", MetaFile, ji.epoch, m, err)
		}
	})
}

// listTree returns the paths, sizes and modification times of the files
// under dir.
func listTree(t testing.TB, dir string) []string {
	t.Helper()
	var out []string
	err := filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		fi, err := d.Info()
		if err != nil {
			return err
		}
		out = append(out, path+" "+fi.Mode().String()+" "+fi.ModTime().String()+" "+strconv.FormatInt(fi.Size(), 10))
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}
