package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/tensorwire/tensorwire/serve/mlp"
)

var mlpCmd = command{
	name:  "mlp",
	usage: "tensorwire mlp [--sizes N,N,...] [--seed S] [--force] PREFIX",
	help: "write the parameters of a randomly initialised MLP (Linear layers of the given widths, ReLU between them) " +
		"at PREFIX, in the layout PyTorch's TensorDict(model.state_dict(), batch_size=[]).memmap_(PREFIX) writes " +
		"(\"0.weight\", \"0.bias\", \"2.weight\", ...), so that `tensorwire node --serve NAME,params=P` has weights to serve " +
		"without PyTorch or tensordict installed; PyTorch's uniform(-1/sqrt(in), 1/sqrt(in)) initialisation, seeded " +
		"(docs/serve.md, \"Weights\")",
	run: runMLP,
}

func runMLP(_ context.Context, args []string, stdout, _ io.Writer) error {
	fs := flag.NewFlagSet("mlp", flag.ContinueOnError)
	sizesFlag := fs.String("sizes", "64,256,256,16", "the layers' widths, input first: N,N[,N...]")
	seed := fs.Uint64("seed", 1, "seed of the random initialisation")
	force := fs.Bool("force", false, "replace the TensorDict (or empty folder) at PREFIX; nothing else is ever replaced")
	pos, err := parse(fs, args)
	if err != nil {
		return err
	}
	if len(pos) != 1 {
		return fmt.Errorf("%w: want one PREFIX, got %q", errUsage, pos)
	}
	var sizes []int
	for _, f := range strings.Split(*sizesFlag, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || n < 1 || n > 1<<20 { // 1<<20: the widest layer a node serves (mlp.New)
			return fmt.Errorf("%w: --sizes %s: %q is not a width (a whole number, 1 to %d)", errUsage, *sizesFlag, f, 1<<20)
		}
		sizes = append(sizes, n)
	}
	if len(sizes) < 2 {
		return fmt.Errorf("%w: --sizes %s: want an input and an output width at least", errUsage, *sizesFlag)
	}
	prefix := pos[0]
	if _, err := os.Stat(prefix); err == nil && !*force {
		return fmt.Errorf("%s exists: --force replaces it", prefix)
	} else if err != nil && !errors.Is(err, os.ErrNotExist) {
		return err
	}
	if *force {
		// Only a TensorDict (its meta.json) or an empty folder is replaced:
		// a typo must not remove a folder of other files.
		if fi, err := os.Lstat(prefix); err == nil {
			entries, _ := os.ReadDir(prefix)
			_, merr := os.Lstat(filepath.Join(prefix, "meta.json"))
			if !fi.IsDir() || (len(entries) > 0 && merr != nil) {
				return fmt.Errorf("%s is not a TensorDict (no meta.json) nor an empty folder: --force replaces only those", prefix)
			}
		}
	}
	// Written beside PREFIX and renamed into place once complete: a write
	// that fails (a full disk) leaves what was there.
	clean := filepath.Clean(prefix)
	if err := os.MkdirAll(filepath.Dir(clean), 0o755); err != nil {
		return err
	}
	tmp, err := os.MkdirTemp(filepath.Dir(clean), "."+filepath.Base(clean)+".mlp-*")
	if err != nil {
		return err
	}
	defer os.RemoveAll(tmp) // a no-op once renamed
	td := mlp.Random(sizes, *seed)
	m, err := td.Memmap(tmp)
	if err == nil {
		err = m.Close()
	}
	if err == nil {
		err = os.Chmod(tmp, 0o755)
	}
	if err == nil && *force {
		err = os.RemoveAll(clean)
	}
	if err == nil {
		err = os.Rename(tmp, clean)
	}
	if err != nil {
		return fmt.Errorf("writing %s: %w", prefix, err)
	}
	fmt.Fprintf(stdout, "wrote an MLP %v (seed %d) at %s\n", sizes, *seed, prefix)
	return nil
}
