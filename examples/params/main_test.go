package main

import "testing"

// TestRun runs the example, short, and fails if any of its checks does.
func TestRun(t *testing.T) {
	if err := run(3, 4, t.TempDir(), "", "params"); err != nil {
		t.Fatal(err)
	}
}
