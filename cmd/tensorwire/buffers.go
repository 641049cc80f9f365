package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/tensorwire/tensorwire/replay"
	"github.com/tensorwire/tensorwire/rpc"
)

// bufferSpec is one --buffer flag of the node command:
// NAME[,capacity=N][,sampler=KIND][,alpha=A][,beta=B][,min-size=N][,lease=D].
type bufferSpec struct {
	name string
	cfg  replay.Config
}

// bufferFlags collects repeated --buffer flags.
type bufferFlags []bufferSpec

func (f *bufferFlags) String() string { return fmt.Sprint(len(*f), " buffers") }

// Set parses one --buffer value.
func (f *bufferFlags) Set(v string) error {
	parts := strings.Split(v, ",")
	spec := bufferSpec{name: parts[0]}
	if spec.name == "" || strings.Contains(spec.name, "..") || filepath.IsAbs(spec.name) {
		return fmt.Errorf("buffer name %q: a folder under the root", spec.name)
	}
	kind, alpha, beta := "uniform", 0.6, 0.4
	for _, p := range parts[1:] {
		k, val, ok := strings.Cut(p, "=")
		if !ok {
			return fmt.Errorf("buffer %s: %q is not key=value", spec.name, p)
		}
		var err error
		switch k {
		case "capacity":
			spec.cfg.Capacity, err = strconv.Atoi(val)
		case "min-size":
			spec.cfg.Limit.MinSize, err = strconv.Atoi(val)
		case "sampler":
			kind = val
		case "alpha":
			alpha, err = strconv.ParseFloat(val, 64)
		case "beta":
			beta, err = strconv.ParseFloat(val, 64)
		case "lease":
			spec.cfg.Lease, err = time.ParseDuration(val)
		default:
			return fmt.Errorf("buffer %s: unknown setting %q", spec.name, k)
		}
		if err != nil {
			return fmt.Errorf("buffer %s: %s: %w", spec.name, k, err)
		}
	}
	switch kind {
	case "uniform":
		spec.cfg.Sampler = replay.Uniform()
	case "without_replacement":
		spec.cfg.Sampler = replay.WithoutReplacement()
	case "prioritized":
		spec.cfg.Sampler = replay.Prioritized(alpha, beta)
	case "fifo":
		spec.cfg.Sampler = replay.FIFO()
	default:
		return fmt.Errorf("buffer %s: unknown sampler %q", spec.name, kind)
	}
	*f = append(*f, spec)
	return nil
}

// servedBuffers are the buffers a node opened or created, served on its
// server; checkpointed every interval and closed by close.
type servedBuffers struct {
	bufs []*replay.Buffer
	log  *slog.Logger
}

// open opens each buffer at root/NAME, or creates it when the folder holds
// none, and returns a register hook serving them under their names.
func (f bufferFlags) open(root string, log *slog.Logger) (*servedBuffers, func(*rpc.Server) error, error) {
	sb := &servedBuffers{log: log}
	for _, spec := range f {
		prefix := filepath.Join(root, spec.name)
		b, err := replay.Open(prefix)
		if errors.Is(err, replay.ErrNotFound) {
			if spec.cfg.Capacity == 0 {
				err = fmt.Errorf("buffer %s: no buffer at %s to open, and no capacity= to create one", spec.name, prefix)
			} else {
				if b, err = replay.Create(prefix, spec.cfg); err == nil {
					log.Info("buffer created", "name", spec.name, "prefix", prefix, "capacity", spec.cfg.Capacity)
				}
			}
		} else if err == nil {
			st := b.Stats()
			log.Info("buffer opened", "name", spec.name, "prefix", prefix, "capacity", st.Capacity, "size", st.Size)
		}
		if err != nil {
			sb.close()
			return nil, nil, err
		}
		sb.bufs = append(sb.bufs, b)
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
	var errs []error
	for _, b := range sb.bufs {
		errs = append(errs, b.Close())
	}
	return errors.Join(errs...)
}
