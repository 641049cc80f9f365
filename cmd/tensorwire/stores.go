package main

import (
	"errors"
	"fmt"
	"log/slog"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/tensorwire/tensorwire/rpc"
	"github.com/tensorwire/tensorwire/store"
)

// storeSpec is one --store flag of the node command:
// NAME[,max-value=SIZE][,inline=SIZE][,sync=always|none][,lease=D][,get-timeout=D][,history=N][,trash-grace=D][,repair=drop].
type storeSpec struct {
	name string
	opts store.Options
}

// storeFlags collects repeated --store flags.
type storeFlags []storeSpec

func (f *storeFlags) String() string { return fmt.Sprint(len(*f), " stores") }

// Set parses one --store value.
func (f *storeFlags) Set(v string) error {
	parts := strings.Split(v, ",")
	spec := storeSpec{name: parts[0]}
	if err := store.CheckName(spec.name); err != nil {
		return fmt.Errorf("store name: %w (a folder directly under the root)", err)
	}
	for _, other := range *f {
		if other.name == spec.name {
			return fmt.Errorf("store %s given twice", spec.name)
		}
	}
	seen := map[string]bool{}
	for _, p := range parts[1:] {
		k, val, ok := strings.Cut(p, "=")
		if !ok {
			return fmt.Errorf("store %s: %q is not key=value", spec.name, p)
		}
		if seen[k] {
			return fmt.Errorf("store %s: %s given twice", spec.name, k)
		}
		seen[k] = true
		var err error
		switch k {
		case "max-value":
			spec.opts.MaxValueBytes, err = parseSize(val)
		case "inline":
			spec.opts.InlineBytes, err = parseSize(val)
		case "sync":
			switch val {
			case "always":
			case "none":
				spec.opts.NoSync = true
			default:
				err = fmt.Errorf("%q is not always or none", val)
			}
		case "lease":
			spec.opts.LeaseTTL, err = positiveDuration(val)
		case "trash-grace":
			spec.opts.TrashGrace, err = positiveDuration(val)
		case "get-timeout":
			spec.opts.GetTimeout, err = positiveDuration(val)
		case "repair":
			// Open reports what it would drop either way; this drops it.
			if val != "drop" {
				err = fmt.Errorf("%q is not drop (without repair, the node only reports what it would drop)", val)
			}
			spec.opts.Repair = true
		case "history":
			spec.opts.History, err = strconv.Atoi(val)
			if err == nil && spec.opts.History <= 0 {
				err = fmt.Errorf("%d is not a positive number of events", spec.opts.History)
			}
		default:
			return fmt.Errorf("store %s: unknown setting %q (have max-value, inline, sync, lease, get-timeout, history, trash-grace, repair)", spec.name, k)
		}
		if err != nil {
			return fmt.Errorf("store %s: %s: %w", spec.name, k, err)
		}
	}
	*f = append(*f, spec)
	return nil
}

func positiveDuration(s string) (time.Duration, error) {
	d, err := time.ParseDuration(s)
	if err == nil && d <= 0 {
		err = fmt.Errorf("%v is not a positive duration", d)
	}
	return d, err
}

// parseSize reads a size in bytes: a number with an optional unit B, KiB,
// MiB, GiB (or K, M, G, meaning the same).
func parseSize(s string) (int64, error) {
	units := []struct {
		suffix string
		mult   int64
	}{{"GiB", 1 << 30}, {"MiB", 1 << 20}, {"KiB", 1 << 10}, {"G", 1 << 30}, {"M", 1 << 20}, {"K", 1 << 10}, {"B", 1}}
	mult := int64(1)
	for _, u := range units {
		if n, ok := strings.CutSuffix(s, u.suffix); ok {
			s, mult = n, u.mult
			break
		}
	}
	n, err := strconv.ParseInt(s, 10, 64)
	if err != nil || n <= 0 || n > (1<<62)/mult {
		return 0, fmt.Errorf("%q is not a size such as 1048576, 512KiB or 64MiB", s)
	}
	return n * mult, nil
}

// servedStores are the stores a node opened, closed by close.
type servedStores []*store.Store

// open opens (or creates) each store at root/NAME and returns a register
// hook serving them under their names.
func (f storeFlags) open(root string, log *slog.Logger) (servedStores, func(*rpc.Server) error, error) {
	var ss servedStores
	for _, spec := range f {
		spec.opts.Logger = log.With("store", spec.name)
		s, err := store.Open(filepath.Join(root, spec.name), spec.opts)
		if err != nil {
			ss.close()
			return nil, nil, fmt.Errorf("store %s: %w", spec.name, err)
		}
		st := s.Stats()
		log.Info("store opened", "name", spec.name, "dir", s.Dir(), "revision", st.Revision, "bins", st.Bins,
			"items", st.Items, "params", st.Params)
		ss = append(ss, s)
	}
	register := func(srv *rpc.Server) error {
		if len(f) == 0 {
			return nil
		}
		svc, err := store.Register(srv)
		if err != nil {
			return err
		}
		for i, spec := range f {
			if err := svc.Add(spec.name, ss[i]); err != nil {
				return err
			}
		}
		return nil
	}
	return ss, register, nil
}

func (ss servedStores) close() error {
	var errs []error
	for _, s := range ss {
		errs = append(errs, s.Close())
	}
	return errors.Join(errs...)
}
