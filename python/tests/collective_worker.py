"""One rank of the collective tests (tests/test_collective*.py start one
process per rank): `python collective_worker.py MODE`, with RANK,
WORLD_SIZE, MASTER_ADDR, MASTER_PORT and TW_TRANSPORT set (and TW_THEN
to run the mode again in a second communicator). It prints one
JSON line, {"rank": r, "failures": [...], ...}; the test asserts on it."""

import json
import os
import signal
import sys
import time
import traceback

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import tensorwire.collective as mpi4torch  # noqa: E402

# torch is imported by main() for the modes that use it: a rank of the
# others (kill, interrupt, token) is numpy alone, as a user's may be, and
# spares the suite an import of torch per process (4-8 s of a core with
# PyPI's torch: 38 of test_collective's 80 rank processes, counted 2026-12-02).
torch = None
NUMPY_ONLY = ("kill", "interrupt", "token", "nospace", "fork")

failures = []
report = {}


def check(cond, what):
    if not cond:
        failures.append(what)


def data(q, shape, seed=0, dtype=np.float64):
    """Rank q's input: every rank can compute every rank's."""
    rng = np.random.default_rng(1000 * seed + q)
    return rng.standard_normal(shape).astype(dtype)


def offsets(counts):
    return np.concatenate([[0], np.cumsum(counts)]).astype(int)


def join():
    shm_dir = None
    if os.environ.get("TW_HOST_DIRS"):
        # Hosts told apart by their shared folders (a host is a kernel and
        # a folder): TW_PER_HOST ranks on each, in rank order.
        host = int(os.environ["RANK"]) // int(os.environ["TW_PER_HOST"])
        shm_dir = os.path.join(os.environ["TW_HOST_DIRS"], f"h{host}")
        os.makedirs(shm_dir, exist_ok=True)
    shm_dir = os.environ.get("TW_SHM_DIR_" + os.environ["RANK"]) or shm_dir  # this rank's own folder
    return mpi4torch.join(transport=os.environ.get("TW_TRANSPORT", "auto"), shm_dir=shm_dir, timeout=60)


def cases(n, r):
    """(name, forward on a torch tensor, this rank's input, the plain
    computation of this rank's output) for every operation and root."""
    counts = [q + 1 for q in range(n)]
    off = offsets(counts)
    tot = int(off[-1])
    out = []
    xs = [data(q, (3, 4), 1) for q in range(n)]
    out.append(("Allreduce", lambda c, x: c.Allreduce(x, mpi4torch.MPI_SUM), xs[r], sum(xs)))
    for root in range(n):
        out.append((f"Bcast_ root {root}", lambda c, x, root=root: c.Bcast_(x, root), xs[r], xs[root]))
        out.append((f"Reduce_ root {root}", lambda c, x, root=root: c.Reduce_(x, mpi4torch.MPI_SUM, root), xs[r],
                    sum(xs) if r == root else np.zeros_like(xs[r])))
        gs = [data(q, (2, q + 1), 2) for q in range(n)]
        out.append((f"Gather root {root}", lambda c, x, root=root: c.Gather(x, 1, root), gs[r],
                    np.concatenate(gs, axis=1) if r == root else np.zeros((2, 0))))
        sx = data(root, (tot, 2), 3)
        out.append((f"Scatter root {root}", lambda c, x, root=root: c.Scatter(x, 0, r + 1, root),
                    sx if r == root else np.zeros((tot, 2)), sx[off[r]:off[r + 1]]))
    ag = [data(q, (q + 1, 3), 4) for q in range(n)]
    out.append(("Allgather", lambda c, x: c.Allgather(x, 0), ag[r], np.concatenate(ag, axis=0)))
    aa = [data(q, (q + 1, tot), 5) for q in range(n)]
    out.append(("Alltoall", lambda c, x: c.Alltoall(x, 0, 1, r + 1), aa[r],
                np.concatenate([a[:, off[r]:off[r + 1]] for a in aa], axis=0)))
    # mpi4torch's redistribution (gatheraxis == scatteraxis): rank q holds
    # q+1 rows, and gets n-q of the joined ones; then back, and equal pieces.
    rd = [data(q, (2, q + 1, 3), 9) for q in range(n)]
    joined = np.concatenate(rd, axis=1)
    new = offsets([n - q for q in range(n)])
    out.append(("Alltoall redistribution", lambda c, x: c.Alltoall(x, 1, 1, n - r), rd[r],
                joined[:, new[r]:new[r + 1]]))
    out.append(("Alltoall redistribution, negative axis, counts list",
                lambda c, x: c.Alltoall(x, -2, 1, [n - q for q in range(n)]), rd[r], joined[:, new[r]:new[r + 1]]))
    eq = [data(q, (n, 2), 10) for q in range(n)] if n > 1 else [data(0, (1, 2), 10)]
    eqj = np.concatenate(eq, axis=0)
    out.append(("Alltoall redistribution, equal pieces", lambda c, x: c.Alltoall(x, 0, 0, None), eq[r],
                eqj[eqj.shape[0] // n * r:eqj.shape[0] // n * (r + 1)]))
    # mpi4torch's tests: Scatter of a Gather is an Alltoall, and two Alltoalls are the identity.
    mt = data(r, (3, 1, n, 2), 11)
    mts = [data(q, (3, 1, n, 2), 11) for q in range(n)]
    out.append(("Alltoall as Scatter(Gather)", lambda c, x: c.Alltoall(x, 1, 2, 1), mt,
                np.concatenate([m[:, :, r:r + 1] for m in mts], axis=1)))
    rs = [data(q, (tot, 2), 6) for q in range(n)]
    out.append(("ReduceScatter", lambda c, x: c.ReduceScatter(x, mpi4torch.MPI_SUM, 0, r + 1), rs[r],
                sum(rs)[off[r]:off[r + 1]]))
    return out


def mode_ops(comm):
    n, r = comm.size, comm.rank
    report.setdefault("transports", []).append(comm.transport)
    report["bell"] = comm._s._bell is not None
    for name, fn, x, want in cases(n, r):
        # Forward, torch and numpy, against the plain computation.
        got = fn(comm, torch.from_numpy(x.copy()))
        check(isinstance(got, torch.Tensor), f"{name}: torch in, {type(got)} out")
        check(tuple(got.shape) == want.shape and np.allclose(got.numpy(), want, atol=1e-12),
              f"{name} (torch): got {got.shape}, want {want.shape}")
        got = fn(comm, x.copy())
        check(isinstance(got, np.ndarray) and got.shape == want.shape and np.allclose(got, want, atol=1e-12),
              f"{name} (numpy)")
        # The dot-product test of the adjoint: sum_r <A(x)_r, y_r> = sum_r <x_r, A*(y)_r>.
        xt = torch.from_numpy(data(r, x.shape, 7)).requires_grad_()
        y = fn(comm, xt)
        w = torch.from_numpy(data(r, tuple(y.shape), 8))
        lhs = (y * w).sum()
        lhs.backward()
        rhs = (xt.detach() * xt.grad).sum()
        tot = comm.Allreduce(np.array([lhs.item(), rhs.item()]), mpi4torch.MPI_SUM)
        check(abs(tot[0] - tot[1]) <= 1e-10 * max(1.0, abs(tot[0])), f"{name}: dot-product test {tot[0]} != {tot[1]}")
    # Other dtypes and reductions, forward.
    ints = [np.arange(6, dtype=np.int32).reshape(2, 3) * (q + 1) - 4 * q for q in range(n)]
    got = comm.Allreduce(ints[r], mpi4torch.MPI_MAX)
    check(got.dtype == np.int32 and (got == np.maximum.reduce(ints)).all(), "Allreduce MPI_MAX int32")
    got = comm.Allreduce(torch.from_numpy(ints[r]), mpi4torch.MPI_MIN)
    check(got.dtype == torch.int32 and (got.numpy() == np.minimum.reduce(ints)).all(), "Allreduce MPI_MIN int32")
    bf = torch.full((2, 2), float(r), dtype=torch.bfloat16)
    got = comm.Allgather(bf, 0)
    check(got.dtype == torch.bfloat16 and got.shape == (2 * n, 2)
          and got.float().tolist() == [[float(q)] * 2 for q in range(n) for _ in range(2)], "Allgather bfloat16")
    comm.Barrier()
    # Isend/Irecv on numpy, a ring.
    h = comm.Isend(np.full(3, r, dtype=np.int64), (r + 1) % n, 5)
    got = comm.Recv(np.zeros(3, dtype=np.int64), (r - 1) % n, 5)
    comm.Wait(h)
    check((got == (r - 1) % n).all(), f"Isend/Recv numpy ring: {got}")


def mode_isend(comm):
    """mpi4torch's examples/isend-recv-wait.py, forward and backward."""
    n, r = comm.size, comm.rank
    a = torch.tensor([1.0 + r]).requires_grad_()
    handle = comm.Isend(a, (r + 1) % n, 0)
    recvbuffer = mpi4torch.JoinDummies(torch.empty_like(a), [handle.dummy])
    b = comm.Recv(recvbuffer, (r - 1 + n) % n, 0)
    wait_ret = comm.Wait(mpi4torch.JoinDummiesHandle(handle, [b]))
    res = mpi4torch.JoinDummies(a + b, [wait_ret])
    res.backward()
    report["res"] = res.tolist()
    report["grad"] = a.grad.tolist()
    check(res.tolist() == [1.0 + r + 1.0 + (r - 1) % n], f"res {res.tolist()}")
    check(a.grad.tolist() == [2.0], f"a.grad {a.grad.tolist()}")


def mode_regression(comm):
    """mpi4torch's examples/simple_linear_regression.py, with every rank's
    gradient checked against the single-process one."""
    torch.manual_seed(42)
    num_points = 10000
    chunk_size = num_points // comm.size
    rest = num_points % comm.size
    if comm.rank < rest:
        chunk_size += 1
        offset = chunk_size * comm.rank
    else:
        offset = chunk_size * comm.rank + rest
    allx = 2.0 * torch.rand([num_points], dtype=torch.double)
    xinput = allx[offset:offset + chunk_size]

    def some_parametrized_function(inp, params):
        return (params[2] * inp + params[1]) * inp + params[0]

    gen_params = torch.tensor([0.1, 1.0, -2.0])
    youtput = some_parametrized_function(xinput, gen_params)
    ally = some_parametrized_function(allx, gen_params)

    def lossfunction(params):
        params = comm.Allreduce(params, mpi4torch.MPI_SUM) / comm.size
        localloss = torch.sum(torch.square(youtput - some_parametrized_function(xinput, params)))
        return comm.Allreduce(localloss, mpi4torch.MPI_SUM)

    def single(params):
        return torch.sum(torch.square(ally - some_parametrized_function(allx, params)))

    def run(loss_fn):
        params = torch.arange(3, dtype=torch.double).requires_grad_()
        first = []
        optimizer = torch.optim.LBFGS([params], 1)

        def closure():
            loss = loss_fn(params)
            optimizer.zero_grad()
            loss.backward()
            if not first:
                first.append(params.grad.clone())
            return loss
        optimizer.step(closure)
        return first[0], params.detach()

    g_dist, p_dist = run(lossfunction)
    # Single process: the distributed loss counts the averaged params once
    # per rank (each rank's Allreduce(params)/size), so its gradient is the
    # single-process one.
    g_one, p_one = run(single)
    report["grad"] = g_dist.tolist()
    report["params"] = p_dist.tolist()
    check(torch.allclose(g_dist, g_one, rtol=1e-6, atol=1e-6), f"grad {g_dist.tolist()} != {g_one.tolist()}")
    check(torch.allclose(p_dist, p_one, rtol=1e-6, atol=1e-6), f"params {p_dist.tolist()} != {p_one.tolist()}")
    check(torch.allclose(p_dist, gen_params, atol=1e-4), f"params {p_dist.tolist()} not the generating ones")


def expect(cls, fn, what):
    try:
        fn()
    except cls as e:
        return str(e)
    except Exception as e:  # noqa: BLE001
        failures.append(f"{what}: {type(e).__name__}: {e}")
        return None
    failures.append(f"{what}: no error")
    return None


def mode_errors(comm):
    n, r = comm.size, comm.rank
    msgs = report.setdefault("messages", {})
    msgs["shape"] = expect(mpi4torch.MismatchError, lambda: comm.Allreduce(np.zeros(3 + (r == 1)), mpi4torch.MPI_SUM),
                           "mismatched shapes")
    msgs["dtype"] = expect(mpi4torch.MismatchError, lambda: comm.Allreduce(
        np.zeros(3, dtype=np.float32 if r == 0 else np.float64), mpi4torch.MPI_SUM), "mismatched dtypes")
    msgs["root"] = expect(mpi4torch.ArgumentError, lambda: comm.Bcast_(np.zeros(3), n), "root out of range")
    msgs["redistribution"] = expect(mpi4torch.ArgumentError, lambda: comm.Alltoall(np.zeros((2, 3)), 0, 0, 3),
                                    "redistribution counts that do not add up")
    # An axis out of range, through the autograd path (torch tensors): the
    # same error on every rank, not an IndexError raised by one rank before
    # the call (the others would wait for it).
    msgs["axis"] = expect(mpi4torch.ArgumentError, lambda: comm.Allgather(
        torch.ones(2, 3, requires_grad=True), 2), "axis out of range")
    msgs["axis1"] = expect(mpi4torch.MismatchError, lambda: comm.Alltoall(
        torch.ones(2, 3, requires_grad=True), 2 if r == 1 else 0, 0, None), "one rank's axis out of range")
    msgs["axis0d"] = expect(mpi4torch.ArgumentError, lambda: comm.Gather(torch.tensor(1.0 + r), 0, 0),
                            "a 0-d tensor has no axis 0")
    # A tensor rank 0 cannot send (a dtype with no tensordict name): the
    # same ArgumentError on every rank, raised on rank 0 from its own
    # cause, not an error there alone while the others wait for it.
    causes = []

    def unsendable():
        try:
            comm.Allreduce(np.array(["a", "b"]) if r == 0 else np.zeros(2), mpi4torch.MPI_SUM)
        except mpi4torch.ArgumentError as e:
            causes.append(type(e.__cause__).__name__)
            raise
    msgs["unsendable"] = expect(mpi4torch.ArgumentError, unsendable, "a dtype with no tensordict name on rank 0")
    check(causes == (["InvalidArgumentError"] if r == 0 else ["NoneType"]), f"the unsendable tensor's cause: {causes}")
    x = torch.ones(3, requires_grad=True)
    y = comm.Allreduce(x, mpi4torch.MPI_MAX)
    msgs["adjoint"] = expect(mpi4torch.NoAdjointError, lambda: y.sum().backward(), "MAX backward")
    # The communicator goes on.
    got = comm.Allreduce(np.ones(3), mpi4torch.MPI_SUM)
    check((got == n).all(), "Allreduce after the errors")


def mode_kill(comm):
    """Rank KILL_RANK kills itself (SIGKILL) in the middle of a loop of
    4 MiB allreduces (KILL_HOW "sidecar": kills its sidecar); the others
    report their error and how long it took, then join a new communicator
    of the survivors at NEW_PORT (with "sidecar", of every rank: the
    victim's process lives, and so does an output it kept from before)."""
    n, r = comm.size, comm.rank
    victim = int(os.environ["KILL_RANK"])
    how = os.environ.get("KILL_HOW")
    x = np.ones(1 << 19)
    held = None
    i = 0
    try:
        while True:
            if r == victim and i == 5:
                if how == "sidecar":
                    os.kill(comm._s._p.pid, signal.SIGKILL)
                    comm._s._p.wait()  # dead before the next call
                elif how == "inflight":
                    # Killed while its sidecar is inside the collective,
                    # waiting for the others (who come a second later).
                    import threading
                    threading.Timer(0.3, os.kill, (os.getpid(), signal.SIGKILL)).start()
                elif how == "forked":
                    # A child forked as a DataLoader worker is (it holds
                    # every fd the rank had, the write end of its
                    # sidecar's pipe too) outlives the rank, killed
                    # between calls.
                    child = os.fork()
                    if child == 0:
                        devnull = os.open(os.devnull, os.O_RDWR)
                        os.dup2(devnull, 1)
                        os.dup2(devnull, 2)
                        time.sleep(120)
                        os._exit(0)
                    with open(os.environ["TW_CHILD"], "w") as f:
                        json.dump({"pid": child, "killed_at": time.time()}, f)
                    os.kill(os.getpid(), signal.SIGKILL)
                else:
                    if how == "stop":
                        os.kill(os.getpid(), signal.SIGSTOP)
                    os.kill(os.getpid(), signal.SIGKILL)
            if r != victim and i == 5 and how == "inflight":
                time.sleep(1)
            y = comm.Allreduce(x, mpi4torch.MPI_SUM)
            if i == 4:
                held = y  # in a region of the data file (4 MiB)
            i += 1
    except Exception as e:  # noqa: BLE001
        report["error"] = type(e).__name__
        report["message"] = str(e)
        report["at"] = time.time()
    try:
        comm.Allreduce(x, mpi4torch.MPI_SUM)
        failures.append("a call after the loss succeeded")
    except Exception as e:  # noqa: BLE001
        report["after"] = type(e).__name__
    comm.close()
    if held is not None:
        check(bool((held == n).all()), "an output kept from before the loss changed")
    survivors = list(range(n)) if how == "sidecar" else [q for q in range(n) if q != victim]
    c2 = mpi4torch.join(f"127.0.0.1:{os.environ['NEW_PORT']}", survivors.index(r), len(survivors),
                        transport=os.environ.get("TW_TRANSPORT", "auto"), timeout=60)
    got = c2.Allreduce(np.ones(4), mpi4torch.MPI_SUM)
    check((got == len(survivors)).all(), "Allreduce in the new communicator")
    c2.close()


def mode_fork(comm):
    """Rank 0 forks a child (as a user's worker pool may) that tries the
    inherited communicator: ClosedError saying it is the parent's, from
    a call and from alloc; its close and its normal exit leave the
    parent's alone. Then every rank's Allreduce still sums right."""
    n, r = comm.size, comm.rank
    check((comm.Allreduce(np.ones(4), mpi4torch.MPI_SUM) == n).all(), "the Allreduce before the fork")
    if r == 0:
        rd, wr = os.pipe()
        pid = os.fork()
        if pid == 0:
            os.close(rd)
            got = []
            for what, fn in (("Allreduce", lambda: comm.Allreduce(np.ones(4), mpi4torch.MPI_SUM)),
                             ("alloc", lambda: comm.alloc(16))):
                try:
                    fn()
                    got.append(f"{what}: no error")
                except mpi4torch.ClosedError as e:
                    got.append(f"{what}: ClosedError" + (" naming the fork" if "forked" in str(e) else f": {e}"))
                except Exception as e:  # noqa: BLE001
                    got.append(f"{what}: {type(e).__name__}: {e}")
            comm.close()
            os.write(wr, json.dumps(got).encode())
            os.close(wr)
            sys.exit(0)  # atexit hooks and all
        os.close(wr)
        with os.fdopen(rd) as f:
            report["child"] = json.loads(f.read() or "[]")
        _, status = os.waitpid(pid, 0)
        check(status == 0, f"the child's exit status {status}")
    for step in range(3):
        got = comm.Allreduce(np.full(4, float(step)), mpi4torch.MPI_SUM)
        check((got == n * step).all(), f"the Allreduce after the fork, step {step}: {got}")


def mode_interrupt(comm):
    """Ctrl-C (SIGINT) on rank 0 while its Allreduce waits for rank 1: a
    KeyboardInterrupt, then ClosedError on its next call; rank 1, which
    comes later (once rank 0's file TW_INTERRUPTED exists: no sleep orders
    them, so that a loaded machine cannot let rank 1 in first), gets a lost
    rank, not a hang: on its first call, or on its second when the first
    could complete with what rank 0's sidecar left (reported as
    "completed")."""
    marker = os.environ["TW_INTERRUPTED"]
    if comm.rank == 0:
        import threading
        main = threading.main_thread().ident

        def interrupt_when_waiting():
            # SIGINT once the main thread waits for the reply (its request
            # sent): not on a timer, which a loaded machine can let fire
            # before the call has begun.
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline:
                f = sys._current_frames().get(main)
                while f is not None:
                    if f.f_code.co_name == "_read_exactly":
                        os.kill(os.getpid(), signal.SIGINT)
                        return
                    f = f.f_back
                time.sleep(0.005)

        try:
            # Rank 1 waits for the marker: the call cannot complete, and
            # the signal finds it waiting.
            threading.Thread(target=interrupt_when_waiting, daemon=True).start()
            comm.Allreduce(np.ones(4), mpi4torch.MPI_SUM)
            failures.append("the Allreduce returned")
        except KeyboardInterrupt:
            report["interrupted"] = True
        open(marker, "w").close()
        try:
            comm.Allreduce(np.ones(4), mpi4torch.MPI_SUM)
        except Exception as e:  # noqa: BLE001
            report["after"] = type(e).__name__
    else:
        deadline = time.monotonic() + 60
        while not os.path.exists(marker) and time.monotonic() < deadline:
            time.sleep(0.01)
        # Rank 0's sidecar may have put its part of the interrupted call
        # where rank 1's finds it before it went (shm: its input and its
        # arrival): then rank 1's call can complete, with the right sum,
        # before its sidecar has seen the loss (seen once). Its next call
        # cannot: the loss is an error by then, never a hang.
        for _ in range(2):
            try:
                got = comm.Allreduce(np.ones(4), mpi4torch.MPI_SUM)
            except Exception as e:  # noqa: BLE001
                report["error"] = type(e).__name__
                break
            check(got.tolist() == [2.0] * 4, f"the completed Allreduce gave {got.tolist()}")
            report["completed"] = report.get("completed", 0) + 1
        else:
            failures.append("rank 1's Allreduce returned after rank 0's sidecar was gone")


def mode_mixed(comm):
    """With a Go rank (tests/gorank) in the communicator: the same calls."""
    n, r = comm.size, comm.rank
    got = comm.Allreduce(torch.full((4,), float(r + 1)), mpi4torch.MPI_SUM)
    check(got.tolist() == [n * (n + 1) / 2] * 4, f"Allreduce {got.tolist()}")
    got = comm.Allgather(np.full((1, 2), r, dtype=np.int64), 0)
    check(got.tolist() == [[q, q] for q in range(n)], f"Allgather {got.tolist()}")
    x = torch.full((3,), float(r), requires_grad=True)
    y = comm.Allgather(x, 0)
    (y * torch.arange(3.0 * n)).sum().backward()
    # d/dx_r of sum over ranks of <Allgather(x), w>: n copies of w's piece r.
    check(x.grad.tolist() == [n * float(3 * r + i) for i in range(3)], f"Allgather backward {x.grad.tolist()}")


def mode_pool(comm):
    """Large outputs are not copied into fresh memory: an in-place call's
    (Allreduce, Bcast_, Reduce_, an Irecv's Wait) stays in the data file
    as a region (tensorwire/_regions.py), the others' come from the reused
    buffers of the pool (tensorwire/_outpool.py). Every result is right;
    a result still referenced (itself, a view, a slice, a .numpy() of it,
    a gradient), in a region or a pooled buffer, keeps its values across
    later calls; a loop of one size reuses its regions and the file does
    not grow; in a loop of varying sizes regions and pool stay within
    their bounds."""
    n, r = comm.size, comm.rank
    s = comm._s
    pool, regions = s._pool, s._regions
    m = 1 << 15  # float64: 256 KiB, above the pool's and the regions' smallest size
    tot = n * (n + 1) / 2

    def val(step):
        return torch.full((m,), float((r + 1) * (step + 1)))

    def want(step):
        return tot * (step + 1)

    def in_file(t):
        return in_data_file(comm, t)

    held = {}
    kinds = ["tensor", "view", "numpy", "reshaped numpy", "memoryview", "numpy call"]
    # More held than there may be regions: the last ones are copied out.
    kinds += [f"more {i}" for i in range(regions.max_regions + 2 - len(kinds))]
    y0 = comm.Allreduce(val(0), mpi4torch.MPI_SUM)
    check(in_file(y0), "a large Allreduce's output was copied out of the data file")
    del y0
    check(regions.stats()[0] == 0, f"a dropped output's region still live: {regions.stats()}")
    for step, kind in enumerate(kinds, 1):
        x = val(step)
        y = comm.Allreduce(x.numpy() if kind == "numpy call" else x, mpi4torch.MPI_SUM)
        check(bool((y == want(step)).all()), f"step {step}: {y[:3].tolist()}")
        held[kind] = {"view": lambda: y[10:20], "numpy": lambda: y.numpy(),
                      "reshaped numpy": lambda: y.numpy().reshape(2, -1)[1],
                      "memoryview": lambda: memoryview(y.numpy()), "numpy call": lambda: y[5:]}.get(kind, lambda: y)()
        report.setdefault("copied", 0)
        report["copied"] += not in_file(y)
        del y
    check(regions.stats()[0] == regions.max_regions, f"{regions.stats()} regions live, want {regions.max_regions}")
    for step, (k, v) in enumerate(held.items(), 1):
        got = np.asarray(v) if not isinstance(v, torch.Tensor) else v.numpy()
        check(bool((got == want(step)).all()), f"held {k} overwritten: {got[:3].tolist()}")
    held.clear()
    check(regions.stats()[0] == 0, f"regions live after every output was dropped: {regions.stats()}")
    # A loop of one size reuses its regions (the gradient keeps one): the
    # file does not grow after the first steps.
    x = torch.full((m,), 1.0, requires_grad=True)
    for step in range(10):
        if step == 3:
            size = s._size
        y = comm.Allreduce(x, mpi4torch.MPI_SUM)
        y.backward(torch.ones_like(y))
        check(bool((y == n).all()), f"fwd-bwd step {step}: {y[:3].tolist()}")
        check(bool((x.grad == n * (step + 1)).all()), f"grad at step {step}: {x.grad[:3].tolist()}")
    report["fwd_bwd_grew"] = s._size - size
    report["fwd_bwd_regions"] = regions.stats()[0]
    del y, x
    # Varying sizes: regions and pool stay within their bounds.
    most = (0, 0)
    for step in range(40):
        k = m + 512 * (step % 13)
        y = comm.Allreduce(torch.full((k,), 1.0), mpi4torch.MPI_SUM)
        check(y.shape == (k,) and bool((y == n).all()), f"size {k}")
        g = comm.Allgather(torch.full((k,), float(r)), 0)
        check(g.shape == (n * k,) and float(g[-1]) == n - 1, f"Allgather size {k}")
        got, bufs = regions.stats(), pool.stats()
        most = (max(most[0], got[0], bufs[0]), max(most[1], got[1], bufs[1]))
    report["most"] = most
    check(most[0] <= max(pool.max_bufs, regions.max_regions) and most[1] <= min(pool.max_bytes, regions.max_bytes),
          f"regions or pool grew to {most}")
    # Other outputs: placed ones (Allgather, pooled), bfloat16 (Bcast_), int64, an Irecv's.
    g = comm.Allgather(torch.full((m,), float(r)), 0)
    check(g.tolist() == [float(q) for q in range(n) for _ in range(m)], "Allgather from the pool")
    b = comm.Bcast_(torch.full((m,), 1.5 + r, dtype=torch.bfloat16), 0)  # no sum of bfloat16
    check(b.dtype == torch.bfloat16 and bool((b == 1.5).all()), f"bfloat16 {b[:3]}")
    i = comm.Allreduce(np.full((m,), r, dtype=np.int64), mpi4torch.MPI_SUM)
    check(i.dtype == np.int64 and bool((i == n * (n - 1) // 2).all()), f"int64 {i[:3]}")
    got = None
    if r == 0:
        comm.Send(torch.arange(m, dtype=torch.float64), 1, 5)
    elif r == 1:
        got = comm.Recv(torch.zeros(m, dtype=torch.float64), 0, 5)
        check(in_file(got), "an Irecv's large tensor was copied out of the data file")
    y = comm.Allreduce(val(1), mpi4torch.MPI_SUM)  # after the Recv: it must not land on its region
    check(bool((y == want(1)).all()), "Allreduce after the Recv")
    if got is not None:
        check(got.tolist() == list(range(m)), f"the received tensor was overwritten: {got[:3].tolist()}")
    check(bool((g[:m] == 0).all()) and bool((b == 1.5).all()) and bool((i == n * (n - 1) // 2).all()),
          "kept outputs overwritten")


def mode_nospace(comm):
    """Rank 0's data file is in a small folder (8 MiB). An Allgather whose
    room (3 MiB of input and the 6 MiB its output would take with equal
    pieces) does not fit there, but whose input and real output (rank 1
    sends 64 KiB) do, goes through the scratch and is right. Then an
    input that does not fit: rank 0 gets NoSpaceError (not a SIGBUS at
    its write into the mapping), the other ranks a lost rank (not a wait
    for rank 0)."""
    small = comm.Allreduce(np.ones(128), mpi4torch.MPI_SUM)
    check(float(small[0]) == comm.size, f"a small Allreduce: {small[:3]}")
    counts = [(3 << 20) // 8] + [8192] * (comm.size - 1)
    got = comm.Allgather(np.full(counts[comm.rank], float(comm.rank)), 0)
    want = np.concatenate([np.full(c, float(q)) for q, c in enumerate(counts)])
    check(got.shape == want.shape and bool((got == want).all()), "an Allgather whose room does not fit rank 0's folder")
    try:
        comm.Allreduce(np.ones(4 << 20), mpi4torch.MPI_SUM)  # 32 MiB of float64
        report["error"] = None
    except Exception as e:  # noqa: BLE001
        report["error"] = type(e).__name__
        report["msg"] = str(e)


def in_data_file(comm, t):
    """Whether tensor or array t's memory is a live region of comm's data
    file (an output that stayed there, not a copy), in whichever mapping
    of the file the region was made."""
    p = t.data_ptr() if isinstance(t, torch.Tensor) else t.ctypes.data
    for r in comm._s._regions._live:
        start = r.__array_interface__["data"][0]
        if start <= p < start + (r.end - r.off):
            return True
    return False


def mode_room(comm):
    """The collectives that are not in place, at sizes whose outputs stay in
    the data file: each result right and in the file. Then an Allgather
    whose output outgrows the room its call gave it (rank 0's guess, from
    its own smaller input): right, copied, and not written over the kept
    output that follows its hole."""
    n, r = comm.size, comm.rank
    m = 1 << 15  # float64: 256 KiB
    cat = torch.cat
    full = torch.full
    got_all = cat([full((m,), float(q)) for q in range(n)])
    got = {
        "Allgather": (comm.Allgather(full((m,), float(r)), 0), got_all),
        "ReduceScatter": (comm.ReduceScatter(torch.arange(n * m, dtype=torch.float64) + r, mpi4torch.MPI_SUM, 0),
                          n * torch.arange(r * m, (r + 1) * m, dtype=torch.float64) + sum(range(n))),
        "Scatter": (comm.Scatter(torch.arange(n * m, dtype=torch.float64) if r == 0 else torch.zeros(n * m), 0, m, 0),
                    torch.arange(r * m, (r + 1) * m, dtype=torch.float64)),
        "Alltoall": (comm.Alltoall(cat([full((1, m), float(10 * r + q)) for q in range(n)]), 1, 0, 1),
                     cat([full((1, m), float(10 * q + r)) for q in range(n)], 1)),
    }
    g = comm.Gather(full((m,), float(r)), 0, 0)
    if r == 0:
        got["Gather"] = (g, got["Allgather"][1])
    for name, (y, want) in got.items():
        check(y.shape == want.shape and bool((y == want).all()), f"{name}: {y.shape} {y.reshape(-1)[:3].tolist()}")
        check(in_data_file(comm, y), f"{name}'s output was copied out of the data file")
    got.clear()
    del g, y
    regions = comm._s._regions
    check(regions.stats()[0] == 0, f"regions live after every output was dropped: {regions.stats()}")
    # A hole of exactly the room rank 0's Allgather asks (its input, then n
    # times it), and a kept output right after it.
    k = m // 4
    y1 = comm.Allreduce(full((k + n * k,), 1.0), mpi4torch.MPI_SUM)
    y2 = comm.Allreduce(full((m,), 2.0), mpi4torch.MPI_SUM)
    s = comm._s
    check((y1.data_ptr() - s._ptr, y2.data_ptr() - s._ptr) == (0, 8 * (k + n * k)),
          f"the layout: {y1.data_ptr() - s._ptr}, {y2.data_ptr() - s._ptr}")
    del y1
    mine = k if r == 0 else 3 * k  # rank 0's guess (n times its own) is short
    g = comm.Allgather(full((mine,), float(r)), 0)
    want = cat([full((k if q == 0 else 3 * k,), float(q)) for q in range(n)])
    check(g.shape == want.shape and bool((g == want).all()), f"the outgrown Allgather: {g.shape}")
    check(bool((y2 == 2 * n).all()), "the outgrown Allgather wrote over the output kept after its hole")
    report["outgrown_in_file"] = in_data_file(comm, g)
    # The client's path for a sidecar of pipe version 1 (no at, no room;
    # such a client never made a region): every input at offset 0, outputs
    # copied, a held one kept across a later call.
    del y2, g
    check(regions.stats()[0] == 0, f"regions live before version 1: {regions.stats()}")
    comm._s._pipe = 1
    a = comm.Allreduce(full((m,), 1.0), mpi4torch.MPI_SUM)
    b = comm.Allgather(full((m,), float(r)), 0)
    check(bool((a == n).all()) and not in_data_file(comm, a), "version 1: Allreduce")
    check(bool((b == got_all).all()) and not in_data_file(comm, b), "version 1: Allgather")
    check(bool((a == n).all()) and regions.stats()[0] == 0, "version 1: a held output overwritten, or a region made")


def mode_alloc(comm):
    """comm.alloc: tensors in the data file, which an Allreduce, Reduce_ or
    Bcast_ reads where they are (out_at: no copy in) and leaves as they
    were, its output in the file too; an output passed on the same way,
    including to offset 0; a view at a 64-byte multiple too, an unaligned
    one copied; gradients through an allocated leaf; and the plain tensors
    alloc gives below 64 KiB, past the regions' bound and to a sidecar of
    pipe 2."""
    n, r = comm.size, comm.rank
    s = comm._s
    regions = s._regions
    sent = []
    call = s.call

    def spy(req, *a, **k):
        sent.append(req)  # as call leaves it: with at and out_at
        return call(req, *a, **k)

    s.call = spy

    def no_copy():
        return "out_at" in sent[-1]

    m = 1 << 15  # float64: 256 KiB
    buf = comm.alloc(m)
    check(buf.dtype == torch.float32 and buf.shape == (m,) and bool((buf == 0).all()), f"alloc: {buf.dtype} {buf.shape}")
    check(in_data_file(comm, buf), "alloc's tensor is not in the data file")
    buf.copy_(torch.arange(m, dtype=torch.float32) * (r + 1))
    mine = buf.clone()
    total = torch.arange(m, dtype=torch.float32) * sum(range(1, n + 1))
    y = comm.Allreduce(buf, mpi4torch.MPI_SUM)
    check(bool((y == total).all()), "Allreduce of an allocated tensor")
    check(no_copy() and sent[-1]["at"] == 0 and sent[-1]["out_at"] != 0, f"Allreduce copied its input in: {sent[-1]}")
    check(bool((buf == mine).all()), "Allreduce changed its allocated input")
    check(in_data_file(comm, y) and y.data_ptr() != buf.data_ptr(), "Allreduce's output")
    # buf's region (offset 0) freed: the next output kept there, out_at 0.
    del buf
    y2 = comm.Allreduce(y, mpi4torch.MPI_SUM)
    check(no_copy() and sent[-1]["out_at"] == 0, f"an output passed on: {sent[-1]}")
    check(bool((y2 == n * total).all()) and bool((y == total).all()), "Allreduce of an output kept in the file")
    del y, y2
    buf = comm.alloc(2, m // 2, dtype=torch.float64)
    buf.copy_(torch.full((2, m // 2), float(r)))
    b = comm.Bcast_(buf, n - 1)
    check(no_copy() and bool((b == n - 1).all()) and bool((buf == r).all()), "Bcast_ of an allocated tensor")
    rd = comm.Reduce_(buf, mpi4torch.MPI_SUM, 0)
    want = sum(range(n)) if r == 0 else 0
    check(no_copy() and bool((rd == want).all()) and bool((buf == r).all()), "Reduce_ of an allocated tensor")
    v = comm.Allreduce(buf[1], mpi4torch.MPI_SUM)  # a row: 128 KiB in, at a 64-byte multiple
    check(no_copy() and bool((v == sum(range(n))).all()), "Allreduce of a view of an allocated tensor")
    u = comm.Allreduce(buf.view(-1)[1:], mpi4torch.MPI_SUM)  # 8 bytes in: copied
    check(not no_copy() and bool((u == sum(range(n))).all()), "Allreduce of an unaligned view")
    del b, rd, v, u
    leaf = comm.alloc(m).requires_grad_()
    out = comm.Allreduce(leaf, mpi4torch.MPI_SUM)
    (out * (r + 1)).sum().backward()
    check(bool((leaf.grad == sum(range(1, n + 1))).all()), "the gradient through an allocated leaf")
    del leaf, out
    small = comm.alloc(3, 4)
    check(not in_data_file(comm, small) and bool((small == 0).all()), "alloc below 64 KiB")
    arr = comm.alloc((4, m), dtype=np.int32)
    check(isinstance(arr, np.ndarray) and arr.dtype == np.int32 and arr.shape == (4, m), "alloc with a numpy dtype")
    del arr
    many = [comm.alloc(m) for _ in range(regions.max_regions + 1)]
    kept = [in_data_file(comm, t) for t in many]
    check(kept == [True] * (regions.max_regions - 1) + [False, False],
          f"allocs past the regions' bound ({regions.max_regions} with buf's): {kept}")
    for t in many:
        t.fill_(1.0)
    ys = [comm.Allreduce(t, mpi4torch.MPI_SUM) for t in many[-2:]]
    check(all(bool((y == n).all()) for y in ys), "Allreduce of a plain tensor alloc gave")
    del many, ys, buf
    s._pipe = 2  # a sidecar without out_at
    old = comm.alloc(m)
    check(not in_data_file(comm, old), "alloc with a sidecar of pipe 2")
    z = comm.Allreduce(comm.Allreduce(torch.ones(m), mpi4torch.MPI_SUM), mpi4torch.MPI_SUM)
    check(not no_copy() and bool((z == n * n).all()), "pipe 2: an output passed on")
    s._pipe = 3
    s.call = call


def mode_sendrecv(comm):
    """Send and Recv without a gradient to carry (numpy; torch without
    requires_grad; torch under no_grad) take the sidecar's blocking send
    and recv, one call each: values right, large and small, the received
    tensor kept in the data file; with a gradient, Isend/Irecv and Wait,
    whose backward carries it (as mpi4torch's)."""
    r = comm.rank
    peer = r ^ 1
    s = comm._s
    sent = []
    call = s.call

    def spy(req, *a, **k):
        sent.append(req["op"])
        return call(req, *a, **k)

    s.call = spy
    for k, n in enumerate((3, 1 << 16)):  # 24 bytes; 512 KiB of float64
        xs = [data(q, (n,), 20 + k) for q in (0, 1)]
        for kind in ("numpy", "torch", "no_grad"):
            x = xs[r] if kind == "numpy" else torch.from_numpy(xs[r]).requires_grad_(kind == "no_grad")
            del sent[:]
            if kind == "no_grad":
                with torch.no_grad():
                    got = pingpong(comm, x, peer)
            else:
                got = pingpong(comm, x, peer)
            got = got if isinstance(got, np.ndarray) else got.detach().numpy()
            check(np.array_equal(got, xs[peer]), f"{kind}, {n} elements: not the peer's values")
            check(sent == ["send", "recv"] or sent == ["recv", "send"], f"{kind}, {n} elements: calls {sent}")
            if n > 3 and kind != "numpy":
                check(in_data_file(comm, pingpong_last[0]), f"{kind}: the received tensor was copied out")
    # With a gradient: Isend/Irecv and their Waits, and the backward.
    x = torch.from_numpy(data(r, (4,), 30)).requires_grad_()
    del sent[:]
    if r % 2 == 0:
        comm.Send(x, peer, 0)
        y = comm.Recv(torch.zeros(4, requires_grad=True), peer, 1)
    else:
        y = comm.Recv(torch.zeros(4, requires_grad=True), peer, 0)
        comm.Send(x, peer, 1)
    check("isend" in sent and "irecv" in sent and "send" not in sent, f"with a gradient: calls {sent}")
    check(np.array_equal(y.detach().numpy(), data(peer, (4,), 30)), "with a gradient: not the peer's values")
    s.call = call
    # Isend and Irecv of 512 KiB keep their tensors in regions of the data
    # file until their Waits (pipe 4's keep), across a call that grows the
    # file in between; the Irecv's output is its region.
    n = 1 << 16
    mine, theirs = data(r, (n,), 40), data(peer, (n,), 40)
    x = torch.from_numpy(mine.copy())
    size0 = s._size
    hs = comm.Isend(x, peer, 5)
    hr = comm.Irecv(torch.zeros(n), peer, 5)
    check(len(s._held) == 2, f"regions held by the running Isend and Irecv: {len(s._held)}, want 2")
    x.fill_(-1.0)  # the Isend's bytes are its own copy in the file: changing x changes nothing
    big = comm.Allreduce(torch.ones(4 << 20 >> 3), mpi4torch.MPI_SUM)  # 4 MiB: the file grows
    check(s._size > size0, f"the file did not grow ({size0} -> {s._size})")
    got = comm.Wait(hr)
    comm.Wait(hs)
    check(np.array_equal(got.numpy(), theirs), "a kept Irecv: not the peer's values")
    check(in_data_file(comm, got), "a kept Irecv's tensor was copied out")
    check(len(s._held) == 0 and not s._orphans, f"held after the Waits: {len(s._held)}, orphans {len(s._orphans)}")
    check(bool((big == comm.size).all()), "the Allreduce between")
    # A Send of a tensor of alloc reads it where it is: the request's at is
    # the tensor's place in the file.
    buf = comm.alloc(n, dtype=torch.float64)
    buf.copy_(torch.from_numpy(mine))
    reqs = []

    def spy_req(req, *a, **k):
        reqs.append(req)
        return call(req, *a, **k)

    s.call = spy_req
    got = pingpong(comm, buf, peer)
    s.call = call
    sends = [q for q in reqs if q["op"] == "send"]
    where = s._regions.find(buf.data_ptr(), n * 8)
    check(len(sends) == 1 and where is not None and sends[0].get("at") == where,
          f"the Send of an allocated tensor: at {sends[0].get('at') if sends else None}, the tensor at {where}")
    check(np.array_equal(got.numpy(), theirs), "an allocated tensor's Send: not the peer's values")


pingpong_last = [None]


def pingpong(comm, x, peer):
    """Rank 2i sends x to 2i+1 and receives its x; 2i+1 the reverse."""
    if comm.rank % 2 == 0:
        comm.Send(x, peer, 0)
        got = comm.Recv(x, peer, 1)
    else:
        got = comm.Recv(x, peer, 0)
        comm.Send(x, peer, 1)
    pingpong_last[0] = got
    return got


def mode_cuda(comm):
    """CUDA tensors in and out (through host memory), forward and backward."""
    n = comm.size
    x = torch.ones(4, device="cuda", requires_grad=True)
    y = comm.Allreduce(x, mpi4torch.MPI_SUM)
    check(y.device.type == "cuda" and y.tolist() == [float(n)] * 4, f"Allreduce on cuda: {y}")
    y.sum().backward()
    check(x.grad.device.type == "cuda" and x.grad.tolist() == [float(n)] * 4, f"grad on cuda: {x.grad}")


def token_join():
    """Joins with $TW_TOKEN; reports the exception class every rank gets."""
    t0 = time.monotonic()
    try:
        c = mpi4torch.join(transport="tcp", token=os.environ["TW_TOKEN"], timeout=30)
        report["joined"] = True
        c.close()
    except Exception as e:  # noqa: BLE001
        report["error"] = type(e).__name__
        report["message"] = str(e)
    report["seconds"] = time.monotonic() - t0
    report["rank"] = int(os.environ["RANK"])


def main():
    global torch
    mode = sys.argv[1]
    if mode not in NUMPY_ONLY:
        import torch
        torch.set_default_dtype(torch.float64)
    else:
        check("torch" not in sys.modules, f"mode {mode}: torch imported by the collective client")
    if mode == "token":
        token_join()
        report["failures"] = failures
        print(json.dumps(report), flush=True)
        return
    # The rank is known before the join: a join that fails is then a
    # failure the test prints, not a report without a rank.
    report["rank"] = int(os.environ["RANK"])
    try:
        comm = join()
        globals()["mode_" + mode](comm)
        if mode not in ("kill",):
            comm.close()
        if os.environ.get("TW_THEN"):
            # The same mode again in a second communicator of this process,
            # TW_THEN = "TRANSPORT@PORT": one process set runs both
            # transports (and a process joins again after a close).
            transport, _, port = os.environ["TW_THEN"].partition("@")
            comm = mpi4torch.join(f"127.0.0.1:{port}", int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"]),
                                  transport=transport, timeout=60)
            globals()["mode_" + mode](comm)
            comm.close()
    except Exception:  # noqa: BLE001
        failures.append(traceback.format_exc())
    report["failures"] = failures
    print(json.dumps(report), flush=True)


if __name__ == "__main__":
    main()
