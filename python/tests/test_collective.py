"""tensorwire.collective against real processes: each rank a Python
process (tests/collective_worker.py) with its sidecar, a real Go rank
(`tensorwire collective rank`), over shared mappings or TCP.

One process set per size runs every operation and root in a communicator
over shared mappings, then in a second one over TCP: results against a
plain computation and the dot-product test of every adjoint
(docs/collective.md, "From Python")."""

import json
import os
import signal
import subprocess
import sys
import tempfile
import time
import unittest

import zygote
from collective_worker import NUMPY_ONLY
from nodes import HERE, binary, python_env, stable_port

WORKER = os.path.join(HERE, "collective_worker.py")

try:
    import torch  # noqa: F401
    HAVE_TORCH = True
except ImportError:
    HAVE_TORCH = False


# The ranks of the modes that use torch are forked from a process that
# imported it once (zygote.py: 42 ranks, 1.4-2.2 s of a core each to import
# torch); the NUMPY_ONLY modes' are started as `python collective_worker.py`,
# torch never imported.
_zygote = None


def tearDownModule():
    global _zygote
    if _zygote is not None:
        _zygote.close()
        _zygote = None


def start_ranks(mode, size, transport="auto", extra=None, ranks=None, port=None):
    global _zygote
    port = port or stable_port()
    procs = []
    for r in (range(size) if ranks is None else ranks):
        env = python_env()
        env.update({"RANK": str(r), "WORLD_SIZE": str(size), "MASTER_ADDR": "127.0.0.1",
                    "MASTER_PORT": str(port), "TW_TRANSPORT": transport, "TENSORWIRE_BIN": binary()})
        env.update(extra or {})
        if HAVE_TORCH and mode not in NUMPY_ONLY and zygote.available():
            if _zygote is None:
                _zygote = zygote.Zygote(["numpy", "torch"], env=python_env())
            procs.append(_zygote.popen([WORKER, mode], env))
            continue
        procs.append(subprocess.Popen([sys.executable, WORKER, mode], env=env, stdout=subprocess.PIPE,
                                      stderr=subprocess.PIPE, text=True))
    return procs, port


def finish(tc, procs, timeout=300, want_rc=0):
    """Each rank's report (None for one that printed none)."""
    reports = []
    deadline = time.monotonic() + timeout
    for p in procs:
        try:
            out, err = p.communicate(timeout=max(1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            for q in procs:
                q.kill()
            tc.fail(f"a rank did not finish within {timeout}s (a hang)")
        lines = [ln for ln in out.splitlines() if ln.startswith("{")]
        rep = json.loads(lines[-1]) if lines else None
        if want_rc is not None:
            tc.assertEqual(p.returncode, want_rc, err[-3000:])
            tc.assertIsNotNone(rep, err[-3000:])
        reports.append(rep)
    return reports


def run_ranks(tc, mode, size, transport="auto", extra=None, timeout=300):
    procs, _ = start_ranks(mode, size, transport, extra)
    reports = finish(tc, procs, timeout)
    for r, rep in enumerate(reports):
        tc.assertEqual(rep["rank"], r)
        tc.assertEqual(rep["failures"], [], f"rank {r}")
    return reports


@unittest.skipUnless(HAVE_TORCH, "needs torch")
class TestCollectiveOps(unittest.TestCase):
    """Every operation and root, forward (torch and numpy) and its adjoint's
    dot-product test, at 2, 3 and 4 ranks on both transports (one process
    set per size, shared mappings then TCP)."""

    def test_ops_with_the_bell(self):
        """The same with the bell's bounded spin (join(spin=...)) on each
        side of every rank's pipe."""
        reports = run_ranks(self, "ops", 3, "shm", extra={"TENSORWIRE_COLLECTIVE_SPIN_US": "50"})
        self.assertEqual([rep["bell"] for rep in reports], [True] * 3)


def _ops_test(size):
    def test(self):
        # Both transports in one process set, one communicator after the
        # other: a rank process costs an import of torch (4-8 s of a core
        # with PyPI's), and a process that joins again is a case of its own.
        reports = run_ranks(self, "ops", size, "shm", extra={"TW_THEN": f"tcp@{stable_port()}"})
        self.assertEqual([rep["transports"] for rep in reports], [["shm", "tcp"]] * size)
    return test


for _size in (2, 3, 4):
    setattr(TestCollectiveOps, f"test_ops_{_size}_ranks_shm_then_tcp", _ops_test(_size))


@unittest.skipUnless(HAVE_TORCH, "needs torch")
class TestCollectivePool(unittest.TestCase):
    """Large outputs without a fresh allocation: an in-place call's stays in
    the data file (a region), the others' come from the output pool's
    reused buffers. Results right, a result still referenced never
    overwritten by a later call, a loop of one size on the same regions,
    regions and pool bounded in a loop of varying sizes
    (collective_worker.py, mode_pool)."""

    def test_outputs_in_regions_and_pool_3_ranks(self):
        reports = run_ranks(self, "pool", 3, "shm")
        for rep in reports:
            self.assertEqual(rep["copied"], 2, "want every held output in a region but the 2 past max_regions")
            self.assertEqual(rep["fwd_bwd_grew"], 0, "a loop of one size grew the data file after its first steps")
            self.assertLessEqual(rep["fwd_bwd_regions"], 3)

    def test_alloc_3_ranks(self):
        """comm.alloc's tensors are read where they are (collective_worker.py,
        mode_alloc)."""
        run_ranks(self, "alloc", 3, "shm")

    def test_outputs_that_are_not_in_place_3_ranks(self):
        reports = run_ranks(self, "room", 3, "shm")
        self.assertEqual([rep["outgrown_in_file"] for rep in reports], [False, True, True],
                         "rank 0's outgrown output should be copied, the others' stay")


class TestCollectiveNoSpace(unittest.TestCase):
    """A full folder for the data file: rank 0's is an 8 MiB tmpfs (mounted
    here: root only). An Allgather whose room does not fit there but whose
    input and output do goes through; an input of 32 MiB does not fit:
    rank 0 gets NoSpaceError and leaves, rank 1 a lost rank, no hang."""

    def setUp(self):
        if not hasattr(os, "geteuid") or os.geteuid() != 0:
            self.skipTest("needs root to mount a small tmpfs")
        self.dir = tempfile.mkdtemp()
        out = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=8m", "tmpfs", self.dir], capture_output=True,
                             text=True)
        if out.returncode:
            os.rmdir(self.dir)
            self.skipTest(f"cannot mount a tmpfs: {out.stderr.strip()}")

    def tearDown(self):
        subprocess.run(["umount", self.dir], check=False)
        os.rmdir(self.dir)

    def test_full_folder(self):
        procs, _ = start_ranks("nospace", 2, "tcp", extra={"TW_SHM_DIR_0": self.dir})
        reports = finish(self, procs, 120)
        for r, rep in enumerate(reports):
            self.assertEqual(rep["failures"], [], f"rank {r}")
        self.assertEqual(reports[0]["error"], "NoSpaceError", reports[0])
        self.assertIn("cannot grow", reports[0]["msg"])
        self.assertIn(reports[1]["error"], ("PeerLostError", "RankAbortedError", "BrokenError"), reports[1])


@unittest.skipUnless(HAVE_TORCH, "needs torch")
class TestCollectiveHier(unittest.TestCase):
    """Every operation and root, and its adjoint, on a hierarchical
    communicator: 2 hosts of 2 ranks, told apart by their shared folders."""

    def test_ops_2x2_hier(self):
        with tempfile.TemporaryDirectory() as d:
            reports = run_ranks(self, "ops", 4, "hier", extra={"TW_HOST_DIRS": d, "TW_PER_HOST": "2"})
        self.assertEqual([rep["transports"] for rep in reports], [["hier"]] * 4)


def _cuda():
    return HAVE_TORCH and torch.cuda.is_available()


@unittest.skipUnless(_cuda(), "no GPU on this machine (or no torch): CUDA tensors untested")
class TestCollectiveCUDA(unittest.TestCase):
    def test_cuda_tensors(self):
        """CUDA tensors go through host memory: results and gradients come
        back on the GPU."""
        run_ranks(self, "cuda", 2)


@unittest.skipUnless(HAVE_TORCH, "needs torch")
class TestCollectiveExamples(unittest.TestCase):
    def test_simple_linear_regression(self):
        """mpi4torch's example: every rank's gradient is the single-process
        one (1e-6), and LBFGS finds the generating parameters."""
        reports = run_ranks(self, "regression", 3)
        for rep in reports:
            self.assertEqual(rep["params"], reports[0]["params"])

    def test_send_recv_blocking_2_ranks(self):
        """Send and Recv without a gradient in one sidecar call each, with one
        through Isend/Irecv (collective_worker.py, mode_sendrecv)."""
        run_ranks(self, "sendrecv", 2, "shm")

    def test_isend_recv_wait_joindummies(self):
        """mpi4torch's README idiom (examples/isend-recv-wait.py): a ring of
        Isend, Recv and Wait with JoinDummies, forward and backward."""
        for size in (2, 3):
            reports = run_ranks(self, "isend", size, "tcp" if size == 3 else "shm")
            for r, rep in enumerate(reports):
                self.assertEqual(rep["res"], [2.0 + r + (r - 1) % size])
                self.assertEqual(rep["grad"], [2.0])


@unittest.skipUnless(HAVE_TORCH, "needs torch")
class TestCollectiveFailures(unittest.TestCase):
    def test_errors_are_the_same_on_every_rank(self):
        """Mismatched shapes and dtypes, a root out of range, a tensor one
        rank cannot send, the backward of MPI_MAX: the same exception on
        every rank, and the communicator goes on."""
        reports = run_ranks(self, "errors", 3)
        for rep in reports:
            for what, msg in rep["messages"].items():
                self.assertEqual(msg, reports[0]["messages"][what], what)
        self.assertIn("root 3 is not a rank of 3", reports[0]["messages"]["root"])

    def _killed(self, how, transport, extra=None):
        new_port = stable_port()
        procs, _ = start_ranks("kill", 3, transport, {"KILL_RANK": "2", "NEW_PORT": str(new_port),
                                                       "KILL_HOW": how, **(extra or {})})
        t0 = time.monotonic()
        reports = finish(self, procs[:2], timeout=120, want_rc=None)
        took = time.monotonic() - t0
        procs[2].kill()  # stopped ranks stay stopped
        finish(self, procs[2:], timeout=30, want_rc=None)
        self.assertEqual(procs[2].returncode, -9)
        for r in (0, 1):
            self.assertEqual(procs[r].returncode, 0)
            rep = reports[r]
            self.assertEqual(rep["failures"], [], f"rank {r}")
            self.assertIn(rep["error"], ("PeerLostError", "RankAbortedError", "BrokenError"), rep["message"])
            self.assertIn(rep["after"], ("BrokenError", "PeerLostError"))
        print(f"\n{how} ({transport}): survivors failed with {reports[0]['error']}: {reports[0]['message'][:200]}; "
              f"{took:.1f}s for the whole run")
        return reports

    def test_rank_killed_mid_collective(self):
        """kill -9 of a Python rank in a loop of 4 MiB allreduces: the others
        get the error (no hang), then form a new communicator."""
        for transport in ("shm", "tcp"):
            with self.subTest(transport=transport):
                self._killed("kill", transport)

    def test_rank_killed_inside_its_call(self):
        """kill -9 of a Python rank whose sidecar is inside a collective,
        waiting for the others: the sidecar breaks off (its stdin's writer
        is gone), and the others fail when they come to it."""
        for transport in ("shm", "tcp"):
            with self.subTest(transport=transport):
                self._killed("inflight", transport)

    def test_rank_killed_with_a_forked_child(self):
        """kill -9 of a Python rank whose forked child (a DataLoader
        worker, say) lives on, holding the write end of the sidecar's
        pipe: the sidecar sees its parent gone all the same and leaves, so
        the others fail within seconds, not when the child exits."""
        for transport in ("shm", "tcp"):
            with self.subTest(transport=transport), tempfile.TemporaryDirectory() as d:
                child = os.path.join(d, "child")
                try:
                    reports = self._killed("forked", transport, {"TW_CHILD": child})
                    with open(child) as f:
                        killed_at = json.load(f)["killed_at"]
                    for r in (0, 1):
                        self.assertLess(reports[r]["at"] - killed_at, 20, f"rank {r}")
                finally:
                    if os.path.exists(child):
                        with open(child) as f:
                            try:
                                os.kill(json.load(f)["pid"], signal.SIGKILL)
                            except ProcessLookupError:
                                pass

    def test_forked_child_cannot_use_the_parents(self):
        """A child forked from a rank gets ClosedError (naming the fork) from
        the inherited communicator, and its close and exit leave the
        parent's communicator working (before, its frames went down the
        parent's pipe and put the parent's calls out of step)."""
        reports = run_ranks(self, "fork", 2, "shm")
        self.assertEqual(reports[0]["child"], ["Allreduce: ClosedError naming the fork",
                                               "alloc: ClosedError naming the fork"])

    def test_sidecar_killed(self):
        """kill -9 of a Python rank's sidecar mid-loop: that rank gets
        PeerLostError naming its sidecar, then ClosedError; an output it
        kept from before stays right; the others get a lost rank; then all
        three, the victim too, form a new communicator."""
        for transport in ("shm", "tcp"):
            with self.subTest(transport=transport):
                reports = run_ranks(self, "kill", 3, transport, {"KILL_RANK": "2", "NEW_PORT": str(stable_port()),
                                                                 "KILL_HOW": "sidecar"}, timeout=120)
                self.assertEqual(reports[2]["error"], "PeerLostError", reports[2])
                self.assertIn("sidecar", reports[2]["message"])
                self.assertEqual(reports[2]["after"], "ClosedError")
                for rep in reports[:2]:
                    self.assertIn(rep["error"], ("PeerLostError", "RankAbortedError", "BrokenError"), rep["message"])
                    self.assertIn(rep["after"], ("BrokenError", "PeerLostError"))

    def test_interrupted_call(self):
        """Ctrl-C in a rank's call: KeyboardInterrupt there, ClosedError on
        its next call (its sidecar is gone: the pipe was out of step), and
        the other rank gets a lost rank instead of waiting: on its first
        call, or on its second when the first completed with the right sum
        from what rank 0's sidecar had sent before it went (1 run in 12
        under load did)."""
        with tempfile.TemporaryDirectory() as d:
            reports = run_ranks(self, "interrupt", 2, "shm", {"TW_INTERRUPTED": os.path.join(d, "interrupted")},
                                timeout=120)
        self.assertTrue(reports[0].get("interrupted"), reports[0])
        self.assertEqual(reports[0].get("after"), "ClosedError")
        self.assertIn(reports[1].get("error"), ("PeerLostError", "RankAbortedError", "BrokenError"), reports[1])

    def test_rank_stopped(self):
        """SIGSTOP of a Python rank: its sidecar sees its parent stopped for
        5 s (frozen_after) and leaves; the others get the error, no hang."""
        self._killed("stop", "shm")


@unittest.skipUnless(HAVE_TORCH, "needs torch")
class TestCollectiveJoin(unittest.TestCase):
    def test_wrong_token_fails_every_rank_fast(self):
        """One rank's token differs: every rank's join fails at once with
        JoinRefusedError (collective.unauthenticated), none waits out its
        timeout; with the same token they join."""
        procs = []
        port = stable_port()
        for r in range(3):
            procs += start_ranks("token", 3, "tcp", {"TW_TOKEN": "wrong" if r == 1 else "secret"}, ranks=[r],
                                 port=port)[0]
        reports = finish(self, procs, timeout=60)
        for rep in reports:
            self.assertEqual(rep.get("error"), "JoinRefusedError", rep)
            self.assertLess(rep["seconds"], 25, rep)
        reports = run_ranks(self, "token", 2, "tcp", {"TW_TOKEN": "secret"})
        self.assertTrue(all(rep.get("joined") for rep in reports), reports)

    def test_bad_config(self):
        """A rank outside the size is ConfigError from join, at once."""
        from tensorwire import collective
        with self.assertRaises(collective.ConfigError) as cm:
            collective.join(f"127.0.0.1:{stable_port()}", 3, 2, binary=binary())
        self.assertIn("rank 3", str(cm.exception))
        from unittest import mock
        env = {k: v for k, v in os.environ.items() if k not in ("MASTER_ADDR", "MASTER_PORT")}
        with mock.patch.dict(os.environ, env, clear=True):
            with self.assertRaises(collective.ConfigError):  # no addr, no MASTER_ADDR
                collective.join(binary=binary())

    def test_timeout_of_forever(self):
        """A join timeout (or frozen_after) past what Go's Duration holds,
        1e10 s or inf, means forever: the sidecar starts (before
        2026-12-02 its flag was "10000000000.0s", which Go cannot parse,
        and the sidecar exited with a usage error)."""
        from tensorwire import collective
        for t in (1e10, float("inf")):
            comm = collective.join(f"127.0.0.1:{stable_port()}", 0, 1, binary=binary(), timeout=t,
                                   frozen_after=t)
            try:
                comm.Barrier()
            finally:
                comm.close()


@unittest.skipUnless(HAVE_TORCH, "needs torch")
class TestCollectiveMixed(unittest.TestCase):
    def test_go_rank_and_python_ranks(self):
        """A Go program's rank (tests/gorank, collective.Join) with Python
        ranks in one communicator, on both transports."""
        gorank = os.environ.get("TENSORWIRE_GORANK")
        if not gorank:
            import tempfile
            d = tempfile.mkdtemp(prefix="tensorwire-pytest-gorank-")
            gorank = os.path.join(d, "gorank")
            subprocess.run(["go", "build", "-o", gorank, "./python/tests/gorank"],
                           cwd=os.path.dirname(os.path.dirname(HERE)), check=True)
        for transport in ("shm", "tcp"):
            with self.subTest(transport=transport):
                size = 3
                procs, port = start_ranks("mixed", size, transport, ranks=[0, 2])
                g = subprocess.run([gorank, "-addr", f"127.0.0.1:{port}", "-rank", "1", "-size", str(size),
                                    "-transport", transport], capture_output=True, text=True, timeout=120)
                self.assertEqual(g.returncode, 0, g.stderr)
                reports = finish(self, procs, timeout=120)
                for rep in reports:
                    self.assertEqual(rep["failures"], [])
                self.assertIn("ok", g.stdout)


if __name__ == "__main__":
    unittest.main()


@unittest.skipUnless(HAVE_TORCH, "needs torch")
class TestCollectiveReadme(unittest.TestCase):
    def _block(self):
        import re
        with open(os.path.join(os.path.dirname(os.path.dirname(HERE)), "README.md")) as f:
            text = f.read()
        m = re.search(r"<!-- begin from-python-collective -->\n```python\n(.*?)```\n<!-- end from-python-collective -->"
                      r"\n\nprints `([^`]*)`", text, re.S)
        self.assertIsNotNone(m, "README.md has no from-python-collective block followed by what it prints")
        return m.group(1), m.group(2)

    def test_training_loop_over_torchrun_variables(self):
        """The README's data-parallel loop, 3 ranks from RANK, WORLD_SIZE,
        MASTER_ADDR and MASTER_PORT; and under torchrun when it is there."""
        code, printed = self._block()
        port = stable_port()
        procs = []
        for r in range(3):
            env = python_env()
            env.update({"RANK": str(r), "WORLD_SIZE": "3", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port),
                        "TENSORWIRE_BIN": binary()})
            procs.append(subprocess.Popen([sys.executable, "-c", code], env=env, stdout=subprocess.PIPE,
                                          stderr=subprocess.PIPE, text=True))
        outs = [p.communicate(timeout=180) for p in procs]
        for p, (out, err) in zip(procs, outs):
            self.assertEqual(p.returncode, 0, err[-3000:])
        self.assertEqual(outs[0][0].strip(), printed)
        torchrun = os.path.join(os.path.dirname(sys.executable), "torchrun")
        import torch
        if not os.path.exists(torchrun) or int(torch.__version__.split(".")[0]) < 2:
            return  # no torchrun here (Debian's, of torch 1.13, fails on Python 3.11 before starting a worker)
        import tempfile
        with tempfile.NamedTemporaryFile("w", suffix=".py") as f:
            f.write(code)
            f.flush()
            env = python_env()
            env["PATH"] = os.path.dirname(binary()) + os.pathsep + env.get("PATH", "")
            env.pop("TENSORWIRE_BIN", None)
            # Rank 0 would listen on torchrun's MASTER_PORT+1, a port nobody
            # checked was free: with the suite's other processes' sockets
            # about, CI once found it taken ("bind: address already in
            # use"). A port found free, as the run above uses.
            env["TENSORWIRE_COLLECTIVE_PORT"] = str(stable_port())
            r = subprocess.run([torchrun, "--standalone", "--nproc_per_node", "2", f.name], env=env,
                               capture_output=True, text=True, timeout=300)
        self.assertEqual(r.returncode, 0, r.stderr[-3000:])
        self.assertEqual(r.stdout.strip(), printed)


class TestQuietStarts(unittest.TestCase):
    """Pipe 5's quiet Isend and Irecv: the client does not wait for their
    starts' replies; one whose start failed gets an error reply, which the
    client reads past (keeping it) while it waits for a later call's reply,
    and raises from that request's Wait instead of the sidecar's "not
    pending". (The sidecar's side: cmd/tensorwire's
    TestCollectiveSidecar_QuietP2P; the quiet path itself runs in every
    Isend/Irecv test above.)"""

    def test_failed_start_raised_by_its_wait(self):
        import numpy as np
        from tensorwire import collective as c

        s = c._Sidecar.__new__(c._Sidecar)
        s._quiet, s._quiet_err = {5}, {}
        replies = [{"id": 5, "code": 3, "reason": "collective.argument", "msg": "collective: invalid argument: bad"},
                   {"id": 6}]
        s._read = lambda: replies.pop(0)
        self.assertEqual(s._reply(6), {"id": 6})
        self.assertEqual(s._quiet, set())
        self.assertIsInstance(s._quiet_err[5], c.ArgumentError)

        def call(req, *a, **kw):
            raise c.WaitedError(f"wait: request {req['req']} is not pending")

        s.call, s._ids, s._held, s._orphans = call, iter(range(7, 100)), {}, []
        comm = c.MPI_Communicator(s)
        with self.assertRaisesRegex(c.ArgumentError, "bad"):
            comm._wait(5, np.zeros(4), recv=False)
        self.assertEqual(s._quiet_err, {})
