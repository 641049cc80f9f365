package replay

import (
	"encoding/json"
	"errors"
	"slices"
	"strings"
	"testing"
)

func TestParseSampler_RoundTrip(t *testing.T) {
	for _, tc := range []struct {
		text    string
		sampler Sampler
		out     string
	}{
		{"uniform", Uniform(), "uniform"},
		{"without_replacement", WithoutReplacement(), "without_replacement"},
		{"fifo", FIFO(), "fifo"},
		{"prioritized(alpha=0.7, beta=0.9)", Prioritized(0.7, 0.9), "prioritized(alpha=0.7, beta=0.9)"},
		{"prioritized", Prioritized(0.6, 0.4), "prioritized(alpha=0.6, beta=0.4)"},
		{"prioritized(beta=1)", Prioritized(0.6, 1), "prioritized(alpha=0.6, beta=1)"},
	} {
		s, err := ParseSampler(tc.text)
		if err != nil || s != tc.sampler {
			t.Errorf("ParseSampler(%q) = %v, %v; want %v", tc.text, s, err, tc.sampler)
			continue
		}
		text, err := s.MarshalText()
		if err != nil || string(text) != tc.out || s.String() != tc.out {
			t.Errorf("%v: MarshalText %q, %v; String %q; want %q", s, text, err, s.String(), tc.out)
		}
		var back Sampler
		if err := back.UnmarshalText(text); err != nil || back != s {
			t.Errorf("UnmarshalText(%q) = %v, %v; want %v", text, back, err, s)
		}
	}
	if got := (Sampler{}).String(); got != "uniform" {
		t.Errorf("the zero Sampler is %q, want uniform", got)
	}
	for _, bad := range []string{"stack", "", "uniform(alpha=1)", "prioritized(alpha=-1)", "prioritized(gamma=1)"} {
		if _, err := ParseSampler(bad); !errors.Is(err, ErrConfig) {
			t.Errorf("ParseSampler(%q): %v; want ErrConfig", bad, err)
		}
	}
	if got := SamplerKinds(); !slices.Equal(got, []string{"uniform", "without_replacement", "prioritized", "fifo", "lifo", "max_heap", "min_heap"}) {
		t.Errorf("SamplerKinds() = %v", got)
	}
	for _, k := range SamplerKinds() {
		if s, err := ParseSampler(k); err != nil || s.Kind() != k {
			t.Errorf("ParseSampler(%q) = %v, %v", k, s, err)
		}
	}
}

func TestSampler_WithParam(t *testing.T) {
	s, err := Prioritized(0.6, 0.4).WithParam("beta", 0.9)
	if err != nil || s != Prioritized(0.6, 0.9) {
		t.Fatalf("WithParam(beta, 0.9) = %v, %v", s, err)
	}
	if p := s.Params(); len(p) != 3 || p["alpha"] != 0.6 || p["beta"] != 0.9 || p["eps"] != 1e-8 {
		t.Errorf("Params() = %v", p)
	}
	if p := Uniform().Params(); len(p) != 0 {
		t.Errorf("Uniform().Params() = %v", p)
	}
	for _, tc := range []struct {
		s    Sampler
		name string
		v    float64
		want string
	}{
		{Uniform(), "alpha", 1, "uniform takes no parameters (alpha given)"},
		{Prioritized(1, 1), "gamma", 1, "prioritized takes no gamma"},
		{Prioritized(1, 1), "alpha", -1, "alpha=-1"},
	} {
		if _, err := tc.s.WithParam(tc.name, tc.v); !errors.Is(err, ErrConfig) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%v.WithParam(%s, %g): %v; want ErrConfig saying %q", tc.s, tc.name, tc.v, err, tc.want)
		}
	}
}

func TestParseWriter_RoundTrip(t *testing.T) {
	for _, tc := range []struct {
		text   string
		writer Writer
	}{
		{"round_robin", RoundRobin()},
		{"top_k(key=reward)", TopK("reward")},
		{"top_k(key=next/reward)", TopK("next", "reward")},
	} {
		w, err := ParseWriter(tc.text)
		if err != nil || !w.equal(tc.writer) {
			t.Errorf("ParseWriter(%q) = %v, %v; want %v", tc.text, w, err, tc.writer)
			continue
		}
		text, err := w.MarshalText()
		if err != nil || string(text) != tc.text || w.String() != tc.text {
			t.Errorf("%v: MarshalText %q, %v; want %q", w, text, err, tc.text)
		}
		var back Writer
		if err := back.UnmarshalText(text); err != nil || !back.equal(w) || back.Kind() != w.Kind() || !slices.Equal(back.Key(), w.Key()) {
			t.Errorf("UnmarshalText(%q) = %v, %v; want %v", text, back, err, w)
		}
	}
	if w := (Writer{}); w.String() != "round_robin" || !w.equal(RoundRobin()) {
		t.Errorf("the zero Writer is %v, want round_robin", w)
	}
	for _, bad := range []string{"", "fifo", "top_k", "top_k()", "top_k(key=)", "top_k(key=a//b)", "round_robin(key=a)", "top_k(reward)"} {
		if w, err := ParseWriter(bad); !errors.Is(err, ErrConfig) {
			t.Errorf("ParseWriter(%q) = %v, %v; want ErrConfig", bad, w, err)
		}
	}
}

// TestConfig_KindsRefused: a Config's sampler and writer are checked by
// the same rules as their text.
func TestConfig_KindsRefused(t *testing.T) {
	for _, tc := range []struct {
		name string
		cfg  Config
		want string
	}{
		{"top-k without a key", Config{Capacity: 4, Writer: TopK()}, "top-k writer without a key"},
		{"prioritized out of range", Config{Capacity: 4, Sampler: Prioritized(-1, 0)}, "alpha=-1"},
	} {
		if _, err := Create(t.TempDir(), tc.cfg); !errors.Is(err, ErrConfig) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v; want ErrConfig saying %q", tc.name, err, tc.want)
		}
	}
}

// TestMeta_UnknownKindsRefused: replay.json naming a sampler or writer
// kind this version does not know is refused, naming it.
func TestMeta_UnknownKindsRefused(t *testing.T) {
	good := `{"format":"tensorwire.replay","version":1,"capacity":4,"sampler":{"kind":"uniform"},"writer":{"kind":"round_robin"}}`
	if _, _, err := parseMeta([]byte(good)); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct{ from, to, want string }{
		{`"uniform"`, `"stack"`, `unknown kind "stack"`},
		{`"round_robin"`, `"newest"`, `writer "newest"`},
	} {
		_, _, err := parseMeta([]byte(strings.Replace(good, tc.from, tc.to, 1)))
		if !errors.Is(err, ErrConfig) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("replay.json with %s: %v; want ErrConfig saying %q", tc.to, err, tc.want)
		}
	}
	var m meta
	if err := json.Unmarshal([]byte(good), &m); err != nil || m.Writer.Kind != writerRoundRobin {
		t.Errorf("writer decoded as %+v, %v", m.Writer, err)
	}
}
