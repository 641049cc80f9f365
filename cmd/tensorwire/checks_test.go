package main

import (
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// TestNode_ChecksConfigBeforeMakingServices: a node whose token file,
// TLS files, root or --listen is bad fails before it makes any buffer or
// store: a failed start leaves nothing under the root (a buffer made then
// would fix its capacity for the next start), and a typo in --root is not
// created.
func TestNode_ChecksConfigBeforeMakingServices(t *testing.T) {
	goodToken := tokenFile(t, "s3cret", 0o600)
	for _, tc := range []struct {
		name string
		args []string
		code int
		msg  string
	}{
		{"world-readable token", []string{"--listen", "127.0.0.1:0", "--token-file", tokenFile(t, "s3cret", 0o644)}, 1, "other users"},
		{"missing token", []string{"--listen", "127.0.0.1:0", "--token-file", "/nonexistent/token"}, 1, "/nonexistent/token"},
		{"missing TLS files", []string{"--listen", "127.0.0.1:0", "--tls-cert", "/nonexistent/c.pem", "--tls-key", "/nonexistent/k.pem"}, 1, "/nonexistent/c.pem"},
		{"malformed listen with a token", []string{"--listen", "nohostport", "--token-file", goodToken}, 2, "--listen nohostport"},
		{"listen port out of range with a token", []string{"--listen", "127.0.0.1:99999", "--token-file", goodToken}, 2, "--listen 127.0.0.1:99999"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			root := t.TempDir()
			args := append(tc.args, "--root", root, "--buffer", "buf,capacity=10", "--store", "st")
			code, _, errOut := runNodeInProcess(t, args...)
			if code != tc.code || !strings.Contains(errOut, tc.msg) {
				t.Errorf("exit %d, stderr %q; want exit %d mentioning %q", code, errOut, tc.code, tc.msg)
			}
			if entries, _ := os.ReadDir(root); len(entries) > 0 {
				var names []string
				for _, e := range entries {
					names = append(names, e.Name())
				}
				t.Errorf("the failed start left %v under the root", names)
			}
		})
	}
	t.Run("listen address in use", func(t *testing.T) {
		busy, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		defer busy.Close()
		root := t.TempDir()
		code, _, errOut := runNodeInProcess(t, "--listen", busy.Addr().String(), "--root", root,
			"--buffer", "buf,capacity=10", "--store", "st", "--insecure")
		if code != 1 || !strings.Contains(errOut, "--listen "+busy.Addr().String()) {
			t.Errorf("exit %d, stderr %q; want exit 1 naming --listen", code, errOut)
		}
		if entries, _ := os.ReadDir(root); len(entries) > 0 {
			t.Errorf("the failed start left %d entries under the root", len(entries))
		}
	})
	t.Run("missing root", func(t *testing.T) {
		root := filepath.Join(t.TempDir(), "typo")
		code, _, errOut := runNodeInProcess(t, "--listen", "127.0.0.1:0", "--root", root, "--buffer", "buf,capacity=10")
		if code != 1 || !strings.Contains(errOut, root) {
			t.Errorf("exit %d, stderr %q; want exit 1 naming %s", code, errOut, root)
		}
		if _, err := os.Stat(root); err == nil {
			t.Errorf("the node created the missing root %s", root)
		}
	})
}

// TestMLP_ForceReplacesOnlyATensorDict: "mlp --force" replaces a
// TensorDict or an empty folder, never a folder of other files (it removed
// the whole folder, whatever it held).
func TestMLP_ForceReplacesOnlyATensorDict(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "precious")
	mustWrite(t, filepath.Join(dir, "thesis.txt"), "years of work")
	code, _, errOut := runCLI(t, "mlp", "--force", "--sizes", "4,2", dir)
	if code != 1 || !strings.Contains(errOut, "not a TensorDict") {
		t.Errorf("mlp --force on a folder of other files: exit %d, stderr %q; want exit 1 refusing it", code, errOut)
	}
	mustRead(t, filepath.Join(dir, "thesis.txt"), "years of work")

	file := filepath.Join(t.TempDir(), "notes")
	mustWrite(t, file, "notes")
	if code, _, errOut := runCLI(t, "mlp", "--force", "--sizes", "4,2", file); code != 1 {
		t.Errorf("mlp --force on a file: exit %d, stderr %q; want 1", code, errOut)
	}
	mustRead(t, file, "notes")

	// What --force is for: a TensorDict (an earlier mlp), an empty folder.
	prefix := filepath.Join(t.TempDir(), "params")
	for i, args := range [][]string{{"--sizes", "4,2"}, {"--force", "--sizes", "8,3"}} {
		if code, _, errOut := runCLI(t, append(append([]string{"mlp"}, args...), prefix)...); code != 0 {
			t.Fatalf("mlp %d: exit %d: %s", i, code, errOut)
		}
	}
	empty := t.TempDir()
	if code, _, errOut := runCLI(t, "mlp", "--force", "--sizes", "4,2", empty); code != 0 {
		t.Errorf("mlp --force on an empty folder: exit %d: %s", code, errOut)
	}
}

// TestMLP_SizesBounded: a width past what a served MLP takes (1<<20,
// mlp.New) is a usage error, not a crash (a width product that overflows
// was a nil pointer dereference).
func TestMLP_SizesBounded(t *testing.T) {
	prefix := filepath.Join(t.TempDir(), "params")
	cmd := exec.Command(cliBinary(t), "mlp", "--sizes", "4294967296,4294967296", prefix)
	out, err := cmd.CombinedOutput()
	code := cmd.ProcessState.ExitCode()
	if err != nil && code < 0 {
		t.Fatal(err)
	}
	if code != 2 || strings.Contains(string(out), "panic") || !strings.Contains(string(out), "--sizes") {
		t.Errorf("exit %d, output:\n%.600s\nwant exit 2 with a usage message about --sizes", code, out)
	}
	if _, err := os.Stat(prefix); err == nil {
		t.Errorf("%s was made", prefix)
	}
}

// TestStats_TimeoutMustBePositive: "stats --timeout" of zero or less is a usage
// error, not a failed scrape ("context deadline exceeded", exit 1).
func TestStats_TimeoutMustBePositive(t *testing.T) {
	for _, d := range []string{"0", "-1s"} {
		code, _, errOut := runCLI(t, "stats", "--timeout", d, "127.0.0.1:1")
		if code != 2 || !strings.Contains(errOut, "--timeout") {
			t.Errorf("--timeout %s: exit %d, stderr %q; want exit 2 naming --timeout", d, code, errOut)
		}
	}
}

// TestMLP_ForceKeepsOldOnFailure: "mlp --force" whose write fails (a
// full disk; here a file size limit) leaves the weights that were there:
// it removed them before writing the new ones.
func TestMLP_ForceKeepsOldOnFailure(t *testing.T) {
	prefix := filepath.Join(t.TempDir(), "params")
	if code, _, errOut := runCLI(t, "mlp", "--sizes", "8,4", prefix); code != 0 {
		t.Fatalf("mlp: exit %d: %s", code, errOut)
	}
	// 100 blocks of 512 bytes: the new 800x800 float32 weights do not fit.
	cmd := exec.Command("sh", "-c", `ulimit -f 100 && exec "$0" mlp --force --sizes 800,800 "$1"`, cliBinary(t), prefix)
	out, err := cmd.CombinedOutput()
	if err == nil {
		t.Skipf("the write did not fail under ulimit -f: %s", out)
	}
	if _, err := os.Stat(filepath.Join(prefix, "meta.json")); err != nil {
		t.Errorf("after a failed mlp --force (%s), the old weights are gone: %v", strings.TrimSpace(string(out)), err)
	}
	if entries, _ := os.ReadDir(filepath.Dir(prefix)); len(entries) != 1 {
		t.Errorf("the failed write left %d entries beside the prefix, want only it", len(entries))
	}
}

// TestSpecs_NameLeftOut: a service flag's value that begins with one of
// its settings (the NAME left out) is a usage error; it made a store or a
// buffer named "max-value=1MiB".
func TestSpecs_NameLeftOut(t *testing.T) {
	for _, args := range [][]string{
		{"--store", "max-value=1MiB"},
		{"--buffer", "sampler=uniform,capacity=5"},
		{"--buffer", "capacity=5"},
	} {
		root := t.TempDir()
		code, _, errOut := runNodeInProcess(t, append([]string{"--listen", "127.0.0.1:0", "--root", root}, args...)...)
		if code != 2 || !strings.Contains(errOut, "NAME") {
			t.Errorf("%q: exit %d, stderr %q; want exit 2 asking for the NAME", args, code, errOut)
		}
		if entries, _ := os.ReadDir(root); len(entries) > 0 {
			t.Errorf("%q: made %s under the root", args, entries[0].Name())
		}
	}
}
