package main

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/tensorwire/tensorwire/internal/nodeproc"
	"github.com/tensorwire/tensorwire/internal/testkit/proctest"
)

const readme = "../../README.md"

// readmeBlock returns the body of the fenced code block between the
// README's "<!-- begin NAME -->" and "<!-- end NAME -->" lines.
func readmeBlock(t *testing.T, name string) string {
	t.Helper()
	b, err := os.ReadFile(readme)
	if err != nil {
		t.Fatal(err)
	}
	_, rest, ok := strings.Cut(string(b), "<!-- begin "+name+" -->\n")
	block, _, ok2 := strings.Cut(rest, "<!-- end "+name+" -->")
	if !ok || !ok2 {
		t.Fatalf("README.md has no block between <!-- begin %s --> and <!-- end %s -->", name, name)
	}
	block = strings.TrimSpace(block)
	if !strings.HasPrefix(block, "```") || !strings.HasSuffix(block, "```") {
		t.Fatalf("the %s block is not one fenced code block:\n%s", name, block)
	}
	_, body, _ := strings.Cut(block, "\n") // after the opening fence and its language
	return strings.TrimSuffix(body, "```")
}

// TestReadme_Walkthrough runs the README's replay walkthrough as written:
// the shell block (its folder moved to a temporary one, its node on a free
// loopback port, the built command in place of "go run ./cmd/tensorwire")
// and then the Go client block, built as a program of this module, against
// that node.
func TestReadme_Walkthrough(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs programs")
	}
	dir := t.TempDir()
	shell := readmeBlock(t, "walkthrough-shell")
	goSrc := readmeBlock(t, "walkthrough-go")
	for _, want := range []string{`"/tmp/tw/token"`, `"/tmp/tw/root"`, `"localhost:7070"`, "rpc.WithToken(token)"} {
		if !strings.Contains(goSrc, want) {
			t.Errorf("the Go block lacks %s, which the shell block's paths and port imply", want)
		}
	}

	// The shell block, line by line (continuations joined).
	shell = strings.ReplaceAll(shell, "\\\n", " ")
	shell = strings.ReplaceAll(shell, "/tmp/tw", dir)
	var nodeArgs []string
	for line := range strings.Lines(shell) {
		line = strings.TrimSpace(line)
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		if rest, ok := strings.CutPrefix(line, "go run ./cmd/tensorwire "); ok {
			nodeArgs = strings.Fields(rest)
			continue
		}
		if out, err := exec.Command("sh", "-c", line).CombinedOutput(); err != nil {
			t.Fatalf("%s: %v\n%s", line, err, out)
		}
	}
	if len(nodeArgs) == 0 || nodeArgs[0] != "node" {
		t.Fatalf("the shell block runs no \"go run ./cmd/tensorwire node\":\n%s", shell)
	}
	for _, flag := range []string{"--token-file", "--buffer", "--listen"} {
		if !strings.Contains(strings.Join(nodeArgs, " "), flag+" ") {
			t.Errorf("the node line lacks %s: %q", flag, nodeArgs)
		}
	}
	if fi, err := os.Stat(filepath.Join(dir, "token")); err != nil || fi.Mode().Perm() != 0o600 {
		t.Errorf("the token file: %v, %v; want mode 0600", fi, err)
	}
	for i := range nodeArgs {
		if i > 0 && nodeArgs[i-1] == "--listen" {
			nodeArgs[i] = "127.0.0.1:0" // a free port, not the README's 7070
		}
	}
	stderr := &proctest.LockedBuffer{}
	node, err := nodeproc.Spawn(context.Background(), nodeproc.Child{
		Name: "the README's node", Path: cliBinary(t), Args: nodeArgs, Stderr: stderr,
	})
	if err != nil {
		t.Fatalf("%v; stderr:\n%s", err, stderr)
	}
	t.Cleanup(func() { node.Stop() })

	// The Go block, as walk/main.go of a folder in this module.
	if err := os.MkdirAll("testdata", 0o755); err != nil {
		t.Fatal(err)
	}
	src, err := os.MkdirTemp("testdata", "readme-walk-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		os.RemoveAll(src)
		os.Remove("testdata") // if empty
	})
	if err := os.WriteFile(filepath.Join(src, "main.go"), []byte(goSrc), 0o644); err != nil {
		t.Fatal(err)
	}
	bin := filepath.Join(dir, "walk")
	if out, err := exec.Command("go", "build", "-o", bin, "./"+src).CombinedOutput(); err != nil {
		t.Fatalf("go build of the README's Go block: %v\n%s", err, out)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	run := func(args ...string) string {
		t.Helper()
		out, err := exec.CommandContext(ctx, bin, append([]string{"-addr", node.Addr,
			"-token-file", filepath.Join(dir, "token")}, args...)...).CombinedOutput()
		if err != nil {
			t.Fatalf("the README's client: %v\n%s\nnode's stderr:\n%s", err, out, stderr)
		}
		return string(out)
	}
	first := run("-root", filepath.Join(dir, "root"))
	for _, want := range []string{"shared filesystem: true\n", "sample before min-size: waited 200ms, deadline exceeded\n",
		"sampled: [256] first reward: ", " weights: 256\n", "priorities updated: 256\n", "buffer holds: 1024\n"} {
		if !strings.Contains(first, want) {
			t.Errorf("the first run's output lacks %q:\n%s", want, first)
		}
	}
	second := run("-root", "")
	for _, want := range []string{"shared filesystem: false\n", "the buffer held enough already\n", "buffer holds: 2048\n"} {
		if !strings.Contains(second, want) {
			t.Errorf("the second run's output (rows as bytes) lacks %q:\n%s", want, second)
		}
	}
	if err := node.Stop(); err != nil {
		t.Errorf("stopping the node: %v\n%s", err, stderr)
	}
}
