package replay

import (
	"context"

	"github.com/tensorwire/tensorwire/internal/service"
	"github.com/tensorwire/tensorwire/rpc"
)

// The messages of replay.delete (replay.reset takes a nameRequest and
// returns an empty map).
type (
	deleteRequest struct {
		Name string     `codec:"name"`
		Info SampleInfo `codec:"info"` // indices, and ids (nil: whatever the slots hold); weights ignored
	}
	deleteResponse struct {
		Deleted int `codec:"deleted"`
	}
)

func (svc *Service) delete(ctx context.Context, req deleteRequest) (deleteResponse, error) {
	sb, err := svc.buffers.Lookup(req.Name)
	if err != nil {
		return deleteResponse{}, err
	}
	n, err := sb.Item.Delete(ctx, req.Info)
	return deleteResponse{Deleted: n}, err
}

func (svc *Service) reset(ctx context.Context, req nameRequest) (rpc.Empty, error) {
	sb, err := svc.buffers.Lookup(req.Name)
	if err != nil {
		return rpc.Empty{}, err
	}
	return rpc.Empty{}, sb.Item.Reset(ctx)
}

// Delete removes transitions from the buffer, as Buffer.Delete does, and
// returns how many it removed.
func (c *Client) Delete(ctx context.Context, info SampleInfo) (int, error) {
	resp, err := service.Call[deleteResponse](ctx, &c.calls, MethodDelete, deleteRequest{Name: c.name, Info: info})
	return resp.Deleted, err
}

// Reset empties the buffer, as Buffer.Reset does. It is not sent again
// when the connection breaks after the request may have reached the node:
// the error says so, and the caller decides.
func (c *Client) Reset(ctx context.Context) error {
	_, err := service.Call[rpc.Empty](ctx, &c.calls, MethodReset, nameRequest{Name: c.name})
	return err
}
