package loader

import (
	"context"
	"encoding/json"
	"errors"
	"math"
	"os"
	"path/filepath"
	"strconv"
	"testing"

	"github.com/tensorwire/tensorwire/memmap"
	"github.com/tensorwire/tensorwire/rpc"
	"github.com/tensorwire/tensorwire/tensordict"
)

func TestDial_BadBatchSize(t *testing.T) {
	f := newFixture(t, 100, Config{Batch: 16, Slots: 4})
	for _, b := range []int{0, -1, 16*4 + 1, 1 << 40} {
		c, err := Dial(context.Background(), f.addr, "train", Options{Batch: b, Root: f.root})
		if err == nil {
			c.Close()
			t.Errorf("batch %d: no error", b)
			continue
		}
		if !errors.Is(err, ErrArgument) {
			t.Errorf("batch %d: %v, want ErrArgument", b, err)
		}
		if b > 0 && !errors.Is(err, rpc.ErrInvalidArgument) {
			t.Errorf("batch %d: %v, want it to match rpc.ErrInvalidArgument too", b, err)
		}
	}
	if st := f.p.Stats(); st.Joined != 0 {
		t.Errorf("%d consumers joined", st.Joined)
	}
	if _, err := Dial(context.Background(), f.addr, "nope", Options{Batch: 1}); !errors.Is(err, ErrNotFound) {
		t.Errorf("unknown loader: %v, want ErrNotFound", err)
	}
	if _, err := NewLocal(Config{Dataset: f.dataset}, Options{Batch: 0}); !errors.Is(err, ErrArgument) {
		t.Errorf("NewLocal with batch 0: %v, want ErrArgument", err)
	}
}

func TestNewProducer_BadDataset(t *testing.T) {
	root := t.TempDir()
	empty := filepath.Join(root, "empty")
	os.Mkdir(empty, 0o755)
	file := filepath.Join(root, "file")
	os.WriteFile(file, []byte("not a tensordict"), 0o644)
	norows := filepath.Join(root, "norows")
	td, err := tensordict.Create(norows, []int{0}, tensordict.Field{Key: []string{"x"}, DType: memmap.Float32, Shape: []int{0, 3}})
	if err != nil {
		t.Fatal(err)
	}
	td.Close()
	nobatch := filepath.Join(root, "nobatch")
	td, err = tensordict.Create(nobatch, nil, tensordict.Field{Key: []string{"x"}, DType: memmap.Float32, Shape: []int{3}})
	if err != nil {
		t.Fatal(err)
	}
	td.Close()
	notensor := filepath.Join(root, "notensor")
	td, err = tensordict.Create(notensor, []int{5})
	if err != nil {
		t.Fatal(err)
	}
	td.Close()
	gray := filepath.Join(root, "gray")
	makeDataset(t, gray, 4)
	for _, tc := range []struct {
		name string
		cfg  Config
		want error
	}{
		{"no prefix", Config{}, ErrDataset},
		{"missing", Config{Dataset: filepath.Join(root, "missing")}, ErrDataset},
		{"empty folder", Config{Dataset: empty}, ErrDataset},
		{"a file", Config{Dataset: file}, ErrDataset},
		{"no rows", Config{Dataset: norows}, ErrDataset},
		{"no batch dimension", Config{Dataset: nobatch}, ErrDataset},
		{"no tensors", Config{Dataset: notensor}, ErrDataset},
		{"transform refuses", Config{Dataset: gray, Transform: &Augment{Key: []string{"labels"}}}, ErrDataset},
		{"index key taken", Config{Dataset: gray, IndexKey: "labels"}, ErrConfig},
		{"no batch size", Config{Dataset: gray, Batch: -1}, ErrConfig},
		{"window past the ring", Config{Dataset: gray, Slots: 2, Window: 3}, ErrConfig},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := tc.cfg
			cfg.Dir = filepath.Join(t.TempDir(), "ring")
			if cfg.Batch == 0 {
				cfg.Batch = 2
			}
			p, err := NewProducer(cfg)
			if err == nil {
				p.Close()
				t.Fatal("no error")
			}
			if !errors.Is(err, tc.want) {
				t.Errorf("%v, want %v", err, tc.want)
			}
			if tc.want == ErrDataset {
				if _, err := os.Stat(cfg.Dir); !os.IsNotExist(err) {
					t.Errorf("the ring folder was made for a dataset refused (%v)", err)
				}
			}
		})
	}
}

func TestNewProducer_RingFolder(t *testing.T) {
	root := t.TempDir()
	data := filepath.Join(root, "data")
	makeDataset(t, data, 10)

	// A folder holding something else is refused, and left as it was.
	other := filepath.Join(root, "other")
	os.Mkdir(other, 0o755)
	os.WriteFile(filepath.Join(other, "precious.txt"), []byte("keep"), 0o644)
	if p, err := NewProducer(Config{Dataset: data, Dir: other, Batch: 2}); !errors.Is(err, ErrExists) {
		if err == nil {
			p.Close()
		}
		t.Errorf("a folder with other files: %v, want ErrExists", err)
	}
	if entries, _ := os.ReadDir(other); len(entries) != 1 {
		t.Errorf("the refused folder holds %d entries, want its 1", len(entries))
	}

	// One producer per folder.
	dir := filepath.Join(root, "ring")
	p, err := NewProducer(Config{Dataset: data, Dir: dir, Batch: 2})
	if err != nil {
		t.Fatal(err)
	}
	if p2, err := NewProducer(Config{Dataset: data, Dir: dir, Batch: 2}); !errors.Is(err, ErrInUse) {
		if err == nil {
			p2.Close()
		}
		t.Errorf("a second producer: %v, want ErrInUse", err)
	}
	ring := p.ring.path
	if err := p.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(ring); !os.IsNotExist(err) {
		t.Errorf("Close left the ring %s (%v)", ring, err)
	}
	// The folder is a loader's now: another producer takes it.
	p, err = NewProducer(Config{Dataset: data, Dir: dir, Batch: 5})
	if err != nil {
		t.Fatal(err)
	}
	p.Close()
}

// TestNewProducer_ReopenEpochOutOfRange: a loader.json whose last epoch
// begun is out of range (damaged, or written by something else) is not
// resumed from: the producer begins at epoch 0, not at an epoch that
// wrapped round to a negative one.
func TestNewProducer_ReopenEpochOutOfRange(t *testing.T) {
	root := t.TempDir()
	data := filepath.Join(root, "data")
	makeDataset(t, data, 10)
	abs, err := filepath.Abs(data)
	if err != nil {
		t.Fatal(err)
	}
	for _, epoch := range []int64{math.MaxInt64, -2, math.MinInt64} {
		t.Run(strconv.FormatInt(epoch, 10), func(t *testing.T) {
			dir := filepath.Join(t.TempDir(), "ring")
			os.Mkdir(dir, 0o755)
			b, _ := json.Marshal(ringMeta{Version: 1, Dataset: abs, Seed: 3, Epoch: epoch})
			if err := os.WriteFile(filepath.Join(dir, MetaFile), b, 0o644); err != nil {
				t.Fatal(err)
			}
			p, err := NewProducer(Config{Dataset: data, Dir: dir, Batch: 2, Seed: 3})
			if err != nil {
				t.Fatal(err)
			}
			defer p.Close()
			ji, err := p.join(2)
			if err != nil {
				t.Fatal(err)
			}
			if ji.epoch != 0 {
				t.Errorf("after a %s saying epoch %d was begun, a consumer joins epoch %d, want 0", MetaFile, epoch, ji.epoch)
			}
		})
	}
}
