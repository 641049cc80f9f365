package replay

import (
	"context"
	"fmt"
	"io"
	"time"

	"github.com/tensorwire/tensorwire/replay"
)

var phaseNames = map[string]string{phaseStart: "the warm-up", phaseFilled: "the memcpy measurement", phaseTimed: "the timed phase",
	phaseDone: "the checkpoint after the run"}

// printProgress prints a line a second to w from the buffer's own
// counters, until ctx ends or the run is done: the participants' mode, the
// phase and how long it has run, and the transitions inserted and sampled
// per second over the last second (samples count rows sampled again).
func printProgress(ctx context.Context, w io.Writer, b *replay.Buffer, c *coordinator) {
	t := time.NewTicker(time.Second)
	defer t.Stop()
	last, _ := b.Stats()
	lastAt := time.Now()
	for tick := 0; ; tick++ {
		select {
		case <-ctx.Done():
			return
		case <-c.finished:
			return
		case <-t.C:
		}
		st, err := b.Stats()
		if err != nil {
			return // closed
		}
		now := time.Now()
		secs := now.Sub(lastAt).Seconds()
		inserted := float64(st.Inserted-last.Inserted) / secs
		sampled := float64(st.Sampled-last.Sampled) / secs
		mode, phase, since := c.state()
		began := since.After(lastAt)
		last, lastAt = st, now
		elapsed := now.Sub(since).Round(100 * time.Millisecond)
		if began {
			// The phase began during this second: its rates would mix two phases.
			fmt.Fprintf(w, "replay %s: %s began\n", mode, phaseNames[phase])
			continue
		}
		switch phase {
		case "":
			if tick%10 == 0 {
				fmt.Fprintf(w, "replay: waiting for %d writer(s) and %d trainer to join (%d have)\n",
					c.run.Writers, trainers, c.arrived(phaseStart))
			}
		case phaseStart:
			fmt.Fprintf(w, "replay %s: warm-up %v: %.0f inserted/s, %.0f sampled/s, %d of %d slots written\n",
				mode, elapsed, inserted, sampled, min(st.Inserted, int64(st.Capacity)), st.Capacity)
		case phaseFilled:
			fmt.Fprintf(w, "replay %s: the trainer measures the memcpy gather limit, writers idle (%v)\n", mode, elapsed)
		case phaseTimed:
			fmt.Fprintf(w, "replay %s: timed %v of %v: %.0f inserted/s, %.0f sampled/s\n",
				mode, elapsed, time.Duration(c.run.DurationNS), inserted, sampled)
		}
	}
}
