"""Which tensorwire binary the package runs (tensorwire/_binary.py): binary=,
then $TENSORWIRE_BIN, then the one a wheel built with Go bundles, then
PATH's; an error naming all three when none is there. Node and the
collective's sidecar both look it up there."""

import os
import stat
import tempfile
import unittest
from unittest import mock

import tensorwire
from tensorwire import _binary, collective
from tensorwire.node import BinaryNotFoundError


def _exe(path):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as f:
        f.write("#!/bin/sh\nexit 0\n")
    os.chmod(path, 0o755)
    return path


class TestBinaryLookup(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.TemporaryDirectory()
        d = self.dir.name
        self.env_bin = _exe(os.path.join(d, "env", "tensorwire"))
        self.bundled = _exe(os.path.join(d, "pkg", "_bin", "tensorwire"))
        self.on_path = _exe(os.path.join(d, "path", "tensorwire"))
        self.plain = os.path.join(d, "plain")
        with open(self.plain, "w") as f:
            f.write("not executable")
        os.chmod(self.plain, stat.S_IRUSR | stat.S_IWUSR)
        env = {k: v for k, v in os.environ.items() if k != "TENSORWIRE_BIN"}
        env["PATH"] = os.path.join(d, "path")
        patches = [mock.patch.dict(os.environ, env, clear=True), mock.patch.object(_binary, "BUNDLED", self.bundled)]
        for p in patches:
            p.start()
            self.addCleanup(p.stop)
        self.addCleanup(self.dir.cleanup)

    def test_order(self):
        os.environ["TENSORWIRE_BIN"] = self.env_bin
        self.assertEqual(_binary.find_binary(self.on_path), self.on_path, "binary= first")
        self.assertEqual(_binary.find_binary(), self.env_bin, "then $TENSORWIRE_BIN")
        del os.environ["TENSORWIRE_BIN"]
        self.assertEqual(_binary.find_binary(), self.bundled, "then the bundled one, before PATH")
        os.remove(self.bundled)
        self.assertEqual(_binary.find_binary(), self.on_path, "then PATH")

    def test_none(self):
        os.remove(self.bundled)
        os.environ["PATH"] = os.path.join(self.dir.name, "nothing")
        with self.assertRaises(BinaryNotFoundError) as cm:
            _binary.find_binary(who="tensorwire.Node")
        msg = str(cm.exception)
        for want in ("tensorwire.Node", "$TENSORWIRE_BIN", self.bundled, "PATH", "built without Go"):
            self.assertIn(want, msg)
        with self.assertRaisesRegex(BinaryNotFoundError, "TENSORWIRE_BIN"):
            tensorwire.Node()
        with self.assertRaisesRegex(collective.ConfigError, "tensorwire.collective.join: no tensorwire binary"):
            collective._binary(None)

    def test_named_but_not_executable(self):
        """A binary someone names is the one run, or an error: no falling
        back to another past it."""
        os.environ["TENSORWIRE_BIN"] = self.plain
        with self.assertRaisesRegex(BinaryNotFoundError, r"\$TENSORWIRE_BIN names, .*plain"):
            _binary.find_binary()
        with self.assertRaisesRegex(BinaryNotFoundError, r"binary= names, .*nowhere"):
            _binary.find_binary(os.path.join(self.dir.name, "nowhere"))
        os.environ["TENSORWIRE_BIN"] = ""  # set but empty: as unset
        self.assertEqual(_binary.find_binary(), self.bundled)

    def test_node_uses_it(self):
        node = tensorwire.Node()
        try:
            self.assertEqual(node._bin, self.bundled)
        finally:
            node.stop()  # removes the temporary root it made
        self.assertEqual(collective._binary(None), self.bundled)


if __name__ == "__main__":
    unittest.main()
