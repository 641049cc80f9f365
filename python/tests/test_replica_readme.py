"""The README's "From Python: a torch model served by replicas in Python
processes" program, run as written (a file of its own, since its workers are
spawned processes), against the tensorwire binary under test; it prints
what the README says it prints."""

import os
import subprocess
import sys
import tempfile
import unittest

from nodes import binary, python_env
from test_readme import printed_after, readme_block

try:
    import torch  # noqa: F401
except ImportError:
    torch = None


@unittest.skipIf(torch is None, "torch is not installed in this interpreter")
class TestReadmeReplicas(unittest.TestCase):
    def test_program(self):
        code = readme_block("from-python-replicas")
        with tempfile.TemporaryDirectory() as d:
            path = os.path.join(d, "program.py")
            with open(path, "w") as f:
                f.write(code)
            env = python_env()
            env["TENSORWIRE_BIN"] = binary()
            r = subprocess.run([sys.executable, path], env=env, capture_output=True, text=True, timeout=300)
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertEqual(r.stdout, printed_after("from-python-replicas"))


if __name__ == "__main__":
    unittest.main()
