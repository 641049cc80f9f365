package store

import (
	"context"
	"iter"

	"github.com/tensorwire/tensorwire/tensordict"
)

// API is what a store offers, in process (*Store) or from another process
// (*Client): the roles (Trainer, Worker) and the examples take either.
type API interface {
	Put(ctx context.Context, bin string, td *tensordict.TensorDict) (uint64, error)
	Append(ctx context.Context, bin string, td *tensordict.TensorDict) (uint64, error)
	Extend(ctx context.Context, bin string, tds []*tensordict.TensorDict) (uint64, error)
	Get(ctx context.Context, bin string) ([]*tensordict.TensorDict, error)
	Peek(ctx context.Context, bin string) ([]*tensordict.TensorDict, error)
	List(ctx context.Context) (map[string]int, uint64, error)
	Delete(ctx context.Context, bin string) (uint64, error)
	Publish(ctx context.Context, name string, td *tensordict.TensorDict) (uint64, error)
	Latest(ctx context.Context, name string) (*Param, error)
	WaitNewer(ctx context.Context, name string, v uint64) (*Param, error)
	Watch(ctx context.Context, prefix string, after uint64) iter.Seq2[Event, error]
}

var (
	_ API = (*Store)(nil)
	_ API = (*Client)(nil)
)
