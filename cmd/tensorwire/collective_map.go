package main

import (
	"fmt"
	"os"

	"github.com/tensorwire/tensorwire/internal/shm"
)

// dataFile is the file a Python rank and its sidecar both map: inputs are
// written at offset 0 by the Python rank, outputs by the sidecar. Either
// side grows it (never shrinks); the other remaps when a frame says the
// file is larger than its mapping.
type dataFile struct {
	f   *os.File
	m   *shm.Map
	mem []byte // m's bytes; nil while nothing is mapped
	// mapped, when set, is told of every new mapping (the sidecar
	// registers it with its communicator: collective.Comm.Register).
	mapped func(mem []byte)
	// holds counts the Isends and Irecvs that use the file's bytes where
	// they are (pyReq.Keep) and may still read or write them: while it is
	// above 0 a remap keeps the old mapping (in old), which their tensors
	// point into, until it falls to 0 (release).
	holds int
	old   []*shm.Map
}

func openDataFile(path string) (*dataFile, error) {
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		return nil, err
	}
	d := &dataFile{f: f}
	fi, err := f.Stat()
	if err != nil {
		f.Close()
		return nil, err
	}
	if err := d.remap(fi.Size()); err != nil {
		f.Close()
		return nil, err
	}
	return d, nil
}

// remap maps the first size bytes of the file (its size already).
func (d *dataFile) remap(size int64) error {
	if int64(len(d.mem)) == size {
		return nil
	}
	if d.holds > 0 {
		d.old = append(d.old, d.m)
	} else if err := d.m.Close(); err != nil {
		return err
	}
	d.m, d.mem = nil, nil
	if size == 0 {
		return nil
	}
	m, err := shm.MapFile(d.f, int(size), true)
	if err != nil {
		return fmt.Errorf("map the data file: %w", err)
	}
	d.m, d.mem = m, m.Bytes()
	if d.mapped != nil {
		d.mapped(d.mem)
	}
	return nil
}

// seen remaps when the other side says the file is now size bytes.
func (d *dataFile) seen(size int64) error {
	if size <= int64(len(d.mem)) {
		return nil
	}
	fi, err := d.f.Stat()
	if err != nil {
		return err
	}
	if fi.Size() < size {
		return fmt.Errorf("the data file is %d bytes, the request says %d", fi.Size(), size)
	}
	return d.remap(size)
}

// ensure grows the file to at least n bytes (rounded up to 1 MiB; its
// blocks reserved, so a full /dev/shm is an error here and not a SIGBUS
// later) and maps it.
func (d *dataFile) ensure(n int64) error {
	if n <= int64(len(d.mem)) {
		return nil
	}
	n = (n + 1<<20 - 1) &^ (1<<20 - 1)
	if fi, err := d.f.Stat(); err == nil && fi.Size() >= n {
		return d.remap(fi.Size())
	}
	if err := shm.Grow(d.f, int(n)); err != nil {
		return fmt.Errorf("grow the data file to %d bytes: %w", n, err)
	}
	return d.remap(n)
}

// release ends one hold; the last unmaps the mappings kept for them.
func (d *dataFile) release() {
	if d.holds--; d.holds > 0 {
		return
	}
	for _, m := range d.old {
		m.Close()
	}
	d.old = nil
}

func (d *dataFile) close() {
	for _, m := range d.old {
		m.Close()
	}
	d.old = nil
	d.m.Close()
	d.m, d.mem = nil, nil
	d.f.Close()
}
