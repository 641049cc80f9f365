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

	// Lease is how long a reservation may stay uncommitted before it expires
	// and its slots go back to the writer; default 30 s. A writer that has
	// not committed by then (it died, or stalled) gets ErrExpired.
	Lease time.Duration
}

// Sampler is how a buffer chooses the transitions a sample returns. Build
// one with Uniform, WithoutReplacement, Prioritized or FIFO; the zero value
// is Uniform.
type Sampler struct{ spec selector.Spec }

// Uniform samples committed transitions uniformly, with replacement.
func Uniform() Sampler { return Sampler{selector.Spec{Kind: "uniform"}} }

// WithoutReplacement samples in epochs: every committed transition once per
// epoch, in random order, before any is sampled again. Transitions committed
// during an epoch join the next one. Within one batch no transition repeats
// when the buffer holds at least as many as the batch.
func WithoutReplacement() Sampler { return Sampler{selector.Spec{Kind: "without_replacement"}} }

// Prioritized samples transition i with probability (p_i+eps)^alpha / sum_j
// (p_j+eps)^alpha, where p_i is its priority (UpdatePriority; new
// transitions get the largest priority seen so far, 1 at first), and gives
// it the importance weight (N P(i))^-beta normalised so the largest is 1
// (Schaul et al., as torchrl's PrioritizedSampler). eps is 1e-8 if zero.
func Prioritized(alpha, beta float64) Sampler {
	return Sampler{selector.Spec{Kind: "prioritized", Alpha: alpha, Beta: beta, Eps: 1e-8}}
}

// FIFO makes the buffer a queue: a sample returns the oldest committed
// transitions and removes them, so each is sampled once (Reverb's Queue).
// A sample waits until the buffer holds the whole batch.
func FIFO() Sampler { return Sampler{selector.Spec{Kind: "fifo"}} }

// String names the sampler and its parameters.
func (s Sampler) String() string {
	sp := s.normal()
	if sp.Kind == "prioritized" {
		return fmt.Sprintf("prioritized(alpha=%g, beta=%g)", sp.Alpha, sp.Beta)
	}
	return sp.Kind
}

// Kind names the sampler's kind: "uniform", "without_replacement",
// "prioritized" or "fifo".
func (s Sampler) Kind() string { return s.normal().Kind }

// Params returns a Prioritized sampler's alpha and beta; 0 and 0 for the
// other kinds.
func (s Sampler) Params() (alpha, beta float64) {
	sp := s.normal()
	return sp.Alpha, sp.Beta
}

func (s Sampler) normal() selector.Spec {
	if s.spec.Kind == "" {
		return selector.Spec{Kind: "uniform"}
	}
	return s.spec
}

// Writer is how a buffer chooses the slots new transitions go to. Build one
// with RoundRobin or TopK; the zero value is RoundRobin.
type Writer struct {
	Kind string   `json:"kind"`          // "round_robin" or "top_k"
	Key  []string `json:"key,omitempty"` // top_k: the ranking key
}

// RoundRobin writes transitions into slots in turn, overwriting the oldest
// once the buffer is full (torchrl's RoundRobinWriter).
func RoundRobin() Writer { return Writer{Kind: "round_robin"} }

// TopK keeps the Capacity transitions with the largest value at key, a
// tensor with one element per transition (torchrl's
// TensorDictMaxValueWriter): once the buffer is full a new transition
// replaces the smallest only if its value is larger, and is dropped
// otherwise (its index is -1).
func TopK(key ...string) Writer { return Writer{Kind: "top_k", Key: slices.Clone(key)} }

func (w Writer) normal() Writer {
	if w.Kind == "" {
		return RoundRobin()
	}
	return w
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
	c.Writer.Key = slices.Clone(c.Writer.Key)
	return c
}

// validate normalises c in place and checks it: its values, and that the
// memory a buffer of its capacity needs (its sampler and writer) does not
// exceed this machine's. It allocates nothing and touches no file.
func (c *Config) validate() error {
	if c.Capacity <= 0 {
		return fmt.Errorf("%w: capacity %d; want at least 1", ErrConfig, c.Capacity)
	}
	if c.Capacity > maxCapacity {
		return fmt.Errorf("%w: capacity %d; at most %d", ErrConfig, c.Capacity, maxCapacity)
	}
	if c.Lease == 0 {
		c.Lease = 30 * time.Second
	}
	if c.Lease < 0 {
		return fmt.Errorf("%w: lease %v; want a positive duration", ErrConfig, c.Lease)
	}
	if c.Limit.MinSize <= 0 {
		c.Limit.MinSize = 1
	}
	if c.Limit.MinSize > c.Capacity {
		return fmt.Errorf("%w: min size %d is larger than the capacity %d: sampling could never start",
			ErrConfig, c.Limit.MinSize, c.Capacity)
	}
	if l := c.Limit; l.SamplesPerInsert < 0 || l.ErrorBuffer < 0 || math.IsNaN(l.SamplesPerInsert) ||
		math.IsNaN(l.ErrorBuffer) || math.IsInf(l.SamplesPerInsert, 0) {
		return fmt.Errorf("%w: rate limit %+v", ErrConfig, l)
	}
	c.Sampler = Sampler{c.Sampler.normal()}
	if err := c.Sampler.spec.Validate(); err != nil {
		return fmt.Errorf("%w: %w", ErrConfig, err)
	}
	c.Writer = c.Writer.normal()
	switch c.Writer.Kind {
	case "round_robin":
	case "top_k":
		if len(c.Writer.Key) == 0 {
			return fmt.Errorf("%w: top-k writer without a key", ErrConfig)
		}
	default:
		return fmt.Errorf("%w: writer %q", ErrConfig, c.Writer.Kind)
	}
	if c.Schema != nil {
		if err := c.Schema.Validate(); err != nil {
			return fmt.Errorf("%w: %w", ErrConfig, err)
		}
		if _, err := c.Schema.NumBytes(c.Capacity); err != nil {
			return fmt.Errorf("%w: the storage of %d transitions: %w", ErrConfig, c.Capacity, err)
		}
	}
	if need, have := c.memory(), memoryLimit(); need > have {
		return fmt.Errorf("%w: capacity %d needs about %s of memory for the %s sampler and the %s writer; this machine has %s",
			ErrConfig, c.Capacity, progress.Bytes(float64(need)), c.Sampler.spec.Kind, c.Writer.Kind, progress.Bytes(float64(have)))
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
	if c.Writer.Kind == "top_k" {
		// Its free list and its heap of (slot, key), and the free list
		// Create or Open builds.
		perSlot := uint64(32)
		if uint64(c.Capacity) > math.MaxUint64/perSlot-need {
			return math.MaxUint64
		}
		need += perSlot * uint64(c.Capacity)
	}
	return need
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
