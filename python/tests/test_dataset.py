"""load_memmap on the golden fixtures (tensordict/testdata/golden) and on what
the Go reader refuses."""

import json
import os
import shutil
import subprocess
import tempfile
import unittest

import numpy as np

import tensorwire
from tensorwire.dataset import FormatError, UnsupportedError, escape_key

from nodes import REPO, binary

GOLDEN = os.path.join(REPO, "tensordict", "testdata", "golden")


def expected_values(leaf):
    """A fixture leaf's values as numpy would hold them."""
    dt = tensorwire.DTYPES[leaf["dtype"]]
    vals = leaf["values"]
    if dt.kind == "c":
        vals = [complex(re, im) for re, im in np.asarray(vals, dtype=object).reshape(-1, 2).tolist()]
    return np.asarray(vals, dtype=object).reshape(-1)


def at(td, path):
    for k in path:
        td = td[k]
    return td


class TestGoldenFixtures(unittest.TestCase):
    def test_fixtures(self):
        """Every fixture loads, every leaf element is its expected.json's, and
        the non-tensors' data too; the pickled one is refused."""
        cases = sorted(c for c in os.listdir(GOLDEN) if not c.endswith(".json"))
        self.assertGreater(len(cases), 5)
        for case in cases:
            with self.subTest(case=case):
                with open(os.path.join(GOLDEN, case + ".expected.json")) as f:
                    exp = json.load(f)
                pickled = [n for n in exp.get("non_tensors") or [] if n.get("pickled") or "data" not in n]
                if case == "nontensor":
                    with self.assertRaises(UnsupportedError) as cm:
                        tensorwire.load_memmap(os.path.join(GOLDEN, case))
                    self.assertIn("other.pickle", str(cm.exception))
                    continue
                td = tensorwire.load_memmap(os.path.join(GOLDEN, case))
                for leaf in exp["leaves"]:
                    a = at(td, leaf["path"])
                    self.assertEqual(list(a.shape), leaf["shape"], leaf["path"])
                    self.assertEqual(a.dtype, tensorwire.DTYPES[leaf["dtype"]], leaf["path"])
                    if "values" in leaf:
                        want = expected_values(leaf)
                        got = a.reshape(-1)
                        if a.dtype.kind == "b":
                            got = got.astype(bool)
                        if leaf["dtype"] == "torch.float16":
                            got = got.view("<u2")  # the fixture has their raw bits
                        self.assertEqual([str(x) for x in got.tolist()], [str(x) for x in want.tolist()], leaf["path"])
                for nt in exp.get("non_tensors") or []:
                    if "data" in nt and not pickled:
                        self.assertEqual(at(td, nt["path"]).data, nt["data"], nt["path"])

    def test_nontensor_json(self):
        """The JSON non-tensors of the nontensor fixture, its pickled one moved out."""
        with tempfile.TemporaryDirectory() as d:
            p = os.path.join(d, "nt")
            shutil.copytree(os.path.join(GOLDEN, "nontensor"), p)
            with open(os.path.join(GOLDEN, "nontensor.expected.json")) as f:
                exp = json.load(f)
            meta = os.path.join(p, "meta.json")
            with open(meta) as f:
                m = json.load(f)
            for nt in exp["non_tensors"]:
                if "data" not in nt:
                    m.pop(nt["path"][-1], None)
            with open(meta, "w") as f:
                json.dump(m, f)
            td = tensorwire.load_memmap(p)
            n = 0
            for nt in exp["non_tensors"]:
                if "data" in nt:
                    self.assertEqual(at(td, nt["path"]).data, nt["data"])
                    n += 1
            self.assertGreater(n, 0)

    def test_escape(self):
        for key, name in [("", "%"), (".", "%2E"), ("..", "%2E%2E"), ("...", "..."), (".x", ".x"),
                          ("a/b", "a%2Fb"), ("100%", "100%25"), ("x y", "x%20y"), ("café", "café"),
                          ("%2E", "%252E"), ("a\x7fb", "a%7Fb"), ("\t", "%09")]:
            self.assertEqual(escape_key(key), name, key)

    def test_special_keys(self):
        """tensordict 0.14's "", "." and ".." (%, %2E, %2E%2E), leaves and folders."""
        td = tensorwire.load_memmap(os.path.join(GOLDEN, "special_keys"))
        for k in ("", ".", ".."):
            self.assertIn(k, td)
            self.assertIn(k, td["nested"])
        self.assertTrue(td[""].filename.endswith("/%.memmap"))
        self.assertTrue(td[".."].filename.endswith("/%2E%2E.memmap"))

    def test_legacy_names(self):
        td = tensorwire.load_memmap(os.path.join(GOLDEN, "legacy_names"))
        self.assertTrue(td[""].filename.endswith("/.memmap"))
        self.assertIn("sub dir", td)


class TestRefused(unittest.TestCase):
    """What the Go reader refuses, refused here too, naming the file."""

    def setUp(self):
        self.dir = tempfile.mkdtemp()
        self.p = os.path.join(self.dir, "td")
        shutil.copytree(os.path.join(GOLDEN, "basic_orjson"), self.p)
        with open(os.path.join(self.p, "meta.json")) as f:
            self.meta = json.load(f)

    def tearDown(self):
        shutil.rmtree(self.dir)

    def write_meta(self, m=None, raw=None):
        with open(os.path.join(self.p, "meta.json"), "w" if raw is None else "wb") as f:
            if raw is None:
                json.dump(m, f)
            else:
                f.write(raw)

    def refused(self, exc, *words):
        with self.assertRaises(exc) as cm:
            tensorwire.load_memmap(self.p)
        for w in words:
            self.assertIn(w, str(cm.exception))

    def test_loads(self):
        td = tensorwire.load_memmap(self.p)
        self.assertEqual(list(td), ["obs", "action", "done", "next"])
        self.assertIsInstance(td["obs"], np.memmap)

    def test_missing_meta(self):
        os.remove(os.path.join(self.p, "meta.json"))
        self.refused(FormatError, "meta.json is missing")

    def test_corrupt_meta(self):
        for raw in [b"{", b"[1]", b'{"a": 1} x', b"\xff"]:
            with self.subTest(raw=raw):
                self.write_meta(raw=raw)
                self.refused(FormatError, "meta.json")

    def test_missing_file(self):
        os.remove(os.path.join(self.p, "obs.memmap"))
        self.refused(FormatError, "obs")

    def test_short_file(self):
        with open(os.path.join(self.p, "obs.memmap"), "r+b") as f:
            f.truncate(3)
        self.refused(FormatError, "shorter", "obs.memmap")

    def test_alias_dtype(self):
        self.meta["action"]["dtype"] = "torch.long"
        self.write_meta(self.meta)
        self.refused(FormatError, "torch.long")

    def test_negative_dim(self):
        self.meta["action"]["shape"] = [-1]
        self.write_meta(self.meta)
        self.refused(FormatError, "shape")

    def test_batch_mismatch(self):
        self.meta["action"]["shape"] = [self.meta["shape"][0] + 1]
        self.write_meta(self.meta)
        self.refused(FormatError, "batch size")

    def test_jagged(self):
        self.meta["action"]["is_nested"] = True
        self.write_meta(self.meta)
        self.refused(UnsupportedError, "jagged")

    def test_other_type(self):
        self.meta["_type"] = "<class 'tensordict._lazy.LazyStackedTensorDict'>"
        self.write_meta(self.meta)
        self.refused(UnsupportedError, "LazyStackedTensorDict")

    def test_neither(self):
        self.meta["x"] = {"device": "cpu"}
        self.write_meta(self.meta)
        self.refused(FormatError, "neither")

    def test_missing_folder(self):
        shutil.rmtree(os.path.join(self.p, "next"))
        self.refused(FormatError, "next")

    def test_fifo(self):
        os.remove(os.path.join(self.p, "obs.memmap"))
        os.mkfifo(os.path.join(self.p, "obs.memmap"))
        self.refused(FormatError, "not a regular file")

    def test_symlink_loop(self):
        m = {"loop": {"type": "TensorDict"}, "shape": [], "device": "cpu",
             "_type": "<class 'tensordict._td.TensorDict'>"}
        os.makedirs(os.path.join(self.dir, "l"))
        with open(os.path.join(self.dir, "l", "meta.json"), "w") as f:
            json.dump(m, f)
        os.symlink(".", os.path.join(self.dir, "l", "loop"))
        with self.assertRaises(FormatError) as cm:
            tensorwire.load_memmap(os.path.join(self.dir, "l"))
        # The kernel gives up on the path (40 links) before the 64 levels.
        self.assertRegex(str(cm.exception), "nested more than 64|symbolic links")


class TestGoWritten(unittest.TestCase):
    def test_import_idx(self):
        """What `tensorwire import idx` writes (a real Go writer) loads, element for element."""
        with tempfile.TemporaryDirectory() as d:
            # An IDX pair: 5 images of 2x3 and their labels.
            imgs = np.arange(30, dtype=np.uint8).reshape(5, 2, 3)
            labels = np.array([3, 1, 4, 1, 5], dtype=np.uint8)
            with open(os.path.join(d, "img.idx"), "wb") as f:
                f.write(bytes([0, 0, 8, 3]) + (5).to_bytes(4, "big") + (2).to_bytes(4, "big") + (3).to_bytes(4, "big"))
                f.write(imgs.tobytes())
            with open(os.path.join(d, "lab.idx"), "wb") as f:
                f.write(bytes([0, 0, 8, 1]) + (5).to_bytes(4, "big") + labels.tobytes())
            out = os.path.join(d, "ds")
            r = subprocess.run([binary(), "import", "idx", "--images", os.path.join(d, "img.idx"),
                                "--labels", os.path.join(d, "lab.idx"), out], capture_output=True, text=True)
            self.assertEqual(r.returncode, 0, r.stderr)
            td = tensorwire.load_memmap(out)
            self.assertEqual(td["images"].dtype, np.uint8)
            self.assertEqual(td["labels"].dtype, np.int64)
            np.testing.assert_array_equal(td["images"], imgs)
            np.testing.assert_array_equal(td["labels"], labels.astype(np.int64))


if __name__ == "__main__":
    unittest.main()
