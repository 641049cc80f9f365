// Package python holds tensorwire's Python client: the tensorwire package
// in this folder (pure Python over numpy and msgpack; see README.md), which
// speaks docs/protocol.md to Go nodes. Go code uses this package to start
// Python processes that import it, wherever the binary runs: the replay
// benchmark's Python trainer and writers (tensorwire bench replay
// --trainer python), the store benchmark's workers (tensorwire bench store
// --writers-lang python), and the other benchmarks' Python roles.
//
// python_test.go runs the Python test suite (tests/, against real Go nodes)
// as part of go test ./..., and skips, saying why, where no python3 has
// numpy and msgpack.
package python

import (
	"embed"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
)

//go:embed tensorwire/*.py
var files embed.FS

// Extract writes the tensorwire Python package into dir, as
// dir/tensorwire/*.py, so that a Python started with PYTHONPATH=dir imports
// this build's client. dir must exist; files already there are replaced.
func Extract(dir string) error {
	return fs.WalkDir(files, ".", func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		dst := filepath.Join(dir, filepath.FromSlash(path))
		if d.IsDir() {
			return os.MkdirAll(dst, 0o755)
		}
		b, err := files.ReadFile(path)
		if err != nil {
			return err
		}
		if err := os.WriteFile(dst, b, 0o644); err != nil {
			return fmt.Errorf("extracting the Python client: %w", err)
		}
		return nil
	})
}
