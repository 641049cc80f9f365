package replay

import (
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// TestClient_CloseRacesCalls: Close runs while many goroutines call
// Extend, Sample, SampleInto, Stats, UpdatePriority and Checkpoint. Every
// call either succeeds or fails with ErrClosed; none sees an unmapped
// mapping (a fault, or "no mapping"), nothing panics, and the race
// detector finds nothing. Every call after Close returns ErrClosed.
func TestClient_CloseRacesCalls(t *testing.T) {
	for _, mode := range sampleModes {
		t.Run(mode, func(t *testing.T) {
			root := t.TempDir()
			n := serveBuffer(t, root, "buf", Config{Capacity: 64, Schema: testSchema})
			c := dialBuffer(t, n.addr, "buf", root, mode)
			extend(t, c, seq(0, 8)...)

			const workers = 4 // of each kind
			calls := map[string]func() error{
				"Extend": func() error { _, err := c.Extend(ctxT(t), transitions(t, 1, 2, 3)); return err },
				"Sample": func() error { _, _, err := c.Sample(ctxT(t), 4); return err },
				"SampleInto": func() error {
					dst, err := testSchema.Zeros(4)
					if err != nil {
						return err
					}
					_, err = c.SampleInto(ctxT(t), dst)
					return err
				},
				"Stats": func() error { _, err := c.Stats(ctxT(t)); return err },
				"UpdatePriority": func() error {
					_, err := c.UpdatePriority(ctxT(t), SampleInfo{Indices: []int{0}}, []float64{1})
					return err
				},
				"Checkpoint": func() error { return c.Checkpoint(ctxT(t)) },
			}
			var (
				wg      sync.WaitGroup
				started atomic.Int64 // goroutines that made a call succeed
				errs    = make(chan error, 1000)
			)
			for name, call := range calls {
				for range workers {
					wg.Add(1)
					go func() {
						defer wg.Done()
						ok := false
						for {
							err := call()
							if err == nil {
								if !ok {
									ok = true
									started.Add(1)
								}
								continue
							}
							if !errors.Is(err, ErrClosed) {
								errs <- fmt.Errorf("%s: %w; want nil or ErrClosed", name, err)
							}
							if !ok {
								started.Add(1) // closed before its first call: fine
							}
							return
						}
					}()
				}
			}
			// Close once every goroutine has made a call, or after a
			// generous while.
			for deadline := time.Now().Add(time.Minute); started.Load() < int64(len(calls)*workers) && time.Now().Before(deadline); {
				time.Sleep(time.Millisecond)
			}
			if err := c.Close(); err != nil {
				t.Errorf("Close: %v", err)
			}
			wg.Wait()
			close(errs)
			for err := range errs {
				t.Error(err)
			}
			for name, call := range calls {
				if err := call(); !errors.Is(err, ErrClosed) {
					t.Errorf("%s after Close: %v; want ErrClosed", name, err)
				}
			}
		})
	}
}

// TestClient_CloseRacesRemap: Close runs while samplers by reference
// remap the buffer's storage, because the node keeps replacing the buffer
// served under the name by another (its id changes). A sample either
// succeeds, or fails with ErrClosed, or with ErrExpired when the buffer
// was replaced in the middle of it; never with a mapping gone from under
// it. Close used to be able to unmap between a remap and the sample's use
// of the new mapping.
func TestClient_CloseRacesRemap(t *testing.T) {
	root := t.TempDir()
	n := serveBuffer(t, root, "buf", Config{Capacity: 64, Schema: testSchema})
	other, err := Create(root+"/other", Config{Capacity: 64, Schema: testSchema})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { other.Close() })
	extend(t, n.b, seq(0, 8)...)
	extend(t, other, seq(0, 8)...)
	if err := n.svc.Add("other", other); err != nil {
		t.Fatal(err)
	}
	stop := make(chan struct{})
	var swaps sync.WaitGroup
	swaps.Add(1)
	go func() {
		defer swaps.Done()
		// Replaced in one step, so that the name always serves one.
		bufs := []*Buffer{other, n.b}
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			default:
			}
			n.svc.buffers.Replace("buf", bufs[i%2])
			time.Sleep(50 * time.Microsecond)
		}
	}()
	defer func() {
		close(stop)
		swaps.Wait()
	}()

	for round := range 20 {
		c := dialBuffer(t, n.addr, "buf", root, "ref")
		var (
			wg      sync.WaitGroup
			samples atomic.Int64
			errs    = make(chan error, 100)
		)
		for range 4 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				dst, err := testSchema.Zeros(4)
				if err != nil {
					errs <- err
					return
				}
				for {
					_, err := c.SampleInto(ctxT(t), dst)
					switch {
					case err == nil || errors.Is(err, ErrExpired):
						samples.Add(1)
					case errors.Is(err, ErrClosed):
						return
					default:
						errs <- fmt.Errorf("round %d: SampleInto: %w; want nil, ErrExpired or ErrClosed", round, err)
						return
					}
				}
			}()
		}
		for deadline := time.Now().Add(time.Minute); samples.Load() < 50 && time.Now().Before(deadline); {
			time.Sleep(100 * time.Microsecond)
		}
		if err := c.Close(); err != nil {
			t.Errorf("Close: %v", err)
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			t.Error(err)
		}
	}
}
