"""The examples run briefly against Go nodes: python/examples/dqn.py,
train_loader.py and serve_policy.py; regression.py starts its own ranks."""

import os
import subprocess
import sys
import unittest

import numpy as np

from nodes import PYDIR, Node, binary, python_env, write_state_dict


class TestExamples(unittest.TestCase):
    def test_dqn(self):
        try:
            import torch  # noqa: F401
        except ImportError:
            self.skipTest("no torch (apt-get install python3-torch): the DQN example not run")
        with Node(buffers=["dqn,capacity=10000,sampler=prioritized,min-size=500"]) as node:
            r = subprocess.run([sys.executable, os.path.join(PYDIR, "examples", "dqn.py"), "--addr", node.addr,
                                "--token-file", node.token_file, "--root", node.root, "--steps", "200",
                                "--log-every", "100", "--actors", "2"],
                               env=python_env(), capture_output=True, text=True, timeout=300)
            self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
            self.assertIn("mode ref", r.stdout)
            self.assertIn("step 200: loss", r.stdout)
            self.assertIn("final greedy return", r.stdout)


    def test_train_loader(self):
        try:
            import torch  # noqa: F401
        except ImportError:
            self.skipTest("no torch (apt-get install python3-torch): the loader example not run")
        node = Node()
        try:
            rng = np.random.default_rng(0)
            x = rng.normal(size=(2000, 8)).astype(np.float32)
            y = (x[:, 0] > 0).astype(np.int64)  # learnable
            for k, a in (("x", x), ("y", y)):
                np.save(os.path.join(node.dir, k + ".npy"), a)
            ds = os.path.join(node.dir, "ds")
            subprocess.run([binary(), "import", "npy", "x=" + os.path.join(node.dir, "x.npy"),
                            "y=" + os.path.join(node.dir, "y.npy"), ds], check=True, capture_output=True)
            node.extra = ["--loader", "tr,dataset=%s,batch=50,slots=8,seed=1" % ds]
            node.start()
            r = subprocess.run([sys.executable, os.path.join(PYDIR, "examples", "train_loader.py"), "--addr", node.addr,
                                "--token-file", node.token_file, "--root", node.root, "--loader", "tr",
                                "--x-key", "x", "--y-key", "y", "--epochs", "3"],
                               env=python_env(), capture_output=True, text=True, timeout=300)
            self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
            self.assertIn("mode ref, 2000 samples, 16 batches an epoch", r.stdout)
            lines = [l for l in r.stdout.splitlines() if l.startswith("epoch ")]
            self.assertEqual(len(lines), 3, r.stdout)
            self.assertTrue(all("2000 samples" in l for l in lines), r.stdout)
        finally:
            node.close()

    def test_serve_policy(self):
        rng = np.random.default_rng(0)
        node = Node(extra=["--serve", "policy,params=policy,max-batch=16"])
        try:
            write_state_dict(os.path.join(node.root, "policy"), {
                "0.weight": rng.normal(size=(32, 64)), "0.bias": rng.normal(size=32),
                "2.weight": rng.normal(size=(16, 32)), "2.bias": rng.normal(size=16)})
            node.start()
            r = subprocess.run([sys.executable, os.path.join(PYDIR, "examples", "serve_policy.py"), "--addr", node.addr,
                                "--token-file", node.token_file, "--root", node.root, "--actors", "16", "--steps", "20"],
                               env=python_env(), capture_output=True, text=True, timeout=300)
            self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
            self.assertIn("mode ref, max batch 16, 16 actors", r.stdout)
            self.assertIn("320 steps in", r.stdout)
        finally:
            node.close()

    def test_regression(self):
        """mpi4torch's data-parallel regression: every rank's gradient through
        two Allreduce calls is the single-process one, on both transports."""
        try:
            import torch  # noqa: F401
        except ImportError:
            self.skipTest("no torch (apt-get install python3-torch): the regression example not run")
        for ranks, transport in ((3, "shm"), (2, "tcp")):
            with self.subTest(transport=transport):
                r = subprocess.run([sys.executable, os.path.join(PYDIR, "examples", "regression.py"), "--ranks",
                                    str(ranks), "--points", "3001", "--transport", transport],
                                   env=dict(python_env(), TENSORWIRE_BIN=binary()), capture_output=True, text=True,
                                   timeout=300)
                self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
                self.assertIn(f"{ranks} ranks ({transport}), 3001 points", r.stdout)
                self.assertEqual(r.stdout.count("  ok"), ranks, r.stdout)


if __name__ == "__main__":
    unittest.main()
