package replay

import (
	"context"
	"fmt"

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
	}
	slicesResponse struct {
		ID       string     `codec:"id"`
		Info     SampleInfo `codec:"info"`     // row by row; -1 and 0 for padding
		Mask     []bool     `codec:"mask"`     // row by row: false for padding
		Episodes []int64    `codec:"episodes"` // slice by slice: its trajectory key
		Batch    *rpc.TD    `codec:"batch"`    // [num_slices*slice_len] rows, slice after slice
	}
)

func (svc *Service) sampleSlices(ctx context.Context, req slicesRequest) (slicesResponse, error) {
	sb, err := svc.buffers.Lookup(req.Name)
	if err != nil {
		return slicesResponse{}, err
	}
	b := sb.Item
	spec := SliceSpec{SliceLen: req.SliceLen, NumSlices: req.NumSlices, PadShort: req.PadShort, Prioritized: req.Prioritized,
		WithoutReplacement: req.WithoutReplacement}
	if req.Bytes {
		td, info, err := b.SampleSlices(ctx, spec)
		if err != nil {
			return slicesResponse{}, err
		}
		return slicesResponse{ID: b.id, Info: info.SampleInfo, Mask: info.Mask, Episodes: info.Episodes, Batch: &rpc.TD{TensorDict: td}}, nil
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
	return slicesResponse{ID: b.id, Info: info.SampleInfo, Mask: info.Mask, Episodes: info.Episodes}, nil
}

// SampleSlices samples slices of episodes, as Buffer.SampleSlices does.
// By bytes the node gathers and checks them and sends the rows; by
// reference the node sends the picks, and the client gathers the rows from
// its own mapping and checks every step's word, asking again for the slices
// found torn.
func (c *Client) SampleSlices(ctx context.Context, spec SliceSpec) (*tensordict.TensorDict, SliceInfo, error) {
	call := func(k int, bytes bool) (slicesResponse, SliceInfo, error) {
		resp, err := service.Call[slicesResponse](ctx, &c.calls, MethodSampleSlices, slicesRequest{
			Name: c.name, Bytes: bytes, SliceLen: spec.SliceLen, NumSlices: k, PadShort: spec.PadShort, Prioritized: spec.Prioritized,
			WithoutReplacement: spec.WithoutReplacement,
		})
		if err != nil {
			return resp, SliceInfo{}, err
		}
		n := spec.SliceLen * k
		if len(resp.Info.Indices) != n || len(resp.Info.IDs) != n || len(resp.Info.Weights) != n || len(resp.Mask) != n ||
			len(resp.Episodes) != k {
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
	resp, info, err := call(spec.NumSlices, false)
	if err != nil {
		return nil, SliceInfo{}, err
	}
	v, err := c.viewOf(ctx, resp.ID)
	if err != nil {
		return nil, SliceInfo{}, err
	}
	defer c.release(v)
	if err := checkSlicePicks(info, v.slots.len()); err != nil {
		return nil, SliceInfo{}, err
	}
	dst, err := schema.Zeros(n)
	if err != nil {
		return nil, SliceInfo{}, err
	}
	_, err = gatherSlicesChecked(v.storage, v.slots, spec.SliceLen, dst, &info, func(k int) (SliceInfo, error) {
		more, again, err := call(k, false)
		if err == nil && more.ID != resp.ID {
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
