package collective

// Reduce: the root gets the reduction of every rank's tensor, the others
// zeros. Through the shared mappings it is Allreduce's algorithm
// (shmReduce, allreduce.go).

const kindReduce kind = 3

// tcpReduce is a ring reduce-scatter, then the blocks gathered at the
// root.
func tcpReduce(x *xfer, p *plan, in, out []byte) error {
	me, n, es := x.c.rank, x.c.size, p.esize
	acc := make([]byte, len(in))
	copy(acc, in)
	blocks := scale(chunks(numel(p.shapes[me]), n), es)
	if err := x.ringReduceScatter(p, acc, blocks); err != nil {
		return err
	}
	return x.gatherBlocks(p.root, acc, blocks, out)
}
