package loader

import (
	"errors"
	"fmt"
	"log/slog"
	"math"
	"strconv"
	"strings"
	"time"

	"github.com/tensorwire/tensorwire/internal/service"
)

// Config says what a Producer serves and how.
type Config struct {
	// Dataset is the prefix of a memory-mapped TensorDict of batch size
	// [N, ...] (tensordict's format; "tensorwire import" makes one). Its
	// rows are the samples. It is mapped read-only.
	Dataset string

	// Producer is "" for a producer that reads Dataset, or
	// ProducerRemote ("remote") for a loader whose batches come from a
	// producer process that attaches to the node (Service.AddRemote,
	// docs/loader.md "A producer in another process"): then Dataset, Seed,
	// Sequential, Transform and IndexKey are not set, and Batch is the
	// process's (0 here).
	Producer string

	// Dir is the ring's folder: created if missing, and it must otherwise
	// be a loader's ring folder or empty. Consumers that share the
	// filesystem map the ring from it, so for them it must lie under the
	// node's root (rpc.WithRoot); others get the batches as bytes.
	Dir string

	// Batch is the number of rows of a producer batch, the unit written
	// into a ring slot. Consumers cut their own batch sizes from these.
	Batch int

	// Slots is the number of batches the ring holds; 0 means 8. The ring
	// takes Slots × Batch rows of the transformed row size on disk (in
	// the page cache, on a tmpfs).
	Slots int

	// Window is how many batches into an epoch a consumer may join and
	// still get the whole epoch (tensorsocket's rubber band): it joins the
	// current epoch until the producer takes a slot for the epoch's batch
	// Window, and gets the batches it missed from the ring, which still
	// holds them. 0 means Slots/2; a negative Window lets nobody join an
	// epoch already begun. At most Slots: with Window = Slots, every
	// consumer that joins before the producer has had to wait for a slot
	// in this epoch gets the whole epoch.
	Window int

	// Seed seeds the per-epoch shuffle and the transform's random sources.
	Seed uint64

	// Sequential serves the rows in dataset order every epoch instead of
	// shuffling them.
	Sequential bool

	// Transform, if not nil, transforms every sample once, for all the
	// consumers (Augment, say). nil serves the rows as stored.
	Transform Transform

	// Workers is how many goroutines run the transform on a batch, each on
	// a share of its rows, when the Transform allows it
	// (ConcurrentTransform; Augment does): a producer that keeps several
	// cores busy where one would be its consumers' bottleneck. 0 or 1:
	// one, the producer's own. A sample is transformed alike whatever the
	// split (its random source is its own). Local loaders take it too.
	Workers int

	// IndexKey, if set, adds a field of that key to every batch: int64, the
	// dataset index of each row.
	IndexKey string

	// Log receives the producer's failure (once, at ERROR, naming the file
	// at fault when one was truncated); nil discards it.
	Log *slog.Logger

	// Heartbeat is how long a consumer may stay silent before it is
	// dropped; 0 means 5s. Consumers send a heartbeat four times within it.
	Heartbeat time.Duration

	// MaxWait bounds how long the producer waits for the consumers to
	// release one ring slot; those still holding it then are dropped (a
	// consumer that never acks stalls nobody for longer). 0 means 1 minute.
	MaxWait time.Duration

	// GrantWait, for a producer process (ProducerRemote), bounds how long
	// the node waits for the process to fill a slot it was granted: a
	// process attached but silent (its data loader hung, the process
	// frozen) is detached then, and its consumers get ErrNoProducer as if
	// it had gone away, instead of waiting for it for ever. 0 means 1
	// minute. A dataset's producer ignores it.
	GrantWait time.Duration
}

// Defaults of the zero Config fields.
const (
	DefaultSlots     = 8
	DefaultHeartbeat = 5 * time.Second
	DefaultMaxWait   = time.Minute
	DefaultGrantWait = time.Minute
)

// DefaultConfig returns the configuration every zero field of a Config
// stands for: Config{}.WithDefaults(). Dataset, Dir and Batch have no
// default: Validate refuses it until they are set.
func DefaultConfig() Config { return Config{}.WithDefaults() }

// WithDefaults returns a copy of c with its zero fields set to their
// defaults: Slots 8, Window Slots/2 (and a negative Window 0: nobody joins
// an epoch begun), Heartbeat 5 s, MaxWait and GrantWait 1 minute, a Log
// that discards.
// It checks nothing (Validate). Apply it once: the 0 it makes of a
// negative Window would be Slots/2 the second time.
func (c Config) WithDefaults() Config {
	if c.Log == nil {
		c.Log = slog.New(slog.DiscardHandler)
	}
	if c.Slots == 0 {
		c.Slots = DefaultSlots
	}
	if c.Window == 0 {
		c.Window = c.Slots / 2
	}
	if c.Window < 0 {
		c.Window = 0
	}
	if c.Heartbeat == 0 {
		c.Heartbeat = DefaultHeartbeat
	}
	if c.MaxWait == 0 {
		c.MaxWait = DefaultMaxWait
	}
	if c.GrantWait == 0 {
		c.GrantWait = DefaultGrantWait
	}
	return c
}

// Validate reports whether c, with its zero fields at their defaults
// (WithDefaults), can make a producer: ErrConfig naming the field and what
// it wants. It is pure: NewProducer finds out whether the dataset and the
// folder are usable.
func (c Config) Validate() error {
	c = c.WithDefaults()
	switch {
	case c.Dir == "":
		return fmt.Errorf("%w: no ring folder (Dir)", ErrConfig)
	case c.Producer != "" && c.Producer != ProducerRemote:
		return fmt.Errorf("%w: producer %q: want %q or none", ErrConfig, c.Producer, ProducerRemote)
	case c.Producer == ProducerRemote && (c.Dataset != "" || c.Batch != 0 || c.Transform != nil || c.IndexKey != "" || c.Sequential || c.Seed != 0):
		return fmt.Errorf("%w: producer=remote takes its batches from the producer process: no dataset, batch, seed, sequential, index or transform", ErrConfig)
	case c.Producer == ProducerRemote:
		if c.Slots < 1 || c.Window > c.Slots || c.Heartbeat < 0 || c.MaxWait < 0 || c.GrantWait < 0 {
			// The dataset producer's checks of these, with a batch of 1
			// (the process's, unknown here) that passes.
			c.Producer, c.Batch = "", 1
			return c.Validate()
		}
		return nil
	case c.Batch <= 0:
		return fmt.Errorf("%w: batch size %d: want at least 1", ErrConfig, c.Batch)
	case c.Slots < 1:
		return fmt.Errorf("%w: %d slots: want at least 1", ErrConfig, c.Slots)
	case c.Window > c.Slots:
		return fmt.Errorf("%w: a window of %d batches is more than the ring's %d slots", ErrConfig, c.Window, c.Slots)
	case c.Heartbeat < 0 || c.MaxWait < 0 || c.GrantWait < 0:
		return fmt.Errorf("%w: negative heartbeat, max wait or grant wait", ErrConfig)
	case c.Workers < 0:
		return fmt.Errorf("%w: %d transform workers: want 0 or more", ErrConfig, c.Workers)
	case int64(c.Batch)*int64(c.Slots) > 1<<31:
		return fmt.Errorf("%w: a ring of %d × %d rows", ErrConfig, c.Slots, c.Batch)
	}
	return nil
}

// Setting is one key of a config's text form (Config.Set): its key, what
// it takes, and a line of help.
type Setting = service.Setting

// Settings returns the keys Set takes, in the order a list of them is
// applied: transform comes before the augment's settings (image-key, pad,
// flip, mean, std), which apply to transform=augment only.
func (Config) Settings() []Setting { return configKeys.Settings() }

// Set sets the field key names from its text, as the command line's
// --loader NAME,KEY=VALUE gives it (Settings lists the keys). A switch
// (sequential, flip) takes no value: Set(key, "") sets it. transform=augment
// makes Transform an *Augment, which image-key, pad, flip, mean and std
// then set; transform=none makes it nil. An unknown key, or a value the
// key does not take, is ErrConfig naming the key, the value and what it
// wants; c is then unchanged (an *Augment it holds is copied, not
// changed).
func (c *Config) Set(key, value string) error { return configKeys.Set(c, key, value, ErrConfig) }

// configKeys is Config's text form, a row a key.
var configKeys = service.Keys[Config]{
	{Setting: Setting{Key: "dataset", Value: "PREFIX", Help: "the TensorDict whose rows are the samples"},
		Set: func(c *Config, v string) error { return service.SetNonEmpty(&c.Dataset, v, "want a prefix") }},
	{Setting: Setting{Key: "batch", Value: "N", Help: "rows of a producer batch"},
		Set: func(c *Config, v string) error { return setCount(&c.Batch, v) }},
	{Setting: Setting{Key: "slots", Value: "N", Help: "batches the ring holds (default 8)"},
		Set: func(c *Config, v string) error { return setCount(&c.Slots, v) }},
	{Setting: Setting{Key: "window", Value: "N", Help: "batches into an epoch a consumer may join (default slots/2; -1 or 0: none)"},
		Set: func(c *Config, v string) error {
			n, err := strconv.Atoi(v)
			if err != nil || n < -1 {
				return errors.New("want a number of batches, or -1 (or 0) for none")
			}
			if n == 0 {
				n = -1
			}
			c.Window = n
			return nil
		}},
	{Setting: Setting{Key: "workers", Value: "N", Help: "goroutines the transform runs on, each on a share of a batch (default 1)"},
		Set: func(c *Config, v string) error { return setCount(&c.Workers, v) }},
	{Setting: Setting{Key: "seed", Value: "S", Help: "seeds the shuffle and the transform"},
		Set: func(c *Config, v string) error {
			n, err := strconv.ParseUint(v, 10, 64)
			if err != nil {
				return fmt.Errorf("want a whole number from 0 to %d", uint64(math.MaxUint64))
			}
			c.Seed = n
			return nil
		}},
	{Setting: Setting{Key: "sequential", Help: "serve the rows in dataset order, unshuffled"},
		Set: func(c *Config, _ string) error { c.Sequential = true; return nil }},
	{Setting: Setting{Key: "index", Value: "KEY", Help: "add each row's dataset index under KEY"},
		Set: func(c *Config, v string) error { return service.SetNonEmpty(&c.IndexKey, v, "want a key") }},
	{Setting: Setting{Key: "heartbeat", Value: "D", Help: "how long a consumer may stay silent (default 5s)"},
		Set: func(c *Config, v string) error { return service.SetPositive(&c.Heartbeat, v) }},
	{Setting: Setting{Key: "max-wait", Value: "D", Help: "how long the producer waits for a slot's release (default 1m)"},
		Set: func(c *Config, v string) error { return service.SetPositive(&c.MaxWait, v) }},
	{Setting: Setting{Key: "transform", Value: "augment|none", Help: "transform every sample once (default none)"},
		Set: func(c *Config, v string) error {
			switch v {
			case "augment":
				if _, ok := c.Transform.(*Augment); !ok {
					c.Transform = &Augment{}
				}
			case "none":
				c.Transform = nil
			default:
				return errors.New("want augment or none")
			}
			return nil
		}},
	{Setting: Setting{Key: "image-key", Value: "K", Help: "augment: the images' key, nested keys joined by / (default images)"},
		Set: func(c *Config, v string) error {
			return setAugment(c, "image-key", func(a *Augment) error { a.Key = strings.Split(v, "/"); return nil })
		}},
	{Setting: Setting{Key: "pad", Value: "P", Help: "augment: pixels of padding around a random crop"},
		Set: func(c *Config, v string) error {
			return setAugment(c, "pad", func(a *Augment) (err error) {
				if a.Pad, err = strconv.Atoi(v); err != nil || a.Pad < 0 {
					return errors.New("want a whole number, 0 or more")
				}
				return nil
			})
		}},
	{Setting: Setting{Key: "flip", Help: "augment: flip half the images horizontally"},
		Set: func(c *Config, _ string) error {
			return setAugment(c, "flip", func(a *Augment) error { a.Flip = true; return nil })
		}},
	{Setting: Setting{Key: "mean", Value: "M", Help: "augment: subtracted from the scaled pixels"},
		Set: func(c *Config, v string) error {
			return setAugment(c, "mean", func(a *Augment) error {
				x, err := strconv.ParseFloat(v, 32) // out of float32's range is an error (and ±Inf)
				if err != nil || math.IsInf(x, 0) || math.IsNaN(x) {
					return errors.New("want a finite number")
				}
				a.Mean = float32(x)
				return nil
			})
		}},
	{Setting: Setting{Key: "std", Value: "S", Help: "augment: divides the centred pixels (default 1)"},
		Set: func(c *Config, v string) error {
			return setAugment(c, "std", func(a *Augment) error {
				x, err := strconv.ParseFloat(v, 32)
				if err != nil || math.IsInf(x, 0) || !(x > 0) {
					return errors.New("want a positive finite number")
				}
				a.Std = float32(x)
				return nil
			})
		}},
	{Setting: Setting{Key: "grant-wait", Value: "D", Help: "producer=remote: how long the process may take to fill a granted slot before it is detached (default 1m)"},
		Set: func(c *Config, v string) error { return service.SetPositive(&c.GrantWait, v) }},
	{Setting: Setting{Key: "producer", Value: "remote", Help: "the batches come from a producer process that attaches (tensorwire.loader.Producer)"},
		Set: func(c *Config, v string) error {
			if v != ProducerRemote {
				return errors.New("want remote")
			}
			c.Producer = v
			return nil
		}},
}

// setCount sets *dst to v, a whole number of at least 1.
func setCount(dst *int, v string) error {
	n, err := strconv.Atoi(v)
	if err != nil || n < 1 {
		return errors.New("want a whole number, at least 1")
	}
	*dst = n
	return nil
}

// setAugment sets a copy of c's *Augment with set, and c's Transform to
// it; an error naming key when c's Transform is not an *Augment.
func setAugment(c *Config, key string, set func(*Augment) error) error {
	cur, ok := c.Transform.(*Augment)
	if !ok {
		return fmt.Errorf("%s applies to transform=augment only", key)
	}
	a := *cur
	if err := set(&a); err != nil {
		return err
	}
	c.Transform = &a
	return nil
}
