package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/tensorwire/tensorwire/replay"
	"github.com/tensorwire/tensorwire/rpc"
)

// bufferSpec is one --buffer flag of the node command:
// NAME[,capacity=N][,sampler=KIND][,PARAM=X...][,min-size=N][,lease=D],
// PARAM a parameter of the sampler (prioritized: alpha, beta, eps). Only
// the settings given are kept: set says which, and the fields hold their
// values.
type bufferSpec struct {
	name     string
	set      map[string]bool // the settings given
	capacity int
	sampler  replay.Sampler // its kind, when set["sampler"]; parameters at their defaults
	params   []samplerParam // in the order given
	minSize  int
	lease    time.Duration
}

// samplerParam is a sampler parameter given as NAME=X.
type samplerParam struct {
	name  string
	value float64
}

// bufferFlags collects repeated --buffer flags.
type bufferFlags []bufferSpec

func (f *bufferFlags) String() string { return fmt.Sprint(len(*f), " buffers") }

// samplerParams returns the names of the parameters of every kind of
// sampler, and a description of which kind takes which for the help:
// "alpha=A, beta=B, eps=E (prioritized)".
func samplerParams() (names []string, help string) {
	var parts []string
	for _, kind := range replay.SamplerKinds() {
		s, _ := replay.ParseSampler(kind)
		params := slices.Sorted(maps.Keys(s.Params()))
		if len(params) == 0 {
			continue
		}
		var ps []string
		for _, p := range params {
			ps = append(ps, p+"="+strings.ToUpper(p[:1]))
			if !slices.Contains(names, p) {
				names = append(names, p)
			}
		}
		parts = append(parts, strings.Join(ps, ", ")+" ("+kind+")")
	}
	return names, strings.Join(parts, "; ")
}

// samplerHelp describes the sampler settings of --buffer for the node's
// help.
func samplerHelp() string {
	_, params := samplerParams()
	return "sampler=" + strings.Join(replay.SamplerKinds(), "|") + " (default uniform) and its parameters " + params
}

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
	params, _ := samplerParams()
	for _, p := range parts[1:] {
		k, val, ok := strings.Cut(p, "=")
		if !ok {
			return fmt.Errorf("buffer %s: %q is not key=value", spec.name, p)
		}
		if spec.set[k] {
			return fmt.Errorf("buffer %s: %s given twice", spec.name, k)
		}
		var err error
		switch {
		case k == "capacity":
			if spec.capacity, err = strconv.Atoi(val); err == nil && spec.capacity < 1 {
				err = errors.New("want at least 1")
			}
		case k == "min-size":
			if spec.minSize, err = strconv.Atoi(val); err == nil && spec.minSize < 1 {
				err = errors.New("want at least 1")
			}
		case k == "sampler":
			if strings.ContainsAny(val, "()") {
				err = errors.New("the kind alone; give its parameters as settings of their own (alpha=0.7)")
			} else {
				spec.sampler, err = replay.ParseSampler(val)
			}
		case slices.Contains(params, k):
			var x float64
			if x, err = strconv.ParseFloat(val, 64); err == nil {
				spec.params = append(spec.params, samplerParam{k, x})
			}
		case k == "lease":
			if spec.lease, err = time.ParseDuration(val); err == nil && spec.lease <= 0 {
				err = errors.New("want a positive duration")
			}
		default:
			return fmt.Errorf("buffer %s: unknown setting %q; the settings are capacity, sampler, %s, min-size and lease",
				spec.name, k, strings.Join(params, ", "))
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
		if _, err := spec.withParams(spec.sampler); err != nil {
			return fmt.Errorf("buffer %s: %w", spec.name, err)
		}
	}
	*f = append(*f, spec)
	return nil
}

// withParams returns sampler with the parameters given set; an error
// naming the one the sampler does not take, or whose value is out of
// range.
func (s bufferSpec) withParams(sampler replay.Sampler) (replay.Sampler, error) {
	for _, p := range s.params {
		var err error
		if sampler, err = sampler.WithParam(p.name, p.value); err != nil {
			return sampler, fmt.Errorf("%s=%g: %w", p.name, p.value, err)
		}
	}
	return sampler, nil
}

// createConfig is the configuration of a new buffer with the spec's
// settings; an error if a parameter given does not apply to its sampler.
func (s bufferSpec) createConfig() (replay.Config, error) {
	cfg := replay.Config{Capacity: s.capacity, Lease: s.lease}
	cfg.Limit.MinSize = s.minSize
	var err error
	cfg.Sampler, err = s.withParams(s.sampler) // the zero Sampler is uniform
	return cfg, err
}

// change returns the configuration of an existing buffer, cur, with the
// spec's settings: those that can change (lease, min-size, the sampler's
// parameters) changed, and an error naming both values for one that cannot
// (capacity, the sampler's kind) or does not apply.
func (s bufferSpec) change(cur replay.Config) (replay.Config, error) {
	next := cur
	switch {
	case s.set["capacity"] && s.capacity != cur.Capacity:
		return cur, fmt.Errorf("capacity=%d, but the buffer's capacity is %d: it is fixed when the buffer is created",
			s.capacity, cur.Capacity)
	case s.set["sampler"] && s.sampler.Kind() != cur.Sampler.Kind():
		return cur, fmt.Errorf("sampler=%s, but the buffer's sampler is %s: its kind is fixed when the buffer is created",
			s.sampler.Kind(), cur.Sampler)
	case s.set["min-size"] && s.minSize > cur.Capacity:
		return cur, fmt.Errorf("min-size=%d is larger than the buffer's capacity %d: sampling could never start",
			s.minSize, cur.Capacity)
	}
	var err error
	if next.Sampler, err = s.withParams(cur.Sampler); err != nil {
		return cur, fmt.Errorf("%w (the buffer's sampler is %s)", err, cur.Sampler)
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
	fp, tp := from.Sampler.Params(), to.Sampler.Params()
	for _, k := range slices.Sorted(maps.Keys(tp)) {
		add(k, fp[k], tp[k])
	}
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
	cfg, err := s.createConfig()
	if err != nil {
		return nil, err
	}
	if !s.set["capacity"] {
		return nil, fmt.Errorf("no buffer at %s to open, and no capacity= to create one", prefix)
	}
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
