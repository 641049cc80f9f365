package replay

import (
	"errors"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/tensorwire/tensorwire/internal/progress"
	"github.com/tensorwire/tensorwire/internal/service"
	"github.com/tensorwire/tensorwire/replay/internal/selector"
	"github.com/tensorwire/tensorwire/tensordict"
)

// Config describes a buffer to Create. Only Capacity is required.
type Config struct {
	// Capacity is the number of transitions the storage holds.
	Capacity int

	// Schema is the fields of one transition: keys, dtypes and shapes
	// without the batch dimension (a batch of n transitions has the shapes
	// [n, shape...]; the storage, [Capacity, shape...]). Nil means the
	// first batch decides.
	Schema tensordict.RowSchema

	// Sampler chooses the transitions a sample returns; the zero value is
	// Uniform().
	Sampler Sampler

	// Writer chooses the slots new transitions go to; the zero value is
	// RoundRobin().
	Writer Writer

	// Limit is the rate limiter; the zero value lets sampling start once one
	// transition is in and never blocks inserts.
	Limit RateLimit

	// MaxTimesSampled, when positive, takes a transition out of sampling
	// once samples have returned it that many times (Reverb's
	// max_times_sampled): with 1, every transition is returned once. The
	// counts are kept in memory; a transition that reached it stays out
	// after a restart, the others start counting again. 0: no limit.
	MaxTimesSampled int

	// TrajKey, when set, names the field of the schema that holds each
	// transition's trajectory (episode) key, an int64 (torchrl's
	// traj_key): the buffer then knows its episodes and samples slices of
	// them (SampleSlices). Keys must be unique per episode. Fixed when the
	// buffer is created.
	TrajKey []string

	// Lease is how long a reservation may stay uncommitted before it expires
	// and its slots go back to the writer; default 30 s. A writer that has
	// not committed by then (it died, or stalled) gets ErrExpired.
	Lease time.Duration
}

// Sampler is how a buffer chooses the transitions a sample returns. Build
// one with Uniform, WithoutReplacement, Prioritized or FIFO, or from its
// text with ParseSampler; the zero value is Uniform.
type Sampler struct{ spec selector.Spec }

// Uniform samples committed transitions uniformly, with replacement.
func Uniform() Sampler { return Sampler{selector.Spec{Kind: selector.KindUniform}} }

// WithoutReplacement samples in epochs: every committed transition once per
// epoch, in random order, before any is sampled again. Transitions committed
// during an epoch join the next one. Within one batch no transition repeats
// when the buffer holds at least as many as the batch.
func WithoutReplacement() Sampler {
	return Sampler{selector.Spec{Kind: selector.KindWithoutReplacement}}
}

// Prioritized samples transition i with probability (p_i+eps)^alpha / sum_j
// (p_j+eps)^alpha, where p_i is its priority (UpdatePriority; new
// transitions get the largest priority seen so far, 1 at first), and gives
// it the importance weight (N P(i))^-beta normalised so the largest is 1
// (Schaul et al., as torchrl's PrioritizedSampler). eps is 1e-8.
func Prioritized(alpha, beta float64) Sampler {
	return Sampler{selector.Spec{Kind: selector.KindPrioritized, Alpha: alpha, Beta: beta, Eps: 1e-8}}
}

// FIFO makes the buffer a queue: a sample returns the oldest committed
// transitions and removes them, so each is sampled once (Reverb's Queue).
// A sample waits until the buffer holds the whole batch.
func FIFO() Sampler { return Sampler{selector.Spec{Kind: selector.KindFIFO}} }

// ParseSampler returns the sampler text names, as String writes it: a
// kind, alone or with parameters in parentheses,
// "prioritized(alpha=0.6, beta=0.4)". The kinds are those of SamplerKinds;
// Prioritized's parameters are alpha, beta and eps, and those left out take
// their defaults (0.6, 0.4 and 1e-8). An unknown kind, a parameter the
// kind does not take, or a value out of range is ErrConfig.
//
// The command line's sampler= and replay.json's sampler kind are read by
// the same rules, and the node describes its buffers' samplers on the wire
// in this text (Stats.Sampler).
func ParseSampler(text string) (Sampler, error) {
	spec, err := selector.ParseSpec(text)
	if err != nil {
		return Sampler{}, fmt.Errorf("%w: sampler: %w", ErrConfig, err)
	}
	return Sampler{spec}, nil
}

// SamplerKinds returns the kinds of sampler ParseSampler knows:
// "uniform", "without_replacement", "prioritized", "fifo", "lifo",
// "max_heap" and "min_heap".
func SamplerKinds() []string {
	var out []string
	for _, k := range selector.Kinds() {
		out = append(out, string(k))
	}
	return out
}

// String names the sampler and its parameters, as ParseSampler reads
// them: "uniform", "prioritized(alpha=0.6, beta=0.4)".
func (s Sampler) String() string { return s.normal().String() }

// MarshalText returns String's text.
func (s Sampler) MarshalText() ([]byte, error) {
	if err := s.normal().Validate(); err != nil {
		return nil, fmt.Errorf("%w: sampler: %w", ErrConfig, err)
	}
	return []byte(s.String()), nil
}

// UnmarshalText sets s to the sampler text names (ParseSampler).
func (s *Sampler) UnmarshalText(text []byte) error {
	p, err := ParseSampler(string(text))
	if err != nil {
		return err
	}
	*s = p
	return nil
}

// Kind names the sampler's kind, one of SamplerKinds.
func (s Sampler) Kind() string { return string(s.normal().Kind) }

// Params returns the parameters the sampler's kind takes, by name, with
// their values: alpha, beta and eps for Prioritized; none for the other
// kinds.
func (s Sampler) Params() map[string]float64 { return s.normal().Params() }

// WithParam returns s with the parameter called name set to v, the others
// as they are; ErrConfig if s's kind takes no such parameter or v is out of
// range.
func (s Sampler) WithParam(name string, v float64) (Sampler, error) {
	spec, err := s.normal().With(name, v)
	if err != nil {
		return s, fmt.Errorf("%w: sampler: %w", ErrConfig, err)
	}
	return Sampler{spec}, nil
}

func (s Sampler) normal() selector.Spec {
	if s.spec.Kind == "" {
		return selector.Spec{Kind: selector.KindUniform}
	}
	return s.spec
}

// Writer is how a buffer chooses the slots new transitions go to. Build one
// with RoundRobin or TopK, or from its text with ParseWriter; the zero value
// is RoundRobin.
type Writer struct{ spec writerSpec }

// writerKind is a kind of writer, as replay.json and the wire spell it.
type writerKind string

// The kinds of writer.
const (
	writerRoundRobin writerKind = "round_robin"
	writerTopK       writerKind = "top_k"
)

// writerSpec is a Writer as replay.json and the wire carry it: an object
// with its kind and, for top-k, the ranking key.
type writerSpec struct {
	Kind writerKind `json:"kind"`
	Key  []string   `json:"key,omitempty"` // top_k: the ranking key
}

// RoundRobin writes transitions into slots in turn, overwriting the oldest
// once the buffer is full (torchrl's RoundRobinWriter).
func RoundRobin() Writer { return Writer{writerSpec{Kind: writerRoundRobin}} }

// TopK keeps the Capacity transitions with the largest value at key, a
// tensor with one element per transition (torchrl's
// TensorDictMaxValueWriter): once the buffer is full a new transition
// replaces the smallest only if its value is larger, and is dropped
// otherwise (its index is -1).
func TopK(key ...string) Writer {
	return Writer{writerSpec{Kind: writerTopK, Key: slices.Clone(key)}}
}

// ParseWriter returns the writer text names, as String writes it:
// "round_robin", or "top_k(key=K)" with K the ranking key, nested keys
// joined by "/" ("top_k(key=next/reward)"). An unknown kind, or a top-k
// writer without a key, is ErrConfig.
func ParseWriter(text string) (Writer, error) {
	name, args, hasArgs := strings.Cut(text, "(")
	w := Writer{writerSpec{Kind: writerKind(name)}}
	if hasArgs {
		key, prefixed := strings.CutPrefix(args, "key=")
		key, closed := strings.CutSuffix(key, ")")
		if !prefixed || !closed || w.spec.Kind != writerTopK {
			return Writer{}, fmt.Errorf("%w: writer %q: want round_robin or top_k(key=K)", ErrConfig, text)
		}
		w.spec.Key = strings.Split(key, "/")
	}
	if err := w.spec.validate(); err != nil {
		return Writer{}, err
	}
	return w, nil
}

// validate checks a writer's kind and key.
func (w writerSpec) validate() error {
	switch w.Kind {
	case writerRoundRobin:
		if len(w.Key) != 0 {
			return fmt.Errorf("%w: the round-robin writer takes no key (%v given)", ErrConfig, w.Key)
		}
	case writerTopK:
		if len(w.Key) == 0 || slices.Contains(w.Key, "") {
			return fmt.Errorf("%w: top-k writer without a key, or with an empty one (%q)", ErrConfig, w.Key)
		}
	default:
		return fmt.Errorf("%w: writer %q; want %s or %s", ErrConfig, w.Kind, writerRoundRobin, writerTopK)
	}
	return nil
}

// String names the writer, as ParseWriter reads it.
func (w Writer) String() string {
	n := w.normal()
	if n.Kind == writerTopK {
		return fmt.Sprintf("%s(key=%s)", n.Kind, strings.Join(n.Key, "/"))
	}
	return string(n.Kind)
}

// MarshalText returns String's text.
func (w Writer) MarshalText() ([]byte, error) {
	if err := w.normal().validate(); err != nil {
		return nil, err
	}
	return []byte(w.String()), nil
}

// UnmarshalText sets w to the writer text names (ParseWriter).
func (w *Writer) UnmarshalText(text []byte) error {
	p, err := ParseWriter(string(text))
	if err != nil {
		return err
	}
	*w = p
	return nil
}

// Kind names the writer's kind: "round_robin" or "top_k".
func (w Writer) Kind() string { return string(w.normal().Kind) }

// Key returns a top-k writer's ranking key; nil for round robin.
func (w Writer) Key() []string { return slices.Clone(w.normal().Key) }

// ranks reports whether the writer needs each transition's ranking key.
func (w Writer) ranks() bool { return w.normal().Kind == writerTopK }

// equal reports whether two writers are the same kind with the same key.
func (w Writer) equal(o Writer) bool {
	a, b := w.normal(), o.normal()
	return a.Kind == b.Kind && slices.Equal(a.Key, b.Key)
}

// footprint returns about how many bytes of memory the writer of a buffer
// of capacity slots holds.
func (w Writer) footprint(capacity int) uint64 {
	if w.normal().Kind != writerTopK {
		return 0
	}
	// Its free list and its heap of (slot, key), and the free list Create
	// or Open builds.
	const perSlot = 32
	if uint64(capacity) > math.MaxUint64/perSlot {
		return math.MaxUint64
	}
	return perSlot * uint64(capacity)
}

func (w Writer) normal() writerSpec {
	if w.spec.Kind == "" && w.spec.Key == nil {
		return writerSpec{Kind: writerRoundRobin}
	}
	return w.spec
}

// RateLimit is a rate limiter as Reverb's SampleToInsertRatio: sampling waits
// until the buffer holds MinSize transitions; and when SamplesPerInsert is
// set, inserts and samples wait so that the number of transitions sampled
// stays within ErrorBuffer of SamplesPerInsert times the number inserted
// (counting from MinSize). Waiting calls return when their context ends.
//
// As in Reverb, inserts and samples can block each other for good when the
// slack is smaller than one insert batch and one sample batch together: keep
// 2*ErrorBuffer >= SamplesPerInsert*(insert batch) + (sample batch).
type RateLimit struct {
	MinSize          int     `json:"min_size"`                     // default 1
	SamplesPerInsert float64 `json:"samples_per_insert,omitempty"` // 0: no ratio
	ErrorBuffer      float64 `json:"error_buffer,omitempty"`       // slack around the ratio, in samples
}

// cloneConfig returns a copy of c that shares no slice with it.
func cloneConfig(c Config) Config {
	c.Schema = c.Schema.Clone()
	c.Writer.spec.Key = slices.Clone(c.Writer.spec.Key)
	c.TrajKey = slices.Clone(c.TrajKey)
	return c
}

// Defaults of the zero Config fields.
const (
	defaultLease   = 30 * time.Second
	defaultMinSize = 1
)

// DefaultConfig returns the configuration every zero field of a Config
// stands for: Config{}.WithDefaults(). Its Capacity is 0: a buffer's
// capacity has no default, and Validate refuses it until it is set.
func DefaultConfig() Config { return Config{}.WithDefaults() }

// WithDefaults returns a copy of c with its zero fields set to their
// defaults: Lease 30 s, Limit.MinSize 1 (and a negative one), the Uniform
// sampler and the RoundRobin writer. It checks nothing (Validate).
func (c Config) WithDefaults() Config {
	if c.Lease == 0 {
		c.Lease = defaultLease
	}
	if c.Limit.MinSize <= 0 {
		c.Limit.MinSize = defaultMinSize
	}
	c.Sampler = Sampler{c.Sampler.normal()}
	c.Writer = Writer{c.Writer.normal()}
	return c
}

// Validate reports whether c, with its zero fields at their defaults
// (WithDefaults), can make a buffer: ErrConfig naming the field and what
// it wants. It is pure: Create and Open also check that the memory a
// buffer of c's capacity needs is there, and the disk.
func (c Config) Validate() error {
	c = c.WithDefaults()
	if c.Capacity <= 0 {
		return fmt.Errorf("%w: capacity %d; want at least 1", ErrConfig, c.Capacity)
	}
	if c.Capacity > maxCapacity {
		return fmt.Errorf("%w: capacity %d; at most %d", ErrConfig, c.Capacity, maxCapacity)
	}
	if c.Lease < 0 {
		return fmt.Errorf("%w: lease %v; want a positive duration", ErrConfig, c.Lease)
	}
	if c.Limit.MinSize > c.Capacity {
		return fmt.Errorf("%w: min size %d is larger than the capacity %d: sampling could never start",
			ErrConfig, c.Limit.MinSize, c.Capacity)
	}
	if l := c.Limit; l.SamplesPerInsert < 0 || l.ErrorBuffer < 0 || math.IsNaN(l.SamplesPerInsert) ||
		math.IsNaN(l.ErrorBuffer) || math.IsInf(l.SamplesPerInsert, 0) {
		return fmt.Errorf("%w: rate limit %+v", ErrConfig, l)
	}
	if c.MaxTimesSampled < 0 || c.MaxTimesSampled > math.MaxInt32 {
		return fmt.Errorf("%w: max times sampled %d; want 0 (no limit) or more", ErrConfig, c.MaxTimesSampled)
	}
	if err := c.Sampler.spec.Validate(); err != nil {
		return fmt.Errorf("%w: %w", ErrConfig, err)
	}
	if err := c.Writer.spec.validate(); err != nil {
		return err
	}
	if slices.Contains(c.TrajKey, "") || (c.TrajKey != nil && len(c.TrajKey) == 0) {
		return fmt.Errorf("%w: trajectory key %q", ErrConfig, c.TrajKey)
	}
	if c.Schema != nil {
		if err := c.Schema.Validate(); err != nil {
			return fmt.Errorf("%w: %w", ErrConfig, err)
		}
		if c.TrajKey != nil {
			if err := checkTrajKey(c.Schema, c.TrajKey); err != nil {
				return fmt.Errorf("%w: %w", ErrConfig, err)
			}
		}
		if _, err := c.Schema.NumBytes(c.Capacity); err != nil {
			return fmt.Errorf("%w: the storage of %d transitions: %w", ErrConfig, c.Capacity, err)
		}
	}
	return nil
}

// validate sets c's defaults in place and checks it: Validate, and that
// the memory a buffer of its capacity needs (its sampler and writer) does
// not exceed this machine's. It allocates nothing and touches no file.
func (c *Config) validate() error {
	*c = c.WithDefaults()
	if err := c.Validate(); err != nil {
		return err
	}
	if need, have := c.memory(), memoryLimit(); need > have {
		return fmt.Errorf("%w: capacity %d needs about %s of memory for the %s sampler and the %s writer; this machine has %s",
			ErrConfig, c.Capacity, progress.Bytes(float64(need)), c.Sampler.spec.Kind, c.Writer.spec.Kind, progress.Bytes(float64(have)))
	}
	return nil
}

// maxCapacity bounds a buffer's capacity so that its slot table's size
// cannot overflow; memory and disk bound it much sooner.
const maxCapacity = math.MaxInt64 / (slotFields * 8)

// memory returns about how many bytes of memory a buffer of c holds for
// its slots: its sampler's and writer's structures (the slot table and the
// storage are mapped files, not counted). c is normalised.
func (c *Config) memory() uint64 {
	need := selector.Footprint(c.Sampler.spec, c.Capacity)
	w := c.Writer.footprint(c.Capacity)
	if c.MaxTimesSampled > 0 {
		w += 4 * uint64(c.Capacity) // the counts; capacity is bounded by maxCapacity
	}
	if c.TrajKey != nil {
		w += 40 * uint64(c.Capacity) // the episode index: a pointer and a step a slot, and episodes
	}
	if need > math.MaxUint64-w {
		return math.MaxUint64
	}
	return need + w
}

// memoryLimit returns the memory this process may use: the machine's, or
// its cgroup's limit when lower.
func memoryLimit() uint64 {
	limit := uint64(math.MaxUint64)
	if ram, ok := totalMemory(); ok {
		limit = ram
	}
	for _, f := range []string{"/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes"} {
		data, err := os.ReadFile(f)
		if err != nil {
			continue
		}
		if n, err := strconv.ParseUint(strings.TrimSpace(string(data)), 10, 64); err == nil && n > 0 {
			limit = min(limit, n)
		}
	}
	return limit
}

// checkDisk checks that the filesystem prefix would be created on has room
// for a buffer of cfg: its slot table, and its storage when the schema is
// known. The error matches both ErrConfig and ENOSPC.
func checkDisk(prefix string, cfg Config) error {
	dir := prefix
	for {
		if _, err := os.Stat(dir); err == nil {
			break
		} else if !errors.Is(err, os.ErrNotExist) {
			return nil // Create's MkdirAll will say what is wrong
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return nil
		}
		dir = parent
	}
	free, ok := freeDisk(dir)
	if !ok {
		return nil // not knowing is no reason to refuse; Create finds out
	}
	slots := uint64(cfg.Capacity) * slotFields * 8
	var storage uint64
	if cfg.Schema != nil {
		n, _ := cfg.Schema.NumBytes(cfg.Capacity) // validated
		storage = uint64(n)
	}
	if need := slots + storage; need > free {
		return fmt.Errorf("%w: %s: a buffer of capacity %d needs %s on disk (slot table %s, storage %s); %s has %s free: %w",
			ErrConfig, prefix, cfg.Capacity, progress.Bytes(float64(need)), progress.Bytes(float64(slots)),
			storageWords(cfg.Schema, storage), dir, progress.Bytes(float64(free)), syscall.ENOSPC)
	}
	return nil
}

func storageWords(schema tensordict.RowSchema, n uint64) string {
	if schema == nil {
		return "made at the first batch"
	}
	return progress.Bytes(float64(n))
}

// Setting is one key of a config's text form (Config.Set): its key, what
// it takes, and a line of help.
type Setting = service.Setting

// Settings returns the keys Set takes, in the order a list of them is
// applied: capacity, sampler, the parameters of every kind of sampler
// (alpha, beta, eps), min-size and lease, then Reverb's table controls:
// samples-per-insert, error-buffer, max-times-sampled, writer and key;
// and traj-key.
func (Config) Settings() []Setting { return configKeys.Settings() }

// Set sets the field key names from its text, as the command line's
// --buffer NAME,KEY=VALUE gives it: capacity=N, min-size=N, lease=D (a
// time.ParseDuration), sampler=KIND (the kind alone: its parameters keep
// their values when the kind is the sampler's already, and take the
// kind's defaults otherwise), and a sampler parameter (alpha=X), which
// the sampler set must take. An unknown key, or a value the key does not
// take, is ErrConfig naming the key, the value and what it wants; c is
// then unchanged.
func (c *Config) Set(key, value string) error { return configKeys.Set(c, key, value, ErrConfig) }

// configKeys is Config's text form, a row a key.
var configKeys = func() service.Keys[Config] {
	keys := service.Keys[Config]{
		{Setting: Setting{Key: "capacity", Value: "N", Help: "transitions the buffer holds; fixed when it is created"},
			Set: func(c *Config, v string) error { return service.SetAtLeast(&c.Capacity, v, 1) }},
		{Setting: Setting{Key: "sampler", Value: strings.Join(SamplerKinds(), "|"), Help: "how samples are chosen (default uniform); its kind is fixed when the buffer is created"},
			Set: func(c *Config, v string) error {
				if strings.ContainsAny(v, "()") {
					return errors.New("the kind alone; give its parameters as settings of their own (alpha=0.7)")
				}
				s, err := ParseSampler(v)
				if err == nil && s.Kind() != c.Sampler.Kind() {
					c.Sampler = s
				}
				return err
			}},
	}
	var params []string
	for _, kind := range selector.Kinds() {
		for _, p := range kind.Params() {
			if slices.Contains(params, p) {
				continue
			}
			params = append(params, p)
			keys = append(keys, service.Key[Config]{
				Setting: Setting{Key: p, Value: strings.ToUpper(p[:1]), Help: "the " + string(kind) + " sampler's " + p},
				Set: func(c *Config, v string) error {
					x, err := strconv.ParseFloat(v, 64)
					if err != nil {
						return errors.New("want a number")
					}
					s, err := c.Sampler.WithParam(p, x)
					if err == nil {
						c.Sampler = s
					}
					return err
				}})
		}
	}
	keys = append(keys,
		service.Key[Config]{Setting: Setting{Key: "min-size", Value: "N", Help: "transitions the buffer holds before sampling starts (default 1)"},
			Set: func(c *Config, v string) error { return service.SetAtLeast(&c.Limit.MinSize, v, 1) }},
		service.Key[Config]{Setting: Setting{Key: "lease", Value: "D", Help: "how long a reservation may stay uncommitted (default 30s)"},
			Set: func(c *Config, v string) error { return service.SetPositive(&c.Lease, v) }},
	)
	return append(append(keys, controlKeys...), trajKey)
}()
