package fill

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"time"

	"github.com/tensorwire/tensorwire/internal/bench/benchkit"
	"github.com/tensorwire/tensorwire/internal/bench/report"
	"github.com/tensorwire/tensorwire/internal/progress"
	"github.com/tensorwire/tensorwire/memmap"
	"github.com/tensorwire/tensorwire/rpc"
	"github.com/tensorwire/tensorwire/tensordict"
)

// batchRows is how many rows every call works on, as in the seed.
const batchRows = 5

// nodeA is node A's side of the benchmark.
type nodeA struct {
	td       *tensordict.TensorDict // node A's mapping of the dataset
	x        *tensordict.Tensor     // its "memmap" leaf
	mm       *memmap.Tensor         // the leaf's mapping
	data     []byte                 // the mapping's bytes: for mincore only
	rel      string                 // the dataset's prefix relative to the root
	rowBytes int
	shared   *rpc.Client // dialed with the root: TensorDicts go by reference
	bytesC   *rpc.Client // dialed without: they go as bytes

	want  []byte // want[r]: the byte every element of row r holds
	value byte   // the last value a fill wrote
	next  int    // the next row set

	cacheFlush []byte
	stderr     io.Writer // progress bars
	row        []byte    // one row, for checks
	resident   int       // the most pages of a cold call's rows found resident before it
}

// A workload is one kind of call, measured warm, hot and cold (unless
// noCold).
type workload struct {
	key, what       string
	call            func(ctx context.Context, rows []int) call
	noCold          bool
	warm, hot, cold report.Latency // the call times at each temperature
}

// A call is one call of a workload on some rows: do is timed, check then
// verifies what it did.
type call struct {
	do, check func() error
}

var errMismatch = errors.New("verification failed")

func (b *nodeA) workloads() []*workload {
	return []*workload{
		{key: "remote_fill", what: "Client.Fill on node B, by reference", call: b.fillCall(func(ctx context.Context, rows []int, v float64) error {
			return b.shared.Fill(ctx, b.td, rows, v)
		})},
		{key: "local_fill", what: "TensorDict.Fill here, same file", call: b.fillCall(func(_ context.Context, rows []int, v float64) error {
			return b.td.Fill(rows, v)
		})},
		{key: "remote_read", what: "Client.Read from node B, rows as bytes", call: b.readCall},
		{key: "bytes_fill", what: "Client.Fill on node B, no shared root", call: b.fillCall(func(ctx context.Context, rows []int, v float64) error {
			return b.bytesC.Fill(ctx, b.td, rows, v)
		})},
		{key: "null_call", what: "Client.Describe: a round trip, no rows", call: b.describeCall, noCold: true},
	}
}

// describeCall asks node B for the dataset's schema: a call that touches
// no rows, so its time is the round trip itself.
func (b *nodeA) describeCall(ctx context.Context, _ []int) call {
	var got rpc.DescribeResponse
	return call{
		do: func() (err error) {
			got, err = b.shared.Describe(ctx, b.rel)
			return err
		},
		check: func() error {
			if len(got.Batch) != 1 || got.Batch[0] != b.td.Len() || got.Bytes != int64(b.td.NumBytes()) {
				return fmt.Errorf("%w: Describe = %+v", errMismatch, got)
			}
			return nil
		},
	}
}

// fillCall returns a workload's calls that fill rows with a new value
// through fill and check, in node A's mapping, that the rows hold it.
func (b *nodeA) fillCall(fill func(ctx context.Context, rows []int, v float64) error) func(context.Context, []int) call {
	return func(ctx context.Context, rows []int) call {
		v := b.newValue(rows)
		return call{
			do: func() error { return fill(ctx, rows, float64(v)) },
			check: func() error {
				for _, r := range rows {
					b.want[r] = v
				}
				return b.checkRows(rows)
			},
		}
	}
}

// readCall reads rows from node B and checks that they hold what was last
// written.
func (b *nodeA) readCall(ctx context.Context, rows []int) call {
	var got *tensordict.TensorDict
	return call{
		do: func() (err error) {
			got, err = b.shared.Read(ctx, b.rel, rows)
			return err
		},
		check: func() error {
			x, err := got.Tensor("memmap")
			if err != nil {
				return err
			}
			data, err := x.Bytes()
			if err != nil {
				return err
			}
			if len(data) != len(rows)*b.rowBytes {
				return fmt.Errorf("%w: read %d bytes for %d rows", errMismatch, len(data), len(rows))
			}
			for i, r := range rows {
				if err := b.checkRow(r, data[i*b.rowBytes:(i+1)*b.rowBytes]); err != nil {
					return fmt.Errorf("read: %w", err)
				}
			}
			return nil
		},
	}
}

// newValue returns the next fill value that no row of rows holds, so that
// a fill that wrote nothing cannot pass its check.
func (b *nodeA) newValue(rows []int) byte {
	for {
		b.value = b.value%255 + 1 // 1..255
		held := false
		for _, r := range rows {
			held = held || b.want[r] == b.value
		}
		if !held {
			return b.value
		}
	}
}

// nextRows returns the next of the dataset's disjoint row sets, the seed's
// pattern moved along: set k is {4k, 4k+1, 4k+2, 4k+3, n-1-k}, so set 0 is
// [0, 1, 2, 3, 999] and set 1 [4, 5, 6, 7, 998] for 1000 rows.
func (b *nodeA) nextRows() []int {
	n := b.td.Len()
	k := b.next % (n / batchRows)
	b.next++
	return []int{4 * k, 4*k + 1, 4*k + 2, 4*k + 3, n - 1 - k}
}

// checkRows checks rows in node A's mapping against want.
func (b *nodeA) checkRows(rows []int) error {
	for _, r := range rows {
		if _, err := b.x.ReadAt(b.row, int64(r)*int64(b.rowBytes)); err != nil {
			return err
		}
		if err := b.checkRow(r, b.row); err != nil {
			return err
		}
	}
	return nil
}

// checkRow checks that every byte of data, row r, is want[r].
func (b *nodeA) checkRow(r int, data []byte) error {
	return benchkit.CheckRow(r, data, b.want[r])
}

// measure runs every workload warm, hot and cold, iters times,
// interleaved.
//
// Warm: the same call on the same rows runs untimed first, then the CPU
// caches are flushed, then the call is timed. Hot: right after, one call
// untimed and the next timed, back to back. Cold: node B's and this
// process's mappings of the dataset are dropped and its pages evicted from
// the page cache (makeCold), then the call is timed. Each warm and cold
// measurement takes the next row set, and every timed call is checked.
func (b *nodeA) measure(ctx context.Context, ws []*workload, iters int) error {
	bar := progress.New(b.stderr, "measuring", "", int64(iters))
	defer bar.Done()
	for range iters {
		for _, w := range ws {
			rows := b.nextRows()
			if err := b.run(w.call(ctx, rows)); err != nil {
				return fmt.Errorf("%s warm-up: %w", w.key, err)
			}
			benchkit.FlushCache(b.cacheFlush)
			d, err := b.timed(w.call(ctx, rows))
			if err != nil {
				return fmt.Errorf("%s warm: %w", w.key, err)
			}
			w.warm.Record(d)

			first, next := w.call(ctx, rows), w.call(ctx, rows)
			if err := first.do(); err != nil { // overwritten by next: checked through it
				return fmt.Errorf("%s hot: %w", w.key, err)
			}
			if d, err = b.timed(next); err != nil {
				return fmt.Errorf("%s hot: %w", w.key, err)
			}
			w.hot.Record(d)
		}
		for _, w := range ws {
			if w.noCold {
				continue
			}
			rows := b.nextRows()
			c := w.call(ctx, rows)
			if err := b.makeCold(ctx); err != nil {
				return err
			}
			n, err := b.residentPages(rows)
			if err != nil {
				return err
			}
			b.resident = max(b.resident, n)
			d, err := b.timed(c)
			if err != nil {
				return fmt.Errorf("%s cold: %w", w.key, err)
			}
			w.cold.Record(d)
		}
		bar.Add(1)
		if err := ctx.Err(); err != nil {
			return err
		}
	}
	return nil
}

func (b *nodeA) run(c call) error {
	if err := c.do(); err != nil {
		return err
	}
	return c.check()
}

func (b *nodeA) timed(c call) (time.Duration, error) {
	t0 := time.Now()
	err := c.do()
	d := time.Since(t0)
	if err == nil {
		err = c.check()
	}
	return d, err
}

// prewrite writes every row r of the dataset with want[r] = 1 + r%251 and
// flushes it to disk, so that cold calls read written blocks from the disk
// (never-written blocks of a new file read as zeros without any I/O).
func (b *nodeA) prewrite(ctx context.Context) (write, flush time.Duration, err error) {
	n := b.td.Len()
	bar := progress.New(b.stderr, "writing the dataset", "B", int64(n*b.rowBytes))
	start := time.Now()
	for r := range n {
		if err := ctx.Err(); err != nil {
			return 0, 0, err
		}
		b.want[r] = byte(1 + r%251)
		if err := b.x.Fill([]int{r}, float64(b.want[r])); err != nil {
			return 0, 0, err
		}
		bar.Add(int64(b.rowBytes))
	}
	bar.Done()
	write = time.Since(start)
	slog.Info("flushing the dataset to disk", "bytes", n*b.rowBytes)
	start = time.Now()
	if err := b.mm.Flush(); err != nil {
		return 0, 0, err
	}
	return write, time.Since(start), nil
}

// checkAll reads every row of the dataset in node A's mapping and checks it
// holds the value last written: no call wrote where it should not have.
func (b *nodeA) checkAll(ctx context.Context) error {
	n := b.td.Len()
	bar := progress.New(b.stderr, "checking every row", "B", int64(n*b.rowBytes))
	defer bar.Done()
	for r := range n {
		if err := ctx.Err(); err != nil {
			return err
		}
		if err := b.checkRows([]int{r}); err != nil {
			return err
		}
		bar.Add(int64(b.rowBytes))
	}
	return nil
}
