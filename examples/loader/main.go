// Command loader runs one producer of Fashion-MNIST batches and three
// training processes that share them, as tensorsocket does: consumers of
// batch sizes 32, 64 and 128, the last one joining late, after the producer
// has published part of the first epoch.
//
//	go run ./examples/loader [--epochs 2] [--dir DIR]
//
// The producer runs in this process: a node (rpc.Server with a root)
// serving a loader.Producer over Fashion-MNIST's training set, imported
// with importer.IDX from the Debian package dataset-fashion-mnist (a
// synthetic set of the same shape when it is not installed), transformed
// once per sample as image loaders do: a random crop of the image padded
// by 4, a horizontal flip, normalized to float32 (loader.Augment). Each
// consumer is a process of its own (this program again) that dials the
// node with loader.Dial, maps the ring from the shared root and iterates
// each epoch with c.Batches. It checks that it saw every sample exactly
// once, and that its batches are bitwise those a loader of its own
// (loader.NewLocal, same seed and transform) would have made, and prints
// what it checked.
package main

import (
	"bufio"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"maps"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/tensorwire/tensorwire/importer"
	"github.com/tensorwire/tensorwire/loader"
	"github.com/tensorwire/tensorwire/memmap"
	"github.com/tensorwire/tensorwire/rpc"
	"github.com/tensorwire/tensorwire/tensordict"
)

const fashionDir = "/usr/share/datasets/fashion-mnist"

// The producer's settings, which the consumers' own loaders repeat.
const (
	seed          = 42
	producerBatch = 64
	slots         = 32
)

// augment is the transform: RandomCrop(28, padding=4),
// RandomHorizontalFlip, ToTensor, Normalize(0.2860, 0.3530).
func augment() *loader.Augment {
	return &loader.Augment{Pad: 4, Flip: true, Mean: 0.2860, Std: 0.3530}
}

func main() {
	epochs := flag.Int("epochs", 2, "epochs every consumer iterates")
	dir := flag.String("dir", "", "folder for the dataset and the node's root (default: a temporary one, removed at the end)")
	consume := flag.String("consume", "", "internal: be a consumer of the node at this address")
	root := flag.String("root", "", "internal: the consumer's view of the shared root")
	data := flag.String("data", "", "internal: the dataset, for the consumer's own loader")
	batch := flag.Int("batch", 0, "internal: the consumer's batch size")
	flag.Parse()
	var err error
	if *consume != "" {
		err = runConsumer(*consume, *root, *data, *batch, *epochs)
	} else {
		err = run(*dir, *epochs)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "loader:", err)
		os.Exit(1)
	}
}

func run(dir string, epochs int) error {
	if dir == "" {
		d, err := os.MkdirTemp("", "tensorwire-loader-")
		if err != nil {
			return err
		}
		defer os.RemoveAll(d)
		dir = d
	}
	data := filepath.Join(dir, "fashion-mnist")
	root := filepath.Join(dir, "root")
	if err := os.MkdirAll(root, 0o755); err != nil {
		return err
	}
	source, err := build(data)
	if err != nil {
		return err
	}
	fmt.Printf("dataset: %s at %s\n", source, data)

	// The producer, served by a node whose root holds its ring.
	p, err := loader.NewProducer(loader.Config{
		Dataset: data, Dir: filepath.Join(root, "fmnist"), Batch: producerBatch, Slots: slots, Window: slots,
		Seed: seed, Transform: augment(), IndexKey: "index",
	})
	if err != nil {
		return err
	}
	defer p.Close()
	srv, err := rpc.NewServer(rpc.WithRoot(root))
	if err != nil {
		return err
	}
	defer srv.Close()
	svc, err := loader.Register(srv)
	if err != nil {
		return err
	}
	if err := svc.Add("fmnist", p); err != nil {
		return err
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return err
	}
	go srv.Serve(l)
	addr := l.Addr().String()
	fmt.Printf("producer: %d samples, batches of %d, a ring of %d slots, serving \"fmnist\" on %s\n", p.Len(), producerBatch, slots, addr)

	// Two consumers join and wait; the producer begins epoch 0 and fills
	// its ring. The third joins then, late: the producer has published
	// batches it never saw, which the ring still holds.
	var cs []*consumer
	defer func() {
		for _, c := range cs {
			c.stop()
		}
	}()
	for _, b := range []int{32, 64} {
		c, err := startConsumer(addr, root, data, b, epochs)
		if err != nil {
			return err
		}
		cs = append(cs, c)
	}
	for p.Stats().InEpoch < slots {
		time.Sleep(10 * time.Millisecond)
	}
	st := p.Stats()
	fmt.Printf("producer: epoch %d begun, %d batches published, the window open: %v\n", st.Epoch, st.InEpoch, st.Window)
	late, err := startConsumer(addr, root, data, 128, epochs)
	if err != nil {
		return err
	}
	cs = append(cs, late)
	for _, c := range cs {
		io.WriteString(c.stdin, "go\n")
	}
	var errs []error
	for _, c := range cs {
		errs = append(errs, c.wait())
	}
	if err := errors.Join(errs...); err != nil {
		return err
	}
	st = p.Stats()
	perEpoch := (p.Len() + producerBatch - 1) / producerBatch
	fmt.Printf("producer: %d batches published: %d epochs of %d, each sample read and transformed once for the three consumers, "+
		"and %d of the next epoch, begun before they left; %d consumers dropped, %d left\n",
		st.Published, st.Epochs, perEpoch, st.Published-st.Epochs*uint64(perEpoch), st.Dropped+st.DroppedSlow, st.Left)
	if st.Dropped+st.DroppedSlow != 0 {
		return fmt.Errorf("%d consumers were dropped", st.Dropped+st.DroppedSlow)
	}
	fmt.Println("all checks passed")
	return nil
}

// consumer is a consumer process.
type consumer struct {
	cmd   *exec.Cmd
	stdin io.WriteCloser
	done  sync.WaitGroup
}

// startConsumer runs this program as a consumer and waits until it has
// joined the producer. Its output is printed with a prefix.
func startConsumer(addr, root, data string, batch, epochs int) (*consumer, error) {
	self, err := os.Executable()
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(self, "--consume", addr, "--root", root, "--data", data, "--batch", fmt.Sprint(batch), "--epochs", fmt.Sprint(epochs))
	cmd.Stderr = os.Stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	c := &consumer{cmd: cmd}
	if c.stdin, err = cmd.StdinPipe(); err != nil {
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	joined := make(chan struct{})
	c.done.Add(1)
	go func() {
		defer c.done.Done()
		sc := bufio.NewScanner(out)
		first := true
		for sc.Scan() {
			fmt.Printf("  consumer batch %3d (pid %d): %s\n", batch, cmd.Process.Pid, sc.Text())
			if first {
				close(joined)
				first = false
			}
		}
		if first {
			close(joined)
		}
	}()
	<-joined
	return c, nil
}

func (c *consumer) wait() error {
	c.done.Wait()
	return c.cmd.Wait()
}

func (c *consumer) stop() {
	c.stdin.Close()
	c.cmd.Process.Kill()
	c.done.Wait()
	c.cmd.Wait()
}

// runConsumer is a consumer: it joins, prints the epoch it joined, waits
// for a line on stdin, then iterates epochs and checks each.
func runConsumer(addr, root, data string, batch, epochs int) error {
	ctx := context.Background()
	c, err := loader.Dial(ctx, addr, "fmnist", loader.Options{Batch: batch, Root: root})
	if err != nil {
		return err
	}
	defer c.Close()
	how := "bytes over the network"
	if c.SharedFS() {
		how = "its own mapping of the ring"
	}
	fmt.Printf("joined at epoch %d; %d batches an epoch; reads batches from %s\n", c.Epoch(), c.Len(), how)
	if _, err := bufio.NewReader(os.Stdin).ReadString('\n'); err != nil {
		return err
	}
	// The loader this training job would run without a producer.
	own, err := loader.NewLocal(loader.Config{Dataset: data, Seed: seed, Transform: augment(), IndexKey: "index"}, loader.Options{Batch: batch})
	if err != nil {
		return err
	}
	defer own.Close()
	for range epochs {
		e := c.Epoch()
		for own.Epoch() < e { // the same epoch of the loader of its own
			for range own.Batches(ctx) {
				break
			}
		}
		var mine []*tensordict.TensorDict
		for b, err := range own.Batches(ctx) {
			if err != nil {
				return err
			}
			cl, err := b.Clone()
			if err != nil {
				return err
			}
			mine = append(mine, cl)
		}
		seen := make([]bool, c.Samples())
		n, same, sizes := 0, 0, map[int]int{}
		start := time.Now()
		for b, err := range c.Batches(ctx) {
			if err != nil {
				return fmt.Errorf("epoch %d: %w", e, err)
			}
			t, err := b.Tensor("index")
			if err != nil {
				return err
			}
			idx, err := tensordict.Values[int64](t)
			if err != nil {
				return err
			}
			for _, i := range idx {
				if seen[i] {
					return fmt.Errorf("epoch %d: sample %d twice", e, i)
				}
				seen[i] = true
			}
			if n < len(mine) && b.Equal(mine[n]) {
				same++
			}
			if img, err := b.Tensor("images"); err != nil || img.DType() != memmap.Float32 {
				return fmt.Errorf("epoch %d: images %v, %v; want float32", e, img, err)
			}
			sizes[b.Len()]++
			n++
		}
		missing := 0
		for _, ok := range seen {
			if !ok {
				missing++
			}
		}
		if missing > 0 || n != c.Len() || same != n || n != len(mine) {
			return fmt.Errorf("epoch %d: %d batches (Len says %d), %d samples missing, %d of them as my own loader's %d",
				e, n, c.Len(), missing, same, len(mine))
		}
		fmt.Printf("epoch %d: %d batches (%s) in %v; every one of the %d samples exactly once; "+
			"each batch bitwise the one my own loader makes\n", e, n, sizesString(sizes), time.Since(start).Round(time.Millisecond), len(seen))
	}
	return nil
}

func sizesString(sizes map[int]int) string {
	keys := slices.Sorted(maps.Keys(sizes))
	slices.Reverse(keys)
	var parts []string
	for _, s := range keys {
		parts = append(parts, fmt.Sprintf("%d of %d rows", sizes[s], s))
	}
	return strings.Join(parts, ", ")
}

// build imports Fashion-MNIST's training set at prefix and says where it
// came from, or writes a synthetic set of its shape.
func build(prefix string) (string, error) {
	images := filepath.Join(fashionDir, "train-images-idx3-ubyte.gz")
	labels := filepath.Join(fashionDir, "train-labels-idx1-ubyte.gz")
	if _, err := os.Stat(images); err == nil {
		n, err := importer.IDX(context.Background(), prefix, []importer.Pair{{Images: images, Labels: labels}}, importer.Options{})
		return fmt.Sprintf("Fashion-MNIST's training set, %d images (%s)", n, fashionDir), err
	}
	const n = 60000
	td, err := tensordict.Create(prefix, []int{n},
		tensordict.Field{Key: []string{"images"}, DType: memmap.Uint8, Shape: []int{n, 28, 28}},
		tensordict.Field{Key: []string{"labels"}, DType: memmap.Int64, Shape: []int{n}})
	if err != nil {
		return "", err
	}
	img, _ := td.Tensor("images")
	row := make([]byte, 28*28)
	for i := range n {
		for j := range row {
			row[j] = byte(i + j)
		}
		if _, err := img.WriteAt(row, int64(i*len(row))); err != nil {
			td.Close()
			return "", err
		}
	}
	return "synthetic, Fashion-MNIST's shape (apt-get install dataset-fashion-mnist for the real one)", td.Close()
}
