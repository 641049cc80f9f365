"""Where the `tensorwire` binary is: the one lookup of everything in this
package that starts it (tensorwire.Node, the collective's sidecar).

The order:

1. the path a caller passes (``binary=``), when it passes one;
2. ``$TENSORWIRE_BIN``, when set;
3. the binary bundled in this package, ``tensorwire/_bin/tensorwire``,
   which ``pip wheel ./python`` (and ``pip install ./python``) builds from
   the repository with Go when Go is on PATH (python/setup.py);
4. ``tensorwire`` on PATH.

A path given in 1 or 2 that is not an executable file is an error naming
it: we do not fall back past a binary someone asked for. When none of them
is there the error names all three places.
"""

import os
import shutil

from .errors import TensorwireError

__all__ = ["find_binary", "BinaryNotFoundError", "BUNDLED"]

ENV = "TENSORWIRE_BIN"

# The bundled binary's path: setup.py's build step writes it there.
BUNDLED = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_bin",
                       "tensorwire.exe" if os.name == "nt" else "tensorwire")


class BinaryNotFoundError(TensorwireError):
    """No tensorwire binary: none given, $TENSORWIRE_BIN unset, none bundled
    in this install (it was built without Go) and none on PATH; or the one
    given or in $TENSORWIRE_BIN is not an executable file."""


def _executable(p):
    return os.path.isfile(p) and os.access(p, os.X_OK)


def find_binary(binary=None, who="tensorwire", error=BinaryNotFoundError):
    """The path of the tensorwire binary to run, in the order above. who
    starts the error's message (the caller's name); error is the class
    raised (BinaryNotFoundError; the collective raises its ConfigError).
    Reads the environment and the filesystem on each call, so a binary
    installed or $TENSORWIRE_BIN set after import is seen."""
    for given, what in ((binary, "binary="), (os.environ.get(ENV), "$" + ENV)):
        if given:
            if not _executable(given):
                raise error(f"{who}: the tensorwire binary {what} names, {given!r}, is not an executable file")
            return given
    if _executable(BUNDLED):
        return BUNDLED
    p = shutil.which("tensorwire")
    if p:
        return p
    bundled = ("not executable" if os.path.exists(BUNDLED) else
               "absent: this install was built without Go")
    raise error(
        f"{who}: no tensorwire binary: ${ENV} is unset, the bundled {BUNDLED} is {bundled}, and "
        "there is no tensorwire on PATH. Set $" + ENV + " to one, install this package with Go on "
        "PATH (pip install ./python from a clone of the repository builds it in), or put it on PATH "
        "(go install github.com/tensorwire/tensorwire/cmd/tensorwire@latest)")
