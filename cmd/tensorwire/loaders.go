package main

import (
	"errors"
	"fmt"
	"log/slog"
	"path/filepath"
	"slices"
	"strings"

	"github.com/tensorwire/tensorwire/loader"
	"github.com/tensorwire/tensorwire/rpc"
)

// loaderHelp says what a --loader value holds, for the node command's help.
const loaderHelp = "NAME,dataset=PREFIX,batch=N[,slots=N][,window=N][,seed=S][,sequential][,index=KEY]" +
	"[,heartbeat=D][,max-wait=D][,workers=N][,transform=augment[,image-key=K][,pad=P][,flip][,mean=M][,std=S]]" +
	" | NAME,producer=remote[,slots=N][,window=N][,heartbeat=D][,max-wait=D][,grant-wait=D]"

// loaderFlags collects repeated --loader flags: the producers a node
// serves, each with its ring in ROOT/NAME.
type loaderFlags []loaderSpec

// loaderSpec is one --loader flag: a name and the producer's Config, the
// settings of loader.Config.Set (Dir is filled in by open).
type loaderSpec struct {
	spec
	cfg loader.Config
}

func (f *loaderFlags) String() string { return fmt.Sprint(len(*f), " loaders") }

// loaderGrammar is what a --loader value holds.
var loaderGrammar = grammar{
	noun:     "loader",
	folder:   true,
	twice:    "given twice",
	keys:     loader.Config{}.Settings(),
	required: []string{"dataset", "batch"},
}

// remoteLoaderGrammar is what a --loader NAME,producer=remote value holds:
// the batches come from a producer process, which says their size.
var remoteLoaderGrammar = func() grammar {
	g := loaderGrammar
	g.required = []string{"producer"}
	return g
}()

// Set parses one --loader value and checks every setting in it.
func (f *loaderFlags) Set(v string) error {
	g := loaderGrammar
	if slices.Contains(strings.Split(v, ",")[1:], "producer="+loader.ProducerRemote) {
		g = remoteLoaderGrammar
	}
	s, cfg, err := readConfig(g, v, specNames(*f), (*loader.Config).Set)
	if err == nil {
		c := cfg
		c.Dir = s.name // the folder is the node's ROOT/NAME
		if verr := c.Validate(); verr != nil && cfg.Producer == loader.ProducerRemote {
			err = fmt.Errorf("loader %s: %w", s.name, verr)
		}
	}
	if err != nil {
		return err
	}
	*f = append(*f, loaderSpec{s, cfg})
	return nil
}

// servedLoaders are the producers a node made.
type servedLoaders struct {
	producers []*loader.Producer
	names     []string
	remotes   []loaderSpec     // producer=remote: served once the server is made
	attached  []*loader.Remote // those, served
}

// checkNames refuses (errUsage, before anything is made) two services of
// the node whose folders, ROOT/NAME, are one, or one inside the other: a
// loader, a replay buffer or a store named as another, or inside another's
// folder (--store s --buffer s/x). Each service refuses a folder holding
// files it did not make, but only when it opens, after the services before
// it made theirs: the node failed at the second, and the first one's files
// stayed where the second would live, so that it failed from then on.
func (f loaderFlags) checkNames(buffers bufferFlags, stores storeFlags) error {
	type use struct{ flag, name, dir string }
	var uses []use
	add := func(flag, name string) { uses = append(uses, use{flag, name, filepath.Clean(name)}) }
	for _, b := range buffers {
		add("--buffer", b.name)
	}
	for _, st := range stores {
		add("--store", st.name)
	}
	for _, spec := range f {
		add("--loader", spec.name)
	}
	sep := string(filepath.Separator)
	for i, u := range uses {
		for _, prev := range uses[:i] {
			switch {
			case u.dir == prev.dir:
				return fmt.Errorf("%w: %s %s: a %s has that name, and both would live in ROOT/%s", errUsage, u.flag, u.name, prev.flag, u.name)
			case strings.HasPrefix(u.dir, prev.dir+sep):
				return fmt.Errorf("%w: %s %s: its folder would be inside ROOT/%s, the %s %s's: give each a folder of its own", errUsage, u.flag, u.name, prev.dir, prev.flag, prev.name)
			case strings.HasPrefix(prev.dir, u.dir+sep):
				return fmt.Errorf("%w: %s %s: the %s %s's folder would be inside ROOT/%s, its own: give each a folder of its own", errUsage, u.flag, u.name, prev.flag, prev.name, u.dir)
			}
		}
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
		if cfg.Producer == loader.ProducerRemote {
			spec.cfg = cfg
			sl.remotes = append(sl.remotes, spec)
			log.Info("loader ready for a producer process", "name", spec.name, "ring", cfg.Dir)
			continue
		}
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
		if len(sl.producers) == 0 && len(sl.remotes) == 0 {
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
		for _, spec := range sl.remotes {
			r, err := svc.AddRemote(spec.name, spec.cfg)
			if err != nil {
				return fmt.Errorf("loader %s: %w", spec.name, err)
			}
			sl.attached = append(sl.attached, r)
		}
		return nil
	}
	return sl, register, nil
}

// close closes every producer.
func (sl *servedLoaders) close() error {
	var errs []error
	for _, r := range sl.attached {
		errs = append(errs, r.Close())
	}
	for _, p := range sl.producers {
		errs = append(errs, p.Close())
	}
	return errors.Join(errs...)
}
