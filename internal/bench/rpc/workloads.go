package rpc

import (
	"context"
	"encoding/binary"
	"fmt"
	"sync"
	"time"

	"github.com/tensorwire/tensorwire/internal/bench/report"
)

// The workload drivers, each generic over the client interface.

const (
	smallCallers = 16 // concurrent callers of the small workload
	smallWarmup  = 20 // untimed calls per caller before the timed window
	bulkWarmup   = 3  // untimed bulk calls per system before the timed ones
)

// smallResult is what one small run measured.
type smallResult struct {
	calls   int
	elapsed time.Duration  // from the start of the window until the last call returned
	lat     report.Latency // every call's latency, all callers
}

// add adds the figures of another run of the workload.
func (r *smallResult) add(o smallResult) {
	r.calls += o.calls
	r.elapsed += o.elapsed
	r.lat.Merge(&o.lat)
}

func (r smallResult) callsPerS() float64 {
	if r.elapsed <= 0 {
		return 0
	}
	return float64(r.calls) / r.elapsed.Seconds()
}

// runSmall has callers goroutines call c.small in a loop for d, after
// smallWarmup untimed calls each, and returns every call's latency (each
// caller records its own histogram; they are merged at the end). Caller i
// sends requests holding i and a sequence number, and checks every response.
// The first error stops all callers and is returned.
func runSmall(ctx context.Context, c client, callers int, d time.Duration) (smallResult, error) {
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	var (
		ready, wg sync.WaitGroup
		start     = make(chan struct{})
		deadline  time.Time // set before start is closed
		lats      = make([]report.Latency, callers)
	)
	ready.Add(callers)
	for i := range callers {
		wg.Go(func() {
			req := make([]byte, smallSize)
			binary.LittleEndian.PutUint64(req, uint64(i))
			var seq uint64
			call := func() error {
				seq++
				binary.LittleEndian.PutUint64(req[8:], seq)
				resp, err := c.small(ctx, req)
				if err != nil {
					return err
				}
				return checkSmallReply(req, resp)
			}
			var err error
			for range smallWarmup {
				if err = call(); err != nil {
					break
				}
			}
			ready.Done()
			if err != nil {
				cancel(fmt.Errorf("small warm-up: %w", err))
				return
			}
			select {
			case <-start:
			case <-ctx.Done():
				return
			}
			l := &lats[i]
			for {
				t0 := time.Now()
				if !t0.Before(deadline) {
					break
				}
				if err := call(); err != nil {
					cancel(fmt.Errorf("small: %w", err))
					return
				}
				l.Record(time.Since(t0))
			}
		})
	}
	ready.Wait()
	t0 := time.Now()
	deadline = t0.Add(d)
	close(start)
	wg.Wait()
	elapsed := time.Since(t0)
	if err := context.Cause(ctx); err != nil {
		return smallResult{}, err
	}
	res := smallResult{elapsed: elapsed}
	for i := range lats {
		res.calls += int(lats[i].Count())
		res.lat.Merge(&lats[i])
	}
	return res, nil
}

// A target is a named client, for the drivers that run several systems.
type target struct {
	name   string
	client client
}

// runBulk sends payload with bulk, in warm+iters rounds each of which calls
// every target once, in order, so that all see the same conditions; it
// returns each target's times of the last iters rounds. Every call gets a
// new call id.
func runBulk(ctx context.Context, targets []target, payload []byte, warm, iters int) ([]report.Latency, error) {
	times := make([]report.Latency, len(targets))
	var id uint64
	for round := range warm + iters {
		for i, t := range targets {
			if err := ctx.Err(); err != nil {
				return nil, err
			}
			id++
			setBulkID(payload, id)
			t0 := time.Now()
			err := t.client.bulk(ctx, payload)
			d := time.Since(t0)
			if err != nil {
				return nil, fmt.Errorf("%s: bulk call %d: %w", t.name, round+1, err)
			}
			if round >= warm {
				times[i].Record(d)
			}
		}
	}
	return times, nil
}

// runStream streams total bytes in msgSize-byte messages with c.stream,
// after (with warmUp) an untimed stream of a sixteenth of that (at least
// one message), and returns the time of the timed one, acknowledgement
// included.
func runStream(ctx context.Context, c client, total int64, msgSize int, warmUp bool) (time.Duration, error) {
	if warmUp {
		warm := min(total, max(total/16, int64(msgSize)))
		if err := c.stream(ctx, warm, msgSize); err != nil {
			return 0, fmt.Errorf("stream warm-up: %w", err)
		}
	}
	t0 := time.Now()
	if err := c.stream(ctx, total, msgSize); err != nil {
		return 0, fmt.Errorf("stream: %w", err)
	}
	return time.Since(t0), nil
}
