package loader

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// plantVictims makes a folder outside the ring folder, holding files a
// producer must never touch, and returns it.
func plantVictims(t *testing.T) string {
	t.Helper()
	outside := filepath.Join(t.TempDir(), "outside")
	for _, v := range []string{"keep.txt", StorageDir + "/keep.txt", SlotsFile} {
		os.MkdirAll(filepath.Join(outside, filepath.Dir(v)), 0o755)
		if err := os.WriteFile(filepath.Join(outside, v), []byte("mine"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return outside
}

func checkVictims(t *testing.T, outside string) {
	t.Helper()
	for _, v := range []string{"keep.txt", StorageDir + "/keep.txt", SlotsFile} {
		if b, err := os.ReadFile(filepath.Join(outside, v)); err != nil || string(b) != "mine" {
			t.Errorf("%s outside the ring folder: %q, %v; want it untouched", v, b, err)
		}
	}
	if entries, _ := os.ReadDir(outside); len(entries) != 3 {
		t.Errorf("the folder outside holds %d entries, want its 3", len(entries))
	}
}

// TestNewProducer_RefusesLinks: a symbolic link planted in a producer's
// ring folder (as its lock, its meta file, or as an earlier ring) is not
// followed: NewProducer refuses with ErrExists naming the link, and what
// the link points to is left as it was (the lock was truncated and
// written through, before).
func TestNewProducer_RefusesLinks(t *testing.T) {
	for _, name := range []string{LockFile, MetaFile, ringPrefix + "0000000000000001"} {
		t.Run(name, func(t *testing.T) {
			root := t.TempDir()
			data := filepath.Join(root, "data")
			makeDataset(t, data, 10)
			dir := filepath.Join(root, "ring")
			p, err := NewProducer(Config{Dataset: data, Dir: dir, Batch: 2})
			if err != nil {
				t.Fatal(err)
			}
			p.Close()
			outside := plantVictims(t)
			target := outside
			if name != ringPrefix+"0000000000000001" {
				target = filepath.Join(outside, "keep.txt")
				os.Remove(filepath.Join(dir, name))
			}
			link := filepath.Join(dir, name)
			if err := os.Symlink(target, link); err != nil {
				t.Fatal(err)
			}
			p, err = NewProducer(Config{Dataset: data, Dir: dir, Batch: 2})
			if err == nil {
				p.Close()
			}
			if !errors.Is(err, ErrExists) || !strings.Contains(err.Error(), link) || !strings.Contains(err.Error(), "symbolic link") {
				t.Errorf("NewProducer with %s a link: %v, want ErrExists naming %s as a symbolic link", name, err, link)
			}
			checkVictims(t, outside)
		})
	}
}

// TestNewProducer_OldRingLinksAreNotFollowed: an earlier ring that holds
// links to a folder outside is removed, and the links with it; what they
// point to is left.
func TestNewProducer_OldRingLinksAreNotFollowed(t *testing.T) {
	root := t.TempDir()
	data := filepath.Join(root, "data")
	makeDataset(t, data, 10)
	dir := filepath.Join(root, "ring")
	p, err := NewProducer(Config{Dataset: data, Dir: dir, Batch: 2})
	if err != nil {
		t.Fatal(err)
	}
	p.Close()
	outside := plantVictims(t)
	old := filepath.Join(dir, ringPrefix+"0000000000000001")
	os.Mkdir(old, 0o755)
	os.Symlink(filepath.Join(outside, StorageDir), filepath.Join(old, StorageDir))
	os.Symlink(filepath.Join(outside, SlotsFile), filepath.Join(old, SlotsFile))
	os.Symlink(outside, filepath.Join(old, "x"))
	p, err = NewProducer(Config{Dataset: data, Dir: dir, Batch: 2})
	if err != nil {
		t.Fatal(err)
	}
	p.Close()
	if _, err := os.Lstat(old); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the earlier ring is still there (%v)", err)
	}
	checkVictims(t, outside)
}

// TestConsumer_RingLinkIsNotFollowed: a consumer by reference maps the
// producer's ring; a slot table or storage replaced by a link to a copy
// elsewhere is not mapped: Dial (or the first batch) fails naming the link.
func TestConsumer_RingLinkIsNotFollowed(t *testing.T) {
	for _, name := range []string{SlotsFile, StorageDir} {
		t.Run(name, func(t *testing.T) {
			f := newFixture(t, 20, Config{Batch: 2, Slots: 4})
			link := filepath.Join(f.p.ring.path, name)
			moved := filepath.Join(t.TempDir(), name)
			if err := os.Rename(link, moved); err != nil {
				t.Fatal(err)
			}
			if err := os.Symlink(moved, link); err != nil {
				t.Fatal(err)
			}
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			c, got := Dial(ctx, f.addr, "train", Options{Batch: 2, Root: f.root})
			if got == nil {
				for _, err := range c.Batches(ctx) {
					got = err
					break
				}
				c.Close()
			}
			if got == nil || !strings.Contains(got.Error(), link) || !strings.Contains(got.Error(), "symbolic link") {
				t.Fatalf("batches through a ring whose %s is a link: %v, want an error naming %s", name, got, link)
			}
		})
	}
}
