package store

import (
	"cmp"
	"errors"
	"log/slog"
	"strconv"
	"strings"
	"time"

	"github.com/tensorwire/tensorwire/internal/service"
)

// Options configure a store (Open). The zero value takes every default.
type Options struct {
	// MaxValueBytes bounds one value's tensor bytes (a Put, an Append, a
	// Publish); larger ones are refused with ErrTooLarge. Default 1 GiB.
	MaxValueBytes int64

	// InlineBytes: values with fewer tensor bytes are kept in the log and
	// in the node's memory; others are written as prefixes under values/,
	// which clients sharing the filesystem map instead of receiving their
	// bytes. Default 1 MiB, at most 64 MiB.
	InlineBytes int64

	// NoSync acknowledges operations once the log's write(2) returns,
	// without fsync: they survive the node's process dying (kill -9) but
	// not the machine crashing. The default fsyncs before acknowledging.
	NoSync bool

	// GetTimeout is how long the items a remote Get returned wait for its
	// acknowledgement before other Gets may take them again. Default 30 s.
	GetTimeout time.Duration

	// LeaseTTL is how long a reader's lease on a parameter version lasts
	// unless renewed (clients renew at a third of it). Default 10 s.
	LeaseTTL time.Duration

	// History is how many events the store keeps at least for watchers to
	// resume from; one older than those gets ErrCompacted. Default 100,000.
	History int

	// CompactBytes: the log is rewritten as the state it describes once it
	// is this long and more than twice that state. Default 64 MiB.
	CompactBytes int64

	// Repair lets Open drop what the log and the folder disagree on, which
	// Open otherwise only reports (at ERROR and WARN, Logger): items and
	// parameter versions whose folder under values/ is missing (lost items
	// are removed from their bins by a get record; a lost latest version
	// stays until a newer one is published), and folders under values/
	// that no record names (deleted). On a folder whose store.log is
	// missing it starts a new store (a new ID), dropping every value.
	// Each thing dropped is logged at WARN.
	Repair bool

	// TrashGrace is how long a deleted value's folder (a Get's or a
	// Delete's item, a parameter version no lease holds any more) stays in
	// trash/ before it is unlinked: readers that still map it keep reading
	// files that are there. On one machine an unlinked mapping stays
	// readable anyway; a reader on another machine sharing the folder over
	// NFS has its own page cache and faults (SIGBUS) on a deleted file, so
	// this is how long it has to finish with a parameter version it mapped
	// once its lease is gone (a Client there copies Get's and Peek's items
	// instead of mapping them). Default 1 minute.
	TrashGrace time.Duration

	// Logger receives what the store reports by itself: that it stopped
	// (its log failed or was removed, at ERROR, once). Default
	// slog.Default().
	Logger *slog.Logger
}

// Defaults of the zero Options fields.
const (
	defaultMaxValueBytes = 1 << 30
	defaultInlineBytes   = 1 << 20
	maxInlineBytes       = 64 << 20
	defaultGetTimeout    = 30 * time.Second
	defaultLeaseTTL      = 10 * time.Second
	defaultHistory       = 100_000
	defaultCompactBytes  = 64 << 20
	defaultTrashGrace    = time.Minute
)

// DefaultOptions returns the options every zero field of Options stands
// for: Options{}.WithDefaults().
func DefaultOptions() Options { return Options{}.WithDefaults() }

// WithDefaults returns a copy of o with its zero fields set to their
// defaults (each field's doc says which). It checks nothing (Validate).
func (o Options) WithDefaults() Options {
	o.MaxValueBytes = cmp.Or(o.MaxValueBytes, defaultMaxValueBytes)
	o.InlineBytes = cmp.Or(o.InlineBytes, defaultInlineBytes)
	o.GetTimeout = cmp.Or(o.GetTimeout, defaultGetTimeout)
	o.LeaseTTL = cmp.Or(o.LeaseTTL, defaultLeaseTTL)
	o.History = cmp.Or(o.History, defaultHistory)
	o.CompactBytes = cmp.Or(o.CompactBytes, defaultCompactBytes)
	o.TrashGrace = cmp.Or(o.TrashGrace, defaultTrashGrace)
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	return o
}

// Validate reports whether o, with its zero fields at their defaults
// (WithDefaults), can open a store: ErrConfig for a negative field, or
// InlineBytes over 64 MiB. It is pure: it touches no file.
func (o Options) Validate() error {
	if o.MaxValueBytes < 0 || o.InlineBytes < 0 || o.GetTimeout < 0 || o.LeaseTTL < 0 || o.History < 0 || o.CompactBytes < 0 || o.TrashGrace < 0 {
		o.Logger = nil // printed below: the options given, not a pointer
		return errorf(ErrConfig, "a negative option in %+v", o)
	}
	if o = o.WithDefaults(); o.InlineBytes > maxInlineBytes {
		return errorf(ErrConfig, "InlineBytes %d; at most %d", o.InlineBytes, maxInlineBytes)
	}
	return nil
}

// Setting is one key of the options' text form (Options.Set): its key,
// what it takes, and a line of help.
type Setting = service.Setting

// Settings returns the keys Set takes, in order: max-value, inline, sync,
// lease, get-timeout, history, trash-grace and repair.
func (Options) Settings() []Setting { return optionKeys.Settings() }

// Set sets the field key names from its text, as the command line's
// --store NAME,KEY=VALUE gives it: max-value=SIZE (MaxValueBytes),
// inline=SIZE (InlineBytes), a SIZE in bytes with an optional unit B, KiB,
// MiB, GiB (or K, M, G); sync=always|none (NoSync); lease=D (LeaseTTL),
// get-timeout=D, trash-grace=D, positive durations; history=N; and
// repair=drop (Repair). An unknown key, or a value the key does not take,
// is ErrConfig naming the key, the value and what it wants; o is then
// unchanged.
func (o *Options) Set(key, value string) error { return optionKeys.Set(o, key, value, ErrConfig) }

// optionKeys is Options' text form, a row a key.
var optionKeys = service.Keys[Options]{
	{Setting: Setting{Key: "max-value", Value: "SIZE", Help: "the largest value's tensor bytes (default 1GiB)"},
		Set: func(o *Options, v string) error { return setSize(&o.MaxValueBytes, v) }},
	{Setting: Setting{Key: "inline", Value: "SIZE", Help: "values smaller than this are kept in the log (default 1MiB, at most 64MiB)"},
		Set: func(o *Options, v string) error { return setSize(&o.InlineBytes, v) }},
	{Setting: Setting{Key: "sync", Value: "always|none", Help: "fsync before acknowledging (always, the default) or not"},
		Set: func(o *Options, v string) error {
			switch v {
			case "always":
				o.NoSync = false
			case "none":
				o.NoSync = true
			default:
				return errors.New("want always or none")
			}
			return nil
		}},
	{Setting: Setting{Key: "lease", Value: "D", Help: "how long a reader's lease on a parameter version lasts (default 10s)"},
		Set: func(o *Options, v string) error { return service.SetPositive(&o.LeaseTTL, v) }},
	{Setting: Setting{Key: "get-timeout", Value: "D", Help: "how long a Get's items wait for its acknowledgement (default 30s)"},
		Set: func(o *Options, v string) error { return service.SetPositive(&o.GetTimeout, v) }},
	{Setting: Setting{Key: "history", Value: "N", Help: "events kept for watchers to resume from (default 100000)"},
		Set: func(o *Options, v string) error {
			return service.SetAtLeast(&o.History, v, 1)
		}},
	{Setting: Setting{Key: "trash-grace", Value: "D", Help: "how long a deleted value's folder stays in trash/ (default 1m)"},
		Set: func(o *Options, v string) error { return service.SetPositive(&o.TrashGrace, v) }},
	{Setting: Setting{Key: "repair", Value: "drop", Help: "drop what the log and the folder disagree on (without it, Open only reports it)"},
		Set: func(o *Options, v string) error {
			// Open reports what it would drop either way; this drops it.
			if v != "drop" {
				return errors.New("want drop (without repair, the node only reports what it would drop)")
			}
			o.Repair = true
			return nil
		}},
}

// setSize sets *dst to v, a size in bytes: a number with an optional unit
// B, KiB, MiB, GiB (or K, M, G, meaning the same).
func setSize(dst *int64, v string) error {
	units := []struct {
		suffix string
		mult   int64
	}{{"GiB", 1 << 30}, {"MiB", 1 << 20}, {"KiB", 1 << 10}, {"G", 1 << 30}, {"M", 1 << 20}, {"K", 1 << 10}, {"B", 1}}
	s, mult := v, int64(1)
	for _, u := range units {
		if n, ok := strings.CutSuffix(s, u.suffix); ok {
			s, mult = n, u.mult
			break
		}
	}
	n, err := strconv.ParseInt(s, 10, 64)
	if err != nil || n <= 0 || n > (1<<62)/mult {
		return errors.New("want a size such as 1048576, 512KiB or 64MiB")
	}
	*dst = n * mult
	return nil
}
