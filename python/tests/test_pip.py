"""`pip install ./python` works offline: setuptools as the build backend,
numpy and msgpack as they are installed (Debian's packages). Outside the
repository it is the pure wheel; in it, with Go on PATH, the wheel holds
the tensorwire binary, and a Node runs it with nothing else installed
(python/setup.py, tensorwire/_binary.py)."""

import glob
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import unittest
import zipfile

from nodes import PYDIR, REPO

# The package's files that pip builds from: what a clone's python/ holds,
# less the tests. The Go files are the python Go package, which
# cmd/tensorwire imports (it embeds tensorwire/*.py).
SOURCES = ("pyproject.toml", "setup.py", "README.md")


def _have_pip():
    return subprocess.run([sys.executable, "-m", "pip", "--version"], capture_output=True).returncode == 0


def _copy_package(dst):
    os.mkdir(dst)
    for name in SOURCES:
        shutil.copy(os.path.join(PYDIR, name), dst)
    for path in glob.glob(os.path.join(PYDIR, "*.go")):
        if not path.endswith("_test.go"):
            shutil.copy(path, dst)
    shutil.copytree(os.path.join(PYDIR, "tensorwire"), os.path.join(dst, "tensorwire"),
                    ignore=shutil.ignore_patterns("__pycache__", "_bin"))


def _venv(d):
    """A venv that sees the system's numpy, msgpack, setuptools and pip; its python."""
    venv = os.path.join(d, "venv")
    subprocess.run([sys.executable, "-m", "venv", "--system-site-packages", "--without-pip", venv], check=True)
    return venv, os.path.join(venv, "bin", "python")


def _env(**extra):
    """This environment less what would point the build or the package
    elsewhere: PYTHONPATH (this tree's tensorwire), $TENSORWIRE_BIN,
    $TENSORWIRE_GO_SRC, $TENSORWIRE_BUILD_BINARY."""
    drop = ("PYTHONPATH", "TENSORWIRE_BIN", "TENSORWIRE_GO_SRC", "TENSORWIRE_BUILD_BINARY")
    env = {k: v for k, v in os.environ.items() if k not in drop}
    env.update(extra)
    return env


class TestPip(unittest.TestCase):
    def setUp(self):
        if not _have_pip():
            self.skipTest("no pip for this python3 (apt-get install python3-pip)")

    def test_install_offline(self):
        """Outside the repository (a copy of python/ alone): the pure package,
        installed as today, without a binary."""
        with tempfile.TemporaryDirectory() as d:
            src = os.path.join(d, "python")
            _copy_package(src)
            venv, py = _venv(d)
            r = subprocess.run([py, "-m", "pip", "install", "--no-build-isolation", "--no-index", src],
                               capture_output=True, text=True, env=_env())
            self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
            r = subprocess.run([py, "-c", "import tensorwire, sys, os; print(tensorwire.__file__); "
                                "print(tensorwire.replay.Buffer.__name__); "
                                "print(os.path.exists(tensorwire._binary.BUNDLED))"],
                               capture_output=True, text=True, cwd=d, env=_env())
            self.assertEqual(r.returncode, 0, r.stderr)
            self.assertTrue(r.stdout.startswith(venv), r.stdout)
            self.assertEqual(r.stdout.split()[-1], "False", "a binary in a wheel built outside the repository")

    def test_wheel_with_binary(self):
        """pip wheel ./python with Go on PATH, in the repository: the wheel
        holds tensorwire/_bin/tensorwire and a platform tag; installed in a
        fresh venv, offline, a Node runs that binary, with no tensorwire on
        PATH and $TENSORWIRE_BIN unset.

        The repository is this one seen through symbolic links, but for a
        copy of python/: pip builds in place (python/build/), and this
        leaves nothing in the tree; setup.py finds go.mod above python/ as
        it does in a clone."""
        if shutil.which("go") is None:
            self.skipTest("no go on PATH: the wheel would be the pure one (test_install_offline)")
        with tempfile.TemporaryDirectory() as d:
            repo = os.path.join(d, "repo")
            os.mkdir(repo)
            for name in os.listdir(REPO):
                if name not in ("python", ".git"):
                    os.symlink(os.path.join(REPO, name), os.path.join(repo, name))
            src = os.path.join(repo, "python")
            _copy_package(src)
            wheels = os.path.join(d, "wheels")
            t0 = time.monotonic()
            # $TENSORWIRE_BUILD_BINARY=1: a failed go build fails the wheel
            # rather than making the pure one.
            r = subprocess.run([sys.executable, "-m", "pip", "wheel", src, "-w", wheels, "--no-deps",
                                "--no-build-isolation", "--no-index"],
                               capture_output=True, text=True, cwd=d, env=_env(TENSORWIRE_BUILD_BINARY="1"),
                               timeout=900)  # a hang guard: a cold go build of the command is ~75 s on 2 busy cores
            self.assertEqual(r.returncode, 0, r.stdout[-3000:] + r.stderr[-3000:])
            built = time.monotonic() - t0
            names = os.listdir(wheels)
            self.assertEqual(len(names), 1, names)
            whl = os.path.join(wheels, names[0])
            # py3-none-<platform>: any Python 3, a binary of one platform (not "any").
            self.assertRegex(names[0], r"^tensorwire-[^-]+-py3-none-(?!any\.)[a-z0-9_.]+\.whl$")
            with zipfile.ZipFile(whl) as z:
                info = z.getinfo("tensorwire/_bin/tensorwire")
                self.assertTrue((info.external_attr >> 16) & 0o111, "the bundled binary is not executable")
                wheel_meta = [n for n in z.namelist() if n.endswith(".dist-info/WHEEL")]
                self.assertIn("Root-Is-Purelib: false", z.read(wheel_meta[0]).decode())

            venv, py = _venv(d)
            r = subprocess.run([py, "-m", "pip", "install", "--no-index", "--no-deps", whl],
                               capture_output=True, text=True, env=_env())
            self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
            # PATH without any folder that holds a tensorwire (nor the venv's bin).
            path = [p for p in os.environ.get("PATH", "").split(os.pathsep)
                    if p and not os.access(os.path.join(p, "tensorwire"), os.X_OK)]
            code = """
import sys
import numpy as np
import tensorwire
from tensorwire import _binary
p = _binary.find_binary()
assert p == _binary.BUNDLED and p.startswith(sys.prefix), (p, sys.prefix)
with tensorwire.Node(store=["main"]) as node:
    assert node._bin == p, node._bin
    s = tensorwire.store.Store(node.address, "main", root=node.root)
    s.put("b", {"x": np.arange(4, dtype=np.int64)})
    print("peek", s.peek("b")[0]["x"].tolist())
    s.close()
"""
            r = subprocess.run([py, "-c", code], capture_output=True, text=True, cwd=d, timeout=300,
                               env=_env(PATH=os.pathsep.join(path)))
            self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
            self.assertEqual(r.stdout.strip(), "peek [0, 1, 2, 3]")
            print(f"\n  test_wheel_with_binary: pip wheel {built:.0f} s, {os.path.getsize(whl) >> 20} MiB",
                  file=sys.stderr)


if __name__ == "__main__":
    unittest.main()
