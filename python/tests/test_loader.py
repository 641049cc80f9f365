"""The loader consumer against a real Go node's producer: epochs that end,
len(), every sample once per epoch, in both modes and batch sizes side by
side, a loop given up, and the consumer that leaves."""

import json
import math
import os
import subprocess
import unittest

import numpy as np

import tensorwire
from tensorwire import loader

from nodes import TOKEN, Node, binary

N = 1000


def make_dataset(d):
    """A dataset of N samples: x float32 [N, 3] with row i all i."""
    src = os.path.join(d, "x.npy")
    np.save(src, np.repeat(np.arange(N, dtype=np.float32)[:, None], 3, axis=1))
    out = os.path.join(d, "ds")
    subprocess.run([binary(), "import", "npy", "x=" + src, out], check=True, capture_output=True)
    return out


class TestLoader(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.node = Node()
        cls.node.extra = ["--loader", "l,dataset=%s,batch=64,slots=8,seed=3,index=index,max-wait=10s" % make_dataset(cls.node.dir)]
        cls.node.start()

    @classmethod
    def tearDownClass(cls):
        cls.node.close()

    def dial(self, mode, batch, **kw):
        return loader.Consumer(self.node.addr, "l", batch, token=TOKEN, root=self.node.root,
                               bytes_mode=mode == "bytes", **kw)

    def check_epoch(self, batches, batch):
        seen = []
        for b in batches:
            idx = b["index"]
            self.assertLessEqual(len(idx), batch)
            np.testing.assert_array_equal(b["x"][:, 0], idx.astype(np.float32))
            seen.extend(idx.tolist())
        self.assertEqual(sorted(seen), list(range(N)))
        return seen

    def test_epochs(self):
        """Two consumers, by reference and by bytes, of batch 100 and 48, each
        in a thread of its own as in a process of its own: each epoch yields
        len() batches and every sample once, in the producer's order, the same
        for both in the epochs they share."""
        import threading
        results, errs = {}, []

        def run(mode, batch):
            try:
                with self.dial(mode, batch) as c:
                    self.assertEqual((c.mode, c.sharing), (mode, "coherent"))
                    self.assertEqual(len(c), math.ceil(N / batch))
                    for _ in range(2):
                        e = c.epoch
                        got = list(c)
                        self.assertEqual(len(got), len(c))
                        results[(mode, e)] = self.check_epoch(got, batch)
            except Exception as e:  # noqa: BLE001
                errs.append(e)

        ts = [threading.Thread(target=run, args=a) for a in (("ref", 100), ("bytes", 48))]
        for t in ts:
            t.start()
        for t in ts:
            t.join(300)
        self.assertEqual(errs, [])
        self.assertEqual(len(results), 4)
        shared = {e for m, e in results if m == "ref"} & {e for m, e in results if m == "bytes"}
        for e in shared:
            self.assertEqual(results[("ref", e)], results[("bytes", e)])

    def test_bytes_rows_received_into_one_buffer(self):
        """By bytes, every full producer batch's rows are read from the
        connection into the same arrays (MessageStream.recv's into), not
        into new ones a batch, and the epoch is whole and right all the
        same: each batch's rows are copied out before the next message."""
        with self.dial("bytes", 48) as c:
            it = iter(c)
            got = [next(it)]
            s = c._sess
            real, into = s.stream.recv, []

            def spy(*a, **kw):
                m = real(*a, **kw)
                dst = (kw.get("into") or {}).get("rows")
                into.append((dst is not None and m["rows"] is dst, len(m["rows"]["index"])))
                return m

            s.stream.recv = spy
            got.extend(it)
            self.check_epoch(got, 48)
            full = [same for same, rows in into if rows == 64]
            self.assertGreater(len(full), 10)
            self.assertTrue(all(full), f"rows of full batches not in the buffer: {into}")
            self.assertTrue(all(not same for same, rows in into if rows != 64), "a short batch fit the buffer")

    def test_forked_child_loops_on_its_own(self):
        """A child forked with a joined Consumer in hand iterates an epoch
        as a consumer of its own, every sample once, and the parent's
        membership is untouched: its epoch too has every sample once.
        Before, the child's loop found the parent's session and failed
        (UnavailableError: the connection is the parent process's)."""
        c = self.dial("ref", 100)
        r, w = os.pipe()
        pid = os.fork()
        if pid == 0:
            code = 1
            try:
                os.close(r)
                seen = sorted(i for b in c for i in b["index"].tolist())
                c.close()
                os.write(w, json.dumps(seen == list(range(N))).encode())
                code = 0
            except BaseException as e:  # noqa: BLE001
                os.write(w, json.dumps(repr(e)).encode())
            finally:
                os._exit(code)
        os.close(w)
        try:
            self.check_epoch(list(c), 100)
        finally:
            c.close()  # leaves: the producer waits for no idle member (MaxWait) in the child's epochs
        with os.fdopen(r) as f:
            child = json.loads(f.read() or "null")
        _, status = os.waitpid(pid, 0)
        self.assertEqual(child, True)
        self.assertEqual(os.waitstatus_to_exitcode(status), 0)

    def test_drop_last_and_torch(self):
        with self.dial("ref", 300, drop_last=True) as c:
            self.assertEqual(len(c), 3)
            batches = list(c)
            self.assertEqual([len(x["index"]) for x in batches], [300, 300, 300])
        try:
            import torch
        except ImportError:
            return
        with self.dial("bytes", 256, as_torch=True) as c:
            b = next(iter(c))
            self.assertIsInstance(b["x"], torch.Tensor)

    def test_break_gives_up_the_epoch(self):
        with self.dial("ref", 64) as c:
            e = c.epoch
            for i, _ in enumerate(c):
                if i == 2:
                    break
            self.assertEqual(c.epoch, e + 1)
            self.check_epoch(list(c), 64)  # the next epoch, whole

    def test_bad_batch_size(self):
        for n in (0, -1):
            with self.assertRaises(loader.ArgumentError):
                self.dial("ref", n)
        with self.assertRaises(loader.ArgumentError) as cm:
            self.dial("ref", 64 * 8 + 1)  # more than the ring
        self.assertIsInstance(cm.exception, tensorwire.InvalidArgumentError)
        with self.assertRaises(loader.NotFoundError):
            loader.Consumer(self.node.addr, "nope", 8, token=TOKEN)

    def test_leaves(self):
        c = self.dial("bytes", 64)
        before = c.stats()
        c.close()
        with tensorwire.Client(self.node.addr, token=TOKEN) as rc:
            from nodes import wait_until
            wait_until(lambda: rc.call("loader.stats", {"name": "l"})["left"] > before["left"], what="the consumer left")


class TestLoaderRestart(unittest.TestCase):
    """The node killed (SIGKILL) between two epochs and started again a
    second later, on the same address, root and loader, while a training
    loop goes on for three more epochs: the loop waits for the node rather
    than failing every later epoch at once, loses at most the one epoch
    whose batches already announced it had yielded (UnavailableError), and
    every other epoch is whole."""

    def test_rides_out_a_restart(self):
        import threading
        import time
        with Node() as node:
            node.extra = ["--loader", "l,dataset=%s,batch=64,slots=8,seed=3,index=index" % make_dataset(node.dir)]
            node.stop()
            node.start()
            for mode in ("ref", "bytes"):
                with self.subTest(mode=mode):
                    c = loader.Consumer(node.addr, "l", 100, token=TOKEN, root=node.root, bytes_mode=mode == "bytes",
                                        timeout=60)
                    try:
                        self.assertEqual(sorted(b for x in c for b in x["index"].tolist()), list(range(N)))
                        node.kill()
                        results = []

                        def loop():
                            for _ in range(3):
                                got = []
                                try:
                                    for b in c:
                                        got.extend(b["index"].tolist())
                                    results.append((got, None))
                                except Exception as e:  # noqa: BLE001
                                    results.append((got, e))

                        t = threading.Thread(target=loop)
                        t.start()
                        time.sleep(1)
                        self.assertTrue(t.is_alive(), f"with the node down, the loop ended at once: {[(len(g), e) for g, e in results]}")
                        node.start()
                        t.join(120)
                        self.assertFalse(t.is_alive())
                        lost = 0
                        for got, err in results:
                            if err is None:
                                self.assertEqual(sorted(got), list(range(N)))
                            else:
                                self.assertIsInstance(err, tensorwire.UnavailableError)
                                self.assertGreater(len(got), 0, f"an epoch lost before its first batch: {err}")
                                lost += 1
                        self.assertLessEqual(lost, 1, results)
                    finally:
                        c.close()


if __name__ == "__main__":
    unittest.main()
