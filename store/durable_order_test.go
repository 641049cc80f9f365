package store

import (
	"sync"
	"testing"
	"time"
)

// TestStore_DurableBeforeReturn: once a write returns, the store's own
// record of what is durable covers it. A Watch from now started after it
// must not replay it, and the version a Publish superseded is collected
// at once; both read that record. The hook holds the log between telling
// the store and waking the writer's caller, once: were the waiters woken
// first, the write would return while the record still lagged.
func TestStore_DurableBeforeReturn(t *testing.T) {
	for _, tc := range []struct {
		name string
		opts Options
	}{
		{"sync", Options{}},
		{"nosync", Options{NoSync: true}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx := ctxT(t)
			s := openT(t, t.TempDir(), tc.opts)
			var once sync.Once
			hook := func(uint64) { once.Do(func() { time.Sleep(200 * time.Millisecond) }) }
			testHookDurable.Store(&hook)
			t.Cleanup(func() { testHookDurable.Store(nil) })
			for i := range 3 {
				rev, err := s.Append(ctx, "b", itemTD(t, int64(i), 1))
				if err != nil {
					t.Fatal(err)
				}
				s.mu.Lock()
				durable := s.durable
				s.mu.Unlock()
				if durable < rev {
					t.Fatalf("append %d returned revision %d while the store counts %d durable", i, rev, durable)
				}
			}
		})
	}
}
