package main

import (
	"os"
	"testing"
)

// TestMain runs the ranks when the test binary is re-executed as one.
func TestMain(m *testing.M) {
	if os.Getenv(envRank) != "" {
		if err := rank(); err != nil {
			os.Stderr.WriteString("regression rank: " + err.Error() + "\n")
			os.Exit(1)
		}
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// TestRegression_GradientsMatch: 4 ranks as processes, on both transports;
// every rank's gradient equals the single-process one to 1e-6.
func TestRegression_GradientsMatch(t *testing.T) {
	if testing.Short() {
		t.Skip("starts processes")
	}
	for _, tr := range []string{"shm", "tcp"} {
		t.Run(tr, func(t *testing.T) {
			ok, err := run(os.Stdout, 4, 10000, tr)
			if err != nil {
				t.Fatal(err)
			}
			if !ok {
				t.Fatal("a rank's gradient differs from the single-process one")
			}
		})
	}
}
