//go:build !unix

package main

import (
	"errors"
	"os"
)

// dataFile needs shared mappings of a file (unix): elsewhere the sidecar
// does not start.
type dataFile struct {
	f   *os.File
	mem []byte
}

var errNoMapping = errors.New("the collective sidecar needs unix shared mappings")

func openDataFile(string) (*dataFile, error) { return nil, errNoMapping }
func (d *dataFile) seen(int64) error         { return errNoMapping }
func (d *dataFile) ensure(int64) error       { return errNoMapping }
func (d *dataFile) close()                   {}
