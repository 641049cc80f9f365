package service

import (
	"context"

	"github.com/tensorwire/tensorwire/rpc"
)

// Dialing is what every service client's Dial takes alike: this side's
// view of the node's root, whether to send rows as bytes even where
// references would do, and rpc's own options (a token, TLS, a logger,
// limits). Each service keeps its public DialOption type and its WithRoot,
// WithBytes and WithRPC (an option of one service is no option of
// another); they set these fields, and Dial and Mode do the rest the same
// way for every service.
type Dialing struct {
	Root  string       // WithRoot: this side's view of the shared root; "": none, bytes only
	Bytes bool         // WithBytes: rows travel with the calls even where references would do
	RPC   []rpc.Option // WithRPC
}

// Dial dials the node at addr with d.RPC, and d.Root as rpc.WithRoot when
// given. The options d holds are not changed.
func (d Dialing) Dial(ctx context.Context, addr string) (*rpc.Client, error) {
	opts := d.RPC[:len(d.RPC):len(d.RPC)]
	if d.Root != "" {
		opts = append(opts, rpc.WithRoot(d.Root))
	}
	return rpc.Dial(ctx, addr, opts...)
}

// Mode decides how a client of rc works: level is how much of the node's
// root the connection shares (rpc.None without a root, or for an object
// that is not under the node's root: underRoot false), and byRef whether
// the client works by reference: it does when level is at least need and
// Bytes was not given. need is the service's: rpc.Coherent for files
// rewritten in place (replay's storage, serve's slots, the loader's ring),
// rpc.Storage for write-once files (store's values). The mode is fixed
// for the client's life: a reconnection does not change it.
func (d Dialing) Mode(ctx context.Context, rc *rpc.Client, underRoot bool, need rpc.Sharing) (level rpc.Sharing, byRef bool, err error) {
	if d.Root == "" || !underRoot {
		return rpc.None, false, nil
	}
	if level, err = rc.Sharing(ctx); err != nil {
		return rpc.None, false, err
	}
	return level, level >= need && !d.Bytes, nil
}
