package main

import (
	"strings"
	"testing"
)

// TestRun_Help checks that every subcommand, asked for -h or --help,
// prints its usage and each of its flags with its default to stdout and
// exits 0.
func TestRun_Help(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want []string // each in stdout
	}{
		{[]string{"node", "-h"}, []string{"tensorwire node --listen", "--checkpoint-every", "(default 1m0s)", "--listen", "--root", "--token-file", "--tls-cert", "--tls-key", "--buffer", "--insecure", "--coherent-storage"}},
		{[]string{"node", "--help"}, []string{"--checkpoint-every"}},
		{[]string{"node", "--root", "/x", "-h"}, []string{"--checkpoint-every"}},
		{[]string{"inspect", "-h"}, []string{"tensorwire inspect", "--json", "--stats"}},
		{[]string{"inspect", "--help"}, []string{"--stats"}},
		{[]string{"import", "-h"}, []string{"tensorwire import idx", "tensorwire import npy"}},
		{[]string{"import", "idx", "-h"}, []string{"tensorwire import idx", "--images", "--labels", "--force"}},
		{[]string{"import", "npy", "--help"}, []string{"tensorwire import npy", "--force"}},
		{[]string{"bench", "-h"}, []string{"tensorwire bench replay"}},
		{[]string{"bench", "replay", "-h"}, []string{"--duration", "--writers", "--capacity"}},
		{[]string{"help", "node"}, []string{"--checkpoint-every"}},
	} {
		t.Run(strings.Join(tc.args, " "), func(t *testing.T) {
			code, out, errOut := runCLI(t, tc.args...)
			if code != 0 {
				t.Errorf("exit %d, want 0; stderr:\n%s", code, errOut)
			}
			for _, w := range tc.want {
				if !strings.Contains(out, w) {
					t.Errorf("stdout lacks %q:\n%s", w, out)
				}
			}
		})
	}
}
