//go:build linux

package collective_test

import (
	"context"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"sync"
	"time"

	"github.com/tensorwire/tensorwire/collective"
	"github.com/tensorwire/tensorwire/tensordict"
)

// Four ranks on two "hosts": a host is a kernel and a shared folder, so
// ranks 0 and 1, with one folder, share mappings, as do ranks 2 and 3 with
// another, and the two hosts meet over TCP. On separate machines each
// would simply use /dev/shm.
func ExampleComm_Topology() {
	l, _ := net.Listen("tcp", "127.0.0.1:0")
	addr := l.Addr().String()
	l.Close()
	base, _ := os.MkdirTemp("", "hosts")
	defer os.RemoveAll(base)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()

	const size = 4
	tops := make([]collective.Topology, size)
	sums := make([][]float32, size)
	var wg sync.WaitGroup
	for rank := range size {
		dir := filepath.Join(base, fmt.Sprint("host", rank/2))
		os.MkdirAll(dir, 0o700)
		wg.Go(func() {
			c, err := collective.Join(ctx, collective.Config{Rank: rank, Size: size, Addr: addr, ShmDir: dir})
			if err != nil {
				fmt.Println(err)
				return
			}
			defer c.Close()
			tops[rank] = c.Topology()
			x, _ := tensordict.FromSlice([]float32{float32(rank), 1})
			y, err := c.Allreduce(ctx, x, collective.Sum)
			if err != nil {
				fmt.Println(err)
				return
			}
			sums[rank], _ = tensordict.Values[float32](y)
		})
	}
	wg.Wait()
	for _, h := range tops[3].Hosts {
		fmt.Println("host: ranks", h.Ranks, "leader", h.Leader)
	}
	fmt.Println("within a host:", tops[3].Local, "between hosts:", tops[3].Between)
	fmt.Println(sums)
	// Output:
	// host: ranks [0 1] leader 0
	// host: ranks [2 3] leader 2
	// within a host: shm between hosts: tcp
	// [[6 4] [6 4] [6 4] [6 4]]
}
