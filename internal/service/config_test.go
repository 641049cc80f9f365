package service

import (
	"errors"
	"testing"
	"time"
)

var errFakeConfig = errors.New("fake: bad config")

type fakeConfig struct {
	N    int
	D    time.Duration
	Name string
	On   bool
}

var fakeKeys = Keys[fakeConfig]{
	{Setting: Setting{Key: "n", Value: "N"}, Set: func(c *fakeConfig, v string) error { return SetAtLeast(&c.N, v, 2) }},
	{Setting: Setting{Key: "d", Value: "D"}, Set: func(c *fakeConfig, v string) error { return SetPositive(&c.D, v) }},
	{Setting: Setting{Key: "name", Value: "S"}, Set: func(c *fakeConfig, v string) error { return SetNonEmpty(&c.Name, v, "want a name") }},
	{Setting: Setting{Key: "on"}, Set: func(c *fakeConfig, _ string) error { c.On = true; return nil }},
}

// TestKeys_Set: a value is set, or refused with an error that names the
// key, the value and what the key wants, matches the class, and leaves
// the config as it was.
func TestKeys_Set(t *testing.T) {
	for _, tc := range []struct {
		key, value string
		want       string // "": no error; else the error's text
		got        fakeConfig
	}{
		{"n", "2", "", fakeConfig{N: 2}},
		{"n", "1", "n=1: want at least 2", fakeConfig{}},
		{"n", "x", "n=x: want a whole number, at least 2", fakeConfig{}},
		{"d", "1m", "", fakeConfig{D: time.Minute}},
		{"d", "0s", "d=0s: want a positive duration", fakeConfig{}},
		{"d", "5", "d=5: want a positive duration", fakeConfig{}},
		{"name", "a", "", fakeConfig{Name: "a"}},
		{"name", "", "name: want a name", fakeConfig{}},
		{"on", "", "", fakeConfig{On: true}},
		{"on", "yes", "on=yes: takes no value", fakeConfig{}},
		{"colour", "red", "colour=red: unknown setting; the settings are n, d, name and on", fakeConfig{}},
	} {
		var c fakeConfig
		err := fakeKeys.Set(&c, tc.key, tc.value, errFakeConfig)
		switch {
		case tc.want == "" && err != nil:
			t.Errorf("Set(%q, %q): %v", tc.key, tc.value, err)
		case tc.want != "" && (err == nil || err.Error() != tc.want || !errors.Is(err, errFakeConfig)):
			t.Errorf("Set(%q, %q): %v; want %q, matching the class", tc.key, tc.value, err, tc.want)
		}
		if c != tc.got {
			t.Errorf("Set(%q, %q): %+v; want %+v", tc.key, tc.value, c, tc.got)
		}
	}
	err := fakeKeys.Set(new(fakeConfig), "colour", "red", nil)
	if !errors.Is(err, ErrUnknownSetting) {
		t.Errorf("an unknown key without a class: %v; want ErrUnknownSetting", err)
	}
	var se *SettingError
	if !errors.As(err, &se) || se.Key != "colour" || se.Value != "red" {
		t.Errorf("errors.As(%v, *SettingError) = %+v", err, se)
	}
}

func TestKeyList(t *testing.T) {
	for _, tc := range []struct {
		keys []string
		want string
	}{
		{nil, ""},
		{[]string{"a"}, "a"},
		{[]string{"a", "b"}, "a and b"},
		{[]string{"a", "b", "c"}, "a, b and c"},
	} {
		var settings []Setting
		for _, k := range tc.keys {
			settings = append(settings, Setting{Key: k})
		}
		if got := KeyList(settings); got != tc.want {
			t.Errorf("KeyList(%v) = %q, want %q", tc.keys, got, tc.want)
		}
	}
	if got := fakeKeys.Settings(); len(got) != 4 || got[3].Key != "on" || !got[3].Switch() || got[0].Switch() {
		t.Errorf("Settings() = %+v", got)
	}
}
