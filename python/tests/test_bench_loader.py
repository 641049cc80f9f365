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
import subprocess
import sys
import tempfile
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


if __name__ == "__main__":
    unittest.main()
