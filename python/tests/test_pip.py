"""`pip install ./python` works offline: setuptools as the build backend,
numpy and msgpack as they are installed (Debian's packages)."""

import os
import shutil
import subprocess
import sys
import tempfile
import unittest

from nodes import PYDIR


class TestPip(unittest.TestCase):
    def test_install_offline(self):
        if subprocess.run([sys.executable, "-m", "pip", "--version"], capture_output=True).returncode != 0:
            self.skipTest("no pip for this python3 (apt-get install python3-pip)")
        with tempfile.TemporaryDirectory() as d:
            src = os.path.join(d, "python")
            os.mkdir(src)
            for name in ("pyproject.toml", "README.md"):
                shutil.copy(os.path.join(PYDIR, name), src)
            shutil.copytree(os.path.join(PYDIR, "tensorwire"), os.path.join(src, "tensorwire"),
                            ignore=shutil.ignore_patterns("__pycache__"))
            venv = os.path.join(d, "venv")
            # A venv that sees the system's numpy, msgpack, setuptools and pip.
            subprocess.run([sys.executable, "-m", "venv", "--system-site-packages", "--without-pip", venv], check=True)
            py = os.path.join(venv, "bin", "python")
            r = subprocess.run([py, "-m", "pip", "install", "--no-build-isolation", "--no-index", src],
                               capture_output=True, text=True)
            self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
            r = subprocess.run([py, "-c", "import tensorwire, sys; print(tensorwire.__file__); "
                                "print(tensorwire.replay.Buffer.__name__)"],
                               capture_output=True, text=True, cwd=d, env={k: v for k, v in os.environ.items()
                                                                           if k != "PYTHONPATH"})
            self.assertEqual(r.returncode, 0, r.stderr)
            self.assertTrue(r.stdout.startswith(venv), r.stdout)


if __name__ == "__main__":
    unittest.main()
