package main

import (
	"errors"
	"fmt"
	"log/slog"
	"math"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/tensorwire/tensorwire/loader"
	"github.com/tensorwire/tensorwire/rpc"
)

// loaderHelp says what a --loader value holds, for the node command's help.
const loaderHelp = "NAME,dataset=PREFIX,batch=N[,slots=N][,window=N][,seed=S][,sequential][,index=KEY]" +
	"[,heartbeat=D][,max-wait=D][,transform=augment[,image-key=K][,pad=P][,flip][,mean=M][,std=S]]"

// loaderFlags collects repeated --loader flags: the producers a node
// serves, each with its ring in ROOT/NAME.
type loaderFlags []loaderSpec

// loaderSpec is one --loader flag: a name and the producer's Config (Dir
// is filled in by open).
type loaderSpec struct {
	name string
	cfg  loader.Config
}

func (f *loaderFlags) String() string { return fmt.Sprint(len(*f), " loaders") }

// Set parses one --loader value and checks every setting in it.
func (f *loaderFlags) Set(v string) error {
	parts := strings.Split(v, ",")
	spec := loaderSpec{name: parts[0]}
	if spec.name == "" || strings.Contains(spec.name, "..") || filepath.IsAbs(spec.name) {
		return fmt.Errorf("loader name %q: a folder under the root", spec.name)
	}
	for _, other := range *f {
		if filepath.Clean(other.name) == filepath.Clean(spec.name) {
			return fmt.Errorf("loader %s given twice", spec.name)
		}
	}
	set := map[string]bool{}
	var aug loader.Augment
	transform := "none"
	for _, p := range parts[1:] {
		k, val, hasVal := strings.Cut(p, "=")
		if set[k] {
			return fmt.Errorf("loader %s: %s given twice", spec.name, k)
		}
		set[k] = true
		var err error
		switch k {
		case "dataset":
			spec.cfg.Dataset = val
			if val == "" {
				err = errors.New("want a prefix")
			}
		case "batch", "slots", "window":
			var n int
			n, err = strconv.Atoi(val)
			switch {
			case k == "window" && (err != nil || n < -1):
				err = errors.New("want a number of batches, or -1 (or 0) for none")
			case k != "window" && (err != nil || n < 1):
				err = errors.New("want a whole number, at least 1")
			}
			switch k {
			case "batch":
				spec.cfg.Batch = n
			case "slots":
				spec.cfg.Slots = n
			default:
				spec.cfg.Window = n
				if n == 0 {
					spec.cfg.Window = -1
				}
			}
		case "seed":
			if spec.cfg.Seed, err = strconv.ParseUint(val, 10, 64); err != nil {
				err = fmt.Errorf("want a whole number from 0 to %d", uint64(math.MaxUint64))
			}
		case "sequential", "flip":
			if hasVal {
				err = errors.New("takes no value")
			}
			spec.cfg.Sequential = spec.cfg.Sequential || k == "sequential"
			aug.Flip = aug.Flip || k == "flip"
		case "index":
			spec.cfg.IndexKey = val
			if val == "" {
				err = errors.New("want a key")
			}
		case "heartbeat", "max-wait":
			var d time.Duration
			if d, err = time.ParseDuration(val); err == nil && d <= 0 {
				err = errors.New("want a positive duration")
			}
			if k == "heartbeat" {
				spec.cfg.Heartbeat = d
			} else {
				spec.cfg.MaxWait = d
			}
		case "transform":
			if transform = val; val != "augment" && val != "none" {
				err = errors.New("want augment or none")
			}
		case "image-key":
			aug.Key = strings.Split(val, "/")
		case "pad":
			if aug.Pad, err = strconv.Atoi(val); err != nil || aug.Pad < 0 {
				err = errors.New("want a whole number, 0 or more")
			}
		case "mean", "std":
			var x float64
			x, err = strconv.ParseFloat(val, 32) // out of float32's range is an error (and ±Inf)
			switch {
			case k == "std" && (err != nil || math.IsInf(x, 0) || !(x > 0)):
				err = errors.New("want a positive finite number")
			case err != nil || math.IsInf(x, 0) || math.IsNaN(x):
				err = errors.New("want a finite number")
			}
			if k == "mean" {
				aug.Mean = float32(x)
			} else {
				aug.Std = float32(x)
			}
		default:
			return fmt.Errorf("loader %s: unknown setting %q", spec.name, k)
		}
		if err != nil {
			return fmt.Errorf("loader %s: %s: %w", spec.name, p, err)
		}
	}
	switch {
	case !set["dataset"]:
		return fmt.Errorf("loader %s: no dataset=PREFIX", spec.name)
	case !set["batch"]:
		return fmt.Errorf("loader %s: no batch=N", spec.name)
	}
	augmenting := transform == "augment"
	for _, k := range []string{"image-key", "pad", "flip", "mean", "std"} {
		if set[k] && !augmenting {
			return fmt.Errorf("loader %s: %s applies to transform=augment only", spec.name, k)
		}
	}
	if augmenting {
		spec.cfg.Transform = &aug
	}
	*f = append(*f, spec)
	return nil
}

// servedLoaders are the producers a node made.
type servedLoaders struct {
	producers []*loader.Producer
	names     []string
}

// checkNames refuses two services of the node that would live in one
// folder, ROOT/NAME: a loader, a replay buffer or a store named as another
// (a store opened on a buffer's folder refuses it, but only after the
// buffer made its files there).
func (f loaderFlags) checkNames(buffers bufferFlags, stores storeFlags) error {
	type use struct{ flag, name string }
	var uses []use
	for _, b := range buffers {
		uses = append(uses, use{"--buffer", b.name})
	}
	for _, st := range stores {
		uses = append(uses, use{"--store", st.name})
	}
	for _, spec := range f {
		uses = append(uses, use{"--loader", spec.name})
	}
	seen := map[string]string{}
	for _, u := range uses {
		k := filepath.Clean(u.name)
		if prev, ok := seen[k]; ok {
			return fmt.Errorf("%w: %s %s: a %s has that name, and both would live in ROOT/%s", errUsage, u.flag, u.name, prev, u.name)
		}
		seen[k] = u.flag
	}
	return nil
}

// open makes the producers, each with its ring in root/NAME, and returns
// a register hook serving them under their names.
func (f loaderFlags) open(root string, log *slog.Logger) (*servedLoaders, func(*rpc.Server) error, error) {
	sl := &servedLoaders{}
	for _, spec := range f {
		cfg := spec.cfg
		cfg.Dir = filepath.Join(root, spec.name)
		cfg.Log = log.With("loader", spec.name)
		p, err := loader.NewProducer(cfg)
		if err != nil {
			sl.close()
			return nil, nil, fmt.Errorf("loader %s: %w", spec.name, err)
		}
		c := p.Config()
		log.Info("loader ready", "name", spec.name, "dataset", cfg.Dataset, "samples", p.Len(), "batch", c.Batch,
			"slots", c.Slots, "window", c.Window, "ring", cfg.Dir)
		sl.producers, sl.names = append(sl.producers, p), append(sl.names, spec.name)
	}
	register := func(s *rpc.Server) error {
		if len(sl.producers) == 0 {
			return nil
		}
		svc, err := loader.Register(s)
		if err != nil {
			return err
		}
		for i, p := range sl.producers {
			if err := svc.Add(sl.names[i], p); err != nil {
				return err
			}
		}
		return nil
	}
	return sl, register, nil
}

// close closes every producer.
func (sl *servedLoaders) close() error {
	var errs []error
	for _, p := range sl.producers {
		errs = append(errs, p.Close())
	}
	return errors.Join(errs...)
}
