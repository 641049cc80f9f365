package main

import (
	"context"
	"encoding/json"
	"path/filepath"
	"strings"
	"testing"

	"github.com/tensorwire/tensorwire/loader"
	"github.com/tensorwire/tensorwire/memmap"
	"github.com/tensorwire/tensorwire/replay"
	"github.com/tensorwire/tensorwire/store"
	"github.com/tensorwire/tensorwire/tensordict"
)

// writeTD writes a TensorDict of batch size [n] with the given tensors at
// prefix.
func writeTD(t *testing.T, prefix string, n int, tensors map[string]*tensordict.Tensor) {
	t.Helper()
	td, err := tensordict.New(n)
	if err != nil {
		t.Fatal(err)
	}
	for k, v := range tensors {
		if err := td.Set(k, v); err != nil {
			t.Fatal(err)
		}
	}
	m, err := td.Memmap(prefix)
	if err != nil {
		t.Fatal(err)
	}
	m.Close()
}

func must[T any](v T, err error) T {
	if err != nil {
		panic(err)
	}
	return v
}

// TestInspect_IntegerStatsAreExact checks that --stats prints integer
// tensors' min, max and sum as exact integers, in the tree and in JSON,
// where a float64 would round them or print them in scientific notation.
func TestInspect_IntegerStatsAreExact(t *testing.T) {
	prefix := filepath.Join(t.TempDir(), "ds")
	pixels := make([]uint8, 2*5000)
	for i := range pixels {
		pixels[i] = 255
	}
	writeTD(t, prefix, 2, map[string]*tensordict.Tensor{
		"pixels": must(tensordict.FromSlice(pixels, 2, 5000)),                     // sum 2,550,000
		"big":    must(tensordict.FromSlice([]int64{1 << 53, 1}, 2)),              // sum 2^53+1: not a float64
		"neg":    must(tensordict.FromSlice([]int64{-1 << 63, -1}, 2)),            // sum below int64's range
		"huge":   must(tensordict.FromSlice([]uint64{1<<64 - 1, 1<<64 - 1}, 2)),   // sum above uint64's
		"ok":     must(tensordict.FromSlice([]bool{true, true}, 2)),               // sum 2
		"x":      must(tensordict.FromSlice([]float64{0.5, 1.5e10}, 2)),           // floats stay %g
		"small":  must(tensordict.FromSlice([]int32{-7, 3}, 2)),                   // min -7 max 3 sum -4
		"wide":   must(tensordict.FromSlice([]uint32{4000000000, 4000000000}, 2)), // sum 8e9
		"bytes":  must(tensordict.FromSlice([]int8{-128, 127}, 2)),                // sum -1
		"shorts": must(tensordict.FromSlice([]uint16{65535, 65535}, 2)),           // sum 131070
		"mid":    must(tensordict.FromSlice([]int16{-32768, -32768}, 2)),          // sum -65536
	})
	code, out, errOut := runCLI(t, "inspect", "--stats", prefix)
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errOut)
	}
	for _, want := range []string{
		"min=255 max=255 sum=2550000",
		"min=1 max=9007199254740992 sum=9007199254740993",
		"min=-9223372036854775808 max=-1 sum=-9223372036854775809",
		"min=18446744073709551615 max=18446744073709551615 sum=36893488147419103230",
		"min=1 max=1 sum=2",
		"min=0.5 max=1.5e+10 sum=1.50000000005e+10",
		"min=-7 max=3 sum=-4",
		"sum=8000000000",
		"min=-128 max=127 sum=-1",
		"sum=131070",
		"sum=-65536",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("tree lacks %q:\n%s", want, out)
		}
	}

	code, out, errOut = runCLI(t, "inspect", "--stats", "--json", prefix)
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errOut)
	}
	var rep struct {
		Fields map[string]struct{ Min, Max, Sum json.Number }
	}
	dec := json.NewDecoder(strings.NewReader(out))
	dec.UseNumber()
	if err := dec.Decode(&rep); err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	for key, want := range map[string][3]string{
		"pixels": {"255", "255", "2550000"},
		"big":    {"1", "9007199254740992", "9007199254740993"},
		"huge":   {"18446744073709551615", "18446744073709551615", "36893488147419103230"},
		"x":      {"0.5", "15000000000", "15000000000.5"},
	} {
		f := rep.Fields[key]
		if got := [3]string{f.Min.String(), f.Max.String(), f.Sum.String()}; got != want {
			t.Errorf("%s: JSON min, max, sum = %v, want %v", key, got, want)
		}
	}
}

// TestInspect_ReplayBuffer inspects a replay buffer's folder: inspect says
// what it is and shows its storage, or says that it has none yet.
func TestInspect_ReplayBuffer(t *testing.T) {
	dir := t.TempDir()
	full := filepath.Join(dir, "buf")
	b, err := replay.Create(full, replay.Config{Capacity: 8})
	if err != nil {
		t.Fatal(err)
	}
	obs := must(tensordict.FromSlice([]float32{1, 2, 3, 4, 5, 6}, 3, 2))
	batch := must(tensordict.New(3))
	batch.Set("obs", obs)
	if _, err := b.Extend(context.Background(), batch); err != nil {
		t.Fatal(err)
	}
	b.Close()
	empty := filepath.Join(dir, "empty")
	if b, err = replay.Create(empty, replay.Config{Capacity: 8}); err != nil {
		t.Fatal(err)
	}
	b.Close()

	code, out, errOut := runCLI(t, "inspect", full)
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errOut)
	}
	storage := filepath.Join(full, replay.StorageDir)
	for _, want := range []string{"replay buffer", storage, "batch_size=[8]", "obs"} {
		if !strings.Contains(out, want) {
			t.Errorf("output lacks %q:\n%s", want, out)
		}
	}

	code, out, errOut = runCLI(t, "inspect", "--json", full)
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errOut)
	}
	var rep struct {
		BatchSize []int `json:"batch_size"`
		Replay    *struct {
			Prefix, Storage string
		} `json:"replay_buffer"`
		Fields map[string]any
	}
	if err := json.Unmarshal([]byte(out), &rep); err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	if rep.Replay == nil || rep.Replay.Prefix != full || rep.Replay.Storage != storage || rep.Fields["obs"] == nil {
		t.Errorf("JSON: %s", out)
	}

	code, out, errOut = runCLI(t, "inspect", empty)
	if code != 0 || !strings.Contains(out, "replay buffer") || !strings.Contains(out, "no storage yet") {
		t.Errorf("a buffer with no batch yet: exit %d\n%s%s", code, out, errOut)
	}
}

// TestInspect_LoaderAndStore: inspect on a loader's ring folder says so,
// with its dataset, and shows the ring's storage while a producer runs;
// on a store's folder it says so and where its values are. Both folders
// hold no meta.json of their own: before, inspect said only that
// meta.json was missing.
func TestInspect_LoaderAndStore(t *testing.T) {
	dir := t.TempDir()
	dataset := filepath.Join(dir, "data")
	td, err := tensordict.Create(dataset, []int{10},
		tensordict.Field{Key: []string{"x"}, DType: memmap.Float32, Shape: []int{10, 3}})
	if err != nil {
		t.Fatal(err)
	}
	td.Close()
	ring := filepath.Join(dir, "ring")
	p, err := loader.NewProducer(loader.Config{Dataset: dataset, Dir: ring, Batch: 4, Slots: 2, Seed: 5})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	code, out, errOut := runCLI(t, "inspect", ring)
	if code != 0 {
		t.Fatalf("a running loader's folder: exit %d: %s", code, errOut)
	}
	for _, want := range []string{"a loader's ring folder", dataset, "seed 5", "batch_size=[8]", "x"} {
		if !strings.Contains(out, want) {
			t.Errorf("a running loader's folder: output lacks %q:\n%s", want, out)
		}
	}
	code, out, errOut = runCLI(t, "inspect", "--json", ring)
	var rep struct {
		Loader *struct {
			Prefix, Dataset, Storage string
			Seed                     uint64
		} `json:"loader"`
		Fields map[string]any
	}
	if err := json.Unmarshal([]byte(out), &rep); code != 0 || err != nil || rep.Loader == nil || rep.Loader.Dataset != dataset ||
		rep.Loader.Seed != 5 || !strings.HasPrefix(rep.Loader.Storage, ring) || rep.Fields["x"] == nil {
		t.Errorf("a running loader's folder, JSON: exit %d, %v\n%s%s", code, err, out, errOut)
	}
	p.Close()
	code, out, errOut = runCLI(t, "inspect", ring)
	if code != 0 || !strings.Contains(out, "a loader's ring folder") || !strings.Contains(out, "no ring") {
		t.Errorf("a loader's folder without a producer: exit %d\n%s%s", code, out, errOut)
	}

	stDir := filepath.Join(dir, "st")
	s, err := store.Open(stDir, store.Options{InlineBytes: 1})
	if err != nil {
		t.Fatal(err)
	}
	value := must(tensordict.New(4))
	value.Set("v", must(tensordict.FromSlice([]float32{1, 2, 3, 4}, 4)))
	if _, err := s.Put(context.Background(), "b", value); err != nil {
		t.Fatal(err)
	}
	s.Close()
	code, out, errOut = runCLI(t, "inspect", stDir)
	if code != 0 || !strings.Contains(out, "a store") || !strings.Contains(out, "1 value, a TensorDict") || !strings.Contains(out, filepath.Join(stDir, "values")) {
		t.Errorf("a store's folder: exit %d\n%s%s", code, out, errOut)
	}
	code, out, errOut = runCLI(t, "inspect", "--json", stDir)
	var srep struct {
		Store *struct {
			Prefix string
			Values []string
		} `json:"store"`
	}
	if err := json.Unmarshal([]byte(out), &srep); code != 0 || err != nil || srep.Store == nil || srep.Store.Prefix != stDir || len(srep.Store.Values) != 1 {
		t.Errorf("a store's folder, JSON: exit %d, %v\n%s%s", code, err, out, errOut)
	}
}
