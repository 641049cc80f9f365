package collective

import (
	"errors"
	"fmt"
	"syscall"

	"github.com/tensorwire/tensorwire/memmap"
	"github.com/tensorwire/tensorwire/tensordict"
)

// Shared buffers (docs/collective.md, "Shared buffers"). Through shared
// mappings a collective copies each rank's input into that rank's data
// file, where the others read it, and copies the result out: the bytes
// cross memory three times. A buffer the other ranks can map where it is,
// one from Alloc or in a file given to Register, saves those copies: an
// Allreduce (AllreduceInto, in place or not) whose input and output are
// shared buffers on every rank is reduced where the inputs are, each rank
// reducing its share of every rank's input and writing the result into
// every rank's output once. A call where some rank's buffers are not
// shared runs as before, with the same result; the choice is made alike on
// every rank, from what every rank's description says.
//
// Only a shared-mapping communicator (Transport SHM) has shared buffers:
// on the others Alloc returns an ordinary tensor and Register does
// nothing, so a program may use them whatever the transport.

// The bits of a rank's reference word (refBits, shm_shared_linux.go).
const (
	refIn      = 1 << iota // the input is in a shared buffer, where refInIdx and refInOff say
	refOut                 // so is the output (refOutIdx, refOutOff), and it is the input or does not overlap it
	refExposed             // the rank did not publish its input: the others read it in its buffer
)

// ErrNotShared is what Free returns for a tensor that Alloc did not make
// (on this communicator), and Deregister for a path never registered.
var ErrNotShared = errors.New("collective: not a shared buffer of this communicator")

// Alloc returns a zeroed tensor of dt and shape whose bytes live in a file
// of the communicator's shared folder, mapped by the other ranks when a
// collective needs it (see "Shared buffers" above). On a communicator
// without shared mappings it is tensordict.Zeros.
//
// The memory lives until Free, also past Close (Close removes the file
// from the folder, not the mapping): a tensor from Alloc is valid as long
// as the program does not Free it. Free it once no collective in flight
// uses it and nothing reads it any more. Alloc is safe to call from any
// goroutine, also while a collective runs. On tmpfs (the default folder)
// the pages are reserved when Alloc returns: a full folder is an error
// wrapping ErrNoSpace, never a fault later.
func (c *Comm) Alloc(dt memmap.DType, shape ...int) (*tensordict.Tensor, error) {
	if c.shm == nil {
		return tensordict.Zeros(dt, shape...)
	}
	if err := c.err(); err != nil {
		return nil, err
	}
	n, err := memmap.NumBytes(dt, shape)
	if err != nil {
		return nil, fmt.Errorf("%w: %v", ErrArgument, err)
	}
	if n == 0 {
		return tensordict.Zeros(dt, shape...) // nothing to share
	}
	b, err := c.shm.alloc(n)
	if err != nil {
		return nil, noSpace(fmt.Errorf("collective: alloc %d bytes: %w", n, err))
	}
	return tensordict.FromBytes(dt, shape, b)
}

// Free releases a tensor from Alloc: its mapping and its file. The tensor,
// and every view of its bytes, must not be used after. A tensor that is
// not from Alloc on this communicator is ErrNotShared (and an ordinary
// tensor from Alloc on a communicator without shared mappings, or one of
// no elements, is left to the garbage collector: Free returns nil).
func (c *Comm) Free(t *tensordict.Tensor) error {
	if c.shm == nil {
		return nil
	}
	b, err := t.Bytes()
	if err != nil {
		return err
	}
	if len(b) == 0 {
		return nil
	}
	return c.shm.free(b)
}

// Register makes the file at path, of which mem is a shared (MAP_SHARED)
// mapping from the file's first byte, a shared buffer of this rank: a
// collective whose tensors lie within mem is read and written there by
// the other ranks. The communicator links the file into its shared folder
// (Config.ShmDir), where the others map it: path must be on that folder's
// file system (else an error, and nothing registered), and may be unlinked
// after (the link keeps the file until Deregister or Close). Registering a
// path again replaces its mapping, as after the file grew and was mapped
// anew; the file must never shrink below what a collective in flight uses.
// Register changes nothing on a communicator without shared mappings.
func (c *Comm) Register(path string, mem []byte) error {
	if c.shm == nil {
		return nil
	}
	if err := c.err(); err != nil {
		return err
	}
	return c.shm.register(path, mem)
}

// Deregister undoes Register: collectives no longer use the file in
// place. ErrNotShared for a path not registered.
func (c *Comm) Deregister(path string) error {
	if c.shm == nil {
		return nil
	}
	return c.shm.deregister(path)
}

// noSpace marks a failure to reserve room in the folder as ErrNoSpace
// when it is one.
func noSpace(err error) error {
	if errors.Is(err, syscall.ENOSPC) || errors.Is(err, syscall.EDQUOT) {
		return fmt.Errorf("%w: %w", ErrNoSpace, err)
	}
	return err
}
