package collective

import (
	"context"
	"fmt"

	"github.com/tensorwire/tensorwire/internal/bench/benchkit"
)

// The loopback bound of the TCP figures (issue 29): an Allreduce over TCP
// moves 2(p-1)/p of the tensor out of every rank and into every rank
// (the ring's and the direct algorithm's volume, which no algorithm that
// reduces across the ranks goes below), and on one host each of those
// bytes goes through loopback TCP: the sender's write and the receiver's
// read, which cost c seconds of CPU a byte (benchkit.Loopback, measured in
// the same run). p ranks on k cores then need at least
// p·2(p-1)/p·S·c / min(p, k) seconds for a tensor of S bytes, so their bus
// bandwidth (S·2(p-1)/p over the time) is at most min(p, k)/(p·c): the
// socket copies alone, before any reduction, rpc framing or wake-up. gloo
// moves the same bytes the same way, so its lines get the same bound.

// tcpBoundGBps is that bound in GB/s for p ranks on k cores, from lb (0
// when lb was not measured).
func tcpBoundGBps(lb *benchkit.Loopback, p, k int) float64 {
	if lb == nil || lb.CPUNsPerByte <= 0 || p <= 0 || k <= 0 {
		return 0
	}
	return float64(min(p, k)) / (float64(p) * lb.CPUNsPerByte)
}

// lineBound is the bound on line r's busbw, ours or gloo's, from what res
// measured (0: none): 2B/p for an Allreduce through shared mappings, the
// loopback bound for one over TCP on this host. Forward+backward runs two
// Allreduces of the same size in the time its busbw is figured over, so its
// bound is half of one's.
func lineBound(res *Result, r Line) float64 {
	var k float64
	switch r.Op {
	case "allreduce":
		k = 1
	case "allreduce-fwd-bwd":
		k = 2
	default:
		return 0
	}
	switch {
	case isShm(r.Transport):
		return boundGBps(res.MemBW, r.Ranks) / k
	case r.Transport == "tcp" && r.Hosts == "":
		return tcpBoundGBps(res.Loopback, r.Ranks, res.Cores) / k
	}
	return 0
}

// loopbackLine measures the loopback cost into res (left nil where it
// cannot be measured) and returns the table's line about it.
func loopbackLine(ctx context.Context, res *Result) string {
	lb, err := benchkit.MeasureLoopback(ctx)
	if err != nil {
		return fmt.Sprintf("loopback TCP: not measured (%v); the tcp lines have no bound", err)
	}
	res.Loopback = &lb
	return fmt.Sprintf("loopback TCP (one stream, 1 MiB writes and reads, buffers in cache): %.2f GB/s, %.3f ns of CPU a byte (sender and receiver); tcp and gloo allreduce bound min(p, %d cores)/(p x that)",
		lb.GBps, lb.CPUNsPerByte, res.Cores)
}
