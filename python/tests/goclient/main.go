// Command goclient is the Go side of the Python client's serve tests
// (python/tests/test_serve.py): it predicts with serve.Client, the Go
// client, so that the Python client's outputs can be compared with its
// own, and measures its predictions per second for the benchmark there.
//
//	goclient -addr A -name M [-token-file F] [-root R] predict IN OUT
//	goclient -addr A -name M [-token-file F] [-root R] bench N DURATION
//
// predict reads IN, the raw little-endian bytes of the input rows (each
// input field's rows, one field after the other, in the model's input
// schema order), predicts them in one request, writes the outputs the same
// way into OUT and prints "version V". bench runs N goroutines, each
// predicting one row (zeros) in a loop for DURATION, and prints
// "predictions/s X". Without -root the rows travel as bytes.
package main

import (
	"bytes"
	"context"
	"flag"
	"fmt"
	"os"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/tensorwire/tensorwire/rpc"
	"github.com/tensorwire/tensorwire/serve"
)

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "goclient:", err)
		os.Exit(1)
	}
}

func run() error {
	addr := flag.String("addr", "", "the node")
	name := flag.String("name", "", "the model")
	tokenFile := flag.String("token-file", "", "the node's token")
	root := flag.String("root", "", "the shared root (empty: bytes)")
	flag.Parse()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	var opts []serve.DialOption
	if *tokenFile != "" {
		b, err := os.ReadFile(*tokenFile)
		if err != nil {
			return err
		}
		opts = append(opts, serve.WithRPC(rpc.WithToken(bytes.TrimRight(b, "\r\n"))))
	}
	if *root != "" {
		opts = append(opts, serve.WithRoot(*root))
	} else {
		opts = append(opts, serve.WithBytes())
	}
	c, err := serve.Dial(ctx, *addr, *name, opts...)
	if err != nil {
		return err
	}
	defer c.Close()
	args := flag.Args()
	switch {
	case len(args) == 3 && args[0] == "predict":
		return predict(ctx, c, args[1], args[2])
	case len(args) == 3 && args[0] == "bench":
		n, err := strconv.Atoi(args[1])
		if err != nil {
			return err
		}
		d, err := time.ParseDuration(args[2])
		if err != nil {
			return err
		}
		return bench(ctx, c, n, d)
	}
	return fmt.Errorf("want predict IN OUT, or bench N DURATION; got %q", args)
}

func predict(ctx context.Context, c *serve.Client, inPath, outPath string) error {
	raw, err := os.ReadFile(inPath)
	if err != nil {
		return err
	}
	schema := c.InputSchema()
	rowBytes := 0
	for _, f := range schema {
		rowBytes += f.DType.Size() * numel(f.Shape)
	}
	if rowBytes == 0 || len(raw)%rowBytes != 0 {
		return fmt.Errorf("%d bytes of input for rows of %d", len(raw), rowBytes)
	}
	n := len(raw) / rowBytes
	in, err := schema.Zeros(n)
	if err != nil {
		return err
	}
	for _, f := range schema {
		t, err := in.Tensor(f.Key...)
		if err != nil {
			return err
		}
		b, err := t.Bytes()
		if err != nil {
			return err
		}
		raw = raw[copy(b, raw):]
	}
	out, v, err := c.Predict(ctx, in)
	if err != nil {
		return err
	}
	var w bytes.Buffer
	for _, f := range c.OutputSchema() {
		t, err := out.Tensor(f.Key...)
		if err != nil {
			return err
		}
		b, err := t.Bytes()
		if err != nil {
			return err
		}
		w.Write(b)
	}
	if err := os.WriteFile(outPath, w.Bytes(), 0o644); err != nil {
		return err
	}
	fmt.Println("version", v)
	return nil
}

func bench(ctx context.Context, c *serve.Client, workers int, d time.Duration) error {
	var done atomic.Int64
	var wg sync.WaitGroup
	errs := make(chan error, workers)
	stop := time.Now().Add(d)
	start := time.Now()
	for range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			in, err := c.InputSchema().Zeros(1)
			if err != nil {
				errs <- err
				return
			}
			for time.Now().Before(stop) {
				if _, _, err := c.Predict(ctx, in); err != nil {
					errs <- err
					return
				}
				done.Add(1)
			}
		}()
	}
	wg.Wait()
	close(errs)
	if err := <-errs; err != nil {
		return err
	}
	fmt.Printf("predictions/s %.0f\n", float64(done.Load())/time.Since(start).Seconds())
	return nil
}

func numel(shape []int) int {
	n := 1
	for _, d := range shape {
		n *= d
	}
	return n
}
