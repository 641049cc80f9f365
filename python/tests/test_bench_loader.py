"""The loader benchmark with a Python producer (tensorwire._bench_loader,
what `tensorwire bench loader --producer python` runs), small and whole:
real processes, a real node, its JSON. What a reader of its figures relies
on: every consumer of every side saw each sample exactly once (so no side
is faster for delivering less), the shared side went by reference, and
its consumers had joined before the producer's epoch began (a consumer
that came late would wait for a producer that had finished: the hang this
test was written for, with batches made once)."""

import json
import os
import signal
import subprocess
import sys
import tempfile
import time
import unittest

try:
    import torch  # noqa: F401
except ImportError:  # pragma: no cover
    torch = None

from nodes import binary, python_env


@unittest.skipUnless(torch is not None, "needs torch")
class TestBenchLoader(unittest.TestCase):

    def run_bench(self, *args):
        with tempfile.TemporaryDirectory() as d:
            out = os.path.join(d, "r.json")
            r = subprocess.run([sys.executable, "-m", "tensorwire._bench_loader", "--bin", binary(),
                                "--consumers", "2", "--step", "0", "--timeout", "120", "--tensorsocket", "off",
                                "--json", out] + list(args),
                               env=python_env(), capture_output=True, text=True, timeout=300)
            self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
            with open(out) as f:
                return json.load(f), r.stdout

    def test_premade_batches_every_sample_once(self):
        # 640 samples: 10 batches, fewer than the ring's 16 slots, so that a
        # producer not held back would publish the whole epoch at once.
        n = 640
        res, text = self.run_bench("--source", "premade", "--samples", str(n))
        self.assertEqual(res["source"], "premade")
        self.assertNotIn("tensorsocket", res)
        self.assertEqual(res["shared"]["producer"]["mode"], "ref")
        for side in ("independent", "shared"):
            cs = res[side]["consumers"]
            self.assertEqual(len(cs), 2, side)
            for c in cs:
                self.assertEqual((c["samples"], c["exactly_once"]), (n, True), side)
                self.assertGreater(c["steady_samples_per_s"], 0, side)
        self.assertIn("batches made once (--source premade)", text)

    def test_killed_run_takes_its_node(self):
        """The run's node goes when the run is killed, as a step of
        scripts/device.sh is at its time limit: before, the node stayed,
        serving nobody, on the machine the next steps measured."""
        with tempfile.TemporaryDirectory() as d:
            p = subprocess.Popen([sys.executable, "-m", "tensorwire._bench_loader", "--bin", binary(),
                                  "--sides", "shared", "--consumers", "1", "--samples", "100000", "--step", "0.05",
                                  "--timeout", "120", "--tensorsocket", "off", "--json", os.path.join(d, "r.json")],
                                 env=python_env(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            try:
                node = None
                deadline = time.monotonic() + 60
                while node is None and time.monotonic() < deadline and p.poll() is None:
                    node = next((pid for pid in _children(p.pid) if "--loader" in _cmdline(pid)), None)
                    time.sleep(0.05)
                self.assertIsNotNone(node, "the run started no node within 60 s")
            finally:
                p.kill()
                p.wait()
            deadline = time.monotonic() + 30
            while _alive(node) and time.monotonic() < deadline:
                time.sleep(0.05)
            if _alive(node):
                os.kill(node, signal.SIGKILL)
                self.fail(f"the node (pid {node}) outlived its killed run by 30 s")


def _children(pid):
    """The pids whose parent is pid (from /proc)."""
    out = []
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                with open(f"/proc/{name}/stat") as f:
                    stat = f.read()
            except OSError:
                continue
            if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
                out.append(int(name))
    return out


def _cmdline(pid):
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def _alive(pid):
    """pid runs (a zombie, its exit not yet reaped by a container's init,
    does not)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


if __name__ == "__main__":
    unittest.main()
