"""The examples run: python/examples/dqn.py, briefly, against a Go node."""

import os
import subprocess
import sys
import unittest

from nodes import PYDIR, Node, python_env


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


if __name__ == "__main__":
    unittest.main()
