package fill

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"slices"

	"github.com/tensorwire/tensorwire/internal/bench/benchkit"
	"github.com/tensorwire/tensorwire/internal/nodeproc"
	"github.com/tensorwire/tensorwire/rpc"
)

// Making a call cold takes both processes. The kernel keeps in the page
// cache every page some process maps, so memmap.Tensor.Evict in this
// process (msync, madvise, fadvise DONTNEED) leaves node B's pages where
// they are. Node B therefore serves one method more than "tensorwire
// node": dropMethod, which drops node B's page-table entries for the file
// (every mapping of it: the read-write one fills use and the read-only one
// reads use). Then Evict here writes the dirty pages back and drops them
// all, and Resident checks, before every cold call, that the rows' pages
// are gone from the page cache.

// dropMethod names the benchmark's extra method on node B.
const dropMethod = "fillbench.drop"

// dropRequest carries the TensorDict whose files node B should drop, by
// reference.
type dropRequest struct {
	TD rpc.TD `codec:"td"`
}

type dropResponse struct {
	Mappings int `codec:"mappings"` // mappings of the files node B dropped
}

// startNodeB starts node B: this program re-executed (self, then the
// hidden flag --node-b) as a child process serving root as "tensorwire
// node" does, with a random token, plus dropMethod. It returns once node B
// listens; Proc.Token is the token.
func startNodeB(ctx context.Context, self []string, root string) (*nodeproc.Proc, error) {
	tokenFile, remove, err := nodeproc.TempToken()
	if err != nil {
		return nil, err
	}
	defer remove() // node B has read it once it listens
	token, err := nodeproc.ReadToken(tokenFile)
	if err != nil {
		return nil, err
	}
	p, err := nodeproc.Spawn(ctx, nodeproc.Child{
		Name: "node B",
		Args: slices.Concat(self, []string{"--node-b", "--listen", "127.0.0.1:0", "--root", root, "--token-file", tokenFile}),
	})
	if err != nil {
		return nil, err
	}
	p.Token = token
	return p, nil
}

// serve is node B's main: it serves n.root until SIGTERM or the end of its
// standard input (nodeproc.ChildContext), after printing its address to
// stdout.
func (n nodeB) serve(stdout io.Writer) error {
	ctx, stop := nodeproc.ChildContext()
	defer stop()
	return nodeproc.Run(ctx, nodeproc.Config{
		Listen:    n.listen,
		Root:      n.root,
		TokenFile: n.tokenFile,
		Log:       slog.With("node", "B", "pid", os.Getpid()),
		Register:  registerDrop,
	}, func(addr string) { fmt.Fprintln(stdout, nodeproc.ListeningPrefix+addr) })
}

// registerDrop adds dropMethod to node B's server.
func registerDrop(s *rpc.Server) error {
	return rpc.Register(s, dropMethod, func(ctx context.Context, req dropRequest) (dropResponse, error) {
		var resp dropResponse
		if req.TD.TensorDict == nil {
			return resp, rpc.Errorf(rpc.InvalidArgument, "no TensorDict")
		}
		for path, x := range req.TD.Leaves() {
			mm, _ := x.Mapping()
			if mm == nil {
				return resp, rpc.Errorf(rpc.FailedPrecondition, "%v came as bytes, not by reference", path)
			}
			b, err := mm.Bytes()
			if err != nil {
				return resp, err
			}
			if len(b) == 0 {
				continue
			}
			n, err := benchkit.DropMappings(b)
			if err != nil {
				return resp, rpc.Errorf(rpc.Internal, "%v: %v", path, err)
			}
			resp.Mappings += n
		}
		return resp, nil
	})
}

// makeCold drops the dataset's pages from node B's page tables, from this
// process's, and from the page cache.
func (b *nodeA) makeCold(ctx context.Context) error {
	resp, err := rpc.Call[dropResponse](ctx, b.shared, dropMethod, dropRequest{TD: rpc.Ref(b.td)})
	if err != nil {
		return fmt.Errorf("node B dropping its mappings: %w", err)
	}
	if resp.Mappings == 0 {
		return fmt.Errorf("node B found no mapping of the dataset to drop")
	}
	return b.mm.Evict()
}

// residentPages returns how many pages of rows are in the page cache.
func (b *nodeA) residentPages(rows []int) (int, error) {
	total := 0
	for _, r := range rows {
		n, _, err := benchkit.Resident(b.data[r*b.rowBytes : (r+1)*b.rowBytes])
		if err != nil {
			return 0, err
		}
		total += n
	}
	return total, nil
}
