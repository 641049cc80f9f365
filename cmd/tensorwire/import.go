package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"strings"
	"time"

	"github.com/tensorwire/tensorwire/importer"
)

var importCmd = command{
	name: "import",
	usage: "tensorwire import idx [--force] --images F --labels F [--images F --labels F ...] PREFIX\n" +
		"  tensorwire import npy [--force] key=FILE.npy ... PREFIX",
	help: "build an on-disk dataset from IDX image/label files (MNIST family, gzipped or not: images uint8 [N, H, W], " +
		"labels int64 [N], pairs concatenated in order) or from NumPy .npy files (nested keys joined by /), with progress",
	run: runImport,
}

// files collects a repeated flag's values.
type files []string

func (f *files) String() string     { return strings.Join(*f, ",") }
func (f *files) Set(v string) error { *f = append(*f, v); return nil }

func runImport(ctx context.Context, args []string, _, stderr io.Writer) error {
	if len(args) == 0 || (args[0] != "idx" && args[0] != "npy") {
		return fmt.Errorf("%w: want idx or npy", errUsage)
	}
	format := args[0]
	fs := flag.NewFlagSet("import "+format, flag.ContinueOnError)
	force := fs.Bool("force", false, "replace PREFIX if it holds a dataset (or is an empty folder); nothing else is ever replaced")
	var images, labels files
	if format == "idx" {
		fs.Var(&images, "images", "IDX images file (repeatable)")
		fs.Var(&labels, "labels", "IDX labels file (repeatable, one per --images)")
	}
	pos, err := parse(fs, args[1:])
	if err != nil {
		return err
	}
	if len(pos) == 0 {
		return fmt.Errorf("%w: missing PREFIX", errUsage)
	}
	prefix := pos[len(pos)-1]
	opts := importer.Options{Force: *force, Progress: stderr}
	start := time.Now()
	var n int
	switch format {
	case "idx":
		if len(pos) != 1 {
			return fmt.Errorf("%w: unexpected arguments %q", errUsage, pos[:len(pos)-1])
		}
		if len(images) == 0 || len(images) != len(labels) {
			return fmt.Errorf("%w: give --images and --labels in pairs (%d and %d given)", errUsage, len(images), len(labels))
		}
		pairs := make([]importer.Pair, len(images))
		for i := range images {
			pairs[i] = importer.Pair{Images: images[i], Labels: labels[i]}
		}
		n, err = importer.IDX(ctx, prefix, pairs, opts)
	case "npy":
		var fls []importer.File
		for _, a := range pos[:len(pos)-1] {
			f, perr := parseNPYArg(a)
			if perr != nil {
				return fmt.Errorf("%w: %v", errUsage, perr)
			}
			fls = append(fls, f)
		}
		if len(fls) == 0 {
			return fmt.Errorf("%w: no key=FILE.npy arguments", errUsage)
		}
		n, err = importer.NPY(ctx, prefix, fls, opts)
	}
	if errors.Is(err, importer.ErrExists) {
		return fmt.Errorf("%w (--force replaces it)", err)
	}
	if err != nil {
		return err
	}
	slog.Info("imported", "prefix", prefix, "rows", n, "took", time.Since(start).Round(time.Millisecond))
	return nil
}

// parseNPYArg parses the command line's key=FILE.npy, nested keys joined by
// "/".
func parseNPYArg(s string) (importer.File, error) {
	k, p, ok := strings.Cut(s, "=")
	if !ok || k == "" || p == "" {
		return importer.File{}, fmt.Errorf("%q is not key=FILE.npy", s)
	}
	return importer.File{Key: strings.Split(k, "/"), Path: p}, nil
}
