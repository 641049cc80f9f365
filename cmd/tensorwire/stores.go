package main

import (
	"errors"
	"fmt"
	"log/slog"
	"path/filepath"

	"github.com/tensorwire/tensorwire/rpc"
	"github.com/tensorwire/tensorwire/store"
)

// storeSpec is one --store flag of the node command:
// NAME[,max-value=SIZE][,inline=SIZE][,sync=always|none][,lease=D][,get-timeout=D][,history=N][,trash-grace=D][,repair=drop],
// the settings of store.Options.Set.
type storeSpec struct {
	spec
	opts store.Options
}

// storeFlags collects repeated --store flags.
type storeFlags []storeSpec

func (f *storeFlags) String() string { return fmt.Sprint(len(*f), " stores") }

// storeGrammar is what a --store value holds.
var storeGrammar = grammar{
	noun: "store",
	checkName: func(name string) error {
		if err := store.CheckName(name); err != nil {
			return fmt.Errorf("store name: %w (a folder directly under the root)", err)
		}
		return nil
	},
	twice: "given twice",
	keys:  store.Options{}.Settings(),
}

// Set parses one --store value and checks every setting in it.
func (f *storeFlags) Set(v string) error {
	s, opts, err := readConfig(storeGrammar, v, specNames(*f), (*store.Options).Set)
	if err != nil {
		return err
	}
	*f = append(*f, storeSpec{s, opts})
	return nil
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
