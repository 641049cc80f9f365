package replay

import (
	"os/exec"
	"strings"
	"testing"
)

// TestRunPyJSON: a script's figures are its last line of output; a script
// that fails says why by its last line of stderr, or, with none, by how
// it ended (an empty reason would leave its row unmarked, as if it ran).
func TestRunPyJSON(t *testing.T) {
	if _, err := exec.LookPath("sh"); err != nil {
		t.Skip("no sh")
	}
	sh := func(script string) *exec.Cmd { return exec.Command("sh", "-c", script) }
	var r SliceResult
	if failed, err := runPyJSON(sh(`echo warming up; echo '{"slices": 7, "bad_slices": 1}'`), &r); failed != "" || err != nil || r.Slices != 7 || r.Bad != 1 {
		t.Errorf("figures: failed %q, %v, %+v", failed, err, r)
	}
	if failed, _ := runPyJSON(sh(`echo Traceback >&2; echo 'ModuleNotFoundError: torchrl' >&2; exit 1`), &r); failed != "ModuleNotFoundError: torchrl" {
		t.Errorf("a failed script: %q, want its last line of stderr", failed)
	}
	if failed, _ := runPyJSON(sh(`exit 3`), &r); !strings.Contains(failed, "exit status 3") {
		t.Errorf("a script failing silently: %q, want how it ended", failed)
	}
	if failed, err := runPyJSON(sh(`echo not json`), &r); failed != "" || err == nil {
		t.Errorf("output not JSON: failed %q, %v; want an error", failed, err)
	}
}
