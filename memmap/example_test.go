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
