package store

import (
	"context"

	"github.com/tensorwire/tensorwire/rpc"
	"github.com/tensorwire/tensorwire/tensordict"
)

// Extend adds tds to the bin, in order, as its last items, in one call and
// one operation (Store.Extend): one revision, returned once durable, one
// event, and all of the values or, on error, none. It is torchrl's
// ReplayBuffer.extend. ErrFormat for no values or more than 4096.
func (c *Client) Extend(ctx context.Context, bin string, tds []*tensordict.TensorDict) (uint64, error) {
	if err := CheckName(bin); err != nil {
		return 0, err
	}
	switch {
	case len(tds) == 0:
		return 0, errorf(ErrFormat, "no values to extend %q with", bin)
	case len(tds) > maxExtend:
		return 0, errorf(ErrFormat, "%d values in one Extend; at most %d", len(tds), maxExtend)
	}
	req := extendRequest{Store: c.name, Bin: bin, Values: make([]valueMsg, len(tds)), Req: c.nextReq()}
	var resp revResponse
	err := c.sendValues(ctx, MethodExtend, tds, false, req.Values, func() (err error) {
		resp, err = rpc.Call[revResponse](ctx, c.rc, MethodExtend, req)
		return err
	})
	return resp.Rev, err
}
