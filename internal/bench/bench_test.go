package bench

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"strings"
	"testing"
)

func newFlags() *flag.FlagSet {
	fs := flag.NewFlagSet("x", flag.ContinueOnError)
	fs.Int("rows", 10, "rows of the dataset")
	fs.String("json", "", "also write the figures as JSON to this `file`")
	fs.Bool("child", false, "internal")
	return fs
}

func TestParse(t *testing.T) {
	for _, tc := range []struct {
		args  []string
		usage bool // a usage error
		help  bool
	}{
		{nil, false, false},
		{[]string{"--rows", "5", "-json", "f"}, false, false},
		{[]string{"--rows", "five"}, true, false},
		{[]string{"--nope"}, true, false},
		{[]string{"--rows", "5", "extra"}, true, false},
		{[]string{"-h"}, false, true},
		{[]string{"--help"}, false, true},
	} {
		var out strings.Builder
		err := Parse("x", newFlags(), tc.args, &out, "child")
		if got := errors.Is(err, ErrUsage); got != tc.usage {
			t.Errorf("%q: %v, usage error %v, want %v", tc.args, err, got, tc.usage)
		}
		if got := errors.Is(err, flag.ErrHelp); got != tc.help {
			t.Errorf("%q: %v, help %v, want %v", tc.args, err, got, tc.help)
		}
		if tc.help {
			u := out.String()
			for _, want := range []string{"usage: tensorwire bench x [flags]", "go run ./benchmarks/x", "--rows int",
				"rows of the dataset (default 10)", "--json file", "docs/benchmarks.md"} {
				if !strings.Contains(u, want) {
					t.Errorf("usage lacks %q:\n%s", want, u)
				}
			}
			if strings.Contains(u, "child") || strings.Contains(u, "default false") || strings.Contains(u, `default ""`) {
				t.Errorf("usage shows the hidden flag:\n%s", u)
			}
		} else if out.Len() > 0 {
			t.Errorf("%q printed %q", tc.args, out.String())
		}
	}
}

func TestExitCode(t *testing.T) {
	for _, tc := range []struct {
		err         error
		interrupted bool
		code        int
		printed     string
	}{
		{nil, false, 0, ""},
		{fmt.Errorf("parse: %w", flag.ErrHelp), false, 0, ""},
		{Usagef("--rows must be at least %d", 5), false, 2, "x: --rows must be at least 5\nrun with -h"},
		{fmt.Errorf("stopped: %w", context.Canceled), true, 130, "x: interrupted"},
		{fmt.Errorf("stopped: %w", context.Canceled), false, 1, "x: stopped: context canceled"},
		{errors.New("verification failed"), false, 1, "x: verification failed"},
		{errors.New("disk full"), true, 1, "x: disk full"},
	} {
		var out strings.Builder
		if code := exitCode(&out, "x", tc.err, tc.interrupted); code != tc.code || !strings.HasPrefix(out.String(), tc.printed) {
			t.Errorf("exitCode(%v, %v) = %d printing %q, want %d printing %q", tc.err, tc.interrupted, code, out.String(), tc.code, tc.printed)
		}
	}
}
