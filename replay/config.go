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
	"github.com/tensorwire/tensorwire/memmap"
	"github.com/tensorwire/tensorwire/replay/internal/selector"
	"github.com/tensorwire/tensorwire/tensordict"
	"golang.org/x/sys/unix"
)

// Config describes a buffer to Create. Only Capacity is required.
type Config struct {
	// Capacity is the number of transitions the storage holds.
	Capacity int

	// Schema is the fields of one transition: keys, dtypes and shapes
	// without the batch dimension. Nil means the first batch decides.
	Schema []tensordict.Field

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
	c.Schema = cloneSchema(c.Schema)
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
		if err := checkSchema(c.Schema); err != nil {
			return fmt.Errorf("%w: %w", ErrConfig, err)
		}
		if _, err := storageSizeOf(c.Capacity, c.Schema); err != nil {
			return fmt.Errorf("%w: %w", ErrConfig, err)
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
	var si unix.Sysinfo_t
	if unix.Sysinfo(&si) == nil && si.Totalram > 0 {
		limit = uint64(si.Totalram) * uint64(max(si.Unit, 1))
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

// storageSizeOf returns the bytes of a storage of capacity transitions of
// schema, or an error if they overflow.
func storageSizeOf(capacity int, schema []tensordict.Field) (int64, error) {
	var total int64
	for _, f := range schema {
		n, err := memmap.NumBytes(f.DType, append([]int{capacity}, f.Shape...))
		if err != nil {
			return 0, fmt.Errorf("field %v: %d transitions of shape %v: %w", f.Key, capacity, f.Shape, err)
		}
		if total > math.MaxInt64-int64(n) {
			return 0, fmt.Errorf("the storage of %d transitions overflows (%s per transition)", capacity, schemaString(schema))
		}
		total += int64(n)
	}
	return total, nil
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
	var st unix.Statfs_t
	if err := unix.Statfs(dir, &st); err != nil {
		return nil // not knowing is no reason to refuse; Create finds out
	}
	free := uint64(st.Bavail) * uint64(st.Bsize)
	slots := uint64(cfg.Capacity) * slotFields * 8
	var storage uint64
	if cfg.Schema != nil {
		n, _ := storageSizeOf(cfg.Capacity, cfg.Schema) // validated
		storage = uint64(n)
	}
	if need := slots + storage; need > free {
		return fmt.Errorf("%w: %s: a buffer of capacity %d needs %s on disk (slot table %s, storage %s); %s has %s free: %w",
			ErrConfig, prefix, cfg.Capacity, progress.Bytes(float64(need)), progress.Bytes(float64(slots)),
			storageWords(cfg.Schema, storage), dir, progress.Bytes(float64(free)), syscall.ENOSPC)
	}
	return nil
}

func storageWords(schema []tensordict.Field, n uint64) string {
	if schema == nil {
		return "made at the first batch"
	}
	return progress.Bytes(float64(n))
}

// checkSchema checks a transition schema: at least one field, valid dtypes
// and shapes, distinct keys.
func checkSchema(fs []tensordict.Field) error {
	if len(fs) == 0 {
		return fmt.Errorf("schema has no fields")
	}
	seen := map[string]bool{}
	for _, f := range fs {
		if len(f.Key) == 0 || slices.Contains(f.Key, "") {
			return fmt.Errorf("field with an empty key %q", f.Key)
		}
		name := fmt.Sprint(f.Key)
		if seen[name] {
			return fmt.Errorf("field %v twice", f.Key)
		}
		seen[name] = true
		if !f.DType.Valid() {
			return fmt.Errorf("field %v: dtype %v", f.Key, f.DType)
		}
		if _, err := memmap.NumBytes(f.DType, append([]int{1}, f.Shape...)); err != nil {
			return fmt.Errorf("field %v: %w", f.Key, err)
		}
	}
	return nil
}

// rowSchema returns the transition schema of a batch: its fields with the
// batch dimension dropped.
func rowSchema(td *tensordict.TensorDict) []tensordict.Field {
	fs := td.Schema()
	for i := range fs {
		fs[i].Shape = fs[i].Shape[1:]
	}
	return fs
}

// sameSchema reports whether a batch's transition schema equals want (the
// same keys, each with the same dtype and shape, in any order), and
// describes the first difference.
func sameSchema(want, got []tensordict.Field) error {
	byKey := make(map[string]tensordict.Field, len(want))
	for _, f := range want {
		byKey[strings.Join(f.Key, "\x00")] = f
	}
	for _, g := range got {
		w, ok := byKey[strings.Join(g.Key, "\x00")]
		switch {
		case !ok:
			return fmt.Errorf("field %v is not in the buffer's schema (%s)", g.Key, schemaString(want))
		case w.DType != g.DType:
			return fmt.Errorf("field %v has dtype %v, want %v", w.Key, g.DType, w.DType)
		case !slices.Equal(w.Shape, g.Shape):
			return fmt.Errorf("field %v has shape %v per transition, want %v", w.Key, g.Shape, w.Shape)
		}
	}
	if len(got) != len(want) {
		return fmt.Errorf("%d fields, want %d (%s)", len(got), len(want), schemaString(want))
	}
	return nil
}

func schemaString(fs []tensordict.Field) string {
	s := ""
	for i, f := range fs {
		if i > 0 {
			s += ", "
		}
		s += fmt.Sprintf("%v %v%v", f.Key, f.DType, f.Shape)
	}
	return s
}
