package rpc

import (
	"fmt"
	"os"
	"reflect"
	"slices"

	"github.com/tensorwire/tensorwire/memmap"
	"github.com/tensorwire/tensorwire/tensordict"
)

// Placing a request's bytes in files as they arrive (PlaceBytes).
//
// A TD that travels as bytes is read into Go memory before its handler
// runs, and a handler that keeps it writes it to disk after: a store
// publishing a 10 MB version received it whole (2.5 to 3.5 ms on loopback)
// and only then wrote and synced it. With PlaceBytes the handler's
// registration names a folder for it before the body is read; the package
// lays the TD out there (tensordict.CreateUnsynced) and writes each
// megabyte into its file as it comes off the connection, starting its
// writeback at once, so the disk works on the first megabytes while the
// last are on the wire and the handler's sync waits for the tail. Nothing
// on the wire changes: the peer cannot tell.

// A RegisterOption changes how Register serves a method.
type RegisterOption struct {
	place any // PlaceBytes's function, typed for the Req it was made for
	req   reflect.Type
}

// Layout is what a TD that travels as bytes will hold, as PlaceBytes's
// function sees it before the bytes arrive: what tensordict.Create makes.
type Layout struct {
	Batch  []int
	Fields []tensordict.Field // in the order their bytes travel
}

// Bytes returns the bytes of l's tensors.
func (l Layout) Bytes() int64 {
	var n int64
	for _, f := range l.Fields {
		b, _ := memmap.NumBytes(f.DType, f.Shape) // checked as the request was decoded
		n += int64(b)
	}
	return n
}

// Placement is where PlaceBytes's function puts a TD's bytes.
type Placement struct {
	// Prefix is the folder the TD is laid out in, in tensordict's memmap
	// format; it must not exist, and its parent must. "" builds the TD in
	// memory as usual.
	Prefix string
	// Writeback: the handler will make the files durable, so the kernel is
	// asked to start writing each megabyte to the disk as soon as it is in
	// (memmap.Tensor.StartWriteback), and the handler's sync waits for the
	// last ones only. Without it the pages are left to the kernel.
	Writeback bool
}

// PlaceBytes has Register write the bytes of a request's TDs into files as
// they arrive, where place says, instead of into Go memory: for a handler
// that would write them to disk anyway (a store's new version), so that
// receiving and writing overlap.
//
// place is called once the request's arguments are decoded and before its
// body is read, for each TD of the request (td, a field of req) that
// travels as bytes and whose layout tensordict.Create can make (its
// tensors only, every nested TensorDict of the root's batch size, not
// Out); other TDs, and TDs for which place returns an empty Prefix, are
// built in memory as usual. It runs on the connection's reader: it must
// not block. An error it returns
// fails the call with that error, and the body is read and dropped. If the
// folder cannot be made (a key tensordict cannot write, a full disk), the
// TD is built in memory instead, and the handler meets the failure when it
// writes it itself.
//
// The handler then gets the TD mapped read-write from Prefix (TD.Prefix),
// its files neither flushed nor synced: it makes them durable itself
// (tensordict.SyncPrefix) if it must. The folder lives for the call: the
// handler keeps it by moving it elsewhere (a rename), and whatever is
// still at Prefix when the call ends is removed, the TD's mappings closed
// first; so is a folder whose body did not arrive whole, without the
// handler running. A process that dies mid-call leaves the folder for its
// owner to sweep.
func PlaceBytes[Req any](place func(req *Req, td *TD, l Layout) (Placement, error)) RegisterOption {
	return RegisterOption{place: place, req: reflect.TypeFor[Req]()}
}

// placeFunc returns opts' placing function for Req, or an error if one
// was made for another request type.
func placeFunc[Req any](method string, opts []RegisterOption) (func(*Req, *TD, Layout) (Placement, error), error) {
	var place func(*Req, *TD, Layout) (Placement, error)
	for _, o := range opts {
		if o.place == nil {
			continue
		}
		p, ok := o.place.(func(*Req, *TD, Layout) (Placement, error))
		if !ok {
			return nil, fmt.Errorf("rpc: method %q: PlaceBytes for requests of type %v, not %v", method, o.req, reflect.TypeFor[Req]())
		}
		place = p
	}
	return place, nil
}

// placed is a TD laid out in a folder by PlaceBytes, held for its call.
type placed struct {
	td     *tensordict.TensorDict
	prefix string
}

// layout returns the layout of a TD that travels as bytes, and whether
// tensordict.Create makes exactly its structure: tensors only, none by
// reference, every nested TensorDict of the root's batch size and with a
// tensor under it, and not sent back (Out).
func (w *wireTD) layout() (Layout, bool) {
	if w == nil || w.Out {
		return Layout{}, false
	}
	var fields []tensordict.Field
	for i, e := range w.Entries {
		switch e.Kind {
		case kindTensor:
			if e.Ref != nil {
				return Layout{}, false
			}
			dt, err := memmap.ParseDType(e.DType)
			if err != nil {
				return Layout{}, false // build says why
			}
			if _, err := memmap.NumBytes(dt, e.Shape); err != nil {
				return Layout{}, false
			}
			fields = append(fields, tensordict.Field{Key: e.Key, DType: dt, Shape: e.Shape})
		case kindDict:
			if !slices.Equal(e.Shape, w.Batch) || !w.tensorUnder(i) {
				return Layout{}, false
			}
		default:
			return Layout{}, false
		}
	}
	return Layout{Batch: w.Batch, Fields: fields}, len(fields) > 0
}

// tensorUnder reports whether a tensor entry after the dict entry i has
// its key under the dict's.
func (w *wireTD) tensorUnder(i int) bool {
	dk := w.Entries[i].Key
	for _, e := range w.Entries[i+1:] {
		if e.Kind == kindTensor && len(e.Key) > len(dk) && slices.Equal(e.Key[:len(dk)], dk) {
			return true
		}
	}
	return false
}

// place lays td out where p says and reads its bytes from the body into
// its files. It reports false, having read nothing, when td is to be built
// in memory instead.
func (in *incoming) place(td *TD, l Layout, p Placement, d *decoded) (bool, error) {
	w := td.wire
	if w.checkGathered() != nil {
		return false, nil // build refuses it
	}
	if _, err := os.Lstat(p.Prefix); err == nil {
		return false, Errorf(Internal, "%s: PlaceBytes: %s exists", in.method, p.Prefix)
	}
	out, err := tensordict.CreateUnsynced(p.Prefix, l.Batch, l.Fields...)
	if err != nil {
		return false, nil // in memory; the handler meets the failure
	}
	d.placed = append(d.placed, placed{td: out, prefix: p.Prefix})
	buf := getBuf(placeChunk)
	defer putBuf(buf)
	for _, f := range l.Fields {
		v, err := out.Get(f.Key...)
		t, ok := v.(*tensordict.Tensor)
		if err != nil || !ok {
			return true, Errorf(Internal, "%s: PlaceBytes: %s: %v", in.method, keyString(f.Key), err)
		}
		if err := in.body.fillFile(t, (*buf)[:placeChunk], p.Writeback); err != nil {
			return true, err
		}
	}
	td.set(out)
	return true, nil
}

// placeChunk is how many bytes of a placed tensor are read and written at
// a time, and the unit of its writeback.
const placeChunk = 1 << 20

// fillFile reads t's bytes (a mapped tensor) from the body, a chunk at a
// time through buf, written into its file; with writeback, each chunk's
// writeback is started as it is written. Placed TDs and CallInto's mapped
// tensors are filled so.
func (b *bodyReader) fillFile(t *tensordict.Tensor, buf []byte, writeback bool) error {
	n := int64(t.NumBytes())
	if err := b.has(t, n); err != nil {
		return err
	}
	mm, base := t.Mapping()
	for off := int64(0); off < n; {
		c := buf[:min(int64(len(buf)), n-off)]
		if err := b.read(c); err != nil {
			return err
		}
		if _, err := t.WriteAt(c, off); err != nil {
			return fmt.Errorf("rpc: writing a mapped tensor: %w", err)
		}
		if writeback && mm != nil {
			mm.StartWriteback(base+off, int64(len(c)))
		}
		off += int64(len(c))
	}
	return nil
}

// releasePlaced closes the placed TDs and removes what is left of their
// folders.
func releasePlaced(ps []placed) {
	for _, p := range ps {
		p.td.Close()
		os.RemoveAll(p.prefix)
	}
}
