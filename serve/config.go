package serve

import (
	"context"
	"errors"
	"log/slog"
	"time"

	"github.com/tensorwire/tensorwire/internal/service"
	"github.com/tensorwire/tensorwire/tensordict"
)

// Model is what a manager serves: anything that maps a batch of input rows
// to a batch of output rows.
//
// Forward gets a TensorDict of batch size [n], 1 <= n <= Config.MaxBatch,
// with the fields of Config.Input, and returns one of batch size [n] with
// the fields of Config.Output, row i the output for input row i. in is
// valid only until Forward returns: a model keeps nothing of it. The result
// is the manager's from then on, and the model must not change it later.
// A replica calls Forward on one batch at a time, so a Model need not be
// safe for concurrent use; each replica has its own (Config.New).
//
// An error or a panic fails the batch's requests with ErrForward and the
// replica is replaced: its model is dropped (closed, if it is an
// io.Closer) and New makes another. So does a memory fault (SIGBUS on a
// mapping whose file was truncated) on the goroutine that calls Forward,
// which runs with debug.SetPanicOnFault. Goroutines the model starts are
// not guarded: a model that reads mappings on them must copy what it needs
// first, as serve/mlp does at Load.
type Model interface {
	Forward(ctx context.Context, in *tensordict.TensorDict) (*tensordict.TensorDict, error)
}

// Loader is a Model whose weights can be changed (Manager.Load): Load
// makes the model compute with params from its next Forward on. A replica
// calls it between batches, never during one, and never concurrently with
// Forward.
//
// The model may keep views of params' tensors instead of copying them
// (tensordict.Tensor.Dense aliases a mapping): the manager keeps params
// valid until every model has loaded a later version, or been closed.
// An error means the model cannot take params (their keys or shapes are
// not the model's); the model must then still be usable, with the
// parameters it had or others, since the manager loads it again.
type Loader interface {
	Model
	Load(ctx context.Context, params *tensordict.TensorDict) error
}

// ParamsNeeder is a Model that may have no parameters worth predicting
// with until its first Load: serve/mlp's MLP, whose constructor's weights
// are zero. When the models a manager builds say they need parameters
// (NeedsParams of replica 0's model, when the manager starts), the manager
// refuses predictions with ErrNoParams until Load, LoadVersion or Follow
// has loaded a first version, instead of answering with the constructor's
// weights; and a replica runs no batch with a model of version 0. Models
// that are not ParamsNeeders serve their constructor's weights as
// version 0.
type ParamsNeeder interface {
	Model
	NeedsParams() bool
}

// Config describes what a Manager serves. Input, Output, MaxBatch and New
// are required.
type Config struct {
	// Input and Output are the fields of one row of the model's input and
	// output: keys (nested keys have several elements), dtypes and the
	// shape of one row, without the batch dimension (torch_spread's shape
	// and dtype buffers).
	Input, Output tensordict.RowSchema

	// MaxBatch is the most rows a Forward gets. A request holds at most
	// MaxBatch rows: it is never split across batches.
	MaxBatch int

	// Replicas is how many models run batches at once, each on its own
	// goroutine with its own model; default 1.
	Replicas int

	// New makes a model: once per replica (replica 0 .. Replicas-1) when
	// the manager starts, once more (replica Replicas) for the spare that
	// takes new weights off the serving path at the first Load, and again
	// whenever a replica is replaced after a failed Forward (with that
	// replica's index). It may be called from any goroutine.
	New func(replica int) (Model, error)

	// Policy says when a free replica closes the batch it takes: Greedy()
	// (nil is Greedy), MaxDelay(d), or a Policy of the caller's own.
	Policy Policy

	// MaxQueue bounds the rows waiting for a replica (in the batch being
	// gathered and behind it); a request that would exceed it fails with
	// ErrQueueFull. Default 4096.
	MaxQueue int

	// Lease is how long a remote client's registration (its shared input
	// and output slots) lasts without a call from it; the client renews it
	// every Lease/4. Default 30 s.
	Lease time.Duration

	// AttachedOnly: the manager runs no replica of its own. Every batch
	// goes to replicas attached from other processes over the
	// serve.replica stream (a Python process holding a torch.nn.Module,
	// docs/serve.md "Replicas in other processes"); Replicas and New are
	// ignored (New may be nil), and Load is ErrConfig (attached replicas
	// load their own weights). The command line's replicas=0.
	AttachedOnly bool

	// AttachWait bounds how long requests wait while the model has no
	// replica (none attached yet, or the last went away): then they fail
	// with ErrNoReplica. Default 10 s.
	AttachWait time.Duration

	// ReplicaTimeout bounds how long an attached replica may take to
	// answer a batch: one silent longer is detached, and its batch runs
	// on another replica (or fails with ErrForward). Default 30 s.
	ReplicaTimeout time.Duration

	// Log is where the manager logs replacements and weight updates; nil:
	// slog.Default().
	Log *slog.Logger
}

const (
	defaultMaxQueue       = 4096
	defaultLease          = 30 * time.Second
	defaultAttachWait     = 10 * time.Second
	defaultReplicaTimeout = 30 * time.Second
	// maxRows bounds MaxBatch and a client's slots: far above any batch a
	// model would take, and small enough that no row count overflows.
	maxRows = 1 << 20
)

// DefaultConfig returns the configuration every zero field of a Config
// stands for: Config{}.WithDefaults(). Input, Output, MaxBatch and New have
// no default: Validate refuses it until they are set.
func DefaultConfig() Config { return Config{}.WithDefaults() }

// WithDefaults returns a copy of c with its zero fields set to their
// defaults: Replicas 1, MaxQueue 4096, Lease 30 s, Log slog.Default(),
// Policy Greedy(). It checks nothing (Validate).
func (c Config) WithDefaults() Config {
	if c.Replicas == 0 && !c.AttachedOnly {
		c.Replicas = 1
	}
	if c.AttachWait == 0 {
		c.AttachWait = defaultAttachWait
	}
	if c.ReplicaTimeout == 0 {
		c.ReplicaTimeout = defaultReplicaTimeout
	}
	if c.MaxQueue == 0 {
		c.MaxQueue = defaultMaxQueue
	}
	if c.Lease == 0 {
		c.Lease = defaultLease
	}
	if c.Log == nil {
		c.Log = slog.Default()
	}
	if c.Policy == nil {
		c.Policy = Greedy()
	}
	return c
}

// Validate reports whether c, with its zero fields at their defaults
// (WithDefaults), can make a Manager: ErrConfig naming the field and what
// it wants. It is pure: it calls no constructor.
func (c Config) Validate() error {
	c = c.WithDefaults()
	switch {
	case c.New == nil && !c.AttachedOnly:
		return configErrorf("no model constructor (New)")
	case c.MaxBatch < 1 || c.MaxBatch > maxRows:
		return configErrorf("max batch %d; want 1 to %d", c.MaxBatch, maxRows)
	case c.AttachWait < 0 || c.ReplicaTimeout < 0:
		return configErrorf("attach wait %v, replica timeout %v; want positive durations", c.AttachWait, c.ReplicaTimeout)
	case !c.AttachedOnly && (c.Replicas < 1 || c.Replicas > 1024):
		return configErrorf("%d replicas; want 1 to 1024", c.Replicas)
	case c.MaxQueue < c.MaxBatch:
		return configErrorf("max queue %d rows is smaller than the max batch %d", c.MaxQueue, c.MaxBatch)
	case c.Lease < 0:
		return configErrorf("lease %v; want a positive duration", c.Lease)
	}
	if err := c.Input.Validate(); err != nil {
		return configErrorf("input schema: %v", err)
	}
	if err := c.Output.Validate(); err != nil {
		return configErrorf("output schema: %v", err)
	}
	return nil
}

// normalize sets c's defaults in place, checks it, and clones its schemas.
func (c *Config) normalize() error {
	*c = c.WithDefaults()
	if err := c.Validate(); err != nil {
		return err
	}
	c.Input, c.Output = c.Input.Clone(), c.Output.Clone()
	return nil
}

// Setting is one key of a config's text form (Config.Set): its key, what
// it takes, and a line of help.
type Setting = service.Setting

// Settings returns the keys Set takes, in order: replicas, max-batch,
// max-delay, queue and lease.
func (Config) Settings() []Setting { return configKeys.Settings() }

// Set sets the field key names from its text, as the command line's
// --serve NAME,KEY=VALUE gives it: replicas=N, max-batch=N, queue=N
// (MaxQueue), whole numbers of at least 1; max-delay=D (Policy:
// MaxDelay(D), a duration >= 0); lease=D, a positive duration. An unknown
// key, or a value the key does not take, is ErrConfig naming the key, the
// value and what it wants; c is then unchanged.
func (c *Config) Set(key, value string) error { return configKeys.Set(c, key, value, ErrConfig) }

// configKeys is Config's text form, a row a key.
var configKeys = service.Keys[Config]{
	{Setting: Setting{Key: "replicas", Value: "N", Help: "models running batches at once (default 1; 0: only replicas attached from other processes)"},
		Set: func(c *Config, v string) error {
			if v == "0" { // attached replicas only (attach.go)
				c.Replicas, c.AttachedOnly = 0, true
				return nil
			}
			c.AttachedOnly = false
			return service.SetAtLeast(&c.Replicas, v, 1)
		}},
	{Setting: Setting{Key: "max-batch", Value: "N", Help: "the most rows a batch holds"},
		Set: func(c *Config, v string) error { return service.SetAtLeast(&c.MaxBatch, v, 1) }},
	{Setting: Setting{Key: "max-delay", Value: "D", Help: "how long a batch not full waits for more requests (default 0: greedy)"},
		Set: func(c *Config, v string) error {
			d, err := time.ParseDuration(v)
			if err != nil || d < 0 {
				return errors.New("want a duration >= 0")
			}
			c.Policy = MaxDelay(d)
			return nil
		}},
	{Setting: Setting{Key: "queue", Value: "N", Help: "the most rows waiting for a replica (default 4096)"},
		Set: func(c *Config, v string) error { return service.SetAtLeast(&c.MaxQueue, v, 1) }},
	{Setting: Setting{Key: "lease", Value: "D", Help: "how long a remote client's registration lasts without a call (default 30s)"},
		Set: func(c *Config, v string) error { return service.SetPositive(&c.Lease, v) }},
	{Setting: Setting{Key: "attach-wait", Value: "D", Help: "how long requests wait while no replica is attached (replicas=0; default 10s)"},
		Set: func(c *Config, v string) error { return service.SetPositive(&c.AttachWait, v) }},
	{Setting: Setting{Key: "replica-timeout", Value: "D", Help: "how long an attached replica may take to answer a batch (default 30s)"},
		Set: func(c *Config, v string) error { return service.SetPositive(&c.ReplicaTimeout, v) }},
}

// checkRows checks a batch of input rows against schema and limit: a
// TensorDict of batch size [n], 1 <= n <= limit, with schema's fields. It
// returns n.
func checkRows(td *tensordict.TensorDict, schema tensordict.RowSchema, limit int, what string) (int, error) {
	if td == nil {
		return 0, schemaErrorf("no %s", what)
	}
	b := td.BatchSize()
	if len(b) != 1 {
		return 0, schemaErrorf("%s of batch size %v; want [n], one row per sample", what, b)
	}
	n := b[0]
	if n < 1 {
		return 0, schemaErrorf("%s of no rows", what)
	}
	if n > limit {
		return 0, schemaErrorf("%s of %d rows; at most %d", what, n, limit)
	}
	if d := schemaDiff(schema, td.RowSchema()); d != "" {
		return 0, schemaErrorf("%s: %s", what, d)
	}
	return n, nil
}
