package loader

import (
	"context"
	"fmt"
	"iter"
	"sync"

	"github.com/tensorwire/tensorwire/internal/service"
	"github.com/tensorwire/tensorwire/rpc"
	"github.com/tensorwire/tensorwire/tensordict"
)

// Options configure a consumer (Dial) or a Local loader.
type Options struct {
	// Batch is the number of rows of the batches iterated: cut from the
	// producer's batches, in the producer's order. Required.
	Batch int

	// DropLast drops an epoch's last batch when it is short of Batch rows,
	// as PyTorch's DataLoader(drop_last=True) does.
	DropLast bool

	// Root is this side's view of the shared root (rpc.WithRoot). With it,
	// a consumer on the producer's filesystem maps the ring and copies the
	// batches out of it: no batch bytes cross the network. Dial only.
	Root string

	// Bytes makes the batches travel as bytes even when the filesystem is
	// shared. Dial only.
	Bytes bool

	// Prefetch is how many batches are made ready ahead of the loop, in a
	// goroutine of their own, while the loop's body trains on the last
	// one: a consumer copies them out of the ring, a Local loader gathers
	// and transforms them. 0 means 1, negative none. Each costs a batch of
	// memory.
	Prefetch int

	// Views makes a consumer yield its batches as read-only views of the
	// ring, where a batch lies within one producer batch (a slot), instead
	// of copying them into Go memory: no copy, and the slot stays held
	// (not released to the producer) until the loop's body returns. A view
	// is valid until the loop's body returns, as any batch; it is
	// read-only (the mapping is: writing into it faults and kills the
	// process), and Clone copies it. After the body returns, the consumer
	// checks the slot's word: a slot rewritten while the body read it
	// (possible only once the producer dropped the consumer, after
	// Config.MaxWait) ends the epoch with ErrDropped, yielded as the next
	// item. Batches that straddle producer batches, and a rank's share
	// (WorldSize), are copied as without Views, each producer batch
	// released once copied, but never past a slot a view still holds; in
	// bytes mode a view is of the rows as they arrived, whose memory a
	// later batch reuses once the body returns. Dial only.
	Views bool

	// RPC passes options to rpc.Dial: a token, TLS, a logger. Dial only.
	RPC []rpc.Option

	// Rank and WorldSize make the consumer take a data-parallel rank's
	// share of each epoch, as PyTorch's DistributedSampler (without its
	// own shuffle) splits the producer's order: positions Rank, Rank +
	// WorldSize, Rank + 2 × WorldSize..., the epoch padded with its first
	// positions to a multiple of WorldSize, so that every rank has
	// ceil(samples / WorldSize) samples and Len batches alike. The ranks
	// together see every sample of an epoch once (the padding's twice).
	// WorldSize 0 or 1 is the whole epoch; otherwise 0 <= Rank <
	// WorldSize. Dial only (NewLocal refuses a WorldSize above 1).
	Rank, WorldSize int
}

// checkShare checks Rank and WorldSize: ErrArgument unless 0 <= Rank <
// WorldSize, or WorldSize is 0 or 1 with Rank 0.
func (o Options) checkShare() error {
	if o.WorldSize < 0 || o.Rank < 0 || (o.WorldSize <= 1 && o.Rank != 0) || (o.WorldSize > 1 && o.Rank >= o.WorldSize) {
		return wrapf(ErrArgument, "rank %d of world size %d: want 0 <= rank < world size, or a world size of 0 or 1", o.Rank, o.WorldSize)
	}
	return nil
}

// dialing is what Dial shares with every service's client: the root, bytes
// and rpc's options (internal/service).
func (o Options) dialing() service.Dialing {
	return service.Dialing{Root: o.Root, Bytes: o.Bytes, RPC: o.RPC}
}

// batchLen returns how many batches of size b an epoch of n samples
// makes.
func batchLen(n, b int, dropLast bool) int {
	if dropLast {
		return n / b
	}
	return (n + b - 1) / b
}

// prefetchOf returns the batches to make ready ahead for opts.
func prefetchOf(opts Options) int {
	if opts.Prefetch == 0 {
		return 1
	}
	return max(opts.Prefetch, 0)
}

// Local is a loader that runs in its own process: the dataset, order and
// transform of a Producer with the same Config (Dataset, Seed, Sequential,
// Transform, IndexKey), cut into batches of Options.Batch rows, with no
// producer and no ring. It is what every training job runs when they do
// not share one; with the same seed it serves the same samples, alike
// transformed, as a producer does.
//
// A Local is used by one goroutine at a time.
type Local struct {
	p        *pipeline
	batch    int
	dropLast bool
	prefetch int
	epoch    int64
	bufs     []*batchBuf // the batch buffers, reused

	mu     sync.Mutex
	closed bool
}

// NewLocal opens cfg.Dataset for a Local loader of opts.Batch rows a batch.
// ErrArgument for a batch size of 0 or less, ErrDataset for a dataset it
// cannot serve.
func NewLocal(cfg Config, opts Options) (*Local, error) {
	if opts.Batch <= 0 {
		return nil, wrapf(ErrArgument, "batch size %d: want at least 1", opts.Batch)
	}
	if opts.WorldSize > 1 || opts.checkShare() != nil {
		return nil, wrapf(ErrArgument, "rank %d of world size %d: a Local loader serves whole epochs (Rank and WorldSize are Dial's)", opts.Rank, opts.WorldSize)
	}
	p, err := newPipeline(cfg, opts.Batch)
	if err != nil {
		return nil, err
	}
	l := &Local{p: p, batch: opts.Batch, dropLast: opts.DropLast, prefetch: prefetchOf(opts)}
	l.bufs = ensureBufs(nil, p.schema, l.batch, l.prefetch)
	for _, b := range l.bufs {
		if err := b.alloc(); err != nil {
			p.close()
			return nil, err
		}
	}
	return l, nil
}

// Len returns the number of batches of an epoch.
func (l *Local) Len() int { return batchLen(l.p.len(), l.batch, l.dropLast) }

// Samples returns the number of samples in an epoch (the dataset's rows).
func (l *Local) Samples() int { return l.p.len() }

// Epoch returns the epoch the next call of Batches iterates.
func (l *Local) Epoch() int64 { return l.epoch }

// Batches returns an iterator over the next epoch's batches, which ends
// with the epoch. A batch is valid until the loop's body returns (its
// memory is reused): Clone it to keep it. An error (ctx ending, a
// transform failing) is yielded once, and ends the epoch.
func (l *Local) Batches(ctx context.Context) iter.Seq2[*tensordict.TensorDict, error] {
	return func(yield func(*tensordict.TensorDict, error) bool) {
		l.mu.Lock()
		closed := l.closed
		l.mu.Unlock()
		if closed {
			yield(nil, ErrClosed)
			return
		}
		epoch := l.epoch
		l.epoch++
		order := l.p.order(epoch)
		iterate(ctx, yield, l.bufs, l.prefetch, l.batch, func(ctx context.Context, out chan<- assembled, pool <-chan *batchBuf) {
			for first := 0; first < len(order); first += l.batch {
				n := min(l.batch, len(order)-first)
				if n < l.batch && l.dropLast {
					break
				}
				var b *batchBuf
				select {
				case b = <-pool:
				case <-ctx.Done():
					return
				}
				dst, err := b.td.Slice(0, n)
				if err == nil {
					err = l.p.fill(dst, epoch, first, order[first:first+n])
				}
				a := assembled{buf: b, n: n}
				if err != nil {
					a = assembled{err: fmt.Errorf("loader: epoch %d, batch at %d: %w", epoch, first, err)}
				}
				select {
				case out <- a:
				case <-ctx.Done():
					return
				}
				if err != nil {
					return
				}
			}
			select {
			case out <- assembled{end: true}:
			case <-ctx.Done():
			}
		})
	}
}

// Close unmaps the dataset. Batches after Close yield ErrClosed.
func (l *Local) Close() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closed {
		return nil
	}
	l.closed = true
	return l.p.close()
}
