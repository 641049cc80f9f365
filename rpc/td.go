package rpc

import (
	"encoding/json"
	"errors"
	"math"
	"path/filepath"
	"reflect"
	"slices"
	"sync"

	"github.com/hashicorp/go-msgpack/v2/codec"
	"github.com/tensorwire/tensorwire/memmap"
	"github.com/tensorwire/tensorwire/tensordict"
)

// TD is a TensorDict argument or result of a call: put it (or a *TD) in the
// fields of a request or response struct, at any depth of structs,
// pointers, slices and arrays (not maps or interfaces).
//
// How it travels is the package's business, not the caller's. When the
// caller and the node share a filesystem (equal FSIDs) and every leaf is a
// mapping of a file under the caller's root, only a reference crosses: file
// paths relative to the root, dtypes, shapes and view offsets. The handler
// then gets views of the same files, mapped from its own root, so what it
// writes the caller sees at once. Otherwise the data crosses as bytes and
// the handler gets a copy in Go memory (or, for a method registered with
// PlaceBytes, mapped from the files the bytes were written into as they
// arrived); if Out is set, the copy's contents after the handler returns
// travel back and are written into the caller's TensorDict, so the caller
// sees the same result either way.
//
// Rows, when set, are the rows (first batch dimension) the call works on.
// By reference the handler gets the whole TensorDict and these Rows; by
// bytes only those rows travel, and the handler gets them as a TensorDict
// of len(Rows) rows with Rows set to 0, 1, ..., len(Rows)-1. A handler that
// reads and writes TensorDict at Rows therefore works in both modes.
//
// A TD a handler receives is valid until the handler returns, like an
// http.Request's body: its mapped views are released then, and the memory
// of tensors that came as bytes is reused for later calls. A handler that
// keeps data beyond its return copies it (Clone). Results are always sent
// as bytes and are the caller's to keep.
type TD struct {
	*tensordict.TensorDict
	Rows []int
	Out  bool
	// Release, when set on a TD of a handler's response, is called once
	// rpc reads the TD's tensors no more: their bytes written to the
	// connection (or compressed), or the response given up (an error, a
	// connection that broke). The handler's code may then reuse their
	// memory, as a pool of batches does. Called once, after the handler
	// returned, whether it returned an error or not; a panic in it is
	// logged and the node goes on. Not sent, and ignored on requests, on
	// message streams and on the caller's side.
	Release func()
	// Seal, when set on the only TD of a stream message, is where its
	// compressed body is made once for every message that sends the same
	// bytes (Seal's contract). Not sent; ignored outside stream messages.
	Seal *Seal

	wire *wireTD // the wire form: set by prepare before encoding, and by decoding
}

// Ref returns a TD for td. It is shorthand for TD{TensorDict: td}.
func Ref(td *tensordict.TensorDict) TD { return TD{TensorDict: td} }

// wireTD is a TD on the wire (docs/protocol.md, "TensorDicts").
type wireTD struct {
	Batch    []int       `codec:"batch"`
	Rows     []int       `codec:"rows"`
	Gathered bool        `codec:"gathered"` // bytes hold only Rows, in order
	Out      bool        `codec:"out"`
	Entries  []wireEntry `codec:"entries"`
}

// Entry kinds.
const (
	kindDict   = "dict"
	kindTensor = "tensor"
	kindData   = "data"
)

// wireEntry is one item of a TensorDict, in Items order (a nested
// TensorDict before its contents).
type wireEntry struct {
	Key   []string `codec:"key"`
	Kind  string   `codec:"kind"`
	DType string   `codec:"dtype"` // tensors: torch name
	Shape []int    `codec:"shape"` // tensors: shape; dicts: batch size
	Ref   *wireRef `codec:"ref"`   // tensors by reference; nil: bytes in the body
	Data  []byte   `codec:"data"`  // non-tensor data, JSON
}

// wireRef names a tensor's data in a file under the shared root.
type wireRef struct {
	Path   string `codec:"path"`   // relative to the root, slash-separated
	File   []int  `codec:"file"`   // the file's full shape; its dtype is the entry's
	Offset int64  `codec:"offset"` // byte offset of the view within the file
}

// CodecEncodeSelf implements codec.Selfer: a TD encodes as its wire form,
// which prepare must have set.
func (t *TD) CodecEncodeSelf(e *codec.Encoder) {
	if t.wire == nil && t.TensorDict != nil {
		panic(errors.New("rpc: TD not prepared for the wire (inside a map or interface?)"))
	}
	e.MustEncode(t.wire)
}

// CodecDecodeSelf implements codec.Selfer.
func (t *TD) CodecDecodeSelf(d *codec.Decoder) {
	var w *wireTD
	d.MustDecode(&w)
	t.wire = w
}

var (
	tdType  = reflect.TypeFor[TD]()
	tdTypes sync.Map // reflect.Type -> bool: can a value of the type hold a TD?
)

// holdsTD reports whether values of type t can contain a TD that findTDs
// would reach. Only complete answers are cached: a type met again while its
// own answer is being worked out (a recursive type) counts as false inside
// that search, which is right for the type the search started from but not
// necessarily for the inner one, so inner answers are not kept.
func holdsTD(t reflect.Type) bool {
	if v, ok := tdTypes.Load(t); ok {
		return v.(bool)
	}
	r := searchTD(t, map[reflect.Type]bool{})
	tdTypes.Store(t, r)
	return r
}

func searchTD(t reflect.Type, visiting map[reflect.Type]bool) bool {
	if t == tdType {
		return true
	}
	if visiting[t] {
		return false
	}
	visiting[t] = true
	defer delete(visiting, t)
	switch t.Kind() {
	case reflect.Struct:
		for i := range t.NumField() {
			if f := t.Field(i); f.IsExported() && searchTD(f.Type, visiting) {
				return true
			}
		}
	case reflect.Pointer, reflect.Slice, reflect.Array:
		return searchTD(t.Elem(), visiting)
	}
	return false
}

// findTDs appends every TD reachable from v (addressable) to out, in a fixed
// order: struct fields in order, elements in order.
func findTDs(v reflect.Value, out []*TD) []*TD {
	if !holdsTD(v.Type()) {
		return out
	}
	switch v.Kind() {
	case reflect.Struct:
		if v.Type() == tdType {
			return append(out, v.Addr().Interface().(*TD))
		}
		for i := range v.NumField() {
			if v.Type().Field(i).IsExported() {
				out = findTDs(v.Field(i), out)
			}
		}
	case reflect.Pointer:
		if !v.IsNil() {
			out = findTDs(v.Elem(), out)
		}
	case reflect.Slice, reflect.Array:
		for i := range v.Len() {
			out = findTDs(v.Index(i), out)
		}
	}
	return out
}

// link is what one side knows about sending TensorDicts to the other.
type link struct {
	shared  bool    // sharing is Coherent: TensorDicts under the root go as references
	sharing Sharing // what the handshake decided
	root    string  // this side's root, absolute; "" when it has none
}

// bodyPart is a tensor's data (all of it, or some of its rows) in a body.
type bodyPart struct {
	t    *tensordict.Tensor
	rows []int // nil: the whole tensor
}

func (p bodyPart) size() int64 {
	if p.rows == nil {
		return int64(p.t.NumBytes())
	}
	return int64(len(p.rows)) * int64(p.t.RowBytes())
}

// prepare sets t's wire form for sending over l, by reference if it can,
// and appends the body parts the bytes form needs.
func (t *TD) prepare(l link, parts []bodyPart) ([]bodyPart, error) {
	if t.TensorDict == nil {
		t.wire = nil
		return parts, nil
	}
	w := &wireTD{Batch: t.BatchSize(), Rows: t.Rows, Out: t.Out}
	if t.Rows != nil {
		if len(w.Batch) == 0 {
			// Even empty Rows: sent as bytes they would make a TD of
			// len(Rows) rows of a TensorDict that has no rows.
			return parts, Errorf(InvalidArgument, "TD rows of a TensorDict without batch dimensions")
		}
		if err := memmap.CheckRows(t.Rows, w.Batch[0]); err != nil {
			return parts, Errorf(InvalidArgument, "TD rows: %w", err)
		}
	}
	var leaves []*tensordict.Tensor // the tensors, in the order of their entries
	for path, v := range t.Items() {
		e := wireEntry{Key: path}
		switch v := v.(type) {
		case *tensordict.TensorDict:
			e.Kind, e.Shape = kindDict, v.BatchSize()
		case *tensordict.Tensor:
			e.Kind, e.DType, e.Shape = kindTensor, v.DType().String(), v.Shape()
			leaves = append(leaves, v)
		case *tensordict.NonTensor:
			b, err := json.Marshal(v.Data)
			if err != nil {
				return parts, Errorf(InvalidArgument, "TD %s: non-tensor data: %w", keyString(path), err)
			}
			e.Kind, e.Data = kindData, b
		}
		w.Entries = append(w.Entries, e)
	}
	t.wire = w
	if l.shared && l.root != "" && w.setRefs(leaves, l.root) {
		return parts, nil
	}
	// By bytes: every tensor, or only the rows the call works on. A mapped
	// tensor whose file was truncated is refused here, before a header
	// commits to its length: DataLoss, not a message broken off midway.
	for _, x := range leaves {
		if err := x.CheckFile(); err != nil {
			return parts, Errorf(DataLoss, "TD: %w", err)
		}
		parts = append(parts, bodyPart{t: x, rows: t.Rows})
	}
	if t.Rows != nil {
		w.Gathered, w.Rows = true, nil
		for i := range w.Entries {
			if w.Entries[i].Kind != kindData {
				w.Entries[i].Shape[0] = len(t.Rows)
			}
		}
		w.Batch[0] = len(t.Rows)
	}
	return parts, nil
}

// setRefs makes w's tensor entries references to the files of leaves (in
// entry order) under root, and reports whether it could: every leaf must
// be a mapping of a file inside root. On false, w is unchanged.
func (w *wireTD) setRefs(leaves []*tensordict.Tensor, root string) bool {
	refs := make([]*wireRef, 0, len(leaves))
	for _, x := range leaves {
		mm, off := x.Mapping()
		if mm == nil {
			return false
		}
		rel, ok := relPath(root, mm.Path(), false)
		if !ok {
			return false
		}
		refs = append(refs, &wireRef{Path: rel, File: mm.Shape(), Offset: off})
	}
	for i := range w.Entries {
		if w.Entries[i].Kind == kindTensor {
			w.Entries[i].Ref, refs = refs[0], refs[1:]
		}
	}
	return true
}

// relPath returns path relative to root (absolute, symlinks resolved),
// slash-separated, if it lies inside; false for root "". A path that is
// not lexically inside is tried again with its symlinks resolved (root
// reached through a symlink). One that is lexically inside is taken as it
// is, unless strict: then it is resolved too, and refused if a symlink
// leads it out of root. References take the lexical answer, which costs
// no system call per leaf; the receiving side's os.Root refuses a
// reference a symlink leads out.
func relPath(root, path string, strict bool) (string, bool) {
	if root == "" {
		return "", false
	}
	abs, err := filepath.Abs(path)
	if err != nil {
		return "", false
	}
	rel, err := filepath.Rel(root, abs)
	if err == nil && filepath.IsLocal(rel) && !strict {
		return filepath.ToSlash(rel), true
	}
	real, err := filepath.EvalSymlinks(abs)
	if err != nil {
		return "", false
	}
	if rel, err = filepath.Rel(root, real); err != nil || !filepath.IsLocal(rel) {
		return "", false
	}
	return filepath.ToSlash(rel), true
}

func keyString(path []string) string {
	b, _ := json.Marshal(path)
	return string(b)
}

// decoded is what TDs made from their wire form on the receiving side hold
// until the call ends: mappings, and (when pooled) the buffers of tensors
// that came as bytes. A nil *decoded allocates fresh memory for the caller
// to keep.
type decoded struct {
	held   []*mapping
	pooled bool
	bufs   []*[]byte
	placed []placed // a request's TDs laid out by PlaceBytes
}

// newTensor returns a tensor in Go memory for bytes about to be read into
// it: from the buffer pool when d is pooled (handlers' arguments, valid
// until the handler returns), else freshly allocated.
func (d *decoded) newTensor(dt memmap.DType, shape []int) (*tensordict.Tensor, error) {
	if d == nil || !d.pooled {
		return tensordict.Zeros(dt, shape...)
	}
	n, err := memmap.NumBytes(dt, shape)
	if err != nil {
		return nil, err
	}
	bp := getBuf(n)
	x, err := tensordict.FromBytes(dt, shape, (*bp)[:n])
	if err != nil {
		putBuf(bp)
		return nil, err
	}
	d.bufs = append(d.bufs, bp)
	return x, nil
}

// build makes t.TensorDict from t.wire: references resolved through res
// (nil: references refused), bytes read by next, which is given each
// bytes-mode tensor to fill in order.
func (t *TD) build(res *resolver, next func(*tensordict.Tensor) error, d *decoded) error {
	w := t.wire
	if w == nil {
		t.TensorDict = nil
		return nil
	}
	if err := w.checkGathered(); err != nil {
		return err
	}
	td, err := tensordict.New(w.Batch...)
	if err != nil {
		return Errorf(InvalidArgument, "TD batch %v: %w", w.Batch, err)
	}
	for _, e := range w.Entries {
		var v tensordict.Value
		switch e.Kind {
		case kindDict:
			sub, err := tensordict.New(e.Shape...)
			if err != nil {
				return Errorf(InvalidArgument, "TD %s: %w", keyString(e.Key), err)
			}
			v = sub
		case kindTensor:
			dt, err := memmap.ParseDType(e.DType)
			if err != nil {
				return Errorf(InvalidArgument, "TD %s: %w", keyString(e.Key), err)
			}
			var x *tensordict.Tensor
			if e.Ref != nil {
				if res == nil {
					return Errorf(FailedPrecondition, "TD %s: a reference, but this side has no shared root, or the peer does not share its page cache (send bytes)", keyString(e.Key))
				}
				m, err := res.acquire(e.Ref, dt)
				if err != nil {
					return err
				}
				if d != nil {
					d.held = append(d.held, m)
				}
				if x, err = tensordict.View(m.mm, e.Ref.Offset, e.Shape...); err != nil {
					return Errorf(InvalidArgument, "TD %s: %w", keyString(e.Key), err)
				}
			} else {
				if x, err = d.newTensor(dt, e.Shape); err != nil {
					return Errorf(InvalidArgument, "TD %s: %w", keyString(e.Key), err)
				}
				if err := next(x); err != nil {
					return err
				}
			}
			v = x
		case kindData:
			var data any
			if err := json.Unmarshal(e.Data, &data); err != nil {
				return Errorf(InvalidArgument, "TD %s: non-tensor data: %w", keyString(e.Key), err)
			}
			v = &tensordict.NonTensor{Data: data}
		default:
			return Errorf(InvalidArgument, "TD %s: unknown entry kind %q", keyString(e.Key), e.Kind)
		}
		if err := td.SetPath(e.Key, v); err != nil {
			return Errorf(InvalidArgument, "TD: %w", err)
		}
	}
	t.set(td)
	return nil
}

// set makes td, built from t.wire, t's TensorDict, with the wire's Rows
// and Out (Rows 0..n-1 for gathered rows).
func (t *TD) set(td *tensordict.TensorDict) {
	w := t.wire
	t.TensorDict, t.Rows, t.Out = td, slices.Clone(w.Rows), w.Out
	if w.Gathered {
		t.Rows = allRows(w.Batch[0])
	}
}

// checkGathered refuses a TD of gathered rows whose row count no bytes on
// the wire pay for: the receiver makes Rows 0..n-1 for n = Batch[0], so n
// is bounded by the rows' bytes in the body.
func (w *wireTD) checkGathered() error {
	if !w.Gathered {
		return nil
	}
	need, err := w.bytesSize()
	if err != nil {
		return err
	}
	if len(w.Batch) == 0 || w.Batch[0] > max(int(need), maxFreeRows) {
		return Errorf(InvalidArgument, "TD of gathered rows with batch %v and %d bytes", w.Batch, need)
	}
	return nil
}

// allRows returns 0, 1, ..., n-1.
func allRows(n int) []int {
	rows := make([]int, n)
	for i := range rows {
		rows[i] = i
	}
	return rows
}

// maxFreeRows is how many rows a TD of gathered rows may have beyond one a
// byte of its body.
const maxFreeRows = 1 << 20

// bytesSize returns the body bytes t's wire form needs (its bytes-mode
// tensors), with an error for shapes or sums that overflow.
func (w *wireTD) bytesSize() (int64, error) {
	var n int64
	for _, e := range w.Entries {
		if e.Kind != kindTensor || e.Ref != nil {
			continue
		}
		dt, err := memmap.ParseDType(e.DType)
		if err != nil {
			return 0, Errorf(InvalidArgument, "TD %s: %w", keyString(e.Key), err)
		}
		b, err := memmap.NumBytes(dt, e.Shape)
		if err != nil {
			return 0, Errorf(InvalidArgument, "TD %s: %w", keyString(e.Key), err)
		}
		if int64(b) > math.MaxInt64-n {
			return 0, Errorf(InvalidArgument, "TD of more than %d bytes", int64(math.MaxInt64))
		}
		n += int64(b)
	}
	return n, nil
}

// checkBody checks that the wire forms (nil ones need nothing) need exactly
// the n bytes of a body for their bytes-mode tensors. Receivers check it
// before they allocate anything for the tensors, so that a few bytes of
// msgpack cannot make them allocate gigabytes.
func checkBody(wires []*wireTD, n int64) error {
	var need int64
	for _, w := range wires {
		if w == nil {
			continue
		}
		b, err := w.bytesSize()
		if err != nil {
			return err
		}
		if b > n-need {
			return Errorf(InvalidArgument, "the TensorDicts need more than the body's %d bytes", n)
		}
		need += b
	}
	if need != n {
		return Errorf(InvalidArgument, "the TensorDicts need %d body bytes, the body has %d", need, n)
	}
	return nil
}

// comesBack reports whether t's contents travel back to the caller after
// the handler: t asked for it (Out) and went as bytes, so the handler's
// writes reached a copy. Both sides decide from the same wire form.
func (w *wireTD) comesBack() bool {
	if w == nil || !w.Out {
		return false
	}
	for _, e := range w.Entries {
		if e.Kind == kindTensor {
			return e.Ref == nil
		}
	}
	return false // no tensors: nothing to send back
}

// writeback returns the body parts that carry t's contents back to the
// caller: its tensors, whole (see comesBack).
func (t *TD) writeback() []bodyPart {
	if !t.wire.comesBack() || t.TensorDict == nil {
		return nil
	}
	var parts []bodyPart
	for _, x := range t.Leaves() {
		parts = append(parts, bodyPart{t: x})
	}
	return parts
}

// applyWriteback writes back, the handler's copy of t as it came back, into
// the caller's TensorDict at t.Rows. Everything is checked before the first
// byte is written.
func (t *TD) applyWriteback(back *tensordict.TensorDict) error {
	if t.Rows != nil {
		return t.SetRows(t.Rows, back)
	}
	return t.SetSlice(0, back)
}
