"""Both ways with the real tensordict (PyPI's, over its torch): what Go writes
(`tensorwire import npy`) loads with tensordict.TensorDict.load_memmap,
element for element; what tensordict's memmap_ writes reads on the Go side
(`tensorwire inspect --json --stats`, a node's tensorwire.read by bytes)
and with this client's load_memmap, byte for byte. The golden fixtures,
transcribed from tensordict's code, load with tensordict itself too.

Skipped, saying so, where tensordict cannot be imported (Debian has no
package of it: .ci/run installs it in a venv from PyPI). Where
TENSORWIRE_NEED_TENSORDICT is set, as in .ci/run's venv run, a missing
tensordict fails these tests instead."""

import json
import os
import subprocess
import tempfile
import unittest
import warnings

import numpy as np

import tensorwire

from nodes import REPO, TOKEN, Node, binary

GOLDEN = os.path.join(REPO, "tensordict", "testdata", "golden")

try:
    import torch
    import tensordict
    from tensordict import NonTensorData, TensorDict
    WHY_NOT = None
except Exception as e:  # ImportError, or a torch that fails to load
    torch = tensordict = None
    WHY_NOT = f"tensordict cannot be imported ({type(e).__name__}: {e}); .ci/run's venv has PyPI's"


def setUpModule():
    if WHY_NOT is None:
        return
    if os.environ.get("TENSORWIRE_NEED_TENSORDICT"):
        raise AssertionError(f"TENSORWIRE_NEED_TENSORDICT is set but {WHY_NOT}")
    raise unittest.SkipTest(WHY_NOT)


# numpy's name for each dtype the Go side writes from .npy files (all but
# bfloat16, which numpy lacks); the big-endian ones are swapped on import.
NPY = ["bool", "uint8", "int8", "int16", "int32", "int64", "float16", "float32", "float64",
       "complex64", "complex128", "uint16", "uint32", "uint64", ">i4", ">f8"]


def sample(rng, dt, shape):
    """Values that fill dt's range: negatives, large integers, fractions."""
    dt = np.dtype(dt)
    if dt.kind == "b":
        return rng.integers(0, 2, size=shape).astype(dt)
    if dt.kind in "iu":
        info = np.iinfo(dt)
        return rng.integers(info.min, info.max, size=shape, dtype=dt.newbyteorder("="), endpoint=True).astype(dt)
    if dt.kind == "f":
        return (rng.standard_normal(shape) * 1000).astype(dt)
    return (rng.standard_normal(shape) + 1j * rng.standard_normal(shape)).astype(dt)


def raw(t):
    """A torch tensor's elements as little-endian bytes (bfloat16 as its bits)."""
    t = t.contiguous()
    if t.dtype == torch.bfloat16:
        t = t.view(torch.int16)
    return t.numpy().tobytes()


def fixture_values(t):
    """A tensor's elements as the golden fixtures' expected.json lists them:
    float16 and bfloat16 as their bits, complex as [re, im]."""
    t = t.contiguous().reshape(-1)
    if t.dtype in (torch.float16, torch.bfloat16):
        return t.view(torch.int16).numpy().view("<u2").tolist()
    if t.is_complex():
        return [[z.real, z.imag] for z in t.tolist()]
    return t.numpy().tolist()


def le(a):
    """A numpy array's elements as little-endian bytes."""
    a = np.asarray(a)
    return np.ascontiguousarray(a, dtype=a.dtype.newbyteorder("<")).tobytes()


def leaves(td, path=()):
    """(path, value) of a nested dict's leaves."""
    for k, v in td.items():
        if isinstance(v, dict):
            yield from leaves(v, path + (k,))
        else:
            yield path + (k,), v


class TestGoWritesTensordictReads(unittest.TestCase):
    def test_import_npy(self):
        """`tensorwire import npy` of every numpy dtype (big-endian ones
        too), nested keys and a key that needs escaping: load_memmap sees the
        batch size, the keys, the dtypes and every element."""
        n, rng = 5, np.random.default_rng(7)
        with tempfile.TemporaryDirectory() as d:
            want, args = {}, []
            for i, name in enumerate(NPY):
                a = sample(rng, name, (n,) + ((3,), (2, 2), ())[i % 3])
                key = ("next/" if i % 4 == 1 else "") + name.replace(">", "be ")
                f = os.path.join(d, f"{i}.npy")
                np.save(f, a)
                want[key] = a
                args.append(f"{key}={f}")
            prefix = os.path.join(d, "ds")
            r = subprocess.run([binary(), "import", "npy"] + args + [prefix], capture_output=True, text=True)
            self.assertEqual(r.returncode, 0, r.stderr)
            td = TensorDict.load_memmap(prefix)
            self.assertEqual(list(td.batch_size), [n])
            got = {"/".join(k) if isinstance(k, tuple) else k: v
                   for k, v in td.items(include_nested=True, leaves_only=True)}
            self.assertEqual(sorted(got), sorted(want))
            for key, a in want.items():
                with self.subTest(key=key):
                    t = got[key]
                    self.assertEqual(t.dtype, torch.from_numpy(a.astype(a.dtype.newbyteorder("="))).dtype)
                    self.assertEqual(tuple(t.shape), a.shape)
                    self.assertEqual(raw(t), le(a))

    def test_golden_fixtures(self):
        """Every golden fixture (transcribed from tensordict's code, not
        written by it) loads with tensordict: its batch size, each leaf's
        dtype, shape and elements, and the non-tensors' data, are the
        expected.json's that the Go and Python readers are held to."""
        for case in sorted(c for c in os.listdir(GOLDEN) if not c.endswith(".json")):
            with open(os.path.join(GOLDEN, case + ".expected.json")) as f:
                e = json.load(f)
            with self.subTest(case=case), warnings.catch_warnings():
                # The pickled non-tensor of "nontensor": tensordict 0.15 loads
                # it with a FutureWarning (the fixture is ours, trusted).
                warnings.simplefilter("ignore", FutureWarning)
                td = TensorDict.load_memmap(os.path.join(GOLDEN, case))
                self.assertEqual(list(td.batch_size), e["tensordicts"][0]["batch_size"])
                for leaf in e["leaves"]:
                    t = td[tuple(leaf["path"])]
                    self.assertEqual((str(t.dtype), list(t.shape)), (leaf["dtype"], leaf["shape"]), leaf["path"])
                    self.assertEqual(fixture_values(t), leaf["values"], leaf["path"])
                for nt in e.get("non_tensors", []):
                    data = bytes.fromhex(nt["data_hex"]) if nt.get("pickled") else nt["data"]
                    self.assertEqual(td[tuple(nt["path"])], data, nt["path"])


class TestTensordictWritesGoReads(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.node = Node().start()
        cls.n = 4
        g = torch.Generator().manual_seed(3)
        rng = np.random.default_rng(3)
        fields = {}
        for name in NPY[:14]:
            fields[name] = torch.from_numpy(sample(rng, name, (cls.n, 3)))
        fields["bfloat16"] = (torch.randn(cls.n, 2, generator=g) * 1000).to(torch.bfloat16)
        fields["next"] = {"reward": torch.randn(cls.n, generator=g), "x y%": torch.arange(cls.n)}
        cls.tensors = fields
        td = TensorDict(fields, batch_size=[cls.n])
        td["note"] = NonTensorData("hello", batch_size=[cls.n])
        cls.prefix = os.path.join(cls.node.root, "td")
        td.memmap_(cls.prefix)

    @classmethod
    def tearDownClass(cls):
        cls.node.close()

    def expected(self):
        return [(k if isinstance(k, tuple) else (k,), t) for k, t in
                TensorDict(self.tensors, batch_size=[self.n]).items(include_nested=True, leaves_only=True)]

    def test_inspect(self):
        """The Go reader (`tensorwire inspect --json --stats`): batch size,
        dtypes, shapes, the non-tensor, and integer sums exactly."""
        r = subprocess.run([binary(), "inspect", "--json", "--stats", self.prefix], capture_output=True, text=True)
        self.assertEqual(r.returncode, 0, r.stderr)
        rep = json.loads(r.stdout)
        self.assertEqual(rep["batch_size"], [self.n])
        self.assertEqual(rep["nontensor"], {"note": "hello"})
        self.assertEqual(sorted(rep["fields"]), sorted("/".join(k) for k, _ in self.expected()))
        for k, t in self.expected():
            with self.subTest(key=k):
                f = rep["fields"]["/".join(k)]
                self.assertEqual((f["dtype"], f["shape"]), (str(t.dtype), list(t.shape)))
                if t.dtype == torch.bool or (not t.is_floating_point() and not t.is_complex()):
                    self.assertEqual(f["sum"], sum(int(x) for x in t.reshape(-1).tolist()))
                elif t.is_floating_point():
                    self.assertAlmostEqual(f["sum"], float(t.double().sum()), delta=1e-9 * float(t.double().abs().sum()) + 1e-9)

    def test_client_load_memmap(self):
        """This client's load_memmap maps every leaf with its bytes."""
        td = tensorwire.load_memmap(self.prefix)
        self.assertEqual(td["note"].data, "hello")
        for k, t in self.expected():
            with self.subTest(key=k):
                a = td
                for p in k:
                    a = a[p]
                self.assertEqual(a.shape, tuple(t.shape))
                self.assertEqual(le(a), raw(t))

    def test_node_reads(self):
        """A node's tensorwire.read (Go's LoadMemmap, the rows sent as bytes:
        no shared root) returns every element tensordict wrote."""
        with tensorwire.Client(self.node.addr, token=TOKEN) as c:
            self.assertEqual(c.sharing(), "none")
            td = c.read("td")
            got = dict(leaves(td))
            for k, t in self.expected():
                with self.subTest(key=k):
                    self.assertEqual(got[k].shape, tuple(t.shape))
                    self.assertEqual(le(got[k]), raw(t))
            rows = c.read("td", rows=[3, 1])
            self.assertEqual(le(rows["float64"]), raw(self.tensors["float64"][[3, 1]]))


if __name__ == "__main__":
    unittest.main()
