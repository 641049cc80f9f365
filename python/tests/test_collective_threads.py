"""Collectives on ranks joined as threads of this process (a sidecar
each), for what needs no rank processes: tensors numpy cannot view (a
conjugate or negative view works; a meta tensor fails with the same
ArgumentError on every rank, not on one alone while the others wait), and
mpi4torch's redistribution (Alltoall with gatheraxis == scatteraxis, done in
Python) with lists of counts: lists that differ between ranks are a
MismatchError on every rank, not a silent wrong result; a list of the
wrong length an ArgumentError on every rank. Each test failed before its
fix (2026-12-03)."""

import os
import sys
import threading
import unittest

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import numpy as np  # noqa: E402

import tensorwire.collective as C  # noqa: E402
from nodes import binary, stable_port  # noqa: E402

try:
    import torch
except ImportError:
    torch = None


def world(n, fn, limit=60):
    """fn(comm) on n ranks joined in this process (a thread each): each
    rank's ("ok", value) or ("err", exception), and the ranks still in fn
    after limit seconds (a hang)."""
    port = stable_port()
    res = [None] * n

    def run(r):
        try:
            comm = C.join(f"127.0.0.1:{port}", r, n, transport="shm", timeout=30, binary=binary())
        except BaseException as e:  # noqa: B902
            res[r] = ("join", e)
            return
        try:
            res[r] = ("ok", fn(comm))
        except BaseException as e:  # noqa: B902
            res[r] = ("err", e)
        finally:
            comm.close()

    ts = [threading.Thread(target=run, args=(r,), daemon=True) for r in range(n)]
    for t in ts:
        t.start()
    for t in ts:
        t.join(limit)
    return res, [r for r, t in enumerate(ts) if t.is_alive()]


@unittest.skipUnless(torch is not None, "needs torch")
class TestConjugateAndMetaTensors(unittest.TestCase):
    def test_conjugate_view(self):
        z = torch.tensor([1 + 2j, 3 - 1j], dtype=torch.complex64)

        def fn(comm):
            # rank 0 broadcasts the conjugate view (complex has no Sum)
            x = z.conj() if comm.rank == 0 else torch.zeros_like(z)
            return comm.Bcast_(x, 0)

        res, hung = world(2, fn)
        self.assertEqual(hung, [])
        for r, (how, v) in enumerate(res):
            self.assertEqual(how, "ok", f"rank {r}: {v!r}")
            self.assertTrue(torch.equal(v, torch.tensor([1 - 2j, 3 + 1j], dtype=torch.complex64)), f"rank {r}: {v}")

    def test_negative_view(self):
        z = torch.tensor([1 + 2j, 3 - 1j], dtype=torch.complex64)

        def fn(comm):
            x = z.conj().imag if comm.rank == 0 else torch.tensor([1.0, 1.0])  # rank 0's is [-2, 1]
            return comm.Allreduce(x, C.MPI_SUM)

        res, hung = world(2, fn)
        self.assertEqual(hung, [])
        for r, (how, v) in enumerate(res):
            self.assertEqual(how, "ok", f"rank {r}: {v!r}")
            self.assertEqual(v.tolist(), [-1.0, 2.0], f"rank {r}")

    def test_conjugate_view_through_autograd(self):
        z = torch.tensor([1 + 2j, 3 - 1j], dtype=torch.complex128)

        def fn(comm):
            x = z.conj() if comm.rank == 0 else z
            return comm.Allgather(x, 0)

        res, hung = world(2, fn)
        self.assertEqual(hung, [])
        for r, (how, v) in enumerate(res):
            self.assertEqual(how, "ok", f"rank {r}: {v!r}")
            self.assertEqual(v.tolist(), [1 - 2j, 3 + 1j, 1 + 2j, 3 - 1j], f"rank {r}")

    def test_meta_tensor_fails_on_every_rank(self):
        def fn(comm):
            x = torch.ones(3, device="meta") if comm.rank == 0 else torch.ones(3)
            return comm.Allreduce(x, C.MPI_SUM)

        res, hung = world(2, fn)
        self.assertEqual(hung, [])
        for r, (how, e) in enumerate(res):
            self.assertEqual(how, "err", f"rank {r}: {e!r}")
            self.assertIsInstance(e, C.ArgumentError, f"rank {r}: {e!r}")


@unittest.skipUnless(torch is not None, "needs torch")
class TestRedistributionCounts(unittest.TestCase):
    def _both(self, fn, exc):
        res, hung = world(2, fn)
        self.assertEqual(hung, [])
        for r, (how, e) in enumerate(res):
            self.assertEqual(how, "err", f"rank {r}: {e!r}")
            self.assertIsInstance(e, exc, f"rank {r}: {e!r}")

    def test_lists_that_differ(self):
        # both add up to the 8 elements: before, rank 0 got [0, 1, 2] and
        # rank 1 [4, 5, 6, 7], element 3 lost, no error anywhere
        self._both(lambda c: c.Alltoall(torch.arange(4.) + 4 * c.rank, 0, 0, [3, 5] if c.rank == 0 else [4, 4]),
                   C.MismatchError)

    def test_list_on_one_rank_a_count_on_the_other(self):
        self._both(lambda c: c.Alltoall(torch.arange(4.) + 4 * c.rank, 0, 0, [3, 5] if c.rank == 0 else 5),
                   C.MismatchError)

    def test_list_of_the_wrong_length_on_one_rank(self):
        self._both(lambda c: c.Alltoall(torch.arange(4.) + 4 * c.rank, 0, 0, [3, 5, 0] if c.rank == 0 else [3, 5]),
                   C.ArgumentError)

    def test_counts_that_agree(self):
        def fn(c):
            x = torch.arange(4.) + 4 * c.rank
            return [c.Alltoall(x, 0, 0, [3, 5]).tolist(), c.Alltoall(x, 0, 0, 3 if c.rank == 0 else 5).tolist(),
                    c.Alltoall(x, 0, 0, None).tolist(), c.Alltoall(x.numpy(), -1, 0, [5, 3]).tolist()]

        res, hung = world(2, fn)
        self.assertEqual(hung, [])
        self.assertEqual(res[0], ("ok", [[0., 1., 2.], [0., 1., 2.], [0., 1., 2., 3.], [0., 1., 2., 3., 4.]]))
        self.assertEqual(res[1], ("ok", [[3., 4., 5., 6., 7.], [3., 4., 5., 6., 7.], [4., 5., 6., 7.], [5., 6., 7.]]))

    def test_adjoint(self):
        # sum_r <A(x)_r, y_r> = sum_r <x_r, A*(y)_r> with counts lists
        def fn(c):
            g = torch.Generator().manual_seed(c.rank)
            x = torch.randn(2, 3 + c.rank, dtype=torch.float64, generator=g).requires_grad_()
            y = c.Alltoall(x, 1, 1, [1, 6])
            w = torch.randn(y.shape, dtype=torch.float64, generator=g)
            lhs = (y * w).sum()
            lhs.backward()
            return lhs.item(), (x.detach() * x.grad).sum().item()

        res, hung = world(2, fn)
        self.assertEqual(hung, [])
        self.assertEqual([how for how, _ in res], ["ok", "ok"], res)
        lhs, rhs = sum(v[0] for _, v in res), sum(v[1] for _, v in res)
        self.assertAlmostEqual(lhs, rhs, places=10)


class TestReceiveFromAClosedRank(unittest.TestCase):
    def test_recv_fails_with_peer_lost(self):
        """A Recv from a rank that closed its communicator (the sidecar's
        Go Comm hears it) fails with PeerLostError instead of waiting for
        good, and a send it took before closing is received."""
        import time

        def fn(comm):
            if comm.rank == 0:
                comm.Send(np.arange(3.0), 1, 4)
                return None  # world() closes it
            got = comm.Recv(np.zeros(3), 0, 4)
            start = time.monotonic()
            try:
                comm.Recv(np.zeros(1), 0, 5)
            except C.PeerLostError as e:
                return got.tolist(), time.monotonic() - start, str(e)
            return "received"

        res, hung = world(2, fn)
        self.assertEqual(hung, [])
        how, v = res[1]
        self.assertEqual(how, "ok", v)
        self.assertEqual(v[0], [0.0, 1.0, 2.0])
        self.assertLess(v[1], 30, v)


if __name__ == "__main__":
    unittest.main()
