//go:build unix

package main

import (
	"fmt"
	"os"
	"syscall"
)

// dataFile is the file a Python rank and its sidecar both map: inputs are
// written at offset 0 by the Python rank, outputs by the sidecar. Either
// side grows it (ftruncate, never shrinks); the other remaps when a frame
// says the file is larger than its mapping.
type dataFile struct {
	f   *os.File
	mem []byte
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
	if d.mem != nil {
		if err := syscall.Munmap(d.mem); err != nil {
			return err
		}
		d.mem = nil
	}
	if size == 0 {
		return nil
	}
	m, err := syscall.Mmap(int(d.f.Fd()), 0, int(size), syscall.PROT_READ|syscall.PROT_WRITE, syscall.MAP_SHARED)
	if err != nil {
		return fmt.Errorf("map the data file (%d bytes): %w", size, err)
	}
	d.mem = m
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

// ensure grows the file to at least n bytes (rounded up to 1 MiB) and maps it.
func (d *dataFile) ensure(n int64) error {
	if n <= int64(len(d.mem)) {
		return nil
	}
	n = (n + 1<<20 - 1) &^ (1<<20 - 1)
	if fi, err := d.f.Stat(); err == nil && fi.Size() >= n {
		return d.remap(fi.Size())
	}
	if err := d.f.Truncate(n); err != nil {
		return fmt.Errorf("grow the data file to %d bytes: %w", n, err)
	}
	return d.remap(n)
}

func (d *dataFile) close() {
	if d.mem != nil {
		syscall.Munmap(d.mem)
		d.mem = nil
	}
	d.f.Close()
}
