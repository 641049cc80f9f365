package replay

import (
	"context"
	"encoding/binary"
	"fmt"
	"math"

	"github.com/tensorwire/tensorwire/internal/service"
	"github.com/tensorwire/tensorwire/rpc"
	"github.com/tensorwire/tensorwire/tensordict"
)

// The messages of replay.sample_slices. With bytes the node gathers and
// checks the slices and sends the rows; without, it sends only the picks,
// which a client sharing its filesystem gathers and checks itself.
type (
	slicesRequest struct {
		Name      string `codec:"name"`
		Bytes     bool   `codec:"bytes"` // send the rows
		SliceLen  int    `codec:"slice_len"`
		NumSlices int    `codec:"num_slices"`
		PadShort  bool   `codec:"pad_short"` // torchrl's strict_length=False
		// Prioritized: torchrl's PrioritizedSliceSampler (the buffer's
		// sampler must be prioritized).
		Prioritized bool `codec:"prioritized"`
		// WithoutReplacement: torchrl's SliceSamplerWithoutReplacement.
		WithoutReplacement bool `codec:"without_replacement"`
		// Packed asks for the picks as Picks and PickWeights instead of
		// Info and Mask (left out when false: a node that does not know it
		// ignores it and answers with Info and Mask).
		Packed bool `codec:"packed,omitempty"`
	}
	slicesResponse struct {
		ID       string     `codec:"id"`
		Info     SampleInfo `codec:"info"`     // row by row; -1 and 0 for padding
		Mask     []bool     `codec:"mask"`     // row by row: false for padding
		Episodes []int64    `codec:"episodes"` // slice by slice: its trajectory key
		Batch    *rpc.TD    `codec:"batch"`    // [num_slices*slice_len] rows, slice after slice
		// Picks, when the request was Packed: row by row, the slot (int64)
		// and its generation (uint64), little-endian, 16 bytes a row; -1 and
		// 0 for padding, whose Mask is false (every other row's is true).
		// Info and Mask are then empty. A msgpack array decodes element by
		// element (by reflection, in go-msgpack); a bin is one copy.
		Picks []byte `codec:"picks,omitempty"`
		// PickWeights, with Picks: each row's weight, float64 little-endian;
		// empty when every weight is 1 (slices not prioritized).
		PickWeights []byte `codec:"pick_weights,omitempty"`
	}
)

// packPicks writes info's rows as a slicesResponse's Picks and PickWeights.
func packPicks(info SliceInfo, weighted bool) (picks, weights []byte) {
	picks = make([]byte, 16*len(info.Indices))
	for i, s := range info.Indices {
		binary.LittleEndian.PutUint64(picks[16*i:], uint64(int64(s)))
		binary.LittleEndian.PutUint64(picks[16*i+8:], info.IDs[i])
	}
	if weighted {
		weights = make([]byte, 8*len(info.Weights))
		for i, w := range info.Weights {
			binary.LittleEndian.PutUint64(weights[8*i:], math.Float64bits(w))
		}
	}
	return picks, weights
}

// unpackPicks reads n rows of Picks and PickWeights into a SliceInfo (its
// Episodes not set).
func unpackPicks(picks, weights []byte, n int) (SliceInfo, error) {
	if len(picks) != 16*n || (len(weights) != 0 && len(weights) != 8*n) {
		return SliceInfo{}, fmt.Errorf("replay: the node sent %d bytes of picks and %d of weights for %d rows", len(picks), len(weights), n)
	}
	info := SliceInfo{SampleInfo: SampleInfo{Indices: make([]int, n), IDs: make([]uint64, n), Weights: make([]float64, n)},
		Mask: make([]bool, n)}
	for i := range n {
		s := int64(binary.LittleEndian.Uint64(picks[16*i:]))
		if s < -1 || s > math.MaxInt32 {
			return SliceInfo{}, fmt.Errorf("replay: the node sampled slot %d", s)
		}
		info.Indices[i], info.IDs[i], info.Mask[i] = int(s), binary.LittleEndian.Uint64(picks[16*i+8:]), s >= 0
		info.Weights[i] = 1
		if len(weights) > 0 {
			info.Weights[i] = math.Float64frombits(binary.LittleEndian.Uint64(weights[8*i:]))
		}
	}
	return info, nil
}

// slicesReply is the response for info: packed if asked.
func slicesReply(id string, req slicesRequest, info SliceInfo, batch *rpc.TD) slicesResponse {
	r := slicesResponse{ID: id, Episodes: info.Episodes, Batch: batch}
	if req.Packed {
		r.Picks, r.PickWeights = packPicks(info, req.Prioritized)
	} else {
		r.Info, r.Mask = info.SampleInfo, info.Mask
	}
	return r
}

func (svc *Service) sampleSlices(ctx context.Context, req slicesRequest) (slicesResponse, error) {
	sb, err := svc.buffers.Lookup(req.Name)
	if err != nil {
		return slicesResponse{}, err
	}
	b := sb.Item
	if svc.unpacked {
		req.Packed = false
	}
	spec := SliceSpec{SliceLen: req.SliceLen, NumSlices: req.NumSlices, PadShort: req.PadShort, Prioritized: req.Prioritized,
		WithoutReplacement: req.WithoutReplacement}
	if req.Bytes {
		// SampleSlices into a batch the node sent before (sentBatches).
		if err := spec.check(b); err != nil {
			return slicesResponse{}, err
		}
		td, back, err := svc.sent.batch(ctx, b, spec.SliceLen*spec.NumSlices, "steps")
		if err != nil {
			return slicesResponse{}, err
		}
		info, err := b.sampleSlicesInto(ctx, spec, td)
		if err != nil {
			back()
			return slicesResponse{}, err
		}
		return slicesReply(b.id, req, info, &rpc.TD{TensorDict: td, Release: back}), nil
	}
	if err := spec.check(b); err != nil {
		return slicesResponse{}, err
	}
	if err := rpc.RequireCoherent(ctx, "a sample read"); err != nil {
		return slicesResponse{}, err
	}
	if err := b.enter(); err != nil {
		return slicesResponse{}, err
	}
	defer b.leave()
	var info SliceInfo
	if err := b.pickSlices(ctx, spec, spec.NumSlices, &info); err != nil {
		return slicesResponse{}, err
	}
	return slicesReply(b.id, req, info, nil), nil
}

// SampleSlices samples slices of episodes, as Buffer.SampleSlices does.
// By bytes the node gathers and checks them and sends the rows; by
// reference the node sends the picks, and the client gathers the rows from
// its own mapping and checks every step's word, asking again for the slices
// found torn.
func (c *Client) SampleSlices(ctx context.Context, spec SliceSpec) (*tensordict.TensorDict, SliceInfo, error) {
	return c.sampleSlices(ctx, spec, nil)
}

// SampleSlicesInto is SampleSlices into dst, a TensorDict with the
// buffer's schema and batch size [NumSlices*SliceLen] (from an earlier
// SampleSlices, say), without allocating it: by bytes the rows are read
// from the connection straight into dst where its layout is theirs
// (rpc.CallInto), else copied in; by reference they are gathered into it.
// Padding rows (Mask false) are zeroed, as SampleSlices' are.
func (c *Client) SampleSlicesInto(ctx context.Context, spec SliceSpec, dst *tensordict.TensorDict) (SliceInfo, error) {
	if err := checkSliceDst(spec, dst); err != nil {
		return SliceInfo{}, rpc.Errorf(rpc.CodeOf(err), "%w", err) // as the node would say it
	}
	td, info, err := c.sampleSlices(ctx, spec, dst)
	if err != nil {
		return SliceInfo{}, err
	}
	if err := copyIn(dst, td); err != nil {
		return SliceInfo{}, err
	}
	return info, nil
}

// sampleSlices is SampleSlices, into into when it is not nil (a batch of
// the right rows; the batch returned is into only if the rows went there).
func (c *Client) sampleSlices(ctx context.Context, spec SliceSpec, into *tensordict.TensorDict) (*tensordict.TensorDict, SliceInfo, error) {
	call := func(k int, bytes bool) (slicesResponse, SliceInfo, error) {
		var dst []*tensordict.TensorDict
		if bytes && into != nil {
			dst = []*tensordict.TensorDict{into}
		}
		resp, err := service.Call[slicesResponse](ctx, &c.calls, MethodSampleSlices, slicesRequest{
			Name: c.name, Bytes: bytes, SliceLen: spec.SliceLen, NumSlices: k, PadShort: spec.PadShort, Prioritized: spec.Prioritized,
			WithoutReplacement: spec.WithoutReplacement, Packed: true,
		}, dst...)
		if err != nil {
			return resp, SliceInfo{}, err
		}
		n := spec.SliceLen * k
		if len(resp.Episodes) != k {
			return resp, SliceInfo{}, fmt.Errorf("replay: the node sent a sample of %d slices for %d", len(resp.Episodes), k)
		}
		if resp.Picks != nil { // packed
			info, err := unpackPicks(resp.Picks, resp.PickWeights, n)
			info.Episodes = resp.Episodes
			return resp, info, err
		}
		// A node from before packed picks.
		if len(resp.Info.Indices) != n || len(resp.Info.IDs) != n || len(resp.Info.Weights) != n || len(resp.Mask) != n {
			return resp, SliceInfo{}, fmt.Errorf("replay: the node sent a sample of slices that is not %d slices of %d", k, spec.SliceLen)
		}
		return resp, SliceInfo{SampleInfo: resp.Info, Mask: resp.Mask, Episodes: resp.Episodes}, nil
	}
	n := spec.SliceLen * spec.NumSlices
	if c.bytes {
		resp, info, err := call(spec.NumSlices, true)
		if err != nil {
			return nil, SliceInfo{}, err
		}
		if resp.Batch == nil || resp.Batch.TensorDict == nil {
			return nil, SliceInfo{}, fmt.Errorf("replay: the node sent no rows")
		}
		if got, err := batchLen(resp.Batch.TensorDict); err != nil || got != n {
			return nil, SliceInfo{}, fmt.Errorf("replay: the node sent %d rows for %d slices of %d", got, spec.NumSlices, spec.SliceLen)
		}
		return resp.Batch.TensorDict, info, nil
	}
	if spec.SliceLen <= 0 || spec.NumSlices <= 0 || spec.NumSlices > maxSample || n > maxSample {
		return nil, SliceInfo{}, argumentErrorf("slice length %d and number of slices %d: both positive, at most %d steps", spec.SliceLen, spec.NumSlices, maxSample)
	}
	schema, err := c.knownSchema(ctx)
	if err != nil {
		return nil, SliceInfo{}, err
	}
	id, info, err := c.slicePicks(spec, call)
	if err != nil {
		return nil, SliceInfo{}, err
	}
	v, err := c.viewOf(ctx, id)
	if err != nil {
		return nil, SliceInfo{}, err
	}
	defer c.release(v)
	if err := checkSlicePicks(info, v.slots.len()); err != nil {
		return nil, SliceInfo{}, err
	}
	dst := into
	if dst == nil {
		if dst, err = schema.Zeros(n); err != nil {
			return nil, SliceInfo{}, err
		}
	}
	_, err = gatherSlicesChecked(v.storage, v.slots, spec.SliceLen, dst, &info, func(k int) (SliceInfo, error) {
		more, again, err := call(k, false)
		if err == nil && more.ID != id {
			err = fmt.Errorf("%w: the buffer was created anew while sampled", ErrExpired)
		}
		if err == nil {
			err = checkSlicePicks(again, v.slots.len())
		}
		return again, err
	})
	if err != nil {
		return nil, SliceInfo{}, err
	}
	return dst, info, nil
}

// slicePicks returns the node's picks for a sample of slices by reference,
// and the buffer they are of: from the slices asked for ahead
// (WithSlicesAhead) if some are left for spec, else from a call now, which
// asks for the next samples' too.
func (c *Client) slicePicks(spec SliceSpec, call func(k int, bytes bool) (slicesResponse, SliceInfo, error)) (string, SliceInfo, error) {
	ahead := min(c.o.slicesAhead, maxSample/(spec.SliceLen*spec.NumSlices))
	if ahead <= 1 {
		resp, info, err := call(spec.NumSlices, false)
		return resp.ID, info, err
	}
	c.slMu.Lock()
	id, info, ok := c.slLeft.take(spec)
	c.slMu.Unlock()
	if ok {
		return id, info, nil
	}
	resp, all, err := call(spec.NumSlices*ahead, false)
	if err != nil {
		return "", SliceInfo{}, err
	}
	c.slMu.Lock()
	defer c.slMu.Unlock()
	c.slLeft = slicesLeft{spec: spec, id: resp.ID, info: all}
	id, info, _ = c.slLeft.take(spec)
	return id, info, nil
}

// slicesLeft are picks of slices asked for ahead (WithSlicesAhead) and not
// yet used: whole slices of spec, of the buffer id, from slice next on.
type slicesLeft struct {
	spec SliceSpec
	id   string
	info SliceInfo
	next int
}

// take returns the next spec.NumSlices slices, or false if fewer are left
// or they were asked for another spec. What it returns shares no element
// with what it keeps.
func (l *slicesLeft) take(spec SliceSpec) (string, SliceInfo, bool) {
	k := spec.NumSlices
	if l.spec != spec || l.next+k > len(l.info.Episodes) {
		return "", SliceInfo{}, false
	}
	a, b := l.next*spec.SliceLen, (l.next+k)*spec.SliceLen
	out := SliceInfo{
		SampleInfo: SampleInfo{Indices: l.info.Indices[a:b:b], IDs: l.info.IDs[a:b:b], Weights: l.info.Weights[a:b:b]},
		Mask:       l.info.Mask[a:b:b],
		Episodes:   l.info.Episodes[l.next : l.next+k : l.next+k],
	}
	l.next += k
	return l.id, out, true
}

// checkSlicePicks checks the node's picks of slices before they index this
// side's mappings: a slot in range, or -1 for padding.
func checkSlicePicks(info SliceInfo, capacity int) error {
	for i, s := range info.Indices {
		if s < -1 || s >= capacity || (s == -1) == info.Mask[i] {
			return fmt.Errorf("replay: the node sampled slot %d of %d (mask %v)", s, capacity, info.Mask[i])
		}
	}
	return nil
}
