package store_test

import (
	"context"
	"errors"
	"fmt"
	"log"
	"net"
	"os"
	"path/filepath"

	"github.com/tensorwire/tensorwire/rpc"
	"github.com/tensorwire/tensorwire/store"
	"github.com/tensorwire/tensorwire/tensordict"
)

// rollout returns a small TensorDict.
func rollout(reward float32) *tensordict.TensorDict {
	td, _ := tensordict.New()
	r, _ := tensordict.FromSlice([]float32{reward})
	td.Set("reward", r)
	return td
}

// Bins in one process: tensorshare's put, append, peek, get and list.
func Example() {
	dir, _ := os.MkdirTemp("", "store-example-")
	defer os.RemoveAll(dir)
	ctx := context.Background()
	s, err := store.Open(filepath.Join(dir, "st"), store.Options{})
	if err != nil {
		log.Fatal(err)
	}
	defer s.Close()

	s.Put(ctx, "xyz", rollout(1))    // replaces the bin's content
	s.Append(ctx, "xyz", rollout(2)) // adds an item
	s.Append(ctx, "xyz", rollout(3))
	counts, rev, _ := s.List(ctx)
	fmt.Println("list:", counts, "at revision", rev)

	items, _ := s.Get(ctx, "xyz") // returns the items and empties the bin
	for _, td := range items {
		r, _ := td.Tensor("reward")
		v, _ := tensordict.Values[float32](r)
		fmt.Println("got reward", v[0])
		td.Close()
	}
	counts, _, _ = s.List(ctx)
	fmt.Println("list after get:", counts)
	// Output:
	// list: map[xyz:3] at revision 3
	// got reward 1
	// got reward 2
	// got reward 3
	// list after get: map[]
}

// Several items as one operation (torchrl's extend): one revision, all
// of them or none.
func ExampleStore_Extend() {
	dir, _ := os.MkdirTemp("", "store-example-")
	defer os.RemoveAll(dir)
	ctx := context.Background()
	s, err := store.Open(filepath.Join(dir, "st"), store.Options{})
	if err != nil {
		log.Fatal(err)
	}
	defer s.Close()

	s.Append(ctx, "rollouts", rollout(1))
	rev, err := s.Extend(ctx, "rollouts", []*tensordict.TensorDict{rollout(2), rollout(3), rollout(4)})
	if err != nil {
		log.Fatal(err)
	}
	counts, _, _ := s.List(ctx)
	fmt.Println("revision", rev, "items", counts["rollouts"])
	_, err = s.Extend(ctx, "rollouts", nil)
	fmt.Println(errors.Is(err, store.ErrFormat))
	// Output:
	// revision 2 items 4
	// true
}

// Parameters and rollouts: tensorshare's RLTrainer and RLWorker.
func ExampleTrainer() {
	dir, _ := os.MkdirTemp("", "store-example-")
	defer os.RemoveAll(dir)
	ctx := context.Background()
	s, _ := store.Open(filepath.Join(dir, "st"), store.Options{})
	defer s.Close()

	trainer, _ := store.NewTrainer(s) // keeps rollouts of its latest version only
	worker, _ := store.NewWorker(s)

	trainer.Publish(ctx, rollout(0.5)) // version 1
	p, _ := worker.WaitNewer(ctx)      // the first version
	fmt.Println("worker has version", p.Version)
	p.Close()
	worker.AddRollout(ctx, rollout(1)) // made with version 1

	trainer.Publish(ctx, rollout(0.6)) // version 2: the rollout above is now off-policy
	p, _ = worker.WaitNewer(ctx)
	p.Close()
	worker.AddRollout(ctx, rollout(2)) // made with version 2

	rs, _ := trainer.Rollouts(ctx)
	for _, r := range rs {
		fmt.Println("rollout of version", r.Version)
		r.Close()
	}
	fmt.Println("dropped", trainer.Dropped())
	// Output:
	// worker has version 1
	// rollout of version 2
	// dropped 1
}

// Watching a bin: events with revisions, from any revision still kept.
func ExampleStore_Watch() {
	dir, _ := os.MkdirTemp("", "store-example-")
	defer os.RemoveAll(dir)
	ctx := context.Background()
	s, _ := store.Open(filepath.Join(dir, "st"), store.Options{})
	defer s.Close()

	s.Append(ctx, "data", rollout(1))
	s.Append(ctx, "data", rollout(2))
	s.Get(ctx, "data")
	n := 0
	for e, err := range s.Watch(ctx, "data", 0) {
		if err != nil {
			log.Fatal(err)
		}
		fmt.Println(e.Revision, e.Op, e.Name, e.Items)
		if n++; n == 3 {
			break
		}
	}
	// Output:
	// 1 append data 1
	// 2 append data 2
	// 3 get data 0
}

// A node serving a store, and a client sharing its root: large values go
// by reference.
func ExampleDial() {
	root, _ := os.MkdirTemp("", "store-example-")
	defer os.RemoveAll(root)
	ctx := context.Background()

	// The node: tensorwire node --root ROOT --store st does the same.
	s, _ := store.Open(filepath.Join(root, "st"), store.Options{})
	defer s.Close()
	srv, _ := rpc.NewServer(rpc.WithRoot(root))
	svc, _ := store.Register(srv)
	svc.Add("st", s)
	l, _ := net.Listen("tcp", "127.0.0.1:0")
	go srv.Serve(l)
	defer srv.Close()

	c, err := store.Dial(ctx, l.Addr().String(), "st", store.WithRoot(root))
	if err != nil {
		log.Fatal(err)
	}
	defer c.Close()
	fmt.Println("shared filesystem:", c.SharedFS())

	w, _ := tensordict.FromSlice(make([]float32, 1<<20)) // 4 MiB: written once, renamed into place
	params, _ := tensordict.New()
	params.Set("w", w)
	v, _ := c.Publish(ctx, "net", params)
	p, _ := c.Latest(ctx, "net") // a read-only mapping, leased until Close
	x, _ := p.TD.Tensor("w")
	fmt.Println("version", v, "mapped", x.Mapped())
	p.Close()
	// Output:
	// shared filesystem: true
	// version 1 mapped true
}
