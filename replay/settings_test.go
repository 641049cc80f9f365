package replay

import (
	"math"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/tensorwire/tensorwire/internal/testkit/svctest"
	"github.com/tensorwire/tensorwire/memmap"
	"github.com/tensorwire/tensorwire/tensordict"
)

// TestConfig_Defaults: DefaultConfig is the zero Config with its defaults,
// and WithDefaults fills only the zero fields.
func TestConfig_Defaults(t *testing.T) {
	d := DefaultConfig()
	if d.Capacity != 0 || d.Lease != 30*time.Second || d.Limit.MinSize != 1 || d.Sampler != Uniform() || !d.Writer.equal(RoundRobin()) {
		t.Errorf("DefaultConfig() = %+v", d)
	}
	if !reflect.DeepEqual(d, Config{}.WithDefaults()) {
		t.Errorf("DefaultConfig() = %+v, Config{}.WithDefaults() = %+v", d, Config{}.WithDefaults())
	}
	c := Config{Capacity: 8, Lease: time.Second, Limit: RateLimit{MinSize: 4}, Sampler: FIFO()}.WithDefaults()
	if c.Capacity != 8 || c.Lease != time.Second || c.Limit.MinSize != 4 || c.Sampler != FIFO() {
		t.Errorf("WithDefaults changed a field given: %+v", c)
	}
	if err := d.Validate(); err == nil || !strings.Contains(err.Error(), "capacity 0") {
		t.Errorf("DefaultConfig().Validate() = %v; want the capacity refused", err)
	}
}

// TestConfig_Validate: a Config is refused with ErrConfig naming the field
// and what it wants; the zero fields stand for their defaults.
func TestConfig_Validate(t *testing.T) {
	schema := tensordict.RowSchema{{Key: []string{"obs"}, DType: memmap.Float32, Shape: []int{4}}}
	for _, tc := range []struct {
		name string
		cfg  Config
		want string // "": valid
	}{
		{"capacity alone", Config{Capacity: 1}, ""},
		{"every field", Config{Capacity: 8, Schema: schema, Sampler: Prioritized(0.6, 0.4), Writer: TopK("obs"),
			Limit: RateLimit{MinSize: 8, SamplesPerInsert: 2, ErrorBuffer: 100}, Lease: time.Minute}, ""},
		{"no capacity", Config{}, "capacity 0; want at least 1"},
		{"negative capacity", Config{Capacity: -1}, "capacity -1; want at least 1"},
		{"capacity too large", Config{Capacity: math.MaxInt}, "at most"},
		{"negative lease", Config{Capacity: 1, Lease: -time.Second}, "lease -1s; want a positive duration"},
		{"min size over capacity", Config{Capacity: 4, Limit: RateLimit{MinSize: 5}}, "min size 5 is larger than the capacity 4"},
		{"negative ratio", Config{Capacity: 4, Limit: RateLimit{SamplesPerInsert: -1}}, "rate limit"},
		{"NaN slack", Config{Capacity: 4, Limit: RateLimit{ErrorBuffer: math.NaN()}}, "rate limit"},
		{"sampler out of range", Config{Capacity: 4, Sampler: Prioritized(-1, 0.4)}, "alpha"},
		{"top-k without a key", Config{Capacity: 4, Writer: TopK()}, "top-k writer without a key"},
		{"bad schema", Config{Capacity: 4, Schema: tensordict.RowSchema{{DType: memmap.Float32}}}, "bad config"},
	} {
		err := tc.cfg.Validate()
		svctest.WantConfigError(t, tc.name, err, tc.want, "", ErrConfig)
	}
}

// TestConfig_Set: the text form sets the field its key names, or refuses
// the value naming the key, the value and what it wants, and leaves the
// config as it was.
func TestConfig_Set(t *testing.T) {
	prioritized := Config{Sampler: Prioritized(0.7, 0.5)}
	for _, tc := range []struct {
		from       Config
		key, value string
		want       string // "": set; else the error's text after "key=value: "
		check      func(Config) bool
	}{
		{Config{}, "capacity", "16", "", func(c Config) bool { return c.Capacity == 16 }},
		{Config{}, "capacity", "0", "want at least 1", nil},
		{Config{}, "capacity", "x", "want a whole number, at least 1", nil},
		{Config{}, "min-size", "4", "", func(c Config) bool { return c.Limit.MinSize == 4 }},
		{Config{}, "min-size", "-1", "want at least 1", nil},
		{Config{}, "lease", "250ms", "", func(c Config) bool { return c.Lease == 250*time.Millisecond }},
		{Config{}, "lease", "0s", "want a positive duration", nil},
		{Config{}, "lease", "5", "want a positive duration", nil},
		{Config{}, "sampler", "fifo", "", func(c Config) bool { return c.Sampler == FIFO() }},
		{Config{}, "sampler", "prioritized", "", func(c Config) bool { return c.Sampler == Prioritized(0.6, 0.4) }},
		{prioritized, "sampler", "prioritized", "", func(c Config) bool { return c.Sampler == prioritized.Sampler }},
		{prioritized, "sampler", "uniform", "", func(c Config) bool { return c.Sampler == Uniform() }},
		{Config{}, "sampler", "lifo", `unknown kind "lifo"`, nil},
		{Config{}, "sampler", "prioritized(alpha=1)", "the kind alone", nil},
		{prioritized, "alpha", "0.9", "", func(c Config) bool { return c.Sampler.Params()["alpha"] == 0.9 }},
		{prioritized, "eps", "0.01", "", func(c Config) bool { return c.Sampler.Params()["eps"] == 0.01 }},
		{prioritized, "alpha", "-1", "alpha=-1", nil},
		{prioritized, "beta", "x", "want a number", nil},
		{Config{}, "alpha", "0.5", "uniform takes no parameters (alpha given)", nil},
		{Config{}, "colour", "red", "unknown setting; the settings are capacity, sampler, alpha, beta, eps, min-size and lease", nil},
	} {
		c := tc.from
		err := c.Set(tc.key, tc.value)
		name := tc.key + "=" + tc.value
		switch {
		case !svctest.WantConfigError(t, "Set "+name, err, tc.want, name+": ", ErrConfig):
		case tc.want == "" && !tc.check(c):
			t.Errorf("Set %s: %+v", name, c)
		case tc.want != "" && !reflect.DeepEqual(c, tc.from):
			t.Errorf("Set %s, refused, changed the config: %+v", name, c)
		}
	}
	var keys []string
	for _, s := range (Config{}).Settings() {
		keys = append(keys, s.Key)
		if s.Value == "" || s.Help == "" {
			t.Errorf("setting %+v: no value or no help", s)
		}
	}
	if got := strings.Join(keys, ","); got != "capacity,sampler,alpha,beta,eps,min-size,lease" {
		t.Errorf("Settings() keys %s", got)
	}
}
