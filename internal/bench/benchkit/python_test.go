package benchkit

import (
	"os/exec"
	"slices"
	"strings"
	"testing"
)

func TestFindPython(t *testing.T) {
	if _, err := exec.LookPath("python3"); err != nil {
		t.Skip("no python3 on PATH")
	}
	for _, c := range []struct {
		interp, modules string
		want            string // the interpreter, or "" for an error holding err
		err             string
	}{
		{"", "sys", "python3", ""},
		{"python3", "sys, json", "python3", ""},
		{"python3", "tensorwire_no_such_module", "", "tensorwire_no_such_module"},
		{"/nonexistent/python3", "sys", "", "/nonexistent/python3"},
	} {
		got, err := FindPython(c.interp, c.modules)
		switch {
		case c.want != "" && (err != nil || got != c.want):
			t.Errorf("FindPython(%q, %q) = %q, %v; want %q", c.interp, c.modules, got, err, c.want)
		case c.want == "" && (err == nil || !strings.Contains(err.Error(), c.err)):
			t.Errorf("FindPython(%q, %q) = %q, %v; want an error naming %q", c.interp, c.modules, got, err, c.err)
		}
	}
}

func TestPythonEnv(t *testing.T) {
	t.Setenv("PYTHONPATH", "/elsewhere")
	env := PythonEnv("/client")
	if !slices.Contains(env, "PYTHONPATH=/client:/elsewhere") || !slices.Contains(env, "PYTHONDONTWRITEBYTECODE=1") {
		t.Errorf("PythonEnv: %v", env[len(env)-2:])
	}
}
