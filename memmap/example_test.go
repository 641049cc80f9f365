package memmap_test

import (
	"fmt"
	"log"
	"os"
	"path/filepath"

	"github.com/tensorwire/tensorwire/memmap"
)

// Create a file-backed tensor, scatter rows into it, and gather them back.
func ExampleCreate() {
	dir, _ := os.MkdirTemp("", "example")
	defer os.RemoveAll(dir)

	t, err := memmap.Create(filepath.Join(dir, "x.memmap"), memmap.Uint8, 4, 3)
	if err != nil {
		log.Fatal(err)
	}
	defer t.Close()
	if err := t.Scatter([]int{2, 0}, []byte{7, 7, 7, 1, 2, 3}); err != nil {
		log.Fatal(err)
	}
	rows := make([]byte, 2*t.RowBytes())
	if err := t.Gather(rows, []int{0, 2}); err != nil {
		log.Fatal(err)
	}
	fmt.Println(rows, t.Shape())
	// Output: [1 2 3 7 7 7] [4 3]
}

// Write rows of a mapped tensor to a file (or a socket) without copying
// them through a buffer of your own: on a descriptor the kernel copies
// straight from the mapping.
func ExampleTensor_GatherTo() {
	dir, _ := os.MkdirTemp("", "example")
	defer os.RemoveAll(dir)

	t, err := memmap.Create(filepath.Join(dir, "lines.memmap"), memmap.Uint8, 3, 4)
	if err != nil {
		log.Fatal(err)
	}
	defer t.Close()
	if err := t.Scatter([]int{0, 1, 2}, []byte("one\ntwo\nsix\n")); err != nil {
		log.Fatal(err)
	}
	out, err := os.Create(filepath.Join(dir, "out.txt"))
	if err != nil {
		log.Fatal(err)
	}
	defer out.Close()
	n, err := t.GatherTo(out, 0, t.RowBytes(), []int{2, 0, 0})
	if err != nil {
		log.Fatal(err)
	}
	b, _ := os.ReadFile(out.Name())
	fmt.Printf("%d bytes:\n%s", n, b)
	// Output:
	// 12 bytes:
	// six
	// one
	// one
}
