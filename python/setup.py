"""The build step that puts the tensorwire binary into the wheel.

pyproject.toml holds the package's metadata; this file adds one thing to
setuptools' build: when `go` is on PATH and this folder sits in the
repository (a go.mod of module github.com/tensorwire/tensorwire in a folder
above it, as when pip builds ./python in place), build_py also runs

    CGO_ENABLED=0 go build -trimpath -buildvcs=false -o <build_lib>/tensorwire/_bin/tensorwire ./cmd/tensorwire

and the wheel is then tagged for this platform (py3-none-linux_x86_64, say),
not pure Python, since it holds a binary of one OS and architecture.
tensorwire.Node and the collective's sidecar run that binary when
$TENSORWIRE_BIN is unset (tensorwire/_binary.py). Without Go, without the
repository, or when the build fails, the wheel is the pure one, with a
warning saying why.

$TENSORWIRE_BUILD_BINARY: unset (as above), "0" (never build the binary: a
pure wheel), or "1" (the binary is required: no Go, no repository or a
failed build fails the wheel). $TENSORWIRE_GO_SRC: the repository's folder,
where this folder is a copy outside it.

-buildvcs=false: the binary does not read its VCS stamp, and stamping fails
the build in a clone that git refuses to read (another owner's, say).
"""

import os
import shutil
import subprocess
import sys

from setuptools import setup
from setuptools.command.build_py import build_py

try:  # setuptools 70.1 and later have their own
    from setuptools.command.bdist_wheel import bdist_wheel
except ImportError:  # before: the wheel package's (Debian 12: python3-wheel)
    from wheel.bdist_wheel import bdist_wheel

HERE = os.path.dirname(os.path.abspath(__file__))
MODULE = "github.com/tensorwire/tensorwire"
BIN = "tensorwire.exe" if os.name == "nt" else "tensorwire"


class BuildError(Exception):
    """Why the binary was not built."""


def _module_root(start):
    """The folder above start (or start) whose go.mod declares MODULE and
    that holds cmd/tensorwire; None if there is none."""
    d = start
    while True:
        gomod = os.path.join(d, "go.mod")
        if os.path.isfile(gomod):
            with open(gomod, encoding="utf-8", errors="replace") as f:
                for line in f:
                    parts = line.split()
                    if len(parts) >= 2 and parts[0] == "module":
                        if parts[1].strip('"') == MODULE and os.path.isdir(os.path.join(d, "cmd", "tensorwire")):
                            return d
                        break
        parent = os.path.dirname(d)
        if parent == d:
            return None
        d = parent


def go_build(out):
    """Builds ./cmd/tensorwire into out; raises BuildError saying why not."""
    go = shutil.which("go")
    if go is None:
        raise BuildError("no go on PATH")
    src = os.environ.get("TENSORWIRE_GO_SRC")
    root = _module_root(os.path.abspath(src)) if src else _module_root(HERE)
    if root is None:
        where = f"$TENSORWIRE_GO_SRC ({src})" if src else HERE
        raise BuildError(f"no go.mod of {MODULE} in or above {where}: not in the repository")
    out = os.path.abspath(out)  # go runs in root
    os.makedirs(os.path.dirname(out), exist_ok=True)
    env = dict(os.environ, CGO_ENABLED="0")
    cmd = [go, "build", "-trimpath", "-buildvcs=false", "-o", out, "./cmd/tensorwire"]
    print(f"tensorwire: {' '.join(cmd)} (in {root})", file=sys.stderr)
    r = subprocess.run(cmd, cwd=root, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if r.returncode != 0:
        raise BuildError(f"go build failed (exit {r.returncode}):\n{r.stdout[-4000:]}")


class BuildPyWithBinary(build_py):
    """build_py, then the binary into build_lib/tensorwire/_bin (module doc)."""

    def run(self):
        super().run()
        out = os.path.join(self.build_lib, "tensorwire", "_bin", BIN)
        if os.path.exists(out):  # an earlier build's, in the same build folder: built again or not at all
            os.remove(out)
        mode = os.environ.get("TENSORWIRE_BUILD_BINARY", "")
        if mode == "0":
            print("tensorwire: $TENSORWIRE_BUILD_BINARY=0: a pure wheel, without the binary", file=sys.stderr)
            return
        if getattr(self, "editable_mode", False):  # pip install -e: nothing of build_lib is installed
            print("tensorwire: an editable install: the binary is not built into it", file=sys.stderr)
            return
        try:
            go_build(out)
        except BuildError as e:
            if mode == "1":
                raise SystemExit(f"tensorwire: $TENSORWIRE_BUILD_BINARY=1 but the binary was not built: {e}")
            msg = (f"tensorwire: building the pure wheel, without the tensorwire binary ({e}); "
                   "tensorwire.Node will look for it in $TENSORWIRE_BIN and on PATH")
            print("WARNING: " + msg, file=sys.stderr)


class BdistWheel(bdist_wheel):
    """A wheel of this platform when the binary is in it: py3-none-<platform>
    (any Python 3, no extension modules, one OS and architecture)."""

    def run(self):
        if not self.skip_build:
            self.run_command("build")
        built = os.path.exists(os.path.join(self.get_finalized_command("build_py").build_lib,
                                            "tensorwire", "_bin", BIN))
        self.root_is_pure = not built
        if built:  # the package then goes to platlib, as a wheel with a binary's should
            self.distribution.has_ext_modules = lambda: True
        super().run()

    def get_tag(self):
        impl, abi, plat = super().get_tag()
        if not self.root_is_pure:
            return "py3", "none", plat
        return impl, abi, plat


if __name__ == "__main__":  # setuptools runs this file as __main__; tests import it
    setup(cmdclass={"build_py": BuildPyWithBinary, "bdist_wheel": BdistWheel})
