package rpc

import (
	"context"
	"fmt"

	"github.com/tensorwire/tensorwire/tensordict"
)

// Names of the built-in methods every Server serves (and MethodStats).
const (
	MethodFill     = "tensorwire.fill"
	MethodRead     = "tensorwire.read"
	MethodDescribe = "tensorwire.describe"
	// MethodCoherence is the coherence probe's (coherence.go): a client
	// and a node that both opted in (WithCoherentStorage) check whether
	// their filesystem keeps mappings coherent across page caches.
	MethodCoherence = "tensorwire.coherence"
)

// FillRequest asks a node to fill rows of a TensorDict: TD at TD.Rows (all
// rows when nil), with Value converted to each leaf's dtype, or, when Src is
// set, with Src's rows (row i of Src goes to row TD.Rows[i]). Every key,
// dtype, shape and index is checked before anything is written, so a
// refused fill changes nothing.
type FillRequest struct {
	// TD is the TensorDict written, by reference when the caller shares
	// the node's root (the node writes the mapped files), by bytes
	// otherwise (then sent back: TD.Out). TD.Rows are the rows filled.
	TD TD `codec:"td"`
	// Value is written to every element of the rows, converted to each
	// leaf's dtype; ignored when Src is set.
	Value float64 `codec:"value"`
	// Src, when set, holds the rows written: its rows Src.Rows (all when
	// nil), one for each of TD.Rows, with TD's keys, dtypes and row shapes.
	Src *TD `codec:"src"`
}

// FillResponse reports how many rows were filled.
type FillResponse struct {
	Rows int `codec:"rows"` // rows of TD written
}

// ReadRequest asks a node for rows of the TensorDict stored at Prefix
// (relative to the node's root): Rows, or all rows when nil. When Into is
// set the rows are written into it (at Into.Rows, or its first rows) and
// nothing comes back but the count: with a shared filesystem, into the
// caller's memory-mapped TensorDict without a byte crossing the network.
type ReadRequest struct {
	// Prefix is the TensorDict's folder, slash-separated, relative to the
	// node's root; it may not lead out of the root.
	Prefix string `codec:"prefix"`
	// Rows are the rows read, in order, repeats allowed; nil means all.
	// Their bytes are bounded by Limits.MaxBodyBytes (ResourceExhausted).
	Rows []int `codec:"rows"`
	// Into, when set, receives the rows at Into.Rows (nil: its first
	// len(Rows) rows), with the stored TensorDict's keys, dtypes and row
	// shapes; sent back (Into.Out) when it travels by bytes.
	Into *TD `codec:"into"`
}

// ReadResponse holds the rows read (when the request had no Into).
type ReadResponse struct {
	TD   TD  `codec:"td"`   // the rows, in Go memory on the caller's side; empty with Into
	Rows int `codec:"rows"` // how many rows were read
}

// DescribeRequest asks for the schema of the TensorDict at Prefix.
type DescribeRequest struct {
	Prefix string `codec:"prefix"` // relative to the node's root, as ReadRequest.Prefix
}

// DescribeResponse describes a stored TensorDict: its batch size, its
// tensors as Create takes them (full shapes, in the order Leaves visits
// them) and their total bytes.
type DescribeResponse struct {
	Batch  []int              `codec:"batch"`  // its batch size
	Fields []tensordict.Field `codec:"fields"` // its leaves, full shapes (batch dimensions included)
	Bytes  int64              `codec:"bytes"`  // the bytes of all its leaves
}

func registerServices(s *Server) {
	Register(s, MethodFill, func(ctx context.Context, req FillRequest) (FillResponse, error) {
		return fill(ctx, req, s.o.limits.MaxBodyBytes)
	})
	Register(s, MethodRead, s.read)
	Register(s, MethodDescribe, s.describe)
	Register(s, MethodStats, func(context.Context, StatsRequest) (Stats, error) { return s.Stats(), nil })
	Register(s, MethodCoherence, s.coherence)
}

// checkGather refuses to gather n rows of td when they would take more than
// max bytes: the peer chooses the rows (repeats allowed), the node pays for
// the memory.
func checkGather(td *tensordict.TensorDict, n int, max int64) error {
	if l := td.Len(); l > 0 {
		if per := int64(td.NumBytes() / l); per > 0 && int64(n) > max/per {
			return Errorf(ResourceExhausted, "%d rows of %d bytes are more than the %d-byte limit", n, per, max)
		}
	}
	return nil
}

// fill serves MethodFill; maxBytes bounds the rows of Src it gathers.
func fill(ctx context.Context, req FillRequest, maxBytes int64) (FillResponse, error) {
	td := req.TD.TensorDict
	if td == nil {
		return FillResponse{}, Errorf(InvalidArgument, "fill: no TensorDict")
	}
	rows := req.TD.Rows
	if rows == nil && td.NumBytes() == 0 {
		// Nothing to write, and td.Len() is then bounded by no bytes: do
		// not make a slice of that many rows.
		return FillResponse{Rows: td.Len()}, nil
	}
	if rows == nil {
		rows = allRows(td.Len())
	}
	if err := ctx.Err(); err != nil {
		return FillResponse{}, err
	}
	var err error
	if req.Src != nil && req.Src.TensorDict != nil {
		src := req.Src.TensorDict
		if req.Src.Rows != nil {
			if err := checkGather(src, len(req.Src.Rows), maxBytes); err != nil {
				return FillResponse{}, err
			}
			if src, err = src.Gather(req.Src.Rows); err != nil {
				return FillResponse{}, err
			}
		}
		err = td.SetRows(rows, src)
	} else {
		err = td.Fill(rows, req.Value)
	}
	if err != nil {
		return FillResponse{}, fmt.Errorf("fill: %w", err)
	}
	return FillResponse{Rows: len(rows)}, nil
}

// stored returns the TensorDict at prefix under s's root, held until the
// returned release is called. A peer that does not share the node's page
// cache (PeerSharing below Coherent) may have written it through its own:
// for it the TensorDict is opened anew, not taken from the mapping cache,
// whose pages may predate that write.
func (s *Server) stored(ctx context.Context, prefix string) (*tensordict.TensorDict, func(), error) {
	if s.res == nil {
		return nil, nil, Errorf(FailedPrecondition, "this node has no root")
	}
	acquire := s.res.acquireTD
	if lv, ok := PeerSharing(ctx); ok && lv < Coherent {
		acquire = s.res.loadTDFresh
	}
	m, err := acquire(prefix)
	if err != nil {
		return nil, nil, err
	}
	return m.td, func() { s.res.release(m) }, nil
}

func (s *Server) read(ctx context.Context, req ReadRequest) (ReadResponse, error) {
	td, release, err := s.stored(ctx, req.Prefix)
	if err != nil {
		return ReadResponse{}, err
	}
	defer release()
	rows := req.Rows
	if rows == nil {
		rows = allRows(td.Len())
	}
	var (
		dst     *tensordict.TensorDict
		dstRows []int
	)
	if req.Into != nil && req.Into.TensorDict != nil {
		dst, dstRows = req.Into.TensorDict, req.Into.Rows
		if dstRows == nil {
			dstRows = allRows(len(rows))
		}
		if len(dstRows) != len(rows) {
			return ReadResponse{}, Errorf(InvalidArgument, "read: %d rows into %d", len(rows), len(dstRows))
		}
	}
	if err := checkGather(td, len(rows), s.o.limits.MaxBodyBytes); err != nil {
		return ReadResponse{}, err
	}
	got, err := td.Gather(rows)
	if err != nil {
		return ReadResponse{}, fmt.Errorf("read %q: %w", req.Prefix, err)
	}
	if dst == nil {
		return ReadResponse{TD: Ref(got), Rows: len(rows)}, nil
	}
	if err := dst.SetRows(dstRows, got); err != nil {
		return ReadResponse{}, fmt.Errorf("read %q into: %w", req.Prefix, err)
	}
	return ReadResponse{Rows: len(rows)}, nil
}

func (s *Server) describe(ctx context.Context, req DescribeRequest) (DescribeResponse, error) {
	td, release, err := s.stored(ctx, req.Prefix)
	if err != nil {
		return DescribeResponse{}, err
	}
	defer release()
	return DescribeResponse{Batch: td.BatchSize(), Fields: td.Schema(), Bytes: int64(td.NumBytes())}, nil
}

// Fill fills rows of td on the node with v (see FillRequest); rows nil
// means all. With a shared filesystem and td mapped under the client's
// root, the node writes the mapped file directly and no tensor bytes cross
// the network; otherwise the rows travel to the node and back.
func (c *Client) Fill(ctx context.Context, td *tensordict.TensorDict, rows []int, v float64) error {
	_, err := Call[FillResponse](ctx, c, MethodFill, FillRequest{TD: TD{TensorDict: td, Rows: rows, Out: true}, Value: v})
	return err
}

// Read returns rows (nil: all) of the TensorDict stored at prefix under the
// node's root, as a TensorDict in Go memory.
func (c *Client) Read(ctx context.Context, prefix string, rows []int) (*tensordict.TensorDict, error) {
	resp, err := Call[ReadResponse](ctx, c, MethodRead, ReadRequest{Prefix: prefix, Rows: rows})
	return resp.TD.TensorDict, err
}

// ReadInto writes rows of the TensorDict stored at prefix under the node's
// root into dst at dstRows (nil: dst's first rows). With a shared
// filesystem and dst mapped under the client's root, the node writes dst's
// files directly.
func (c *Client) ReadInto(ctx context.Context, prefix string, rows []int, dst *tensordict.TensorDict, dstRows []int) error {
	_, err := Call[ReadResponse](ctx, c, MethodRead, ReadRequest{Prefix: prefix, Rows: rows, Into: &TD{TensorDict: dst, Rows: dstRows, Out: true}})
	return err
}

// Describe returns the schema of the TensorDict stored at prefix under the
// node's root.
func (c *Client) Describe(ctx context.Context, prefix string) (DescribeResponse, error) {
	return Call[DescribeResponse](ctx, c, MethodDescribe, DescribeRequest{Prefix: prefix})
}
