package loader

import (
	"context"
	"errors"
	"log/slog"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/tensorwire/tensorwire/internal/testkit/proctest"
	"github.com/tensorwire/tensorwire/tensordict"
)

// TestProducer_TruncatedFileIsNamedAndLogged: a producer whose dataset, or
// whose own ring, is truncated under it stops with ErrFailed naming the
// file that was truncated (before, a truncated ring was reported as a
// fault with no file, or as the dataset's), and says so once at ERROR in
// its log (before: nothing was logged; issue 24).
func TestProducer_TruncatedFileIsNamedAndLogged(t *testing.T) {
	for _, which := range []string{"dataset", "ring"} {
		t.Run(which, func(t *testing.T) {
			var log proctest.LockedBuffer
			f := newFixture(t, 512, Config{Batch: 16, Slots: 4, Log: slog.New(slog.NewTextHandler(&log, nil))})
			td := f.p.pipe.src.td
			if which == "ring" {
				td = f.p.ring.store
			}
			path := firstMapped(t, td)
			if err := os.Truncate(path, 0); err != nil {
				t.Fatal(err)
			}
			c := f.dial(t, 16, true)
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			var err error
			for e := 0; e < 3 && err == nil; e++ {
				_, _, err = consumerEpoch(ctx, c)
			}
			if !errors.Is(err, ErrFailed) {
				t.Fatalf("consuming with the %s truncated: %v, want ErrFailed", which, err)
			}
			failed := f.p.Stats().Failed
			if !strings.Contains(failed, "truncated: "+path) {
				t.Errorf("the producer's failure does not name %s:\n%s", path, failed)
			}
			if which == "ring" && strings.Contains(failed, "truncated: "+firstMapped(t, f.p.pipe.src.td)) {
				t.Errorf("a truncated ring is blamed on the dataset:\n%s", failed)
			}
			if n := strings.Count(log.String(), "level=ERROR"); n != 1 || !strings.Contains(log.String(), path) {
				t.Errorf("%d ERROR lines, want 1 naming %s:\n%s", n, path, log.String())
			}
		})
	}
}

// firstMapped returns the file of td's first mapped leaf.
func firstMapped(t *testing.T, td *tensordict.TensorDict) string {
	t.Helper()
	for _, l := range td.Leaves() {
		if mm, _ := l.Mapping(); mm != nil {
			return mm.Path()
		}
	}
	t.Fatal("no mapped leaf")
	return ""
}
