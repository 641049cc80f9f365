// Command rpcfill runs the seed scenario end to end: node A creates a 1.2 GB
// memory-mapped TensorDict on a shared filesystem, asks node B to fill some
// of its rows, and sees the result in its own mapping, with no tensor bytes
// crossing the network.
//
//	go run ./examples/rpcfill [--rows 1000] [--root DIR] [--addr HOST:PORT] [--token-file F]
//
// Node A (this process) creates {"memmap": uint8 [rows, 640, 640, 3]} with
// tensordict.Create, which reserves the file's disk blocks without putting
// a byte of it in Go memory, under the shared root: a new temporary folder,
// or a new folder inside --root; it is removed at the end. It then calls
// fill on node B with rows [0, 1, 2, 3, rows-1], then [4, 5, 6, 7, rows-2]
// ([..., 999] and [..., 998] at the default size). Node B resolves the
// reference in its own root, maps the same file and writes ones into those
// rows. Node A checks, in its own mapping, that exactly those rows are now
// all ones, and that rows 8, rows-3 and a sample of others are still all
// zeros.
//
// Without --addr, node B is this same program, re-executed as a child
// process (nodeb.go) that serves with rpc.NewServer and Serve, as
// "tensorwire node" does, on a free loopback port, with a random token it
// reads from its standard input. With --addr it is a node you started,
// sharing the root:
//
//	tensorwire node --listen 127.0.0.1:7070 --root DIR --token-file F
//	go run ./examples/rpcfill --addr 127.0.0.1:7070 --root DIR --token-file F
//
// # How to read the output
//
// "shared filesystem: true" means both nodes found the same identity file
// at their roots, so the call carried a reference (the file's path under
// the root, dtype, shape and the five row numbers: a few hundred bytes)
// instead of 6,144,000 bytes of rows each way. With false (node B has a
// different root) the same calls work, but the rows travel as bytes. The
// times are what node A waited for each call; the first includes node B
// mapping the file and both calls include the first touch of pages never
// written (benchmarks/fill measures warm and cold calls). The Go heap line
// shows that 1.2 GB of storage cost no Go memory.
package main

import (
	"bytes"
	"context"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"path/filepath"
	"runtime"
	"slices"
	"syscall"
	"time"

	"github.com/tensorwire/tensorwire/memmap"
	"github.com/tensorwire/tensorwire/rpc"
	"github.com/tensorwire/tensorwire/tensordict"
)

var imageShape = []int{640, 640, 3}

type config struct {
	rows                  int
	root, addr, tokenFile string
}

func main() {
	if len(os.Args) > 1 && os.Args[1] == nodeBArg { // node B, when this program is re-executed as one
		os.Exit(runNodeB(os.Args[2:]))
	}
	var cfg config
	flag.IntVar(&cfg.rows, "rows", 1000, "rows (640x640x3 images) of the TensorDict")
	flag.StringVar(&cfg.root, "root", "", "the shared root (default: a new temporary folder)")
	flag.StringVar(&cfg.addr, "addr", "", "node B's address (default: start node B here)")
	flag.StringVar(&cfg.tokenFile, "token-file", "", "the shared secret (default with --addr: none; without: a random one)")
	flag.Parse()
	if flag.NArg() > 0 || cfg.rows < 16 {
		fmt.Fprintln(os.Stderr, "rpcfill: need --rows >= 16 and no arguments")
		flag.Usage()
		os.Exit(2)
	}
	if err := run(cfg); err != nil {
		slog.Error("rpcfill failed", "err", err)
		os.Exit(1)
	}
}

func run(cfg config) (err error) {
	// Ctrl-C or SIGTERM ends the calls, so that the folder still goes.
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	ctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()

	// The shared root, and the folder of ours in it that goes at the end.
	root, mine := cfg.root, ""
	if root == "" {
		if root, err = os.MkdirTemp("", "tensorwire-rpcfill-"); err != nil {
			return err
		}
		mine = root
	} else if mine, err = os.MkdirTemp(root, "rpcfill-"); err != nil {
		return err
	}
	defer func() {
		if rerr := os.RemoveAll(mine); rerr != nil && err == nil {
			err = rerr
		}
	}()
	prefix := filepath.Join(mine, "images")
	rel, err := filepath.Rel(root, prefix)
	if err != nil {
		return err
	}

	// Node A: the storage.
	start := time.Now()
	td, err := tensordict.Create(prefix, []int{cfg.rows},
		tensordict.Field{Key: []string{"memmap"}, DType: memmap.Uint8, Shape: append([]int{cfg.rows}, imageShape...)})
	if err != nil {
		return err
	}
	defer td.Close()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	fmt.Printf("node A  pid %d created %s {\"memmap\": uint8 %v} (%.2f GB) in %v; Go heap in use: %s\n",
		os.Getpid(), prefix, append([]int{cfg.rows}, imageShape...), float64(td.NumBytes())/1e9,
		time.Since(start).Round(time.Millisecond), formatBytes(ms.HeapInuse))

	// Node B: ours, or the one at --addr.
	addr, token := cfg.addr, []byte(nil)
	if cfg.tokenFile != "" {
		if token, err = readToken(cfg.tokenFile); err != nil {
			return err
		}
	}
	if addr == "" {
		if token == nil {
			token = randomToken()
		}
		b, err := startNodeB(ctx, root, token)
		if err != nil {
			return err
		}
		defer func() {
			if serr := b.stop(); serr != nil && err == nil {
				err = serr
			}
		}()
		addr = b.addr
		fmt.Printf("node B  pid %d (this program, re-executed) listening on %s\n", b.pid(), addr)
	} else {
		fmt.Printf("node B  %s\n", addr)
	}
	opts := []rpc.Option{rpc.WithRoot(root)}
	if token != nil {
		opts = append(opts, rpc.WithToken(token))
	}
	c, err := rpc.Dial(ctx, addr, opts...)
	if err != nil {
		return err
	}
	defer c.Close()
	shared, err := c.SharedFS(ctx)
	if err != nil {
		return err
	}
	how := "TensorDicts travel as references (path, dtype, shape, rows), no tensor bytes cross"
	if !shared {
		how = "node B has another root: the rows travel as bytes, both ways"
	}
	fmt.Printf("link    shared filesystem: %v (root %s): %s\n", shared, root, how)
	if shared {
		desc, err := c.Describe(ctx, filepath.ToSlash(rel))
		if err != nil {
			return err
		}
		for _, f := range desc.Fields {
			fmt.Printf("node B  sees %s: batch %v, %q %s %v, %d bytes\n", rel, desc.Batch, f.Key, f.DType, f.Shape, desc.Bytes)
		}
	}

	// The seed's two calls, each checked in node A's own mapping.
	n := cfg.rows
	calls := [][]int{{0, 1, 2, 3, n - 1}, {4, 5, 6, 7, n - 2}}
	sample := []int{8, n - 3}
	for k := 1; k < 10; k++ { // and about every tenth row between them
		if r := k * n / 10; r > 8 && r < n-3 {
			sample = append(sample, r)
		}
	}
	rowBytes := td.NumBytes() / n
	moved := "of rows written by node B into the mapped file"
	if !shared {
		moved = "of rows sent to node B and back"
	}
	var ones []int
	for i, rows := range calls {
		t0 := time.Now()
		if err := c.Fill(ctx, td, rows, 1); err != nil {
			return err
		}
		fmt.Printf("fill    %v with 1 on node B: %.2f ms (%d bytes %s)\n",
			rows, float64(time.Since(t0).Microseconds())/1000, len(rows)*rowBytes, moved)
		ones = append(ones, rows...)
		zeros := append(slices.Concat(calls[i+1:]...), sample...)
		if err := verify(td, ones, zeros); err != nil {
			return err
		}
		fmt.Printf("checked in node A's mapping, every byte of each row:\n  all ones:  %v\n  all zeros: %v\n", ones, zeros)
	}
	return nil
}

// verify checks that every byte of each row in ones is 1 and of each row in
// zeros is 0, reading node A's mapping one row at a time.
func verify(td *tensordict.TensorDict, ones, zeros []int) error {
	x, err := td.Tensor("memmap")
	if err != nil {
		return err
	}
	row := make([]byte, x.RowBytes())
	check := func(rows []int, want byte) error {
		for _, r := range rows {
			if _, err := x.ReadAt(row, int64(r)*int64(len(row))); err != nil {
				return err
			}
			if bytes.Count(row, []byte{want}) != len(row) { // vectorized; the loop finds the byte
				i := 0
				for row[i] == want {
					i++
				}
				return fmt.Errorf("node B did not leave the rows as asked: row %d byte %d is %d, want %d", r, i, row[i], want)
			}
		}
		return nil
	}
	if err := check(ones, 1); err != nil {
		return err
	}
	return check(zeros, 0)
}

// formatBytes prints n bytes in binary units: "3.2 MiB".
func formatBytes(n uint64) string {
	const units = "KMGTPE"
	if n < 1024 {
		return fmt.Sprintf("%d B", n)
	}
	f, i := float64(n)/1024, 0
	for f >= 1024 && i < len(units)-1 {
		f /= 1024
		i++
	}
	return fmt.Sprintf("%.1f %ciB", f, units[i])
}
