package serve

import (
	"errors"
	"log/slog"
	"testing"
	"time"

	"github.com/tensorwire/tensorwire/internal/testkit/svctest"
	"github.com/tensorwire/tensorwire/memmap"
	"github.com/tensorwire/tensorwire/tensordict"
)

// validConfig is a Config Validate accepts, but for what a case changes.
func validConfig(change func(*Config)) Config {
	c := Config{
		Input:    tensordict.RowSchema{{Key: []string{"x"}, DType: memmap.Float32, Shape: []int{2}}},
		Output:   tensordict.RowSchema{{Key: []string{"y"}, DType: memmap.Float32, Shape: []int{2}}},
		MaxBatch: 8,
		New:      func(int) (Model, error) { return nil, errors.New("not called") },
	}
	if change != nil {
		change(&c)
	}
	return c
}

// TestConfig_Defaults: DefaultConfig is the zero Config with its
// defaults, and WithDefaults fills only the zero fields.
func TestConfig_Defaults(t *testing.T) {
	d := DefaultConfig()
	if d.Replicas != 1 || d.MaxQueue != 4096 || d.Lease != 30*time.Second || d.Log != slog.Default() || d.Policy != Greedy() || d.MaxBatch != 0 {
		t.Errorf("DefaultConfig() = %+v", d)
	}
	c := Config{Replicas: 3, MaxQueue: 64, Lease: time.Second}.WithDefaults()
	if c.Replicas != 3 || c.MaxQueue != 64 || c.Lease != time.Second {
		t.Errorf("WithDefaults changed a field given: %+v", c)
	}
	if err := d.Validate(); err == nil || !errors.Is(err, ErrConfig) {
		t.Errorf("DefaultConfig().Validate() = %v; want ErrConfig (no New, no MaxBatch)", err)
	}
}

// TestConfig_Validate: a Config is refused with ErrConfig naming the field
// and what it wants; the zero fields stand for their defaults.
func TestConfig_Validate(t *testing.T) {
	for _, tc := range []struct {
		name   string
		change func(*Config)
		want   string // "": valid
	}{
		{"valid", nil, ""},
		{"every field", func(c *Config) {
			c.Replicas, c.MaxQueue, c.Lease, c.Policy = 4, 8, time.Second, MaxDelay(time.Millisecond)
		}, ""},
		{"no New", func(c *Config) { c.New = nil }, "no model constructor (New)"},
		{"no max batch", func(c *Config) { c.MaxBatch = 0 }, "max batch 0; want 1 to"},
		{"max batch too large", func(c *Config) { c.MaxBatch = maxRows + 1 }, "want 1 to"},
		{"too many replicas", func(c *Config) { c.Replicas = 1025 }, "1025 replicas; want 1 to 1024"},
		{"negative replicas", func(c *Config) { c.Replicas = -1 }, "-1 replicas"},
		{"queue under the batch", func(c *Config) { c.MaxQueue = 4 }, "max queue 4 rows is smaller than the max batch 8"},
		{"negative lease", func(c *Config) { c.Lease = -time.Second }, "lease -1s; want a positive duration"},
		{"bad input", func(c *Config) { c.Input = tensordict.RowSchema{{DType: memmap.Float32}} }, "input schema"},
		{"bad output", func(c *Config) { c.Output = tensordict.RowSchema{{DType: memmap.Float32}} }, "output schema"},
	} {
		err := validConfig(tc.change).Validate()
		svctest.WantConfigError(t, tc.name, err, tc.want, "", ErrConfig)
	}
}

// TestConfig_Set: the text form sets the field its key names, or refuses
// the value naming the key, the value and what it wants, and leaves the
// config as it was.
func TestConfig_Set(t *testing.T) {
	for _, tc := range []struct {
		key, value string
		want       string // "": set; else the error's text after "key=value: "
		check      func(Config) bool
	}{
		{"replicas", "4", "", func(c Config) bool { return c.Replicas == 4 }},
		{"replicas", "0", "", func(c Config) bool { return c.Replicas == 0 && c.AttachedOnly }},
		{"replicas", "-1", "want at least 1", nil},
		{"attach-wait", "2s", "", func(c Config) bool { return c.AttachWait == 2*time.Second }},
		{"attach-wait", "0s", "want a positive duration", nil},
		{"replica-timeout", "5s", "", func(c Config) bool { return c.ReplicaTimeout == 5*time.Second }},
		{"max-batch", "32", "", func(c Config) bool { return c.MaxBatch == 32 }},
		{"max-batch", "x", "want a whole number, at least 1", nil},
		{"queue", "64", "", func(c Config) bool { return c.MaxQueue == 64 }},
		{"queue", "-2", "want at least 1", nil},
		{"max-delay", "2ms", "", func(c Config) bool { return c.Policy == MaxDelay(2*time.Millisecond) }},
		{"max-delay", "0s", "", func(c Config) bool { return c.Policy == Greedy() }},
		{"max-delay", "-1ms", "want a duration >= 0", nil},
		{"lease", "10s", "", func(c Config) bool { return c.Lease == 10*time.Second }},
		{"lease", "0s", "want a positive duration", nil},
		{"colour", "red", "unknown setting; the settings are replicas, max-batch, max-delay, queue, lease, attach-wait and replica-timeout", nil},
	} {
		var c Config
		err := c.Set(tc.key, tc.value)
		name := tc.key + "=" + tc.value
		switch {
		case !svctest.WantConfigError(t, "Set "+name, err, tc.want, name+": ", ErrConfig):
		case tc.want == "" && !tc.check(c):
			t.Errorf("Set %s: %+v", name, c)
		case tc.want != "" && (c.Replicas != 0 || c.MaxBatch != 0 || c.MaxQueue != 0 || c.Lease != 0 || c.Policy != nil):
			t.Errorf("Set %s, refused, changed the config: %+v", name, c)
		}
	}
	for _, s := range (Config{}).Settings() {
		if s.Value == "" || s.Help == "" {
			t.Errorf("setting %+v: no value or no help", s)
		}
	}
}
