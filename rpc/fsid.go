package rpc

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
)

// FSIDFile is the name of the file, at the top of a shared root, that holds
// the root's filesystem identity.
const FSIDFile = ".tensorwire-fsid"

// FSID is a filesystem identity: 16 random bytes stored once in FSIDFile at
// a shared root. Every node that mounts the same shared filesystem reads the
// same id there, so two nodes whose ids are equal (and not zero) can send
// each other references to files under the root instead of their bytes.
// The zero FSID means "no shared root".
type FSID [16]byte

// IsZero reports whether id is the zero FSID.
func (id FSID) IsZero() bool { return id == FSID{} }

// String returns id in lower-case hex, as it is stored in FSIDFile.
func (id FSID) String() string { return hex.EncodeToString(id[:]) }

// ReadFSID returns the identity of the shared root dir, creating FSIDFile
// with a new random id if the root has none. Creation is atomic and safe
// against other nodes doing the same at once: the file is written under a
// temporary name and hard-linked into place, and whoever links first wins;
// the others read the winner's id.
func ReadFSID(root string) (FSID, error) {
	path := filepath.Join(root, FSIDFile)
	id, err := readFSIDFile(path)
	if err == nil || !errors.Is(err, os.ErrNotExist) {
		return id, err
	}
	if _, err := rand.Read(id[:]); err != nil {
		return FSID{}, fmt.Errorf("fsid: %w", err)
	}
	tmp, err := os.CreateTemp(root, FSIDFile+".tmp*")
	if err != nil {
		return FSID{}, fmt.Errorf("fsid: %w", err)
	}
	defer os.Remove(tmp.Name())
	_, err = tmp.WriteString(id.String() + "\n")
	if err == nil {
		err = tmp.Sync()
	}
	if cerr := tmp.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return FSID{}, fmt.Errorf("fsid: %w", err)
	}
	if err := os.Link(tmp.Name(), path); err != nil && !errors.Is(err, os.ErrExist) {
		return FSID{}, fmt.Errorf("fsid: %w", err)
	}
	return readFSIDFile(path)
}

func readFSIDFile(path string) (FSID, error) {
	var id FSID
	b, err := os.ReadFile(path)
	if err != nil {
		return id, fmt.Errorf("fsid: %w", err)
	}
	s := strings.TrimSpace(string(b))
	if n, err := hex.Decode(id[:], []byte(s)); err != nil || n != len(id) || len(s) != 2*len(id) || id.IsZero() {
		return FSID{}, fmt.Errorf("fsid: %s does not hold a %d-byte hex id", path, len(id))
	}
	return id, nil
}
