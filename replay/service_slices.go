package replay

import (
	"context"

	"github.com/tensorwire/tensorwire/internal/service"
	"github.com/tensorwire/tensorwire/rpc"
	"github.com/tensorwire/tensorwire/tensordict"
)

// The messages of replay.sample_slices. The node always sends the rows:
// it gathers and checks the slices itself.
type (
	slicesRequest struct {
		Name      string `codec:"name"`
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
	td, info, err := b.SampleSlices(ctx, SliceSpec{SliceLen: req.SliceLen, NumSlices: req.NumSlices, PadShort: req.PadShort, Prioritized: req.Prioritized,
		WithoutReplacement: req.WithoutReplacement})
	if err != nil {
		return slicesResponse{}, err
	}
	return slicesResponse{ID: b.id, Info: info.SampleInfo, Mask: info.Mask, Episodes: info.Episodes, Batch: &rpc.TD{TensorDict: td}}, nil
}

// SampleSlices samples slices of episodes, as Buffer.SampleSlices does;
// the node sends the rows (in either mode).
func (c *Client) SampleSlices(ctx context.Context, spec SliceSpec) (*tensordict.TensorDict, SliceInfo, error) {
	resp, err := service.Call[slicesResponse](ctx, &c.calls, MethodSampleSlices, slicesRequest{
		Name: c.name, SliceLen: spec.SliceLen, NumSlices: spec.NumSlices, PadShort: spec.PadShort, Prioritized: spec.Prioritized,
		WithoutReplacement: spec.WithoutReplacement,
	})
	if err != nil {
		return nil, SliceInfo{}, err
	}
	n := spec.SliceLen * spec.NumSlices
	if resp.Batch == nil || resp.Batch.TensorDict == nil || len(resp.Info.Indices) != n || len(resp.Mask) != n ||
		len(resp.Episodes) != spec.NumSlices {
		return nil, SliceInfo{}, schemaErrorf("the node sent a sample of slices that is not %d slices of %d", spec.NumSlices, spec.SliceLen)
	}
	if got, err := batchLen(resp.Batch.TensorDict); err != nil || got != n {
		return nil, SliceInfo{}, schemaErrorf("the node sent %d rows for %d slices of %d", got, spec.NumSlices, spec.SliceLen)
	}
	return resp.Batch.TensorDict, SliceInfo{SampleInfo: resp.Info, Mask: resp.Mask, Episodes: resp.Episodes}, nil
}
