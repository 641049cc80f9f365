"""mpi4torch's data-parallel linear regression on tensorwire.collective: every
rank holds a share of the data points, the loss has two Allreduce calls (one
averaging the parameters, one summing the ranks' losses), and PyTorch's
autograd takes the gradient through them. The program checks every rank's
gradient against the gradient of the same loss computed in one process, to
1e-6, and fits the parameters with LBFGS on every rank.

    python3 python/examples/regression.py [--ranks 4] [--points 10000] [--transport auto|shm|tcp]

It starts --ranks copies of itself as processes, as torchrun would (RANK,
WORLD_SIZE, MASTER_ADDR and MASTER_PORT set for each; under torchrun itself
run `torchrun --nproc_per_node 4 python/examples/regression.py --rank-only`),
and exits with status 1 if a rank's gradient differs from the single-process
one. The Go version is examples/regression.

The model: y = (p2*x + p1)*x + p0, data generated with p = (0.1, 1, -2) at x
uniform in [0, 2), split into contiguous shares as mpi4torch splits them.
Under the convention that the global loss is the sum of the ranks' losses,
each rank's loss is Allreduce(local loss), the ranks' parameters are averaged
by Allreduce(params)/size, and each rank's gradient is the single-process
gradient of the sum over all points of (y - f(x, p))^2.
"""

import argparse
import json
import os
import socket
import subprocess
import sys

try:
    import torch
except ImportError:  # pragma: no cover
    sys.exit("this example needs PyTorch (pip install torch, or apt-get install python3-torch)")

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import tensorwire.collective as mpi4torch  # noqa: E402  (was: import mpi4torch)

GEN = [0.1, 1.0, -2.0]


def f(x, p):
    return (p[2] * x + p[1]) * x + p[0]


def data(points, seed=42):
    torch.manual_seed(seed)
    x = 2.0 * torch.rand([points], dtype=torch.double)
    return x, f(x, torch.tensor(GEN, dtype=torch.double))


def share(points, rank, size):
    """The rows [offset, offset + n) of rank's share, as mpi4torch splits them."""
    n, rest = divmod(points, size)
    if rank < rest:
        return (n + 1) * rank, n + 1
    return n * rank + rest, n


def fit(loss_fn):
    """The gradient at p = (0, 1, 2), and the parameters LBFGS finds from there."""
    params = torch.arange(3, dtype=torch.double).requires_grad_()
    first = []
    opt = torch.optim.LBFGS([params], 1)

    def closure():
        opt.zero_grad()
        loss = loss_fn(params)
        loss.backward()
        if not first:
            first.append(params.grad.clone())
        return loss

    opt.step(closure)
    return first[0], params.detach()


def rank_main(args):
    # From RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT, as mpi4torch.COMM_WORLD is.
    comm = mpi4torch.join(transport=args.transport)
    x, y = data(args.points)
    off, n = share(args.points, comm.rank, comm.size)
    x, y = x[off:off + n], y[off:off + n]

    def loss(params):
        params = comm.Allreduce(params, mpi4torch.MPI_SUM) / comm.size
        local = torch.sum(torch.square(y - f(x, params)))
        return comm.Allreduce(local, mpi4torch.MPI_SUM)

    grad, params = fit(loss)
    print(json.dumps({"rank": comm.rank, "grad": grad.tolist(), "params": params.tolist(),
                      "transport": comm.transport}), flush=True)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--ranks", type=int, default=4)
    p.add_argument("--points", type=int, default=10000)
    p.add_argument("--transport", default="auto", choices=["auto", "shm", "tcp"])
    p.add_argument("--rank-only", action="store_true", help="be one rank (under torchrun, or started by this program)")
    args = p.parse_args()
    if args.rank_only:
        rank_main(args)
        return

    port = free_port()
    procs = []
    for r in range(args.ranks):
        env = dict(os.environ, RANK=str(r), WORLD_SIZE=str(args.ranks), MASTER_ADDR="127.0.0.1",
                   MASTER_PORT=str(port))
        procs.append(subprocess.Popen([sys.executable, os.path.abspath(__file__), "--rank-only", "--points",
                                       str(args.points), "--transport", args.transport],
                                      env=env, stdout=subprocess.PIPE, text=True))
    reports = []
    failed = False
    for r, proc in enumerate(procs):
        out, _ = proc.communicate(timeout=300)
        if proc.returncode != 0:
            print(f"rank {r} exited with status {proc.returncode}", file=sys.stderr)
            failed = True
            continue
        reports.append(json.loads(out.strip().splitlines()[-1]))
    if failed:
        sys.exit(1)

    x, y = data(args.points)
    want, params = fit(lambda p: torch.sum(torch.square(y - f(x, p))))
    print(f"{args.ranks} ranks ({reports[0]['transport']}), {args.points} points")
    print(f"single process   gradient {[round(v, 6) for v in want.tolist()]}")
    for rep in reports:
        g = torch.tensor(rep["grad"], dtype=torch.double)
        ok = torch.allclose(g, want, rtol=1e-6, atol=1e-6) and torch.allclose(
            torch.tensor(rep["params"], dtype=torch.double), params, rtol=1e-6, atol=1e-6)
        failed |= not ok
        print(f"rank {rep['rank']}           gradient {[round(v, 6) for v in rep['grad']]}"
              f"  params {[round(v, 4) for v in rep['params']]}  {'ok' if ok else 'DIFFERS'}")
    print(f"generating params {GEN}")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
