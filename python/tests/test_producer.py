"""The loader's producer in a Python process (tensorwire.loader.Producer) over
a real torch DataLoader, against a real Go node's remote loader
(--loader NAME,producer=remote): consumers of other batch sizes by
reference and by bytes, epochs one after another with a short last batch,
tuple batches, a batch whose schema changes, a DataLoader that raises, and
the producer or a consumer killed (kill -9) in processes of their own."""

import math
import os
import signal
import subprocess
import sys
import threading
import time
import unittest

import numpy as np

try:
    import torch
    import torch.utils.data as tud
except ImportError:  # pragma: no cover
    torch = None

from tensorwire import loader
from tensorwire.loader import ArgumentError

from nodes import TOKEN, Node, python_env, wait_until

N = 150  # samples: batches of 32 leave a last one of 22


if torch is not None:
    class Images(tud.Dataset):
        """Sample i: an image uint8 [3, 8, 8] of all (i % 251) with pixel
        [0, 0, 0] i // 251 and [0, 0, 1] i % 251, its label i, and a
        transform (a horizontal flip of a gradient row, then scaled to
        float32) done in the DataLoader's workers. fail_at raises there,
        once the file gate exists if one is named (a worker is a process of
        its own: the test lets it fail only once its consumer has joined)."""

        def __init__(self, n=N, fail_at=None, delay=0.0, gate=None):
            self.n, self.fail_at, self.delay, self.gate = n, fail_at, delay, gate

        def __len__(self):
            return self.n

        def __getitem__(self, i):
            if i == self.fail_at:
                deadline = time.monotonic() + 60
                while self.gate and not os.path.exists(self.gate) and time.monotonic() < deadline:
                    time.sleep(0.01)
                raise ValueError(f"sample {i} is corrupt")
            if self.delay:
                time.sleep(self.delay)
            img = torch.full((3, 8, 8), i % 251, dtype=torch.uint8)
            img[0, 0, 0], img[0, 0, 1] = i // 251, i % 251
            return {"image": img, "label": torch.tensor(i), "scaled": img.float().flip(-1) / 255}


def ids_of(batch):
    """The samples a dict batch holds, checked by content."""
    img, label = batch["image"], batch["label"]
    ids = (img[:, 0, 0, 0].long() * 251 + img[:, 0, 0, 1].long()).tolist()
    if ids != label.tolist():
        raise AssertionError(f"images of {ids[:5]}..., labels {label.tolist()[:5]}...")
    torch.testing.assert_close(batch["scaled"], img.float().flip(-1) / 255)
    return ids


@unittest.skipIf(torch is None, "needs torch")
class TestProducer(unittest.TestCase):
    def setUp(self):
        self.node = Node(extra=["--loader", "train,producer=remote,slots=8,window=8,max-wait=20s"])
        self.node.start()
        self.addCleanup(self.node.close)

    def producer(self, dl, **kw):
        return loader.Producer(self.node.addr, "train", dl, token=TOKEN, root=self.node.root, **kw)

    def consumer(self, batch, mode="ref", **kw):
        c = loader.Consumer(self.node.addr, "train", batch, token=TOKEN, root=self.node.root,
                            bytes_mode=mode == "bytes", timeout=60, **kw)
        self.addCleanup(c.close)
        return c

    def test_epochs_with_consumers_of_other_batch_sizes(self):
        """A DataLoader of batch 32 with a worker and shuffling, written in
        place (ref); consumers of batch 20 by reference and 64 by bytes, in
        threads as in processes of their own: three epochs each, len()
        batches of tensors, every sample exactly once, checked by content."""
        dl = tud.DataLoader(Images(), batch_size=32, shuffle=True, num_workers=1)
        p = self.producer(dl).start()
        self.addCleanup(p.close)
        results, errs = {}, []

        # Both join before either reads, so that they share epochs: a
        # consumer that joins once the other has read its three (a thread
        # started late on a loaded machine) rightly gets later epochs.
        consumers = {batch: self.consumer(batch, mode) for batch, mode in ((20, "ref"), (64, "bytes"))}

        def run(batch, mode):
            try:
                c = consumers[batch]
                self.assertEqual(len(c), math.ceil(N / batch))
                for _ in range(3):
                    e = c.epoch
                    seen, sizes = [], []
                    for b in c:
                        self.assertIsInstance(b["image"], torch.Tensor)
                        seen += ids_of(b)
                        sizes.append(len(b["label"]))
                    self.assertEqual(len(sizes), len(c))
                    self.assertEqual(sizes[:-1], [batch] * (len(c) - 1))
                    self.assertEqual(sorted(seen), list(range(N)), f"epoch {e}, batch {batch}")
                    results[(batch, e)] = seen
                self.assertEqual(c.mode, mode)
            except Exception as x:  # noqa: BLE001
                errs.append(x)

        ts = [threading.Thread(target=run, args=a) for a in ((20, "ref"), (64, "bytes"))]
        for t in ts:
            t.start()
        for t in ts:
            t.join(300)
        self.assertEqual(errs, [])
        self.assertEqual((p.mode, p.layout, p.batch_size, p.samples), ("ref", "dict", 32, N))
        # The same order for both in the epochs they share, and a new
        # shuffle each epoch.
        shared = {e for (b, e) in results if b == 20} & {e for (b, e) in results if b == 64}
        self.assertTrue(shared)
        for e in shared:
            self.assertEqual(results[(20, e)], results[(64, e)])
        e0 = min(e for (b, e) in results if b == 20)
        self.assertNotEqual(results[(20, e0)], results[(20, e0 + 1)])

    def test_tuple_batches_by_bytes(self):
        """(x, y) samples of a TensorDataset, which default_collate makes a
        list of two tensors a batch, sent as bytes with a short last batch:
        consumers get lists of tensors back, each sample once."""
        x = torch.arange(N * 3, dtype=torch.float32).reshape(N, 3)
        y = torch.arange(N)
        dl = tud.DataLoader(tud.TensorDataset(x, y), batch_size=32, shuffle=True)
        # Epochs without end (closed at cleanup): the ring may hold a whole
        # epoch, so on a busy machine the consumer joins epoch 1 and needs
        # an epoch 2 that a producer of two epochs never serves.
        p = self.producer(dl, bytes_mode=True).start()
        self.addCleanup(p.close)
        c = self.consumer(50)
        for _ in range(2):
            seen = []
            for b in c:
                self.assertIsInstance(b, list)
                bx, by = b
                torch.testing.assert_close(bx, x[by])
                seen += by.tolist()
            self.assertEqual(sorted(seen), list(range(N)))
        self.assertEqual((p.mode, p.layout), ("bytes", "list"))
        self.assertEqual(c.schema, [{"dtype": "torch.float32", "key": ["0"], "shape": [3]},
                                    {"dtype": "torch.int64", "key": ["1"], "shape": []}])

    def test_schema_change_names_the_key(self):
        """A batch whose label is int32 after int64 ones: the producer raises
        ArgumentError naming label, consumers get FailedError saying so, and
        the node serves on: the next producer's epoch reaches them whole."""
        good = tud.DataLoader(Images(), batch_size=32)
        batches = list(good)
        joined = threading.Event()

        class Bad:
            """The batches, label int32 in the third, which waits for the
            consumer to have joined: a producer that failed before any
            consumer joined leaves it waiting for the next producer."""

            def __iter__(self):
                for i, b in enumerate(batches):
                    if i == 2:
                        joined.wait(60)
                        b = dict(b, label=b["label"].int())
                    yield b

        p = self.producer(Bad(), samples=N)
        done = threading.Event()
        perr = []

        def run():
            try:
                p.run()
            except Exception as x:  # noqa: BLE001
                perr.append(x)
            done.set()

        threading.Thread(target=run, daemon=True).start()
        c = self.consumer(32)
        joined.set()
        with self.assertRaises(loader.FailedError) as cm:
            for _ in c:
                pass
        self.assertIn("label", str(cm.exception))
        self.assertIn("torch.int32", str(cm.exception))
        self.assertTrue(done.wait(30))
        self.assertIsInstance(perr[0], loader.ArgumentError)
        self.assertIn("label", str(perr[0]))
        p.close()
        p2 = self.producer(good).start()  # without end, as above: c may join its epoch 1
        self.addCleanup(p2.close)
        seen = [i for b in c for i in ids_of(b)]
        self.assertEqual(sorted(seen), list(range(N)))

    def test_failure_reaches_a_consumer_joining_as_it_fails(self):
        """A consumer whose join was answered by a producer that then failed,
        its ring removed before the consumer mapped it, raises the
        producer's failure (FailedError). It waited for the next producer
        (NoProducerError), a minute in CI, as if the first had only gone."""
        from unittest import mock
        batches, joined = list(tud.DataLoader(Images(), batch_size=32)), threading.Event()

        class Failing:
            def __iter__(self):
                yield batches[0]
                joined.wait(60)
                raise ValueError("sample 40 is corrupt")

        p = self.producer(Failing(), samples=N).start()
        self.addCleanup(p.close)
        real = loader._map_ring

        def map_ring(folder, info):
            joined.set()
            wait_until(lambda: not os.path.isdir(folder), 30, "the failed producer's ring removed")
            return real(folder, info)

        with mock.patch.object(loader, "_map_ring", map_ring), self.assertRaises(loader.FailedError) as cm:
            loader.Consumer(self.node.addr, "train", 32, token=TOKEN, root=self.node.root, timeout=10).close()
        self.assertIn("sample 40 is corrupt", str(cm.exception))

    def test_dataloader_raises(self):
        """A DataLoader whose dataset raises in a worker: its message reaches
        the consumers (FailedError), and the producer raises it. It fails
        once the consumer has joined: one that joins after the producer is
        gone waits for the next producer (NoProducerError at its timeout)."""
        gate = os.path.join(self.node.root, "joined")
        dl = tud.DataLoader(Images(fail_at=100, gate=gate), batch_size=32, num_workers=1)
        p = self.producer(dl).start()
        self.addCleanup(p.close)
        c = self.consumer(32, mode="bytes")
        open(gate, "w").close()
        with self.assertRaises(loader.FailedError) as cm:
            for _ in c:
                pass
        self.assertIn("sample 100 is corrupt", str(cm.exception))
        with self.assertRaises(Exception) as pe:
            p.wait(30)
        self.assertIn("sample 100 is corrupt", str(pe.exception))

    def test_producer_killed_and_back(self):
        """The producer's process killed (kill -9) mid-epoch: the consumer's
        loop raises UnavailableError (NoProducerError); a new producer
        process attaches and the consumer's next loop iterates the epoch
        after, whole."""
        proc = self.start_producer_process(delay=0.02)
        c = self.consumer(16)
        seen = []
        with self.assertRaises(loader.NoProducerError):
            for b in c:
                seen += ids_of(b)
                if len(seen) == 64:
                    proc.send_signal(signal.SIGKILL)
                    proc.wait()
        self.assertGreaterEqual(len(seen), 64)
        self.assertLess(len(seen), N)
        proc2 = self.start_producer_process(delay=0)
        e = c.epoch
        seen = [i for b in c for i in ids_of(b)]
        self.assertEqual(sorted(seen), list(range(N)))
        self.assertGreaterEqual(e, 1)
        proc2.kill()
        proc2.wait()

    def test_node_restarted_producer_attaches_again(self):
        """The node killed (kill -9) and started again on the same root and
        address between epochs: the producer, left running, attaches again
        by itself (reattach, the default), and the consumer's next loop,
        which had yielded nothing when the node went away, waits for it and
        iterates a later epoch whole."""
        dl = tud.DataLoader(Images(), batch_size=32)
        p = self.producer(dl, timeout=60).start()
        self.addCleanup(p.close)
        c = self.consumer(16)
        seen = [i for b in c for i in ids_of(b)]
        self.assertEqual(sorted(seen), list(range(N)))
        e0 = c.epoch
        self.node.kill()
        self.node.start()
        wait_until(lambda: p.attached >= 2 or p.error is not None, 60, "the producer attached again")
        self.assertIsNone(p.error)
        # The killed node may have sent batches of the epoch after e0 before
        # it died, ahead of the loop (its window): they sit in this side's
        # socket, the loop yields them, and then ends with UnavailableError,
        # as docs/loader.md says of a loop that has yielded batches of its
        # epoch. The loop after that waits for the node and is whole.
        try:
            seen = [i for b in c for i in ids_of(b)]
        except loader.UnavailableError:
            seen = [i for b in c for i in ids_of(b)]
        self.assertEqual(sorted(seen), list(range(N)))
        self.assertGreater(c.epoch, e0)
        self.assertEqual(p.attached, 2)

    def test_close_while_waiting_to_attach_again_stops_it(self):
        """Producer.close() while run() waits to attach again (the node was
        restarted) stops it: no attaching again, and its thread ends. The
        producer is on a Client the caller owns, which close() leaves open.
        Before the fix run() looked at _closed only when an attach failed,
        not after the backoff's sleep, so it attached to the node again
        after close() and served on for good (close() gave up its join
        after 5 s)."""
        from tensorwire import Client
        c = Client(self.node.addr, token=TOKEN, root=self.node.root)
        self.addCleanup(c.close)
        data = [{"x": np.arange(4 * i, 4 * i + 4, dtype=np.int64)} for i in range(4)]
        p = loader.Producer(c, "train", data, samples=16)
        in_wait = threading.Event()
        real_wait = loader._Backoff.wait

        def wait(self_, err):
            real_wait(self_, err)
            in_wait.set()
            # close() lands during this backoff's sleep: the sleep lasts until it has
            deadline = time.monotonic() + 20
            while not p._closed and time.monotonic() < deadline:
                time.sleep(0.01)

        loader._Backoff.wait = wait
        self.addCleanup(setattr, loader._Backoff, "wait", real_wait)
        p.start()
        self.addCleanup(p.close)
        wait_until(lambda: p.attached >= 1 or p.error is not None, 30, "the producer attached")
        self.assertEqual(p.attached, 1)
        self.node.kill()
        self.assertTrue(in_wait.wait(30), "the producer did not back off")
        self.node.start()
        p.close()
        self.assertTrue(p.wait(5), "the producer's thread runs on after close()")
        self.assertIsNone(p.error)
        self.assertEqual(p.attached, 1, "the producer attached to the node again after close()")

    def test_close_wakes_a_backoff(self):
        """close() wakes a run() sleeping in its backoff between attaches (an
        Event, not a sleep): the producer's thread ends at once."""
        data = [{"x": np.arange(4 * i, 4 * i + 4, dtype=np.int64)} for i in range(4)]
        p = self.producer(data, samples=16, timeout=None)
        slept = threading.Event()
        real_wait = loader._Backoff.wait

        def wait(self_, err):
            slept.set()
            real_wait(self_, err)

        loader._Backoff.wait = wait
        self.addCleanup(setattr, loader._Backoff, "wait", real_wait)
        real_uniform = loader.random.uniform
        loader.random.uniform = lambda a, b: 60.0  # each backoff sleeps 60 s, unless close() cuts it short
        self.addCleanup(setattr, loader.random, "uniform", real_uniform)
        p.start()
        self.addCleanup(p.close)
        wait_until(lambda: p.attached >= 1 or p.error is not None, 30, "the producer attached")
        self.node.kill()
        self.assertTrue(slept.wait(30), "the producer did not back off")
        start = time.monotonic()
        p.close()
        self.assertLess(time.monotonic() - start, 3, "close() waited for the backoff's sleep")
        self.assertFalse(p._thread.is_alive())
        self.assertEqual(p.attached, 1)

    def test_reattach_off_raises(self):
        """reattach=False: the node going away ends run with UnavailableError."""
        dl = tud.DataLoader(Images(), batch_size=32)
        p = self.producer(dl, reattach=False).start()
        self.addCleanup(p.close)
        c = self.consumer(16)
        self.assertEqual(sorted(i for b in c for i in ids_of(b)), list(range(N)))
        self.node.kill()
        with self.assertRaises(loader.UnavailableError):
            p.wait(30)

    def test_consumer_killed_others_go_on(self):
        """A consumer's process killed (kill -9) while it holds batches: the
        node drops it and the other consumer's epochs go on, each sample once."""
        dl = tud.DataLoader(Images(), batch_size=32)
        p = self.producer(dl).start()
        self.addCleanup(p.close)
        code = ("import sys, time\nfrom tensorwire import loader\n"
                "c = loader.Consumer(sys.argv[1], 'train', 8, token=sys.argv[2].encode(), root=sys.argv[3])\n"
                "it = iter(c); next(it); print('holding', flush=True); time.sleep(600)\n")
        victim = subprocess.Popen([sys.executable, "-c", code, self.node.addr, TOKEN.decode(), self.node.root],
                                  env=python_env(), stdout=subprocess.PIPE)
        self.addCleanup(victim.stdout.close)
        self.addCleanup(victim.kill)
        self.assertEqual(victim.stdout.readline().strip(), b"holding")
        c = self.consumer(32)
        victim.send_signal(signal.SIGKILL)
        victim.wait()
        for _ in range(2):
            seen = [i for b in c for i in ids_of(b)]
            self.assertEqual(sorted(seen), list(range(N)))
        wait_until(lambda: c.stats()["dropped"] >= 1, 30, "the killed consumer dropped")

    def test_ranks_share_each_epoch(self):
        """Consumers of rank 0 and 1 of world size 2 over 151 samples in order
        (no shuffle): each takes DistributedSampler's share of the epoch
        (positions rank, rank + 2, ..., padded to 76 from the epoch's
        first), len() batches; together every sample, none twice within a
        rank."""
        n = 151
        dl = tud.DataLoader(Images(n=n), batch_size=32)
        p = self.producer(dl).start()
        self.addCleanup(p.close)
        shares, errs = {}, []

        def run(rank):
            try:
                c = self.consumer(16, rank=rank, world_size=2)
                self.assertEqual(len(c), math.ceil(76 / 16))
                for _ in range(2):
                    shares.setdefault(rank, []).append([i for b in c for i in ids_of(b)])
            except Exception as x:  # noqa: BLE001
                errs.append(x)

        ts = [threading.Thread(target=run, args=(r,)) for r in (0, 1)]
        for t in ts:
            t.start()
        for t in ts:
            t.join(120)
        self.assertEqual(errs, [])
        order = list(range(n)) + [0]  # the epoch's positions, padded as DistributedSampler pads
        for rank in (0, 1):
            for got in shares[rank]:
                self.assertEqual(got, order[rank::2])
                self.assertEqual(len(set(got)), 76)
        self.assertEqual(set(shares[0][0]) | set(shares[1][0]), set(range(n)))

    def test_a_failed_copy_of_a_padding_row_yields_no_wrong_row(self):
        """Rank 1 of 2 over 151 samples takes position 0 again as its padding
        row, copied from batch 0 beside its share's rows. That copy failing
        (DroppedError, as when the slot is rewritten under the read) ends the
        loop with the error before it yields a batch of that epoch, and the
        next loop yields the whole share of a later epoch, padding row
        included: never a batch with the padding row missing or stale."""
        from unittest import mock
        n = 151
        p = self.producer(tud.DataLoader(Images(n=n), batch_size=32)).start()
        self.addCleanup(p.close)
        c = self.consumer(16, rank=1, world_size=2)
        real, failed = loader.Consumer._copy_sel, []

        def copy_sel(self_, s, a, rows, sel):
            if a["index"] == 0 and len(sel) == 1 and not failed:  # the padding row's copy
                failed.append(a["epoch"])
                raise loader.DroppedError("loader: batch 0 was overwritten while it was read (planted)")
            return real(self_, s, a, rows, sel)

        order = (list(range(n)) + [0])[1::2]
        with mock.patch.object(loader.Consumer, "_copy_sel", copy_sel):
            got = []
            with self.assertRaises(loader.DroppedError):
                for b in c:
                    got += ids_of(b)
            self.assertEqual(got, [], "a batch of the epoch whose padding copy failed was yielded")
            self.assertEqual(len(failed), 1)
            self.assertEqual([i for b in c for i in ids_of(b)], order)
            self.assertGreater(c.epoch, failed[0])

    def test_ranks_of_a_world_larger_than_the_epoch(self):
        """A world of 5 over an epoch of 2 samples: DistributedSampler pads
        with the epoch repeated (positions 0, 1, 0, 1, 0), and every rank
        gets its one sample. Rank 4's padding was position 2, which no
        epoch of 2 has: it got an uninitialized row."""
        dl = tud.DataLoader(Images(n=2), batch_size=2)
        p = self.producer(dl).start()
        self.addCleanup(p.close)
        for rank, want in enumerate([0, 1, 0, 1, 0]):
            c = self.consumer(1, rank=rank, world_size=5)
            self.assertEqual(len(c), 1)
            self.assertEqual([i for b in c for i in ids_of(b)], [want], f"rank {rank}")
            c.close()

    def test_resume_mid_epoch(self):
        """A rank's consumer closed after two batches, its state_dict given to
        the consumer that replaces it (while another keeps the epoch going
        and its window open): the new one yields the rest of the share, no
        sample twice."""
        dl = tud.DataLoader(Images(delay=0.002), batch_size=16)
        p = self.producer(dl).start()
        self.addCleanup(p.close)
        keeper = self.consumer(16)  # keeps the epoch going
        kit = iter(keeper)
        next(kit)
        c = self.consumer(8, rank=1, world_size=2)
        it = iter(c)
        first = ids_of(next(it)) + ids_of(next(it))
        state = c.state_dict()
        self.assertEqual((state["samples"], state["rank"], state["world_size"]), (16, 1, 2))
        it.close()
        c.close()
        other = self.consumer(8, rank=0, world_size=2)
        with self.assertRaisesRegex(ArgumentError, "rank 1 of 2's share"):
            other.load_state_dict(state)  # another rank's: it would drop samples of rank 0's share
        other.close()
        c2 = self.consumer(8, rank=1, world_size=2)
        c2.load_state_dict(state)
        self.assertEqual(c2.epoch, state["epoch"], "the window is still open: the same epoch")
        # The keeper reads on, or the ring would fill under it and c2 wait
        # until the node dropped it (max-wait, 20 s of this test's time).
        keeping = threading.Thread(target=lambda: sum(1 for _ in kit))
        keeping.start()
        rest = [i for b in c2 for i in ids_of(b)]
        keeping.join(60)
        self.assertFalse(keeping.is_alive())
        got = first + rest
        self.assertEqual(len(got), len(set(got)))
        self.assertEqual(len(got), 75)

    def start_producer_process(self, delay):
        code = ("import sys, time, torch, torch.utils.data as tud\nsys.path.insert(0, sys.argv[4])\n"
                "from test_producer import Images\nfrom tensorwire import loader\n"
                "dl = tud.DataLoader(Images(delay=float(sys.argv[5])), batch_size=16)\n"
                "loader.Producer(sys.argv[1], 'train', dl, token=sys.argv[2].encode(), root=sys.argv[3]).run()\n")
        here = os.path.dirname(os.path.abspath(__file__))
        proc = subprocess.Popen([sys.executable, "-c", code, self.node.addr, TOKEN.decode(), self.node.root, here,
                                 str(delay)], env=python_env())
        self.addCleanup(proc.kill)
        return proc


if __name__ == "__main__":
    unittest.main()
