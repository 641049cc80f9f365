package replay

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/tensorwire/tensorwire/memmap"
	"github.com/tensorwire/tensorwire/tensordict"
)

// TestCreate_RefusesWhatCannotWork: a configuration that cannot make a
// working buffer is refused with ErrConfig before anything is allocated or
// written: no out-of-memory crash, and nothing left on disk, whether Create
// would have made the folder or found it empty.
func TestCreate_RefusesWhatCannotWork(t *testing.T) {
	free, ok := freeDisk(t.TempDir())
	if !ok {
		t.Skip("this system does not report free disk space, so Create cannot check it")
	}
	const row = 1 << 20
	rows := func(n int) tensordict.RowSchema {
		return tensordict.RowSchema{{Key: []string{"obs"}, DType: memmap.Uint8, Shape: []int{n}}}
	}
	for _, tc := range []struct {
		name  string
		cfg   Config
		want  string
		enosp bool // the error wraps ENOSPC too
	}{
		{"capacity beyond memory", Config{Capacity: 10_000_000_000_000}, "memory", false},
		{"capacity beyond memory, top-k", Config{Capacity: 1 << 40, Writer: TopK("r")}, "memory", false},
		{"storage beyond the disk", Config{Capacity: int(free/row)*2 + 1, Schema: rows(row)}, "free", true},
		{"storage bytes overflow", Config{Capacity: 1 << 40, Schema: rows(1 << 30)}, "too many elements", false},
		{"a key both a tensor and a dict", Config{Capacity: 4, Schema: tensordict.RowSchema{
			{Key: []string{"obs"}, DType: memmap.Uint8}, {Key: []string{"obs", "pixels"}, DType: memmap.Uint8, Shape: []int{4}},
		}}, "inside field [obs]", false},
		{"a field without a dtype", Config{Capacity: 4, Schema: tensordict.RowSchema{{Key: []string{"obs"}, Shape: []int{4}}}}, "dtype", false},
		{"min size over capacity", Config{Capacity: 4, Limit: RateLimit{MinSize: 5}}, "min size", false},
		{"negative lease", Config{Capacity: 4, Lease: -time.Second}, "lease", false},
		{"negative capacity", Config{Capacity: -1}, "capacity", false},
	} {
		for _, exists := range []bool{false, true} {
			name := tc.name
			if exists {
				name += ", empty folder"
			}
			t.Run(name, func(t *testing.T) {
				dir := t.TempDir()
				prefix := filepath.Join(dir, "buf")
				if exists {
					if err := os.Mkdir(prefix, 0o755); err != nil {
						t.Fatal(err)
					}
				}
				b, err := Create(prefix, tc.cfg)
				if err == nil {
					b.Close()
					t.Fatalf("Create(%+v) succeeded", tc.cfg)
				}
				t.Logf("Create: %v", err)
				if !errors.Is(err, ErrConfig) || !strings.Contains(err.Error(), tc.want) {
					t.Errorf("Create: %v; want ErrConfig about %q", err, tc.want)
				}
				if tc.enosp && !errors.Is(err, syscall.ENOSPC) {
					t.Errorf("Create: %v; want it to wrap ENOSPC too", err)
				}
				left, _ := filepath.Glob(filepath.Join(dir, "*", "*"))
				if top, _ := filepath.Glob(filepath.Join(dir, "*")); len(left) > 0 || len(top) != map[bool]int{false: 0, true: 1}[exists] {
					t.Errorf("the refused Create left %v %v", top, left)
				}
			})
		}
	}
}

// TestOpenWith_ChangesWhatCanChange: OpenWith applies and saves the
// settings that can change (lease, rate limit, a prioritized sampler's
// parameters) and refuses the others naming both values, modifying nothing
// at the prefix and letting it go.
func TestOpenWith_ChangesWhatCanChange(t *testing.T) {
	prefix := filepath.Join(t.TempDir(), "buf")
	b, err := Create(prefix, Config{Capacity: 8, Schema: testSchema, Sampler: Prioritized(0.6, 0.4)})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := b.ExtendPriority(ctxT(t), transitions(t, 0, 1, 2), []float64{1, 2, 3}); err != nil {
		t.Fatal(err)
	}
	if err := b.Close(); err != nil {
		t.Fatal(err)
	}
	meta := func() string {
		data, err := os.ReadFile(filepath.Join(prefix, MetaFile))
		if err != nil {
			t.Fatal(err)
		}
		return string(data)
	}
	before := meta()
	refused := errors.New("refused by change")
	for _, tc := range []struct {
		name   string
		change func(c Config) Config
		want   []string
	}{
		{"capacity", func(c Config) Config { c.Capacity = 16; return c }, []string{"capacity 16", "is 8"}},
		{"sampler kind", func(c Config) Config { c.Sampler = Uniform(); return c }, []string{"sampler uniform", "prioritized(alpha=0.6, beta=0.4)"}},
		{"writer", func(c Config) Config { c.Writer = TopK("reward"); return c }, []string{"writer", "top_k", "round_robin"}},
		{"schema", func(c Config) Config { c.Schema = c.Schema[:1]; return c }, []string{"schema"}},
		{"bad value", func(c Config) Config { c.Limit.MinSize = 9; return c }, []string{"min size 9"}},
	} {
		_, err := OpenWith(prefix, func(c Config) (Config, error) { return tc.change(c), nil })
		for _, w := range tc.want {
			if !errors.Is(err, ErrConfig) || !strings.Contains(err.Error(), w) {
				t.Errorf("%s: %v; want ErrConfig saying %q", tc.name, err, w)
			}
		}
		if meta() != before {
			t.Fatalf("%s: the refused change modified %s", tc.name, MetaFile)
		}
	}
	if _, err := OpenWith(prefix, func(Config) (Config, error) { return Config{}, refused }); !errors.Is(err, refused) {
		t.Fatalf("change's own error: %v", err)
	}

	b, err = OpenWith(prefix, func(c Config) (Config, error) {
		if p := c.Sampler.Params(); c.Sampler.Kind() != "prioritized" || p["alpha"] != 0.6 || p["beta"] != 0.4 || c.Capacity != 8 {
			t.Errorf("change was given %+v", c)
		}
		c.Sampler, c.Lease, c.Limit.MinSize = Prioritized(1, 1), 5*time.Second, 2
		return c, nil
	})
	if err != nil {
		t.Fatal(err)
	}
	got := b.Config()
	if p := got.Sampler.Params(); p["alpha"] != 1 || p["beta"] != 1 || got.Lease != 5*time.Second || got.Limit.MinSize != 2 {
		t.Errorf("Config after the change: %+v", got)
	}
	if b.Len() != 3 {
		t.Errorf("Len = %d after reopening with another alpha, want 3", b.Len())
	}
	// The priorities came back from the slot table into the new sampler.
	if _, err := b.UpdatePriority(ctxT(t), SampleInfo{Indices: []int{0, 1}}, []float64{0, 0}); err != nil {
		t.Fatal(err)
	}
	td, _, err := b.Sample(ctxT(t), 50)
	if err != nil {
		t.Fatal(err)
	}
	for _, id := range rowIDs(t, td) {
		if id != 2 {
			t.Fatalf("sampled %d; only 2 has priority", id)
		}
	}
	b.Close()
	for _, w := range []string{`"alpha": 1`, `"beta": 1`, `"lease_ms": 5000`, `"min_size": 2`} {
		if !strings.Contains(meta(), w) {
			t.Errorf("%s after the change lacks %s:\n%s", MetaFile, w, meta())
		}
	}
}
