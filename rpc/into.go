package rpc

import (
	"errors"
	"slices"

	"github.com/tensorwire/tensorwire/tensordict"
)

// CallInto's side of a response: a TD whose wire form fits a TensorDict the
// caller holds is read into that TensorDict's tensors instead of new ones
// (docs/architecture.md, "rpc: results read into the caller's tensors").

// fits reports whether a TD of w's form would be built with dst's
// structure: w's entries are dst's items, as many and key for key, each
// tensor with its dtype and shape and sent as bytes, each nested
// TensorDict with its batch size, no non-tensor data; and w's batch size
// is dst's. Nothing is allocated, so a loop of calls allocates nothing
// to find its TensorDicts fit.
func (w *wireTD) fits(dst *tensordict.TensorDict) bool {
	if w == nil || !slices.Equal(w.Batch, dst.BatchSize()) || w.checkGathered() != nil {
		return false
	}
	items := 0
	for range dst.Items() {
		items++
	}
	// As many entries as dst has items, each naming one of them: with no
	// key twice, every item of dst is named (and, below, receives its
	// bytes). The count first, so that the quadratic check of keys is
	// bounded by the caller's TensorDict, not the peer's message.
	if len(w.Entries) != items {
		return false
	}
	for i, e := range w.Entries {
		v, err := dst.Get(e.Key...)
		if err != nil {
			return false
		}
		switch e.Kind {
		case kindTensor:
			x, ok := v.(*tensordict.Tensor)
			if !ok || e.Ref != nil || x.DType().String() != e.DType || !slices.Equal(x.Shape(), e.Shape) {
				return false
			}
		case kindDict:
			sub, ok := v.(*tensordict.TensorDict)
			if !ok || !slices.Equal(sub.BatchSize(), e.Shape) {
				return false
			}
		default:
			return false
		}
		for _, o := range w.Entries[:i] {
			if slices.Equal(o.Key, e.Key) {
				return false
			}
		}
	}
	return true
}

// fillInto reads t's tensors from body into those of dst, which fits t's
// wire form, and makes dst t's TensorDict. A tensor in Go memory is read
// into directly; a mapped one a chunk at a time through *buf (taken from
// the pool at the first; the caller puts it back) and written as WriteAt
// writes, so that a file truncated under it is an error, not a fault.
//
// A mapped tensor that cannot be written (its file truncated under it,
// closed, its disk full) fails the call with Internal, as other failures to
// take a response on the caller's side do, its cause kept for errors.Is
// (memmap.ErrFault): not Unavailable, which the call would make of it as
// of a connection's failure, while the node and the connection did
// nothing wrong (the rest of the body is read, and the stream kept).
func (t *TD) fillInto(dst *tensordict.TensorDict, body *bodyReader, buf **[]byte) error {
	for _, e := range t.wire.Entries {
		if e.Kind != kindTensor {
			continue
		}
		v, err := dst.Get(e.Key...)
		x, ok := v.(*tensordict.Tensor)
		if err != nil || !ok {
			return Errorf(Internal, "TD %s: not a tensor of the TensorDict it fitted", keyString(e.Key)) // fits checked it
		}
		if mm, _ := x.Mapping(); mm == nil {
			if err := body.fill(x); err != nil {
				return err
			}
			continue
		}
		if *buf == nil {
			*buf = getBuf(placeChunk)
		}
		if err := body.fillFile(x, (**buf)[:placeChunk], false); err != nil {
			_, wire := errors.AsType[*Error](err)
			if _, broken := errors.AsType[*streamError](err); wire || broken {
				return err // the body's: short, corrupt, or cut off
			}
			return Errorf(Internal, "TD %s: %w", keyString(e.Key), err)
		}
	}
	t.set(dst)
	return nil
}
