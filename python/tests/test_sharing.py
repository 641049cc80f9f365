"""The sharing levels of docs/protocol.md ("Sharing") as each service
client acts on them, against a real Go node: through a bindfs view of the
node's root (the same files through another mount and page cache, as
another machine on NFS: "storage") and through a copy of it ("none").
Replay, the loader and serve, whose files are rewritten in place, work by
bytes below "coherent"; the store, whose values are written once, reads
them by reference at "storage" too."""

import os
import shutil
import tempfile
import time
import unittest

import numpy as np

try:
    import torch
except ImportError:
    torch = None

import tensorwire
from tensorwire import loader, replay, serve, store

import test_loader
import test_serve
from nodes import TOKEN, bindfs_view, stateless_view


def ids_batch(ids):
    ids = np.asarray(ids, dtype=np.int64)
    return {"obs": np.repeat(ids[:, None], 4, axis=1).astype(np.float32), "id": ids}


class TestLevels(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.node, _ = test_serve.model_node(settings=",max-batch=8")
        cls.node.buffers = ["view,capacity=100,min-size=1", "copy,capacity=100,min-size=1"]
        cls.node.extra += ["--store", "main", "--store", "kept,inline=4KiB,trash-grace=200ms",
                           "--loader", "l,dataset=%s,batch=64,slots=8,seed=3,index=index,max-wait=10s"
                           % test_loader.make_dataset(cls.node.dir)]
        cls.node.start()
        cls.addClassCleanup(cls.node.close)
        # The node made its root's identity when it started.
        with tensorwire.Client(cls.node.addr, token=TOKEN, root=cls.node.root) as c:
            assert c.sharing() == "coherent", c.sharing()
        cls.copy = os.path.join(tempfile.mkdtemp(prefix="tensorwire-pytest-copy-"), "root")
        # Not the probe folder: the node removes a client's probe files
        # after the client closes, so one may go while the copy walks it
        # (CI once: "No such file or directory" in .tensorwire-probe).
        shutil.copytree(cls.node.root, cls.copy, symlinks=True, ignore=shutil.ignore_patterns(".tensorwire-probe"))
        cls.addClassCleanup(shutil.rmtree, os.path.dirname(cls.copy), True)

    def view(self):
        return bindfs_view(self.node.root, self)

    def test_client(self):
        with tensorwire.Client(self.node.addr, token=TOKEN, root=self.view()) as c:
            self.assertEqual((c.sharing(), c.shared_fs()), (tensorwire.Sharing.STORAGE, False))
            self.assertIn("mount", c._connection(None).why)
        with tensorwire.Client(self.node.addr, token=TOKEN, root=self.copy) as c:
            self.assertEqual((c.sharing(), c.shared_fs()), ("none", False))
        # A folder no node has made a root: none, and the client writes
        # nothing into it (it used to create a .tensorwire-fsid there).
        plain = tempfile.mkdtemp(prefix="tensorwire-pytest-plain-")
        self.addCleanup(shutil.rmtree, plain, True)
        with tensorwire.Client(self.node.addr, token=TOKEN, root=plain) as c:
            self.assertEqual((c.sharing(), c.shared_fs()), ("none", False))
            self.assertIn(".tensorwire-fsid", c._connection(None).why)
        self.assertEqual(os.listdir(plain), [])

    def check_replay(self, root, name, level):
        with replay.Buffer(self.node.addr, name, token=TOKEN, root=root) as b:
            self.assertEqual((b.sharing, b.mode), (level, "bytes"))
            b.extend(ids_batch(range(1, 17)))
        with replay.Buffer(self.node.addr, name, token=TOKEN, root=self.node.root) as r:
            self.assertEqual((r.sharing, r.mode), ("coherent", "ref"))
            td, _ = r.sample(32)
            self.assertTrue((td["id"] >= 1).all() and (td["id"] <= 16).all(), td["id"])
            np.testing.assert_array_equal(td["obs"], np.repeat(td["id"][:, None], 4, axis=1).astype(np.float32))

    def test_replay(self):
        """Rows written through the view or the copy land in the node's
        buffer: a client with the node's root samples them back whole."""
        self.check_replay(self.view(), "view", "storage")
        self.check_replay(self.copy, "copy", "none")

    def test_store(self):
        """Through the view the store reads a large value by reference (a
        read-only mapping of the value's files through the view), and the
        same value as bytes through the copy."""
        big = {"x": np.arange(2 << 20, dtype=np.float32)}  # 8 MiB: a prefix, not inline
        with store.Store(self.node.addr, "main", token=TOKEN, root=self.view()) as s:
            self.assertEqual((s.sharing, s.mode), ("storage", "ref"))
            v = s.publish("params", big)
            with s.latest("params") as p:
                self.assertEqual(p.version, v)
                self.assertIsInstance(p.td["x"], np.memmap)
                np.testing.assert_array_equal(p.td["x"], big["x"])
        with store.Store(self.node.addr, "main", token=TOKEN, root=self.copy) as s:
            self.assertEqual((s.sharing, s.mode), ("none", "bytes"))
            with s.latest("params") as p:
                self.assertNotIsInstance(p.td["x"], np.memmap)
                np.testing.assert_array_equal(p.td["x"], big["x"])

    def test_store_get_kept_past_the_grace(self):
        """Items a get returned through another page cache stay readable
        after the node deleted their files (its trash grace, here 200 ms,
        after the get): they are copies, not mappings. Through the
        stateless view, as on an NFS client whose server deleted the files,
        a mapping died of SIGBUS at its first unread page (before get
        copied at "storage")."""
        view = stateless_view(self.node.root, self)
        big = lambda i: {"x": np.full(2 << 20, i, dtype=np.float32)}  # noqa: E731 (8 MiB: a prefix)
        with store.Store(self.node.addr, "kept", token=TOKEN, root=self.node.root) as w:
            w.extend("b", [big(1), big(2)])
        with store.Store(self.node.addr, "kept", token=TOKEN, root=view) as s:
            self.assertEqual((s.sharing, s.mode), ("storage", "ref"))
            items = s.get("b")
            self.assertEqual([float(it["x"][0]) for it in items], [1.0, 2.0])
            self.assertNotIsInstance(items[0]["x"], np.memmap)
        st = os.path.join(self.node.root, "kept")
        deadline = time.monotonic() + 20
        while os.listdir(os.path.join(st, "values")) or os.listdir(os.path.join(st, "trash")):
            self.assertLess(time.monotonic(), deadline, "the node kept the values 20 s after the get")
            time.sleep(0.05)
        pid = os.fork()  # a SIGBUS kills the child, not the suite
        if pid == 0:
            ok = all((it["x"] == i + 1).all() for i, it in enumerate(items))
            os._exit(0 if ok else 1)
        _, status = os.waitpid(pid, 0)
        self.assertFalse(os.WIFSIGNALED(status), f"reading the items killed the reader: signal {os.WTERMSIG(status)}")
        self.assertEqual(os.WEXITSTATUS(status), 0, "the items read wrong after the node deleted their files")

    @unittest.skipUnless(torch is not None, "needs torch (a bfloat16 tensor)")
    def test_store_copy_keeps_bfloat16(self):
        """A value copied out of its prefix at "storage" keeps its dtype: a
        bfloat16 tensor gotten and put back is bfloat16 still (the copy
        made it uint16 once)."""
        with store.Store(self.node.addr, "main", token=TOKEN, root=self.node.root) as w:
            w.append("bf16", {"w": torch.ones(1 << 20, dtype=torch.bfloat16)})  # 2 MiB: a prefix
        with store.Store(self.node.addr, "main", token=TOKEN, root=self.view()) as s:
            self.assertEqual((s.sharing, s.mode), ("storage", "ref"))
            (got,) = s.get("bf16")
            s.append("bf16-again", got)
        with store.Store(self.node.addr, "main", token=TOKEN, root=self.node.root) as r:
            (again,) = r.peek("bf16-again")
            self.assertEqual(again["w"].dtype, np.dtype("<u2"))  # numpy has no bfloat16: its bits
            with open(os.path.join(os.path.dirname(again["w"].filename), "meta.json")) as f:
                self.assertIn("torch.bfloat16", f.read())

    def test_loader(self):
        for root, level in ((self.view(), "storage"), (self.copy, "none")):
            with self.subTest(level=level), loader.Consumer(self.node.addr, "l", 100, token=TOKEN, root=root) as c:
                self.assertEqual((c.sharing, c.mode), (level, "bytes"))
                seen = []
                for b in c:
                    np.testing.assert_array_equal(b["x"][:, 0], b["index"].astype(np.float32))
                    seen.extend(b["index"].tolist())
                self.assertEqual(sorted(seen), list(range(test_loader.N)))

    def test_serve(self):
        x = np.random.default_rng(1).normal(size=(3, test_serve.SIZES[0])).astype(np.float32)
        with serve.Client(self.node.addr, "policy", token=TOKEN, root=self.node.root) as c:
            self.assertEqual((c.sharing, c.mode), ("coherent", "ref"))
            want = c.predict({"obs": x})["logits"]
        for root, level in ((self.view(), "storage"), (self.copy, "none")):
            with self.subTest(level=level), serve.Client(self.node.addr, "policy", token=TOKEN, root=root) as c:
                self.assertEqual((c.sharing, c.mode), (level, "bytes"))
                np.testing.assert_array_equal(c.predict({"obs": x})["logits"], want)


if __name__ == "__main__":
    unittest.main()
