package store

import (
	"log/slog"
	"testing"
	"time"

	"github.com/tensorwire/tensorwire/internal/testkit/svctest"
)

// TestOptions_Defaults: DefaultOptions is the zero Options with its
// defaults, and WithDefaults fills only the zero fields.
func TestOptions_Defaults(t *testing.T) {
	d := DefaultOptions()
	want := Options{MaxValueBytes: 1 << 30, InlineBytes: 1 << 20, GetTimeout: 30 * time.Second, LeaseTTL: 10 * time.Second,
		History: 100_000, CompactBytes: 64 << 20, TrashGrace: time.Minute, Logger: slog.Default()}
	if d != want || d != (Options{}).WithDefaults() {
		t.Errorf("DefaultOptions() = %+v, want %+v", d, want)
	}
	if err := d.Validate(); err != nil {
		t.Errorf("DefaultOptions().Validate() = %v", err)
	}
	o := Options{InlineBytes: 5, History: 3, NoSync: true}.WithDefaults()
	if o.InlineBytes != 5 || o.History != 3 || !o.NoSync {
		t.Errorf("WithDefaults changed a field given: %+v", o)
	}
}

// TestOptions_Validate: Options are refused with ErrConfig saying what is
// wrong; the zero fields stand for their defaults.
func TestOptions_Validate(t *testing.T) {
	for _, tc := range []struct {
		name string
		o    Options
		want string // "": valid
	}{
		{"zero", Options{}, ""},
		{"inline at its bound", Options{InlineBytes: 64 << 20}, ""},
		{"inline over it", Options{InlineBytes: 64<<20 + 1}, "InlineBytes 67108865; at most 67108864"},
		{"negative max value", Options{MaxValueBytes: -1}, "a negative option"},
		{"negative history", Options{History: -1}, "a negative option"},
		{"negative grace", Options{TrashGrace: -time.Second}, "a negative option"},
		{"negative lease", Options{LeaseTTL: -time.Second}, "a negative option"},
	} {
		err := tc.o.Validate()
		svctest.WantConfigError(t, tc.name, err, tc.want, "", ErrConfig)
	}
}

// TestOptions_Set: the text form sets the field its key names, or refuses
// the value naming the key, the value and what it wants, and leaves the
// options as they were.
func TestOptions_Set(t *testing.T) {
	for _, tc := range []struct {
		key, value string
		want       string // "": set; else the error's text after "key=value: "
		got        Options
	}{
		{"max-value", "64MiB", "", Options{MaxValueBytes: 64 << 20}},
		{"max-value", "3", "", Options{MaxValueBytes: 3}},
		{"max-value", "2G", "", Options{MaxValueBytes: 2 << 30}},
		{"max-value", "0", "want a size such as 1048576, 512KiB or 64MiB", Options{}},
		{"max-value", "x", "want a size", Options{}},
		{"max-value", "9999999999GiB", "want a size", Options{}},
		{"inline", "512KiB", "", Options{InlineBytes: 512 << 10}},
		{"inline", "-1", "want a size", Options{}},
		{"sync", "none", "", Options{NoSync: true}},
		{"sync", "always", "", Options{}},
		{"sync", "sometimes", "want always or none", Options{}},
		{"lease", "3s", "", Options{LeaseTTL: 3 * time.Second}},
		{"lease", "0s", "want a positive duration", Options{}},
		{"get-timeout", "1m", "", Options{GetTimeout: time.Minute}},
		{"get-timeout", "x", "want a positive duration", Options{}},
		{"history", "10", "", Options{History: 10}},
		{"history", "0", "want at least 1", Options{}},
		{"trash-grace", "2m", "", Options{TrashGrace: 2 * time.Minute}},
		{"trash-grace", "-1s", "want a positive duration", Options{}},
		{"repair", "drop", "", Options{Repair: true}},
		{"repair", "yes", "want drop", Options{}},
		{"colour", "red", "unknown setting; the settings are max-value, inline, sync, lease, get-timeout, history, trash-grace and repair", Options{}},
	} {
		var o Options
		err := o.Set(tc.key, tc.value)
		name := tc.key + "=" + tc.value
		svctest.WantConfigError(t, "Set "+name, err, tc.want, name+": ", ErrConfig)
		if o != tc.got {
			t.Errorf("Set %s: %+v, want %+v", name, o, tc.got)
		}
	}
	for _, s := range (Options{}).Settings() {
		if s.Value == "" || s.Help == "" {
			t.Errorf("setting %+v: no value or no help", s)
		}
	}
}
