package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"io/fs"
	"math"
	"math/big"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"text/tabwriter"

	"github.com/tensorwire/tensorwire/internal/progress"
	"github.com/tensorwire/tensorwire/loader"
	"github.com/tensorwire/tensorwire/replay"
	"github.com/tensorwire/tensorwire/tensordict"
)

var inspectCmd = command{
	name:  "inspect",
	usage: "tensorwire inspect [--json] [--stats] PREFIX",
	help: "print the tree of keys with dtype, shape, batch size and bytes on disk; --stats adds min, max and sum " +
		"of each real-valued tensor (read in full; exact for integers); --json prints one JSON object instead. " +
		"A replay buffer's folder shows its storage, a loader's folder its dataset and ring, a store's folder what it holds",
	run: runInspect,
}

func runInspect(ctx context.Context, args []string, stdout, _ io.Writer) error {
	fs := flag.NewFlagSet("inspect", flag.ContinueOnError)
	asJSON := fs.Bool("json", false, "print JSON")
	stats := fs.Bool("stats", false, "add min, max and sum of each real-valued tensor")
	pos, err := parse(fs, args)
	if err != nil {
		return err
	}
	if len(pos) != 1 {
		return fmt.Errorf("%w: want one PREFIX, got %d arguments", errUsage, len(pos))
	}
	prefix := pos[0]
	encode := func(rep *report) error {
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		return enc.Encode(rep)
	}
	// A store's folder: say what it is and where its values are.
	st, err := storeAt(prefix)
	if err != nil {
		return err
	}
	if st != nil {
		if *asJSON {
			return encode(&report{Fields: map[string]field{}, NonTensor: map[string]any{}, Store: st})
		}
		kept := fmt.Sprintf("%d values, each a TensorDict,", len(st.Values))
		if len(st.Values) == 1 {
			kept = "1 value, a TensorDict,"
		}
		fmt.Fprintf(stdout, "%s: a store (%s, docs/store.md): small values are in its log, and %s kept under %s "+
			"(tensorwire inspect %s shows one)\n",
			prefix, storeLog, kept, filepath.Join(prefix, storeValues), filepath.Join(prefix, storeValues, "ID"))
		return nil
	}
	// A loader's folder: say so, and inspect its ring's storage if a
	// producer has one.
	ld, err := loaderAt(prefix)
	if err != nil {
		return err
	}
	if ld != nil {
		if ld.Storage == "" {
			if *asJSON {
				return encode(&report{Fields: map[string]field{}, NonTensor: map[string]any{}, Loader: ld})
			}
			fmt.Fprintf(stdout, "%s: a loader's ring folder (%s, docs/loader.md) for the dataset %s, seed %d, %s; "+
				"no ring: no producer runs on it (inspect the dataset instead)\n", prefix, loader.MetaFile, ld.Dataset, ld.Seed, ld.epochs())
			return nil
		}
		prefix = ld.Storage
	}
	// A replay buffer's folder: inspect its storage, and say so.
	rb, err := replayBufferAt(prefix)
	if err != nil {
		return err
	}
	if rb != nil && rb.Storage == "" {
		if *asJSON {
			return encode(&report{Fields: map[string]field{}, NonTensor: map[string]any{}, Replay: rb})
		}
		fmt.Fprintf(stdout, "%s: a replay buffer (%s) with no storage yet: no batch has been written to it\n", prefix, replay.MetaFile)
		return nil
	}
	if rb != nil {
		prefix = rb.Storage
	}
	td, err := tensordict.LoadMemmap(prefix, tensordict.ReadOnly())
	if err != nil {
		return err
	}
	defer td.Close()
	rep, err := describe(ctx, td, *stats)
	if err != nil {
		return err
	}
	rep.Replay, rep.Loader = rb, ld
	if *asJSON {
		return encode(rep)
	}
	if ld != nil {
		fmt.Fprintf(stdout, "%s: a loader's ring folder (%s, docs/loader.md) for the dataset %s, seed %d, %s; "+
			"its producer's batches are the TensorDict at %s, one batch per slot of rows:\n",
			ld.Prefix, loader.MetaFile, ld.Dataset, ld.Seed, ld.epochs(), ld.Storage)
	}
	if rb != nil {
		fmt.Fprintf(stdout, "%s: a replay buffer (%s); its transitions are the TensorDict at %s, one row per slot "+
			"(rows never written are zeros):\n", rb.Prefix, replay.MetaFile, rb.Storage)
	}
	printTree(stdout, prefix, td, rep)
	return nil
}

// replayInfo says, in inspect's output, that the folder inspected is a
// replay buffer, and where its storage is.
type replayInfo struct {
	Prefix  string `json:"prefix"`  // the buffer's folder, as given
	Storage string `json:"storage"` // its storage TensorDict; "" until the first batch
}

// replayBufferAt returns nil unless prefix is a replay buffer's folder: one
// with a replay.json and no meta.json of its own.
func replayBufferAt(prefix string) (*replayInfo, error) {
	if _, err := os.Stat(filepath.Join(prefix, "meta.json")); err == nil {
		return nil, nil
	}
	if _, err := os.Stat(filepath.Join(prefix, replay.MetaFile)); errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	} else if err != nil {
		return nil, err
	}
	rb := &replayInfo{Prefix: prefix}
	storage := filepath.Join(prefix, replay.StorageDir)
	if _, err := os.Stat(filepath.Join(storage, "meta.json")); err == nil {
		rb.Storage = storage
	} else if !errors.Is(err, fs.ErrNotExist) {
		return nil, err
	}
	return rb, nil
}

// The files that make a folder a store's (docs/store.md, "Files").
const (
	storeLog    = "store.log"
	storeValues = "values"
)

// storeInfo says, in inspect's output, that the folder inspected is a
// store, and which values it keeps as prefixes.
type storeInfo struct {
	Prefix string   `json:"prefix"` // the store's folder, as given
	Values []string `json:"values"` // the folders under values/, each a TensorDict
}

// storeAt returns nil unless prefix is a store's folder: one with a
// store.log and no meta.json of its own.
func storeAt(prefix string) (*storeInfo, error) {
	if _, err := os.Stat(filepath.Join(prefix, "meta.json")); err == nil {
		return nil, nil
	}
	if _, err := os.Stat(filepath.Join(prefix, storeLog)); errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	} else if err != nil {
		return nil, err
	}
	st := &storeInfo{Prefix: prefix, Values: []string{}}
	entries, err := os.ReadDir(filepath.Join(prefix, storeValues))
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		return nil, err
	}
	for _, e := range entries {
		if e.IsDir() {
			st.Values = append(st.Values, e.Name())
		}
	}
	return st, nil
}

// loaderInfo says, in inspect's output, that the folder inspected is a
// loader's ring folder: what its loader.json says, and where the current
// ring's storage is.
type loaderInfo struct {
	Prefix  string `json:"prefix"`  // the folder, as given
	Dataset string `json:"dataset"` // loader.json's
	Seed    uint64 `json:"seed"`
	Epoch   int64  `json:"epoch"`   // the last epoch begun; -1 before any
	Storage string `json:"storage"` // the ring's storage TensorDict; "" when there is no ring
}

// epochs says which epoch the loader began last.
func (ld *loaderInfo) epochs() string {
	if ld.Epoch < 0 {
		return "no epoch begun yet"
	}
	return fmt.Sprintf("last epoch begun %d", ld.Epoch)
}

// loaderAt returns nil unless prefix is a loader's ring folder: one with a
// loader.json and no meta.json of its own.
func loaderAt(prefix string) (*loaderInfo, error) {
	if _, err := os.Stat(filepath.Join(prefix, "meta.json")); err == nil {
		return nil, nil
	}
	data, err := os.ReadFile(filepath.Join(prefix, loader.MetaFile))
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	} else if err != nil {
		return nil, err
	}
	var meta struct {
		Dataset string `json:"dataset"`
		Seed    uint64 `json:"seed"`
		Epoch   int64  `json:"epoch"`
		Ring    string `json:"ring"`
	}
	if err := json.Unmarshal(data, &meta); err != nil {
		return nil, fmt.Errorf("%s: a loader's folder whose %s is damaged: %w", prefix, loader.MetaFile, err)
	}
	ld := &loaderInfo{Prefix: prefix, Dataset: meta.Dataset, Seed: meta.Seed, Epoch: meta.Epoch}
	if meta.Ring != "" && filepath.IsLocal(meta.Ring) {
		storage := filepath.Join(prefix, meta.Ring, loader.StorageDir)
		if _, err := os.Stat(filepath.Join(storage, "meta.json")); err == nil {
			ld.Storage = storage
		} else if !errors.Is(err, fs.ErrNotExist) {
			return nil, err
		}
	}
	return ld, nil
}

// report is inspect's JSON output.
type report struct {
	BatchSize []int            `json:"batch_size"`
	Fields    map[string]field `json:"fields"`
	NonTensor map[string]any   `json:"nontensor"`
	Replay    *replayInfo      `json:"replay_buffer,omitempty"` // set for a replay buffer's folder
	Loader    *loaderInfo      `json:"loader,omitempty"`        // set for a loader's ring folder
	Store     *storeInfo       `json:"store,omitempty"`         // set for a store's folder
}

type field struct {
	DType string `json:"dtype"`
	Shape []int  `json:"shape"`
	Bytes int64  `json:"bytes"` // on disk
	Sum   *num   `json:"sum,omitempty"`
	Min   *num   `json:"min,omitempty"`
	Max   *num   `json:"max,omitempty"`
}

// num is a statistic: an exact integer (of an integer or bool tensor), or a
// float64 that encodes NaN and infinities as the strings "nan", "inf" and
// "-inf", which JSON has no numbers for.
type num struct {
	i *big.Int // the exact value, for integer dtypes; nil for floats
	f float64
}

func (n num) MarshalJSON() ([]byte, error) {
	if n.i != nil {
		return []byte(n.i.String()), nil
	}
	switch {
	case math.IsNaN(n.f):
		return []byte(`"nan"`), nil
	case math.IsInf(n.f, 1):
		return []byte(`"inf"`), nil
	case math.IsInf(n.f, -1):
		return []byte(`"-inf"`), nil
	}
	return json.Marshal(n.f)
}

// String prints an integer in full and a float as %g does.
func (n num) String() string {
	if n.i != nil {
		return n.i.String()
	}
	return strconv.FormatFloat(n.f, 'g', -1, 64)
}

func describe(ctx context.Context, td *tensordict.TensorDict, stats bool) (*report, error) {
	rep := &report{BatchSize: td.BatchSize(), Fields: map[string]field{}, NonTensor: map[string]any{}}
	for p, v := range td.Items() {
		key := strings.Join(p, "/")
		switch v := v.(type) {
		case *tensordict.NonTensor:
			rep.NonTensor[key] = v.Data
		case *tensordict.Tensor:
			f := field{DType: v.DType().String(), Shape: v.Shape()}
			if path := v.Path(); path != "" {
				if fi, err := os.Stat(path); err == nil {
					f.Bytes = fi.Size()
				}
			}
			if stats && v.DType().Real() && v.NumElements() > 0 {
				if err := ctx.Err(); err != nil {
					return nil, err
				}
				if err := addStats(&f, v); err != nil {
					return nil, fmt.Errorf("%s: %w", key, err)
				}
			}
			rep.Fields[key] = f
		}
	}
	return rep, nil
}

// printTree prints the keys as a tree with aligned columns.
func printTree(w io.Writer, prefix string, td *tensordict.TensorDict, rep *report) {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	var total int64
	for _, f := range rep.Fields {
		total += f.Bytes
	}
	fmt.Fprintf(tw, "%s\tTensorDict\tbatch_size=%v\t%s\t\n", prefix, td.BatchSize(), progress.Bytes(float64(total)))
	printLevel(tw, td, nil, "", rep)
	tw.Flush()
}

func printLevel(w io.Writer, td *tensordict.TensorDict, path []string, indent string, rep *report) {
	keys := td.Keys()
	for i, k := range keys {
		branch, next := "├── ", "│   "
		if i == len(keys)-1 {
			branch, next = "└── ", "    "
		}
		p := append(append([]string(nil), path...), k)
		v, _ := td.Get(k)
		switch v := v.(type) {
		case *tensordict.TensorDict:
			fmt.Fprintf(w, "%s%s%s\tTensorDict\tbatch_size=%v\t\t\n", indent, branch, k, v.BatchSize())
			printLevel(w, v, p, indent+next, rep)
		case *tensordict.NonTensor:
			b, _ := json.Marshal(v.Data)
			fmt.Fprintf(w, "%s%s%s\tNonTensorData\t%s\t\t\n", indent, branch, k, b)
		case *tensordict.Tensor:
			f := rep.Fields[strings.Join(p, "/")]
			line := fmt.Sprintf("%s%s%s\t%s\t%v\t%s\t", indent, branch, k, f.DType, f.Shape, progress.Bytes(float64(f.Bytes)))
			if f.Sum != nil {
				line += fmt.Sprintf("min=%v max=%v sum=%v\t", *f.Min, *f.Max, *f.Sum)
			}
			fmt.Fprintln(w, line)
		}
	}
}
