package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"math"
	"os"
	"strings"
	"text/tabwriter"

	"github.com/tensorwire/tensorwire/internal/progress"
	"github.com/tensorwire/tensorwire/tensordict"
)

var inspectCmd = command{
	name:  "inspect",
	usage: "tensorwire inspect [--json] [--stats] PREFIX",
	help: "print the tree of keys with dtype, shape, batch size and bytes on disk; --stats adds min, max and sum " +
		"of each real-valued tensor (read in full); --json prints one JSON object instead",
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
	td, err := tensordict.LoadMemmap(pos[0], tensordict.ReadOnly())
	if err != nil {
		return err
	}
	defer td.Close()
	rep, err := describe(ctx, td, *stats)
	if err != nil {
		return err
	}
	if *asJSON {
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		return enc.Encode(rep)
	}
	printTree(stdout, pos[0], td, rep)
	return nil
}

// report is inspect's JSON output.
type report struct {
	BatchSize []int            `json:"batch_size"`
	Fields    map[string]field `json:"fields"`
	NonTensor map[string]any   `json:"nontensor"`
}

type field struct {
	DType string `json:"dtype"`
	Shape []int  `json:"shape"`
	Bytes int64  `json:"bytes"` // on disk
	Sum   *num   `json:"sum,omitempty"`
	Min   *num   `json:"min,omitempty"`
	Max   *num   `json:"max,omitempty"`
}

// num is a float64 that encodes NaN and infinities as the strings "nan",
// "inf" and "-inf", which JSON has no numbers for.
type num float64

func (n num) MarshalJSON() ([]byte, error) {
	f := float64(n)
	switch {
	case math.IsNaN(f):
		return []byte(`"nan"`), nil
	case math.IsInf(f, 1):
		return []byte(`"inf"`), nil
	case math.IsInf(f, -1):
		return []byte(`"-inf"`), nil
	}
	return json.Marshal(f)
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
				s, err := v.Stats()
				if err != nil {
					return nil, fmt.Errorf("%s: %w", key, err)
				}
				f.Sum, f.Min, f.Max = ptr(num(s.Sum)), ptr(num(s.Min)), ptr(num(s.Max))
			}
			rep.Fields[key] = f
		}
	}
	return rep, nil
}

func ptr[T any](v T) *T { return &v }

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
				line += fmt.Sprintf("min=%g max=%g sum=%g\t", float64(*f.Min), float64(*f.Max), float64(*f.Sum))
			}
			fmt.Fprintln(w, line)
		}
	}
}
