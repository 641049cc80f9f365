package main

import (
	"fmt"
	"path/filepath"
	"slices"
	"strings"

	"github.com/tensorwire/tensorwire/internal/service"
)

// spec is one value of a service flag (--buffer, --store, --loader,
// --serve): NAME[,KEY=VALUE|,SWITCH...], the name and the settings given.
// The settings are kept in the order their flag's keys are listed, not
// the order given, so that one a later one depends on comes first (a
// sampler's kind before its parameters, transform=augment before pad).
type spec struct {
	name     string
	settings []setting
}

// setting is one KEY=VALUE of a spec; a switch's value is "".
type setting struct{ key, value string }

// specName is what names the values a flag was given already (specNames).
func (s spec) specName() string { return s.name }

// has reports whether the spec gives key.
func (s spec) has(key string) bool {
	return slices.ContainsFunc(s.settings, func(st setting) bool { return st.key == key })
}

// apply sets each of the spec's settings with set (a config's Set), in
// order; the first error.
func (s spec) apply(set func(key, value string) error) error {
	for _, st := range s.settings {
		if err := set(st.key, st.value); err != nil {
			return err
		}
	}
	return nil
}

// specNames returns the names of the values a flag was given.
func specNames[S interface{ specName() string }](specs []S) []string {
	names := make([]string, len(specs))
	for i, s := range specs {
		names[i] = s.specName()
	}
	return names
}

// grammar is what the values of one service flag may hold.
type grammar struct {
	noun      string                  // "buffer": errors about a value begin "buffer NAME: "
	folder    bool                    // NAME is a folder under the root, not the root itself: checked so, and two names of one folder are the same
	checkName func(name string) error // NAME's check, when it is not a folder; its error is returned as it is
	twice     string                  // what a name given again is said to be: "given twice"
	keys      []service.Setting       // the settings a value may give, in the order they apply
	required  []string                // keys every value gives
}

// read parses v, a value of the flag given after values named names: its
// name, its settings' keys (known, each once, KEY=VALUE unless a switch),
// then check (which applies the settings to a config and checks what they
// say together) and the keys required. Errors after the name's own are
// said of the name.
func (g grammar) read(v string, names []string, check func(spec) error) (spec, error) {
	parts := strings.Split(v, ",")
	s := spec{name: parts[0]}
	same := func(a, b string) bool { return a == b }
	if k, _, ok := strings.Cut(s.name, "="); ok && slices.ContainsFunc(g.keys, func(st service.Setting) bool { return st.Key == k }) {
		// The NAME left out: it would name a folder "max-value=1MiB".
		return s, fmt.Errorf("%s %q: %s is a setting, not a name: NAME comes first (NAME,%s)", g.noun, v, k, v)
	}
	if g.folder {
		if s.name == "" || strings.Contains(s.name, "..") || filepath.IsAbs(s.name) || filepath.Clean(s.name) == "." {
			return s, fmt.Errorf("%s name %q: a folder under the root (not the root itself)", g.noun, s.name)
		}
		same = func(a, b string) bool { return filepath.Clean(a) == filepath.Clean(b) }
	} else if err := g.checkName(s.name); err != nil {
		return s, err
	}
	if slices.ContainsFunc(names, func(n string) bool { return same(n, s.name) }) {
		return s, fmt.Errorf("%s %s %s", g.noun, s.name, g.twice)
	}
	bad := func(format string, args ...any) (spec, error) {
		return s, fmt.Errorf("%s %s: "+format, append([]any{g.noun, s.name}, args...)...)
	}
	given := map[string]string{}
	for _, p := range parts[1:] {
		k, val, hasVal := strings.Cut(p, "=")
		i := slices.IndexFunc(g.keys, func(st service.Setting) bool { return st.Key == k })
		switch _, dup := given[k]; {
		case i < 0:
			return bad("unknown setting %q; the settings are %s", k, service.KeyList(g.keys))
		case !hasVal && !g.keys[i].Switch():
			return bad("%q is not key=value", p)
		case dup:
			return bad("%s given twice", k)
		}
		given[k] = val
	}
	for _, k := range g.keys {
		if val, ok := given[k.Key]; ok {
			s.settings = append(s.settings, setting{k.Key, val})
		}
	}
	if err := check(s); err != nil {
		return bad("%w", err)
	}
	for _, k := range g.keys {
		if slices.Contains(g.required, k.Key) && !s.has(k.Key) {
			return bad("no %s=%s", k.Key, k.Value)
		}
	}
	return s, nil
}

// readConfig reads v as g's value into a config C of zero value, applying
// its settings with set (C's Set).
func readConfig[C any](g grammar, v string, names []string, set func(c *C, key, value string) error) (spec, C, error) {
	var cfg C
	s, err := g.read(v, names, func(s spec) error {
		return s.apply(func(key, value string) error { return set(&cfg, key, value) })
	})
	return s, cfg, err
}
