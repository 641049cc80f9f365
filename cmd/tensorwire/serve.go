package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"path/filepath"
	"slices"
	"strings"
	"sync"

	"github.com/tensorwire/tensorwire/internal/service"
	"github.com/tensorwire/tensorwire/rpc"
	"github.com/tensorwire/tensorwire/serve"
	"github.com/tensorwire/tensorwire/serve/mlp"
	"github.com/tensorwire/tensorwire/store"
	"github.com/tensorwire/tensorwire/tensordict"
)

// serveSpec is one --serve flag of the node command:
// NAME,params=P|store=S,param=N[,replicas=N][,max-batch=N][,max-delay=D][,queue=N][,lease=D].
// The model is the MLP of package serve/mlp, its layers those of its
// parameters: the TensorDict at ROOT/P, as PyTorch writes a state_dict
// with TensorDict(model.state_dict()).memmap_(P); or the parameter set N
// of the node's store S (--store S), whose every new version the node
// loads (serve.Manager.Follow). The other settings are serve.Config's
// (serve.Config.Set), max-batch 16 unless given.
type serveSpec struct {
	spec
	params string
	store  string
	param  string
	input  tensordict.RowSchema // replicas=0: the schemas (serve_attached.go)
	output tensordict.RowSchema
	cfg    serve.Config // its Input, Output, New and Log set by manager
}

// serveFlags collects repeated --serve flags.
type serveFlags []serveSpec

func (f *serveFlags) String() string { return fmt.Sprint(len(*f), " models") }

const serveUsage = "NAME,params=P|store=S,param=N|replicas=0,input=F,output=F[,replicas=N][,max-batch=N][,max-delay=D][,queue=N][,lease=D]"

// sourceKeys are the settings of a --serve value that say where the
// model's parameters come from; serve.Config's follow.
var sourceKeys = service.Keys[serveSpec]{
	{Setting: service.Setting{Key: "params", Value: "P", Help: "the folder under the root holding its parameters, a PyTorch state_dict memmap"},
		Set: func(s *serveSpec, v string) error {
			if v == "" || strings.Contains(v, "..") || filepath.IsAbs(v) {
				return errors.New("a folder under the root")
			}
			s.params = v
			return nil
		}},
	{Setting: service.Setting{Key: "store", Value: "S", Help: "a store this node serves (--store), whose parameter set param= it serves"},
		Set: func(s *serveSpec, v string) error {
			return service.SetNonEmpty(&s.store, v, "the name of a store this node serves (--store)")
		}},
	{Setting: service.Setting{Key: "param", Value: "N", Help: "the name of a parameter set of store="},
		Set: func(s *serveSpec, v string) error {
			return service.SetNonEmpty(&s.param, v, "the name of a parameter set")
		}},
}

// serveGrammar is what a --serve value holds.
var serveGrammar = grammar{
	noun: "model",
	checkName: func(name string) error {
		if name == "" {
			return fmt.Errorf("a served model needs a name: %s", serveUsage)
		}
		return nil
	},
	twice: "served twice",
	keys:  append(append(sourceKeys.Settings(), schemaKeys.Settings()...), serve.Config{}.Settings()...),
}

// Set parses one --serve value and checks every value in it.
func (f *serveFlags) Set(v string) error {
	m := serveSpec{cfg: serve.Config{Replicas: 1, MaxBatch: 16, Policy: serve.Greedy()}}
	s, err := serveGrammar.read(v, specNames(*f), func(s spec) error {
		if err := s.apply(m.set); err != nil {
			return err
		}
		return m.check()
	})
	if err != nil {
		return err
	}
	m.spec = s
	*f = append(*f, m)
	return nil
}

// set sets one setting of a --serve value.
func (s *serveSpec) set(key, value string) error {
	if slices.ContainsFunc(sourceKeys, func(k service.Key[serveSpec]) bool { return k.Key == key }) {
		return sourceKeys.Set(s, key, value, nil)
	}
	if slices.ContainsFunc(schemaKeys, func(k service.Key[serveSpec]) bool { return k.Key == key }) {
		return schemaKeys.Set(s, key, value, nil)
	}
	return s.cfg.Set(key, value)
}

// check checks what a --serve value's settings say together.
func (s *serveSpec) check() error {
	if err := s.checkAttached(); err != nil {
		return err
	}
	switch {
	case s.input != nil:
	case s.params != "" && (s.store != "" || s.param != ""):
		return errors.New("params=P, or store=S and param=N, not both")
	case (s.store == "") != (s.param == ""):
		return errors.New("store=S and param=N go together")
	case s.params == "" && s.store == "":
		return errors.New("no params=P (the folder under the root holding its parameters, a PyTorch state_dict " +
			"memmap), nor store=S,param=N (a parameter set of a store this node serves)")
	}
	if s.cfg.MaxQueue != 0 && s.cfg.MaxQueue < s.cfg.MaxBatch {
		return fmt.Errorf("queue=%d is smaller than max-batch=%d", s.cfg.MaxQueue, s.cfg.MaxBatch)
	}
	return nil
}

// servedModels are the managers a node runs, and their parameters'
// mappings.
type servedModels struct {
	mu       sync.Mutex
	closed   bool
	managers []*serve.Manager // nil: waiting for its store's first version
	params   []*tensordict.TensorDict
	svc      *serve.Service // once the server is registered
	// cancel ends the context of the goroutines that read a store's
	// parameters, counted by readers: the models waiting for their first
	// version (awaitFirst) and those following their store (Follow).
	// close waits for them, since the node closes its stores after the
	// models, and a store's Close unmaps every version it handed out.
	cancel  context.CancelFunc
	readers sync.WaitGroup
}

// start maps each model's parameters read-only, starts its manager with
// them loaded (version 1, or the store's version), and returns a register
// hook serving them under their names. stores finds the node's stores by
// name. Models that follow a store do so until ctx ends or close.
func (f serveFlags) start(ctx context.Context, root string, stores func(string) *store.Store, log *slog.Logger) (*servedModels, func(*rpc.Server) error, error) {
	ctx, cancel := context.WithCancel(ctx)
	sm := &servedModels{cancel: cancel}
	for _, spec := range f {
		if spec.input != nil {
			m, err := spec.startAttached(spec.input, spec.output, log)
			if err != nil {
				sm.close()
				return nil, nil, fmt.Errorf("model %s: %w", spec.name, err)
			}
			sm.managers, sm.params = append(sm.managers, m), append(sm.params, nil)
			continue
		}
		if spec.store != "" {
			m, err := spec.follow(ctx, stores, &sm.readers, log)
			if errors.Is(err, store.ErrNotFound) && stores(spec.store) != nil {
				// No version yet: the node starts, and the model is served
				// from the first version published (awaitFirst). Said
				// loudly: until then calls to it fail with NotFound.
				log.Warn("model not served until a first version of its parameters is published to its store; until then its calls fail with NotFound",
					"name", spec.name, "store", spec.store, "param", spec.param)
				sm.managers, sm.params = append(sm.managers, nil), append(sm.params, nil)
				continue
			}
			if err != nil {
				sm.close()
				return nil, nil, fmt.Errorf("model %s: %w", spec.name, err)
			}
			sm.managers, sm.params = append(sm.managers, m), append(sm.params, nil)
			continue
		}
		m, params, err := spec.start(ctx, root, log)
		if err != nil {
			sm.close()
			return nil, nil, fmt.Errorf("model %s: %w", spec.name, err)
		}
		sm.managers, sm.params = append(sm.managers, m), append(sm.params, params)
	}
	register := func(s *rpc.Server) error {
		if len(f) == 0 {
			return nil
		}
		svc, err := serve.Register(s)
		if err != nil {
			return err
		}
		sm.svc = svc
		for i, spec := range f {
			if sm.managers[i] == nil {
				sm.readers.Add(1)
				go sm.awaitFirst(ctx, i, spec, stores(spec.store), log)
				continue
			}
			if err := svc.Add(spec.name, sm.managers[i]); err != nil {
				return err
			}
		}
		return nil
	}
	return sm, register, nil
}

// awaitFirst waits for the first version of spec's parameters in st, then
// starts the model's manager with it, serves it under its name and follows
// the store, as follow does for a version there at start; until ctx ends
// (close ends it, then waits for this: sm.readers counts it).
func (sm *servedModels) awaitFirst(ctx context.Context, i int, spec serveSpec, st *store.Store, log *slog.Logger) {
	defer sm.readers.Done()
	p, err := st.WaitNewer(ctx, spec.param, 0)
	if err != nil {
		if ctx.Err() == nil {
			log.Error("model: waiting for the first version of its parameters failed: not served", "name", spec.name, "param", spec.param, "err", err)
		}
		return
	}
	m, err := spec.fromParam(ctx, st, p, &sm.readers, log)
	if err != nil {
		log.Error("model: its parameters' first version cannot be served: not served", "name", spec.name, "param", spec.param, "err", err)
		return
	}
	sm.mu.Lock()
	defer sm.mu.Unlock()
	if sm.closed {
		m.Close()
		return
	}
	sm.managers[i] = m
	if err := sm.svc.Add(spec.name, m); err != nil {
		log.Error("model: cannot serve it", "name", spec.name, "err", err)
	}
}

// follow starts a manager of the MLP whose parameters are the parameter
// set s.param of the node's store s.store: the latest version, which must
// exist, then every new one (Follow, until ctx ends, on a goroutine that
// readers counts).
func (s serveSpec) follow(ctx context.Context, stores func(string) *store.Store, readers *sync.WaitGroup, log *slog.Logger) (*serve.Manager, error) {
	st := stores(s.store)
	if st == nil {
		return nil, fmt.Errorf("store=%s: this node serves no such store (--store %s)", s.store, s.store)
	}
	p, err := st.Latest(ctx, s.param)
	if err != nil {
		return nil, fmt.Errorf("param=%s: %w", s.param, err)
	}
	return s.fromParam(ctx, st, p, readers, log)
}

// fromParam starts the manager of an MLP loaded with version p of the
// parameters s follows in st, then follows st for newer ones until ctx
// ends, on a goroutine that readers counts; it takes p.
func (s serveSpec) fromParam(ctx context.Context, st *store.Store, p *store.Param, readers *sync.WaitGroup, log *slog.Logger) (*serve.Manager, error) {
	sizes, err := mlp.SizesOf(p.TD)
	if err == nil {
		var m *serve.Manager
		if m, err = s.manager(sizes, log); err == nil {
			if err = m.LoadParam(ctx, p); err == nil {
				log.Info("model served", "name", s.name, "model", "mlp", "sizes", sizes, "store", s.store, "param", s.param,
					"version", p.Version, "replicas", s.cfg.Replicas, "max_batch", s.cfg.MaxBatch, "policy", s.cfg.Policy)
				readers.Add(1)
				go func() {
					defer readers.Done()
					if err := m.Follow(ctx, st, s.param); err != nil && ctx.Err() == nil {
						log.Error("following parameters stopped", "name", s.name, "param", s.param, "err", err)
					}
				}()
				return m, nil
			}
			m.Close()
		}
	}
	p.Close()
	return nil, fmt.Errorf("param=%s version %d: %w", s.param, p.Version, err)
}

// manager starts the manager of an MLP of the given layer widths.
func (s serveSpec) manager(sizes []int, log *slog.Logger) (*serve.Manager, error) {
	shape, err := mlp.New(mlp.Config{Sizes: sizes})
	if err != nil {
		return nil, err
	}
	cfg := s.cfg
	cfg.Input, cfg.Output, cfg.Log = shape.Input(), shape.Output(), log.With("model", s.name)
	cfg.New = func(int) (serve.Model, error) { return mlp.New(mlp.Config{Sizes: sizes}) }
	return serve.New(cfg)
}

func (s serveSpec) start(ctx context.Context, root string, log *slog.Logger) (*serve.Manager, *tensordict.TensorDict, error) {
	prefix := filepath.Join(root, s.params)
	params, err := tensordict.LoadMemmap(prefix, tensordict.ReadOnly())
	if err != nil {
		return nil, nil, fmt.Errorf("params: %w", err)
	}
	sizes, err := mlp.SizesOf(params)
	if err != nil {
		params.Close()
		return nil, nil, fmt.Errorf("params %s: %w", prefix, err)
	}
	if s.cfg.AttachedOnly { // the MLP's schemas; its replicas load their own weights
		params.Close()
		shape, err := mlp.New(mlp.Config{Sizes: sizes})
		if err != nil {
			return nil, nil, err
		}
		m, err := s.startAttached(shape.Input(), shape.Output(), log)
		return m, nil, err
	}
	m, err := s.manager(sizes, log)
	if err != nil {
		params.Close()
		return nil, nil, err
	}
	v, err := m.Load(ctx, params)
	if err != nil {
		m.Close()
		params.Close()
		return nil, nil, fmt.Errorf("params %s: %w", prefix, err)
	}
	log.Info("model served", "name", s.name, "model", "mlp", "sizes", sizes, "params", prefix, "version", v,
		"replicas", s.cfg.Replicas, "max_batch", s.cfg.MaxBatch, "policy", s.cfg.Policy)
	return m, params, nil
}

// close ends the goroutines that read a store's parameters and waits for
// them (a model waiting for its first version may be loading it), then
// stops serving (the bells' pollers), stops the managers, and unmaps their
// parameters: once it returns, the node may close its stores.
func (sm *servedModels) close() {
	sm.mu.Lock()
	sm.closed = true // an awaitFirst past its load closes its manager
	sm.mu.Unlock()
	sm.cancel()
	sm.readers.Wait()
	if sm.svc != nil {
		sm.svc.Close()
	}
	for _, m := range sm.managers {
		if m != nil {
			m.Close()
		}
	}
	for _, p := range sm.params {
		if p != nil {
			p.Close()
		}
	}
}
