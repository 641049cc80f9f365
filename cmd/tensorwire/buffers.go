package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/tensorwire/tensorwire/replay"
	"github.com/tensorwire/tensorwire/rpc"
)

// bufferSpec is one --buffer flag of the node command:
// NAME[,capacity=N][,sampler=KIND][,alpha=A][,beta=B][,min-size=N][,lease=D].
// Only the settings given are kept: set says which, and the fields hold
// their values.
type bufferSpec struct {
	name        string
	set         map[string]bool // the settings given
	capacity    int
	kind        string // sampler
	alpha, beta float64
	minSize     int
	lease       time.Duration
}

// bufferFlags collects repeated --buffer flags.
type bufferFlags []bufferSpec

func (f *bufferFlags) String() string { return fmt.Sprint(len(*f), " buffers") }

// samplerKinds are the values of sampler=.
var samplerKinds = []string{"uniform", "without_replacement", "prioritized", "fifo"}

// Set parses one --buffer value and checks every value in it, and that
// they agree with each other, before any buffer is looked for.
func (f *bufferFlags) Set(v string) error {
	parts := strings.Split(v, ",")
	spec := bufferSpec{name: parts[0], set: map[string]bool{}}
	if spec.name == "" || strings.Contains(spec.name, "..") || filepath.IsAbs(spec.name) {
		return fmt.Errorf("buffer name %q: a folder under the root", spec.name)
	}
	for _, other := range *f {
		if filepath.Clean(other.name) == filepath.Clean(spec.name) {
			return fmt.Errorf("buffer %s given twice", spec.name)
		}
	}
	for _, p := range parts[1:] {
		k, val, ok := strings.Cut(p, "=")
		if !ok {
			return fmt.Errorf("buffer %s: %q is not key=value", spec.name, p)
		}
		if spec.set[k] {
			return fmt.Errorf("buffer %s: %s given twice", spec.name, k)
		}
		var err error
		switch k {
		case "capacity":
			if spec.capacity, err = strconv.Atoi(val); err == nil && spec.capacity < 1 {
				err = errors.New("want at least 1")
			}
		case "min-size":
			if spec.minSize, err = strconv.Atoi(val); err == nil && spec.minSize < 1 {
				err = errors.New("want at least 1")
			}
		case "sampler":
			spec.kind = val
			if !slices.Contains(samplerKinds, val) {
				return fmt.Errorf("buffer %s: unknown sampler %q; one of %s", spec.name, val, strings.Join(samplerKinds, ", "))
			}
		case "alpha", "beta":
			x, perr := strconv.ParseFloat(val, 64)
			if err = perr; err == nil && !(x >= 0 && !math.IsInf(x, 1)) {
				err = errors.New("want a finite number >= 0")
			}
			if k == "alpha" {
				spec.alpha = x
			} else {
				spec.beta = x
			}
		case "lease":
			if spec.lease, err = time.ParseDuration(val); err == nil && spec.lease <= 0 {
				err = errors.New("want a positive duration")
			}
		default:
			return fmt.Errorf("buffer %s: unknown setting %q", spec.name, k)
		}
		if err != nil {
			return fmt.Errorf("buffer %s: %s=%s: %w", spec.name, k, val, err)
		}
		spec.set[k] = true
	}
	if spec.set["capacity"] && spec.set["min-size"] && spec.minSize > spec.capacity {
		return fmt.Errorf("buffer %s: min-size=%d is larger than capacity=%d: sampling could never start",
			spec.name, spec.minSize, spec.capacity)
	}
	if spec.set["sampler"] {
		if err := spec.paramsApply(spec.kind); err != nil {
			return fmt.Errorf("buffer %s: %w", spec.name, err)
		}
	}
	*f = append(*f, spec)
	return nil
}

// paramsApply checks that alpha= and beta=, if given, apply to a sampler
// of the given kind.
func (s bufferSpec) paramsApply(kind string) error {
	for _, k := range []string{"alpha", "beta"} {
		if s.set[k] && kind != "prioritized" {
			return fmt.Errorf("%s applies to sampler=prioritized only, not %s", k, kind)
		}
	}
	return nil
}

// createConfig is the configuration of a new buffer with the spec's
// settings.
func (s bufferSpec) createConfig() replay.Config {
	cfg := replay.Config{Capacity: s.capacity, Lease: s.lease}
	cfg.Limit.MinSize = s.minSize
	switch s.kind {
	case "without_replacement":
		cfg.Sampler = replay.WithoutReplacement()
	case "prioritized":
		alpha, beta := 0.6, 0.4
		if s.set["alpha"] {
			alpha = s.alpha
		}
		if s.set["beta"] {
			beta = s.beta
		}
		cfg.Sampler = replay.Prioritized(alpha, beta)
	case "fifo":
		cfg.Sampler = replay.FIFO()
	default:
		cfg.Sampler = replay.Uniform()
	}
	return cfg
}

// change returns the configuration of an existing buffer, cur, with the
// spec's settings: those that can change (lease, min-size, alpha, beta)
// changed, and an error naming both values for one that cannot (capacity,
// the sampler's kind) or does not apply.
func (s bufferSpec) change(cur replay.Config) (replay.Config, error) {
	next := cur
	kind := cur.Sampler.Kind()
	switch {
	case s.set["capacity"] && s.capacity != cur.Capacity:
		return cur, fmt.Errorf("capacity=%d, but the buffer's capacity is %d: it is fixed when the buffer is created",
			s.capacity, cur.Capacity)
	case s.set["sampler"] && s.kind != kind:
		return cur, fmt.Errorf("sampler=%s, but the buffer's sampler is %s: its kind is fixed when the buffer is created",
			s.kind, cur.Sampler)
	case s.set["min-size"] && s.minSize > cur.Capacity:
		return cur, fmt.Errorf("min-size=%d is larger than the buffer's capacity %d: sampling could never start",
			s.minSize, cur.Capacity)
	}
	if err := s.paramsApply(kind); err != nil {
		return cur, fmt.Errorf("%w (the buffer's)", err)
	}
	if kind == "prioritized" {
		alpha, beta := cur.Sampler.Params()
		if s.set["alpha"] {
			alpha = s.alpha
		}
		if s.set["beta"] {
			beta = s.beta
		}
		next.Sampler = replay.Prioritized(alpha, beta)
	}
	if s.set["min-size"] {
		next.Limit.MinSize = s.minSize
	}
	if s.set["lease"] {
		next.Lease = s.lease
	}
	return next, nil
}

// changes describes what differs between two configurations of a buffer,
// in the settings change may change: "lease=30s" to "lease=10s", say.
func changes(from, to replay.Config) (was, now []string) {
	add := func(k string, a, b any) {
		if x, y := fmt.Sprint(a), fmt.Sprint(b); x != y {
			was, now = append(was, k+"="+x), append(now, k+"="+y)
		}
	}
	fa, fb := from.Sampler.Params()
	ta, tb := to.Sampler.Params()
	add("alpha", fa, ta)
	add("beta", fb, tb)
	add("min-size", from.Limit.MinSize, to.Limit.MinSize)
	add("lease", from.Lease, to.Lease)
	return was, now
}

// servedBuffers are the buffers a node opened or created, served on its
// server; checkpointed every interval, watched for their files being lost
// (watch), and closed by close.
type servedBuffers struct {
	bufs  []*replay.Buffer
	names []string
	log   *slog.Logger

	stop    chan struct{} // closed by close: the watch ends
	watched chan struct{} // closed when it has
}

// watchEvery is how often the node checks its buffers' files.
const watchEvery = 2 * time.Second

// watch logs an error, once per buffer, when a buffer's files are found
// deleted, replaced or truncated (Stats.StorageLost): the buffer refuses
// its calls from then on, and the node's log should say why. It runs until
// close.
func (sb *servedBuffers) watch(every time.Duration) {
	defer close(sb.watched)
	t := time.NewTicker(every)
	defer t.Stop()
	reported := make([]bool, len(sb.bufs))
	for {
		select {
		case <-sb.stop:
			return
		case <-t.C:
		}
		for i, b := range sb.bufs {
			if st, err := b.Stats(); err == nil && st.StorageLost != "" && !reported[i] {
				reported[i] = true
				sb.log.Error("buffer storage lost: the node refuses its calls; restore or recreate it and restart the node",
					"name", sb.names[i], "prefix", b.Prefix(), "err", st.StorageLost)
			}
		}
	}
}

// open opens each buffer at root/NAME, or creates it when the folder holds
// none, and returns a register hook serving them under their names. The
// settings given for a buffer that exists change it if they can, and are
// refused if they cannot, before it is opened.
func (f bufferFlags) open(root string, log *slog.Logger) (*servedBuffers, func(*rpc.Server) error, error) {
	sb := &servedBuffers{log: log}
	for _, spec := range f {
		b, err := spec.open(root, log)
		if err != nil {
			sb.close()
			return nil, nil, fmt.Errorf("buffer %s: %w", spec.name, err)
		}
		sb.bufs, sb.names = append(sb.bufs, b), append(sb.names, spec.name)
	}
	if len(sb.bufs) > 0 {
		sb.stop, sb.watched = make(chan struct{}), make(chan struct{})
		go sb.watch(watchEvery)
	}
	register := func(s *rpc.Server) error {
		if len(f) == 0 {
			return nil
		}
		svc, err := replay.Register(s)
		if err != nil {
			return err
		}
		for i, spec := range f {
			if err := svc.Add(spec.name, sb.bufs[i]); err != nil {
				return err
			}
		}
		return nil
	}
	return sb, register, nil
}

// open opens the buffer at root/NAME with the spec's settings, or creates
// it.
func (s bufferSpec) open(root string, log *slog.Logger) (*replay.Buffer, error) {
	prefix := filepath.Join(root, s.name)
	var before replay.Config
	b, err := replay.OpenWith(prefix, func(cur replay.Config) (replay.Config, error) {
		before = cur
		return s.change(cur)
	})
	switch {
	case err == nil:
		st, _ := b.Stats()
		log.Info("buffer opened", "name", s.name, "prefix", prefix, "capacity", st.Capacity, "size", st.Size,
			"sampler", st.Sampler)
		was, now := changes(before, b.Config())
		for i := range was {
			log.Info("buffer setting changed", "name", s.name, "was", was[i], "now", now[i])
		}
		return b, nil
	case !errors.Is(err, replay.ErrNotFound):
		return nil, err
	}
	if err := s.paramsApply(s.createConfig().Sampler.Kind()); err != nil {
		return nil, err
	}
	if !s.set["capacity"] {
		return nil, fmt.Errorf("no buffer at %s to open, and no capacity= to create one", prefix)
	}
	cfg := s.createConfig()
	if b, err = replay.Create(prefix, cfg); err != nil {
		return nil, err
	}
	log.Info("buffer created", "name", s.name, "prefix", prefix, "capacity", cfg.Capacity, "sampler", cfg.Sampler)
	return b, nil
}

// checkpointEvery checkpoints every buffer each interval until ctx ends.
func (sb *servedBuffers) checkpointEvery(ctx context.Context, interval time.Duration) {
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			for _, b := range sb.bufs {
				if err := b.Checkpoint(ctx); err != nil && ctx.Err() == nil {
					sb.log.Error("checkpoint failed", "prefix", b.Prefix(), "err", err)
				}
			}
		}
	}
}

// close checkpoints and closes every buffer.
func (sb *servedBuffers) close() error {
	if sb.stop != nil {
		close(sb.stop)
		<-sb.watched
		sb.stop = nil
	}
	var errs []error
	for _, b := range sb.bufs {
		errs = append(errs, b.Close())
	}
	return errors.Join(errs...)
}
