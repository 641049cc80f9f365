package store

import (
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/tensorwire/tensorwire/internal/testkit/proctest"
)

// syncBuffer is a log sink safe for a logger's concurrent writes.
type syncBuffer = proctest.LockedBuffer

// TestStore_LogRemovedStopsAcknowledging: once store.log is deleted (or
// replaced) under a running store, no operation is acknowledged any more:
// every call fails with ErrLost naming the log, logged once at ERROR.
func TestStore_LogRemovedStopsAcknowledging(t *testing.T) {
	for _, how := range []string{"deleted", "replaced", "folder deleted"} {
		for _, noSync := range []bool{false, true} {
			t.Run(fmt.Sprintf("%s,nosync=%v", how, noSync), func(t *testing.T) {
				ctx := ctxT(t)
				dir := filepath.Join(t.TempDir(), "st")
				var logs syncBuffer
				s := openT(t, dir, Options{NoSync: noSync, Logger: slog.New(slog.NewTextHandler(&logs, nil))})
				if _, err := s.Append(ctx, "b", itemTD(t, 1, 1)); err != nil {
					t.Fatal(err)
				}
				path := filepath.Join(dir, logName)
				switch how {
				case "deleted":
					os.Remove(path)
				case "replaced":
					os.Rename(path, path+".old")
					os.WriteFile(path, []byte(logMagic), 0o644)
				case "folder deleted":
					os.RemoveAll(dir)
				}
				for i := range 3 {
					_, err := s.Append(ctx, "b", itemTD(t, int64(i+2), 1))
					if !errors.Is(err, ErrLost) || !strings.Contains(err.Error(), path) {
						t.Fatalf("Append %d after the log was %s = %v, want ErrLost naming %s", i, how, err, path)
					}
				}
				if _, _, err := s.List(ctx); !errors.Is(err, ErrLost) {
					t.Errorf("List after the log was %s = %v, want ErrLost", how, err)
				}
				if st := s.Stats(); !strings.Contains(st.Stopped, path) {
					t.Errorf("Stats.Stopped = %q, want the loss of %s", st.Stopped, path)
				}
				if n := strings.Count(logs.String(), "level=ERROR"); n != 1 || !strings.Contains(logs.String(), path) {
					t.Errorf("logged %d errors, want 1 naming %s:\n%s", n, path, logs.String())
				}
			})
		}
	}
}

// TestStore_FolderReplacedStops: values/ replaced under a running store (by
// a link elsewhere, say) stops it within a sweep, before it writes there.
func TestStore_FolderReplacedStops(t *testing.T) {
	ctx := ctxT(t)
	dir := t.TempDir()
	s := openT(t, dir, Options{InlineBytes: 64, Logger: slog.New(slog.DiscardHandler)})
	outside := t.TempDir()
	v := filepath.Join(dir, valuesDir)
	os.Rename(v, v+".old")
	if err := os.Symlink(outside, v); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		_, err := s.Append(ctx, "b", itemTD(t, 1, 100))
		if errors.Is(err, ErrLost) && strings.Contains(err.Error(), v) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("Append with values/ a link = %v, want ErrLost naming %s", err, v)
		}
		time.Sleep(10 * time.Millisecond)
	}
	if ents, _ := os.ReadDir(outside); len(ents) != 0 {
		t.Errorf("the store wrote %d entries through the link", len(ents))
	}
}

// TestStore_CompactionIsNoLoss: compactions replace store.log; checks of
// the log running meanwhile never take one for a removal.
func TestStore_CompactionIsNoLoss(t *testing.T) {
	ctx := ctxT(t)
	s := openT(t, t.TempDir(), Options{CompactBytes: 16 << 10, InlineBytes: 4096, Logger: slog.New(slog.DiscardHandler)})
	stop := make(chan struct{})
	done := make(chan error)
	go func() {
		for {
			select {
			case <-stop:
				done <- nil
				return
			default:
			}
			if err := s.health(); err != nil {
				done <- err
				return
			}
		}
	}()
	for i := range 2000 {
		if _, err := s.Put(ctx, "b", itemTD(t, int64(i), 100)); err != nil {
			close(stop)
			t.Fatalf("Put %d: %v", i, err)
		}
	}
	close(stop)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}
