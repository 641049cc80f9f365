package store

import (
	"context"
	"errors"
	"io"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/tensorwire/tensorwire/internal/bench"
	"github.com/tensorwire/tensorwire/internal/bench/benchkit"
	"github.com/tensorwire/tensorwire/internal/bench/benchtest"
)

var testSelf = []string{"bench", "store"}

func testEnv(stdout, stderr io.Writer) bench.Env {
	return bench.Env{Stdout: stdout, Stderr: stderr, Self: testSelf}
}

// TestMain lets Run re-execute the test binary for a role, as
// cmd/tensorwire does.
func TestMain(m *testing.M) { benchtest.Main(m, Run, testSelf...) }

// keys returns the dotted keys of a JSON object, array elements' keys once.
func keys(prefix string, v any, out map[string]bool) {
	switch v := v.(type) {
	case map[string]any:
		for k, x := range v {
			out[prefix+k] = true
			keys(prefix+k+".", x, out)
		}
	case []any:
		for _, x := range v {
			keys(prefix, x, out)
		}
	}
}

// TestRun_Short runs every part, small and short, and checks the JSON has
// exactly the keys and that nothing was lost, duplicated or
// damaged.
func TestRun_Short(t *testing.T) {
	if testing.Short() {
		t.Skip("starts some 80 processes")
	}
	jsonFile := filepath.Join(t.TempDir(), "out.json")
	out := benchtest.RunJSON(t, Run, testSelf, []string{"--mb", "1", "--workers", "2",
		"--duration", "600ms", "--json", jsonFile, "--root", t.TempDir()}, jsonFile)
	t.Logf("\n%s", out.Stdout)
	v := out.JSON
	got := map[string]bool{}
	keys("", v, got)
	want := []string{"broadcast", "broadcast.mode", "broadcast.mb", "broadcast.workers", "broadcast.p50_ms", "broadcast.p99_ms",
		"rollouts", "rollouts.workers", "rollouts.items_per_s", "rollouts.append_p50_ms", "rollouts.append_p99_ms",
		"rollouts.lost", "rollouts.duplicated", "watch", "watch.watchers", "watch.p50_ms", "watch.p99_ms"}
	var gotKeys []string
	for k := range got {
		gotKeys = append(gotKeys, k)
	}
	slices.Sort(gotKeys)
	slices.Sort(want)
	if !slices.Equal(gotKeys, want) {
		t.Errorf("JSON keys %v, want %v", gotKeys, want)
	}
	ro := v["rollouts"].(map[string]any)
	if ro["lost"].(float64) != 0 || ro["duplicated"].(float64) != 0 {
		t.Errorf("rollouts lost %v, duplicated %v", ro["lost"], ro["duplicated"])
	}
	if strings.Contains(out.Stdout, "bad CRC") {
		for _, line := range strings.Split(out.Stdout, "\n") {
			f := strings.Fields(line)
			if len(f) == 9 && (f[0] == "ref" || f[0] == "bytes" || f[0] == "tcp") && f[8] != "0" {
				t.Errorf("bad CRCs: %s", line)
			}
		}
	}
}

func TestRun_Usage(t *testing.T) {
	for _, args := range [][]string{{"--mb", "x"}, {"--workers", "0"}, {"--modes", "carrier-pigeon"}, {"--parts", "all"},
		{"--duration", "0s"}, {"extra"}} {
		err := Run(context.Background(), testEnv(io.Discard, io.Discard), args)
		if !errors.Is(err, ErrUsage) {
			t.Errorf("%q: %v, want a usage error", args, err)
		}
	}
}

// checkRollouts runs the rollouts part with args added and checks what every
// run must hold: items acknowledged, none lost or duplicated, no bad CRC
// in the drainer's row of the table. It returns the JSON's rollouts and
// the table.
func checkRollouts(t *testing.T, args ...string) (map[string]any, string) {
	t.Helper()
	jsonFile := filepath.Join(t.TempDir(), "out.json")
	out := benchtest.RunJSON(t, Run, testSelf, append([]string{"--parts", "rollouts", "--duration", "1s",
		"--json", jsonFile, "--root", t.TempDir()}, args...), jsonFile)
	t.Logf("\n%s", out.Stdout)
	ro := out.JSON["rollouts"].(map[string]any)
	if ro["lost"].(float64) != 0 || ro["duplicated"].(float64) != 0 || ro["items_per_s"].(float64) <= 0 {
		t.Errorf("rollouts: lost %v, duplicated %v, %v items/s", ro["lost"], ro["duplicated"], ro["items_per_s"])
	}
	rows := 0
	for _, line := range strings.Split(out.Stdout, "\n") {
		f := strings.Fields(line)
		if len(f) != 10 {
			continue
		}
		if _, err := strconv.ParseFloat(f[0], 64); err != nil {
			continue // the header or the rule, not the row: items/s ... bad CRC
		}
		rows++
		if f[9] != "0" {
			t.Errorf("bad CRCs: %s", line)
		}
	}
	if rows != 1 {
		t.Errorf("%d rows of the rollouts' table found, want 1", rows)
	}
	return ro, out.Stdout
}

// TestRun_Extend: the rollouts by Extend lose and duplicate nothing, and
// say how many items a call carried.
func TestRun_Extend(t *testing.T) {
	if testing.Short() {
		t.Skip("starts 6 processes")
	}
	ro, table := checkRollouts(t, "--extend", "3")
	if ro["items_per_call"] != 3.0 {
		t.Errorf("items_per_call %v, want 3", ro["items_per_call"])
	}
	if !strings.Contains(table, "extending by 3 items") {
		t.Errorf("the table does not say the items went by Extend")
	}
}

// TestRun_PythonWriters: the rollouts with Python workers (this build's
// client, by Append and by Extend) lose, duplicate and damage nothing, as
// the Go drainer checks every item; the JSON says the workers' language.
func TestRun_PythonWriters(t *testing.T) {
	if testing.Short() {
		t.Skip("starts 6 processes, 4 of them Python")
	}
	if _, err := benchkit.FindPython("", "numpy, msgpack"); err != nil {
		t.Skipf("no python3 with numpy and msgpack (apt-get install python3-numpy python3-msgpack): %v", err)
	}
	for _, extend := range []string{"1", "3"} {
		t.Run("extend="+extend, func(t *testing.T) {
			ro, _ := checkRollouts(t, "--writers-lang", "python", "--extend", extend)
			if ro["writers_lang"] != "python" {
				t.Errorf("writers_lang %v, want python", ro["writers_lang"])
			}
		})
	}
}
