package service

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"
)

// Setting is one key of a service config's text form: what the command
// line's --buffer, --store, --serve and --loader take after the name, as
// KEY=VALUE, and the config's Set applies.
type Setting struct {
	Key   string // as the text spells it: "min-size"
	Value string // what it takes, as a usage line shows it ("N", "D", "always|none"); "" for a switch, given bare
	Help  string // one line
}

// Switch reports whether the setting takes no value: it is given bare
// ("flip"), and its presence sets it.
func (s Setting) Switch() bool { return s.Value == "" }

// SettingError is a value a config's Set refused, or a key it does not
// know: its text names the key and the value given, then what the key
// wants ("capacity=0: want at least 1"). It matches Err and, when set,
// Class (the service's ErrConfig).
type SettingError struct {
	Key, Value string
	Err        error
	Class      error
}

func (e *SettingError) Error() string {
	if e.Value == "" {
		return e.Key + ": " + e.Err.Error()
	}
	return e.Key + "=" + e.Value + ": " + e.Err.Error()
}

func (e *SettingError) Unwrap() []error {
	if e.Class == nil {
		return []error{e.Err}
	}
	return []error{e.Err, e.Class}
}

// ErrUnknownSetting is what Set says of a key the config does not have.
var ErrUnknownSetting = errors.New("unknown setting")

// Key is a row of a config's text form: the setting and how it sets a C
// from its value's text. The error says what the key wants ("want at least
// 1"); Keys.Set names the key and the value.
type Key[C any] struct {
	Setting
	Set func(c *C, value string) error
}

// Keys is a config's text form: its settings, in the order a spec applies
// them (so that one may depend on another set before it: a sampler's kind
// before its parameters).
type Keys[C any] []Key[C]

// Settings returns the keys' settings, in order.
func (ks Keys[C]) Settings() []Setting {
	out := make([]Setting, len(ks))
	for i, k := range ks {
		out[i] = k.Setting
	}
	return out
}

// Set applies key=value to c; a *SettingError, matching class, for a key
// not in ks, a value given to a switch, or a value the key refuses. c is
// unchanged on error unless the key's own Set changed it.
func (ks Keys[C]) Set(c *C, key, value string, class error) error {
	for _, k := range ks {
		if k.Key != key {
			continue
		}
		var err error
		if k.Switch() && value != "" {
			err = errors.New("takes no value")
		} else {
			err = k.Set(c, value)
		}
		if err != nil {
			return &SettingError{Key: key, Value: value, Err: err, Class: class}
		}
		return nil
	}
	return &SettingError{Key: key, Value: value, Class: class,
		Err: fmt.Errorf("%w; the settings are %s", ErrUnknownSetting, KeyList(ks.Settings()))}
}

// KeyList names the settings' keys in prose: "a, b and c".
func KeyList(settings []Setting) string {
	keys := make([]string, len(settings))
	for i, s := range settings {
		keys[i] = s.Key
	}
	if len(keys) < 2 {
		return strings.Join(keys, "")
	}
	return strings.Join(keys[:len(keys)-1], ", ") + " and " + keys[len(keys)-1]
}

// SetAtLeast sets *dst to v, a whole number of at least min; the error
// says what it wants.
func SetAtLeast(dst *int, v string, min int) error {
	n, err := strconv.Atoi(v)
	switch {
	case err != nil:
		return fmt.Errorf("want a whole number, at least %d", min)
	case n < min:
		return fmt.Errorf("want at least %d", min)
	}
	*dst = n
	return nil
}

// SetPositive sets *dst to v, a positive duration (time.ParseDuration);
// the error says what it wants.
func SetPositive(dst *time.Duration, v string) error {
	d, err := time.ParseDuration(v)
	if err != nil || d <= 0 {
		return errors.New("want a positive duration")
	}
	*dst = d
	return nil
}

// SetNonEmpty sets *dst to v, refused with the error want when v is empty.
func SetNonEmpty(dst *string, v, want string) error {
	if v == "" {
		return errors.New(want)
	}
	*dst = v
	return nil
}
