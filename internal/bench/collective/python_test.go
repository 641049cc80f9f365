package collective

import (
	"context"
	"errors"
	"io"
	"testing"

	"github.com/tensorwire/tensorwire/internal/bench"
)

// The flags of --lang python: what it cannot run is a usage error, before
// any process starts.
func TestPython_Usage(t *testing.T) {
	env := bench.Env{Stdout: io.Discard, Stderr: io.Discard}
	for _, args := range [][]string{
		{"--lang", "ruby"},
		{"--lang", "python", "--ops", "broadcast"},
		{"--lang", "python", "--systems", "nccl"},
		{"--lang", "python", "--hosts", "netns", "--transports", "tcp"},
		{"--lang", "python", "--python", "/nonexistent/python3"},
	} {
		if err := Run(context.Background(), env, args); !errors.Is(err, bench.ErrUsage) {
			t.Errorf("%v: %v, want a usage error", args, err)
		}
	}
}
