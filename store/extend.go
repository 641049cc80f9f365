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
	if err := checkExtend(bin, len(tds)); err != nil {
		return 0, err
	}
	if err := checkExtendValues(tds, c.info.InlineBytes); err != nil {
		return 0, err
	}
	req := extendRequest{Store: c.name, Bin: bin, Values: make([]valueMsg, len(tds)), Req: c.nextReq()}
	var resp revResponse
	err := c.sendValues(ctx, MethodExtend, tds, false, req.Values, func() (err error) {
		resp, err = rpc.Call[revResponse](ctx, c.rc, MethodExtend, req)
		return err
	})
	return resp.Rev, err
}

// maxExtend bounds the values of one Extend (and store.extend call).
const maxExtend = 4096

// maxLogged bounds the bytes of an Extend's values kept in the log: a log
// record's size (a variable for tests).
var maxLogged int64 = maxRecord

// checkExtend refuses an Extend of n values to bin before anything is
// done: ErrName, or ErrFormat for none or more than maxExtend.
func checkExtend(bin string, n int) error {
	if err := CheckName(bin); err != nil {
		return err
	}
	switch {
	case n == 0:
		return errorf(ErrFormat, "no values to extend %q with", bin)
	case n > maxExtend:
		return errorf(ErrFormat, "%d values in one Extend; at most %d", n, maxExtend)
	}
	return nil
}

// checkExtendValues refuses the values of an Extend before any is sent or
// staged: ErrFormat for a nil one, ErrTooLarge when those to be kept in
// the log (smaller than inline bytes) pass a log record's size together.
func checkExtendValues(tds []*tensordict.TensorDict, inline int64) error {
	var logged int64
	for _, td := range tds {
		if td == nil {
			return errorf(ErrFormat, "no TensorDict")
		}
		if size := valueBytes(td); size < inline {
			logged += size
		}
	}
	if logged > maxLogged {
		return errorf(ErrTooLarge, "values of %d bytes to keep in the log in one Extend; at most %d together", logged, maxLogged)
	}
	return nil
}
