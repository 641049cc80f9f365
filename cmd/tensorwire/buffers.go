package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/tensorwire/tensorwire/replay"
	"github.com/tensorwire/tensorwire/rpc"
)

// bufferSpec is one --buffer flag of the node command:
// NAME[,capacity=N][,sampler=KIND][,PARAM=X...][,min-size=N][,lease=D]
// [,samples-per-insert=X][,error-buffer=X][,max-times-sampled=N]
// [,writer=round_robin|top_k][,key=K][,traj-key=K], PARAM a parameter of the sampler
// (prioritized: alpha, beta, eps): the settings of replay.Config.Set. Only the settings given are kept, to
// create the buffer with (createConfig) or change the one there (change).
type bufferSpec struct{ spec }

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

// bufferGrammar is what a --buffer value holds.
var bufferGrammar = grammar{noun: "buffer", folder: true, twice: "given twice", keys: replay.Config{}.Settings()}

// Set parses one --buffer value and checks every value in it, and that
// they agree with each other, before any buffer is looked for.
func (f *bufferFlags) Set(v string) error {
	s, err := bufferGrammar.read(v, specNames(*f), func(s spec) error { return bufferSpec{s}.check() })
	if err != nil {
		return err
	}
	*f = append(*f, bufferSpec{s})
	return nil
}

// check checks the spec's values: as the configuration of a new buffer,
// or, when it gives sampler parameters but no sampler (the buffer may
// exist, with a sampler that takes them), with a sampler of the first
// kind that takes them all.
func (s bufferSpec) check() error {
	cfg, err := s.createConfig()
	if err != nil && !s.has("sampler") {
		params, _ := samplerParams()
		for _, kind := range replay.SamplerKinds() {
			try := replay.Config{}
			try.Sampler, _ = replay.ParseSampler(kind)
			takes := try.Sampler.Params()
			if !slices.ContainsFunc(s.settings, func(st setting) bool {
				_, ok := takes[st.key]
				return slices.Contains(params, st.key) && !ok
			}) {
				cfg, err = try, s.apply(try.Set)
				break
			}
		}
	}
	if err != nil {
		return err
	}
	if cfg.Writer.Kind() == "top_k" && len(cfg.Writer.Key()) == 0 {
		return errors.New("writer=top_k needs key=K, the transitions' ranking key")
	}
	if s.has("capacity") && s.has("min-size") && cfg.Limit.MinSize > cfg.Capacity {
		return fmt.Errorf("min-size=%d is larger than capacity=%d: sampling could never start",
			cfg.Limit.MinSize, cfg.Capacity)
	}
	return nil
}

// createConfig is the configuration of a new buffer with the spec's
// settings; an error if a parameter given does not apply to its sampler.
func (s bufferSpec) createConfig() (replay.Config, error) {
	var cfg replay.Config // the zero Sampler is uniform
	err := s.apply(cfg.Set)
	return cfg, err
}

// change returns the configuration of an existing buffer, cur, with the
// spec's settings: those that can change (lease, min-size, the sampler's
// parameters) changed, and an error naming both values for one that cannot
// (capacity, the sampler's kind) or does not apply.
func (s bufferSpec) change(cur replay.Config) (replay.Config, error) {
	next := cur
	for _, st := range s.settings {
		if err := next.Set(st.key, st.value); err != nil {
			return cur, fmt.Errorf("%w (the buffer's sampler is %s)", err, cur.Sampler)
		}
		switch {
		case st.key == "capacity" && next.Capacity != cur.Capacity:
			return cur, fmt.Errorf("capacity=%d, but the buffer's capacity is %d: it is fixed when the buffer is created",
				next.Capacity, cur.Capacity)
		case st.key == "sampler" && next.Sampler.Kind() != cur.Sampler.Kind():
			return cur, fmt.Errorf("sampler=%s, but the buffer's sampler is %s: its kind is fixed when the buffer is created",
				next.Sampler.Kind(), cur.Sampler)
		case (st.key == "writer" || st.key == "key") && next.Writer.String() != cur.Writer.String():
			return cur, fmt.Errorf("%s=%s, but the buffer's writer is %s: it is fixed when the buffer is created",
				st.key, st.value, cur.Writer)
		case st.key == "traj-key" && !slices.Equal(next.TrajKey, cur.TrajKey):
			return cur, fmt.Errorf("traj-key=%s, but the buffer's trajectory key is %q: it is fixed when the buffer is created",
				st.value, strings.Join(cur.TrajKey, "/"))
		case st.key == "min-size" && next.Limit.MinSize > cur.Capacity:
			return cur, fmt.Errorf("min-size=%d is larger than the buffer's capacity %d: sampling could never start",
				next.Limit.MinSize, cur.Capacity)
		}
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
	add("samples-per-insert", from.Limit.SamplesPerInsert, to.Limit.SamplesPerInsert)
	add("error-buffer", from.Limit.ErrorBuffer, to.Limit.ErrorBuffer)
	add("max-times-sampled", from.MaxTimesSampled, to.MaxTimesSampled)
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
	if !s.has("capacity") {
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
