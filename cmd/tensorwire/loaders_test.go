package main

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/tensorwire/tensorwire/loader"
	"github.com/tensorwire/tensorwire/memmap"
	"github.com/tensorwire/tensorwire/tensordict"
)

// imageDataset writes a dataset of n 1×6×6 uint8 images and labels at
// prefix.
func imageDataset(t *testing.T, prefix string, n int) {
	t.Helper()
	td, err := tensordict.Create(prefix, []int{n},
		tensordict.Field{Key: []string{"images"}, DType: memmap.Uint8, Shape: []int{n, 1, 6, 6}},
		tensordict.Field{Key: []string{"labels"}, DType: memmap.Int64, Shape: []int{n}})
	if err != nil {
		t.Fatal(err)
	}
	if err := td.Close(); err != nil {
		t.Fatal(err)
	}
}

// TestNode_ServesLoader: "tensorwire node --loader" serves a producer of
// a dataset with the augment transform; a consumer on the node's root
// iterates an epoch of float32 images, every sample once.
func TestNode_ServesLoader(t *testing.T) {
	root := t.TempDir()
	data := filepath.Join(t.TempDir(), "data")
	imageDataset(t, data, 50)
	n := startNode(t, "--root", root, "--loader",
		"train,dataset="+data+",batch=8,slots=4,seed=3,index=index,transform=augment,pad=2,flip,mean=0.5,std=0.25")
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c, err := loader.Dial(ctx, n.addr, "train", loader.Options{Batch: 16, Root: root})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if !c.SharedFS() || c.Len() != 4 {
		t.Fatalf("SharedFS %v, Len %d; want true, 4", c.SharedFS(), c.Len())
	}
	seen := map[int64]bool{}
	for batch, err := range c.Batches(ctx) {
		if err != nil {
			t.Fatal(err)
		}
		img, err := batch.Tensor("images")
		if err != nil || img.DType() != memmap.Float32 {
			t.Fatalf("images %v, %v; want float32", img, err)
		}
		idx, _ := tensordict.Values[int64](mustTensor(t, batch, "index"))
		for _, i := range idx {
			if seen[i] {
				t.Fatalf("sample %d twice", i)
			}
			seen[i] = true
		}
	}
	if len(seen) != 50 {
		t.Fatalf("%d samples in the epoch, want 50", len(seen))
	}
	c.Close()
	n.stop(t)
	if !strings.Contains(n.stderr.String(), "loader ready") {
		t.Errorf("no log of the loader:\n%s", n.stderr)
	}
}

func mustTensor(t *testing.T, td *tensordict.TensorDict, key string) *tensordict.Tensor {
	t.Helper()
	x, err := td.Tensor(key)
	if err != nil {
		t.Fatal(err)
	}
	return x
}

func TestNode_LoaderFlagErrors(t *testing.T) {
	for _, tc := range []struct{ value, want string }{
		{"", "a folder under the root"},
		{"../up,dataset=d,batch=4", "a folder under the root"},
		{"l,batch=4", "no dataset=PREFIX"},
		{"l,dataset=d", "no batch=N"},
		{"l,dataset=d,batch=0", "batch=0: want a whole number, at least 1"},
		{"l,dataset=d,batch=x", "batch=x: want a whole number, at least 1"},
		{"l,dataset=d,batch=4,slots=0", "slots=0: want a whole number, at least 1"},
		{"l,dataset=d,batch=4,window=-2", "window=-2: want a number of batches, or -1 (or 0) for none"},
		{"l,dataset=d,batch=4,window=x", "window=x: want a number of batches, or -1 (or 0) for none"},
		{"l,dataset=d,batch=4,seed=-1", "seed=-1: want a whole number from 0 to 18446744073709551615"},
		{"l,dataset=d,batch=4,transform=augment,pad=-1", "pad=-1: want a whole number, 0 or more"},
		{"l,dataset=d,batch=4,transform=augment,mean=Inf", "mean=Inf: want a finite number"},
		{"l,dataset=d,batch=4,transform=augment,mean=-inf", "mean=-inf: want a finite number"},
		{"l,dataset=d,batch=4,transform=augment,mean=NaN", "mean=NaN: want a finite number"},
		{"l,dataset=d,batch=4,transform=augment,mean=1e39", "mean=1e39: want a finite number"},
		{"l,dataset=d,batch=4,transform=augment,std=Inf", "std=Inf: want a positive finite number"},
		{"l,dataset=d,batch=4,heartbeat=0s", "want a positive duration"},
		{"l,dataset=d,batch=4,transform=blur", "want augment or none"},
		{"l,dataset=d,batch=4,pad=2", "pad applies to transform=augment only"},
		{"l,dataset=d,batch=4,transform=augment,std=0", "std=0: want a positive finite number"},
		{"l,dataset=d,batch=4,flip=yes,transform=augment", "takes no value"},
		{"l,dataset=d,batch=4,batch=8", "batch given twice"},
		{"l,dataset=d,batch=4,colour=red", `unknown setting "colour"`},
	} {
		var f loaderFlags
		if err := f.Set(tc.value); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("--loader %q: %v, want an error about %q", tc.value, err, tc.want)
		} else if strings.Contains(err.Error(), "strconv") || (strings.Contains(err.Error(), "(window") && !strings.Contains(tc.value, "window")) {
			t.Errorf("--loader %q: %v: a raw parse error, or the window's hint for another setting", tc.value, err)
		}
	}
	var f loaderFlags
	if err := f.Set("a/b,dataset=d,batch=4"); err != nil {
		t.Fatal(err)
	}
	if err := f.Set("a//b/,dataset=d,batch=4"); err == nil || !strings.Contains(err.Error(), "twice") {
		t.Errorf("the same loader twice: %v", err)
	}
	var b bufferFlags
	if err := b.Set("a/b,capacity=4"); err != nil {
		t.Fatal(err)
	}
	if err := f.checkNames(b, nil); err == nil || !strings.Contains(err.Error(), "a --buffer has that name") {
		t.Errorf("a loader named as a buffer: %v", err)
	}
	// A store named as a buffer (issue 24: --store x --buffer x made the
	// buffer's files, then the store refused the folder).
	var sx storeFlags
	var bb bufferFlags
	if err := bb.Set("x,capacity=4"); err != nil {
		t.Fatal(err)
	}
	if err := sx.Set("x"); err != nil {
		t.Fatal(err)
	}
	if err := (loaderFlags{}).checkNames(bb, sx); err == nil || !strings.Contains(err.Error(), "--store x: a --buffer has that name") {
		t.Errorf("a store named as a buffer: %v", err)
	}
	var st storeFlags
	if err := st.Set("s"); err != nil {
		t.Fatal(err)
	}
	if err := f.Set("s/,dataset=d,batch=4"); err != nil {
		t.Fatal(err)
	}
	if err := f.checkNames(nil, st); err == nil || !strings.Contains(err.Error(), "a --store has that name") {
		t.Errorf("a loader named as a store: %v", err)
	}
}

// TestNode_NestedServiceFoldersRefused: a store, buffer or loader whose
// folder would be inside another's (--store s --buffer s/x; a buffer and a
// loader, either way round), or the root itself (--buffer .), is a usage
// error (exit 2) found before anything is made. It failed before checkNames compared folders
// by more than equality: the buffer was created in ROOT/s/x, the store
// then refused ROOT/s ("holds x but no store.log"), the node exited 1, and
// ROOT/s kept the buffer's files, so --store s failed from then on until
// someone deleted them; --buffer . put a buffer's files in the root.
func TestNode_NestedServiceFoldersRefused(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--store", "s", "--buffer", "s/x,capacity=4"}, "--store s: the --buffer s/x's folder would be inside ROOT/s"},
		{[]string{"--buffer", "./b/c/,capacity=4", "--loader", "b,dataset=d,batch=4"}, "--loader b: the --buffer ./b/c/'s folder would be inside ROOT/b"},
		{[]string{"--buffer", "b,capacity=4", "--loader", "b/l,dataset=d,batch=4"}, "--loader b/l: its folder would be inside ROOT/b, the --buffer b's"},
		{[]string{"--buffer", ".,capacity=4"}, "not the root itself"},
		{[]string{"--buffer", "x,capacity=4", "--loader", "x/.,dataset=d,batch=4"}, "--loader x/.: a --buffer has that name"},
	} {
		root := t.TempDir()
		ctx, cancel := context.WithCancel(context.Background())
		cancel() // a node that got as far as serving stops at once
		var out, errb bytes.Buffer
		code := run(ctx, append([]string{"node", "--listen", "127.0.0.1:0", "--root", root}, tc.args...), &out, &errb)
		left, _ := os.ReadDir(root)
		if code != 2 || len(left) > 0 || !strings.Contains(errb.String(), tc.want) {
			t.Errorf("%q: exit %d, root holds %d entries, stderr %q; want exit 2 before anything is made, saying %q", tc.args, code, len(left), errb.String(), tc.want)
		}
	}
}

// TestNode_LoaderBadDataset: a node given a dataset that is missing, an
// empty folder, or holds no rows, does not start: it exits with status 1
// and says why.
func TestNode_LoaderBadDataset(t *testing.T) {
	dir := t.TempDir()
	empty := filepath.Join(dir, "empty")
	imageDataset(t, filepath.Join(dir, "norows"), 0)
	if err := os.Mkdir(empty, 0o755); err != nil {
		t.Fatal(err)
	}
	for _, data := range []string{filepath.Join(dir, "missing"), empty, filepath.Join(dir, "norows")} {
		code, _, stderr := runCLI(t, "node", "--listen", "127.0.0.1:0", "--root", t.TempDir(), "--loader", "l,dataset="+data+",batch=4")
		if code != 1 || !strings.Contains(stderr, "loader l: loader: bad dataset") {
			t.Errorf("dataset %s: exit %d, stderr %q; want 1 and the dataset refused", filepath.Base(data), code, stderr)
		}
	}
}
