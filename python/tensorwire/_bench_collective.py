"""One rank of `tensorwire bench collective --lang python`
(internal/bench/collective): allreduce of float32 torch tensors from
Python, forward alone and forward+backward, through tensorwire.collective,
through torch.distributed with the gloo backend (dist.all_reduce, and
torch.distributed.nn.functional.all_reduce for forward+backward), or
through mpi4torch when it imports.

    python -m tensorwire._bench_collective --system tensorwire|gloo|mpi4torch
        --rank R --size N --addr HOST:PORT [--transport shm|tcp|shm-alloc] --sizes B,B,... --ops OP,OP

--transport shm-alloc is shm with each input a tensor of comm.alloc (read
where it is: no copy into the data file). Each iteration is a barrier and
then the operation; rank 0 times the
operation alone and prints one JSON line per (op, size), the Go ranks'
Line (p50_us, algbw_GBps, busbw_GBps) with "system". With a system that
cannot run here, rank 0 prints {"system": S, "error": why} and exits 0.
"""

import argparse
import json
import sys
import time


def iterations(nbytes):
    return max(5, min(500, (256 << 20) // nbytes))


def p50(times):
    """The median of times as the Go ranks' line has it (report.Percentile):
    the nearest rank, ceil(n/2), so the lower of the two middle values of an
    even count; the table divides one system's p50 by another's."""
    s = sorted(times)
    return s[(len(s) + 1) // 2 - 1]


def bus_factor(op, n):
    if op == "sendrecv":
        return 2  # the round trip's bytes one way per half of it, as the Go ranks' line
    return 2 * (n - 1) / n


def pingpong(send, recv, r, n):
    """The sendrecv op, as the Go ranks run it: ranks 2i and 2i+1 send
    the tensor back and forth (2i first), a rank left over idles; rank 0
    times the round trip."""
    peer = r ^ 1
    if peer >= n:
        return lambda x: None

    def run(x):
        if r % 2 == 0:
            send(x, peer, 0)
            recv(x, peer, 0)
        else:
            recv(x, peer, 0)
            send(x, peer, 0)
    return run


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--system", required=True)
    ap.add_argument("--rank", type=int, required=True)
    ap.add_argument("--size", type=int, required=True)
    ap.add_argument("--addr", required=True)
    ap.add_argument("--transport", default="shm")
    ap.add_argument("--sizes", required=True)
    ap.add_argument("--ops", default="allreduce,allreduce-fwd-bwd")  # and sendrecv
    a = ap.parse_args()
    try:
        import torch
    except ImportError as e:
        if a.rank == 0:
            print(json.dumps({"system": a.system, "error": f"no torch: {e}"}), flush=True)
        return
    torch.set_num_threads(1)
    n, r = a.size, a.rank
    place = None  # makes each input a tensor of comm.alloc (--transport shm-alloc)
    if a.system == "tensorwire":
        from tensorwire import collective as tw
        alloc = a.transport == "shm-alloc"
        comm = tw.join(a.addr, r, n, transport="shm" if alloc else a.transport)
        transport = comm.transport
        if alloc:
            transport = "shm-alloc"
            place = lambda t: comm.alloc(t.shape, dtype=t.dtype).copy_(t)  # noqa: E731

        def fwd(x):
            comm.Allreduce(x, tw.MPI_SUM)

        def fwd_bwd(x):
            y = comm.Allreduce(x, tw.MPI_SUM)
            y.backward(torch.ones_like(y))

        send, recv = comm.Send, comm.Recv
        barrier = comm.Barrier
        close = comm.close
    elif a.system == "gloo":
        import torch.distributed as dist
        import torch.distributed.nn.functional as dnn
        host, port = a.addr.rsplit(":", 1)
        dist.init_process_group("gloo", init_method=f"tcp://{host}:{port}", rank=r, world_size=n)
        transport = "tcp"

        def fwd(x):
            dist.all_reduce(x.detach())

        def fwd_bwd(x):
            y = dnn.all_reduce(x)
            y.backward(torch.ones_like(y))

        def send(x, peer, tag):
            dist.send(x, peer, tag=tag)

        def recv(x, peer, tag):
            dist.recv(x, peer, tag=tag)
            return x

        barrier = dist.barrier
        close = dist.destroy_process_group
    elif a.system == "mpi4torch":
        try:
            import mpi4torch  # noqa: F401
        except ImportError as e:
            if r == 0:
                print(json.dumps({"system": "mpi4torch", "error": f"not installed ({e}): it needs MPI and a "
                                  "C++ compiler to build"}), flush=True)
            return
        comm = mpi4torch.COMM_WORLD
        r = comm.rank  # mpirun started every rank with the same arguments
        if comm.size != n:
            if r == 0:
                print(json.dumps({"system": "mpi4torch", "error": f"COMM_WORLD has {comm.size} ranks, not {n}: "
                                  "start mpi4torch's ranks with mpirun (the benchmark does where it is on PATH)"}),
                      flush=True)
            return
        transport = "mpi"

        def fwd(x):
            comm.Allreduce(x, mpi4torch.MPI_SUM)

        def fwd_bwd(x):
            y = comm.Allreduce(x, mpi4torch.MPI_SUM)
            y.backward(torch.ones_like(y))

        send, recv = comm.Send, comm.Recv
        barrier = lambda: comm.Allreduce(torch.zeros(1), mpi4torch.MPI_SUM)  # noqa: E731
        close = lambda: None  # noqa: E731
    else:
        sys.exit(f"unknown system {a.system}")

    for op in a.ops.split(","):
        for nbytes in (int(s.rstrip("B")) for s in a.sizes.split(",")):
            elems = max(nbytes // 4 // n * n, n)
            g = torch.Generator().manual_seed(r)
            x = torch.rand(elems, generator=g, dtype=torch.float32)
            if place is not None:
                x = place(x)
            if op == "allreduce-fwd-bwd":
                x.requires_grad_()
                run = fwd_bwd
            elif op == "sendrecv":
                run = pingpong(send, recv, r, n)
            else:
                run = fwd
            iters = iterations(nbytes)
            for _ in range(min(iters, 20) // 4):
                run(x)
            times = []
            for _ in range(iters):
                barrier()
                t0 = time.perf_counter()
                run(x)
                times.append(time.perf_counter() - t0)
            if r != 0:
                continue
            med = p50(times)
            b = elems * 4
            alg = b / med / 1e9
            print(json.dumps({"op": op, "ranks": n, "bytes": b, "transport": transport, "system": a.system,
                              "p50_us": med * 1e6, "algbw_GBps": alg, "busbw_GBps": alg * bus_factor(op, n)}),
                  flush=True)
    barrier()
    close()


if __name__ == "__main__":
    main()
