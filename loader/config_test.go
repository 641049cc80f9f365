package loader

import (
	"reflect"
	"testing"
	"time"

	"github.com/tensorwire/tensorwire/internal/testkit/svctest"
)

// TestConfig_Defaults: DefaultConfig is the zero Config with its
// defaults, and WithDefaults fills only the zero fields.
func TestConfig_Defaults(t *testing.T) {
	d := DefaultConfig()
	if d.Slots != DefaultSlots || d.Window != DefaultSlots/2 || d.Heartbeat != DefaultHeartbeat || d.MaxWait != DefaultMaxWait || d.Log == nil {
		t.Errorf("DefaultConfig() = %+v", d)
	}
	for _, tc := range []struct {
		in, want Config
	}{
		{Config{Slots: 4}, Config{Slots: 4, Window: 2}},
		{Config{Slots: 4, Window: 3}, Config{Slots: 4, Window: 3}},
		{Config{Slots: 4, Window: -1}, Config{Slots: 4, Window: 0}}, // nobody joins an epoch begun
		{Config{Heartbeat: time.Second, MaxWait: time.Second}, Config{Slots: 8, Window: 4, Heartbeat: time.Second, MaxWait: time.Second}},
	} {
		got := tc.in.WithDefaults()
		if got.Slots != tc.want.Slots || got.Window != tc.want.Window ||
			tc.want.Heartbeat != 0 && got.Heartbeat != tc.want.Heartbeat || tc.want.MaxWait != 0 && got.MaxWait != tc.want.MaxWait {
			t.Errorf("%+v.WithDefaults() = %+v, want %+v", tc.in, got, tc.want)
		}
	}
}

// TestConfig_Validate: a Config is refused with ErrConfig naming the field
// and what it wants; the zero fields stand for their defaults.
func TestConfig_Validate(t *testing.T) {
	for _, tc := range []struct {
		name string
		cfg  Config
		want string // "": valid
	}{
		{"dir and batch", Config{Dir: "r", Batch: 4}, ""},
		{"window as the slots", Config{Dir: "r", Batch: 4, Slots: 2, Window: 2}, ""},
		{"no window", Config{Dir: "r", Batch: 4, Window: -1}, ""},
		{"no dir", Config{Batch: 4}, "no ring folder (Dir)"},
		{"no batch", Config{Dir: "r"}, "batch size 0: want at least 1"},
		{"negative slots", Config{Dir: "r", Batch: 4, Slots: -1}, "-1 slots: want at least 1"},
		{"window past the ring", Config{Dir: "r", Batch: 4, Slots: 2, Window: 3}, "a window of 3 batches is more than the ring's 2 slots"},
		{"negative heartbeat", Config{Dir: "r", Batch: 4, Heartbeat: -time.Second}, "negative heartbeat, max wait or grant wait"},
		{"negative max wait", Config{Dir: "r", Batch: 4, MaxWait: -time.Second}, "negative heartbeat, max wait or grant wait"},
		{"negative grant wait", Config{Dir: "r", Producer: ProducerRemote, GrantWait: -time.Second}, "negative heartbeat, max wait or grant wait"},
		{"negative workers", Config{Dir: "r", Batch: 4, Workers: -1}, "-1 transform workers: want 0 or more"},
		{"ring too large", Config{Dir: "r", Batch: 1 << 30, Slots: 4}, "a ring of 4 × 1073741824 rows"},
	} {
		err := tc.cfg.Validate()
		svctest.WantConfigError(t, tc.name, err, tc.want, "", ErrConfig)
	}
}

// TestConfig_Set: the text form sets the field its key names, or refuses
// the value naming the key, the value and what it wants, and leaves the
// config as it was (an *Augment it holds, too).
func TestConfig_Set(t *testing.T) {
	augment := func(a Augment) Config { return Config{Transform: &a} }
	for _, tc := range []struct {
		from       Config
		key, value string
		want       string // "": set; else the error's text after "key=value: " ("key: " for no value)
		got        Config
	}{
		{Config{}, "dataset", "d", "", Config{Dataset: "d"}},
		{Config{}, "dataset", "", "want a prefix", Config{}},
		{Config{}, "batch", "4", "", Config{Batch: 4}},
		{Config{}, "batch", "0", "want a whole number, at least 1", Config{}},
		{Config{}, "slots", "x", "want a whole number, at least 1", Config{}},
		{Config{}, "window", "3", "", Config{Window: 3}},
		{Config{}, "window", "0", "", Config{Window: -1}},
		{Config{}, "window", "-1", "", Config{Window: -1}},
		{Config{}, "window", "-2", "want a number of batches, or -1 (or 0) for none", Config{}},
		{Config{}, "workers", "4", "", Config{Workers: 4}},
		{Config{}, "workers", "0", "want a whole number, at least 1", Config{}},
		{Config{}, "seed", "7", "", Config{Seed: 7}},
		{Config{}, "seed", "-1", "want a whole number from 0 to 18446744073709551615", Config{}},
		{Config{}, "sequential", "", "", Config{Sequential: true}},
		{Config{}, "sequential", "yes", "takes no value", Config{}},
		{Config{}, "index", "idx", "", Config{IndexKey: "idx"}},
		{Config{}, "index", "", "want a key", Config{}},
		{Config{}, "heartbeat", "2s", "", Config{Heartbeat: 2 * time.Second}},
		{Config{}, "max-wait", "0s", "want a positive duration", Config{}},
		{Config{}, "grant-wait", "30s", "", Config{GrantWait: 30 * time.Second}},
		{Config{}, "grant-wait", "0s", "want a positive duration", Config{}},
		{Config{}, "transform", "augment", "", augment(Augment{})},
		{augment(Augment{Pad: 2}), "transform", "augment", "", augment(Augment{Pad: 2})},
		{augment(Augment{Pad: 2}), "transform", "none", "", Config{}},
		{Config{}, "transform", "blur", "want augment or none", Config{}},
		{Config{}, "pad", "2", "pad applies to transform=augment only", Config{}},
		{Config{}, "flip", "", "flip applies to transform=augment only", Config{}},
		{augment(Augment{}), "pad", "4", "", augment(Augment{Pad: 4})},
		{augment(Augment{}), "pad", "-1", "want a whole number, 0 or more", augment(Augment{})},
		{augment(Augment{}), "flip", "", "", augment(Augment{Flip: true})},
		{augment(Augment{}), "image-key", "a/b", "", augment(Augment{Key: []string{"a", "b"}})},
		{augment(Augment{}), "mean", "0.5", "", augment(Augment{Mean: 0.5})},
		{augment(Augment{}), "mean", "1e39", "want a finite number", augment(Augment{})},
		{augment(Augment{}), "mean", "NaN", "want a finite number", augment(Augment{})},
		{augment(Augment{}), "std", "0.25", "", augment(Augment{Std: 0.25})},
		{augment(Augment{}), "std", "0", "want a positive finite number", augment(Augment{})},
		{augment(Augment{}), "std", "Inf", "want a positive finite number", augment(Augment{})},
		{Config{}, "colour", "red", "unknown setting; the settings are dataset, batch, slots, window, workers, seed, sequential, " +
			"index, heartbeat, max-wait, transform, image-key, pad, flip, mean, std, grant-wait and producer", Config{}},
	} {
		c := tc.from
		var before Augment
		if a, ok := tc.from.Transform.(*Augment); ok {
			before = *a
		}
		err := c.Set(tc.key, tc.value)
		name := tc.key + "=" + tc.value
		if tc.value == "" {
			name = tc.key
		}
		svctest.WantConfigError(t, "Set "+name, err, tc.want, name+": ", ErrConfig)
		if !reflect.DeepEqual(c, tc.got) {
			t.Errorf("Set %s: %+v (transform %+v), want %+v", name, c, c.Transform, tc.got)
		}
		if a, ok := tc.from.Transform.(*Augment); ok && !reflect.DeepEqual(*a, before) {
			t.Errorf("Set %s changed the *Augment of the config it was given: %+v", name, *a)
		}
	}
	for _, s := range (Config{}).Settings() {
		if s.Help == "" {
			t.Errorf("setting %+v: no help", s)
		}
	}
}
