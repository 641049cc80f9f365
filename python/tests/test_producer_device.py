"""Device delivery of the loader (docs/loader.md, "GPU delivery"): a Python
Producer with device= keeps a ring of device slots, shares them once
through a blob in the ring's folder, and consumers on the same device get
views of the slots, held by the node's ack guard until their loop's body
returns; consumers elsewhere take the host path and .to(device).

Here the device is the CPU stand-in "shm:N" (shared-memory CPU tensors,
torch's file_system strategy), which goes through the same code as CUDA
but for the share/rebuild and the events; the consumers are processes of
their own. The CUDA tests at the end run the same checks on "cuda:0" and
skip without a GPU (scripts/device.sh runs them on one)."""

import json
import os
import signal
import subprocess
import sys
import time
import unittest

try:
    import torch
    import torch.utils.data as tud
except ImportError:  # pragma: no cover
    torch = None

import numpy as np

from tensorwire import Client, InvalidArgumentError, loader

from nodes import TOKEN, Node, python_env, wait_until

HERE = os.path.dirname(os.path.abspath(__file__))
N = 150  # samples: producer batches of 32 leave a last one of 22

if torch is not None:
    from test_producer import Images, ids_of

CUDA = torch is not None and torch.cuda.is_available()

# A consumer process: iterates `epochs` epochs of batch `batch` on `device`
# and prints one JSON line per epoch (the sample ids, checked by content,
# the batch sizes, the delivery, where the tensors were, whether each batch
# was a view of the device ring), then "done".
CONSUMER = r"""
import json, sys
sys.path.insert(0, sys.argv[1])
import torch
from tensorwire import loader
from test_producer import ids_of
addr, token, root, batch, device, epochs = sys.argv[2], sys.argv[3].encode(), sys.argv[4], int(sys.argv[5]), sys.argv[6], int(sys.argv[7])
c = loader.Consumer(addr, "train", batch, token=token, root=root, device=device, timeout=120)
for _ in range(epochs):
    e = c.epoch
    ids, sizes, devices, ptrs = [], [], set(), set()
    for b in c:
        devices.add(str(b["image"].device))
        ids += ids_of({k: v.cpu() for k, v in b.items()})
        sizes.append(len(b["label"]))
        ptrs.add(b["image"].untyped_storage().data_ptr() if hasattr(b["image"], "untyped_storage") else b["image"].storage().data_ptr())
    print(json.dumps({"epoch": e, "ids": ids, "sizes": sizes, "delivery": c.delivery, "devices": sorted(devices),
                      "storages": len(ptrs), "blob_reads": c.blob_reads, "len": len(c), "error": c.device_error}), flush=True)
c.close()
print("done", flush=True)
"""

# A consumer that takes one batch and holds it (the loop's body never
# returns): prints the held batch's ids, then sleeps until killed, or
# until a line on stdin, when it prints the ids again (read from the same
# view) and those of the next batch, which it holds until the next line.
HOLDER = r"""
import json, sys
sys.path.insert(0, sys.argv[1])
import torch
from tensorwire import loader
from test_producer import ids_of
addr, token, root, batch, device = sys.argv[2], sys.argv[3].encode(), sys.argv[4], int(sys.argv[5]), sys.argv[6]
c = loader.Consumer(addr, "train", batch, token=token, root=root, device=device, timeout=120)
it = iter(c)
b = next(it)
print(json.dumps({"ids": ids_of({k: v.cpu() for k, v in b.items()}), "delivery": c.delivery}), flush=True)
sys.stdin.readline()
print(json.dumps({"ids": ids_of({k: v.cpu() for k, v in b.items()})}), flush=True)
b = next(it)
print(json.dumps({"ids": ids_of({k: v.cpu() for k, v in b.items()})}), flush=True)
sys.stdin.readline()
c.close()
"""


class DeviceCase:
    """The checks, on self.device (the producer's) and self.other (a device
    that is not it)."""

    device = None
    other = None
    slots = 8

    def setUp(self):
        self.node = Node(extra=["--loader", f"train,producer=remote,slots={self.slots},window={self.slots},"
                                            "max-wait=60s,heartbeat=10s"])
        self.node.start()
        self.addCleanup(self.node.close)

    def producer(self, dl, **kw):
        p = loader.Producer(self.node.addr, "train", dl, token=TOKEN, root=self.node.root, device=self.device,
                            **kw).start()
        self.addCleanup(p.close)
        return p

    def spawn(self, code, batch, device, *extra, stdin=False):
        proc = subprocess.Popen([sys.executable, "-c", code, HERE, self.node.addr, TOKEN.decode(), self.node.root,
                                 str(batch), device, *map(str, extra)], env=python_env(), stdout=subprocess.PIPE,
                                stdin=subprocess.PIPE if stdin else None, text=True)
        self.addCleanup(lambda: (proc.kill(), proc.wait()))
        self.addCleanup(proc.stdout.close)
        if stdin:
            self.addCleanup(proc.stdin.close)
        return proc

    def lines(self, proc, n, limit=240):
        out = []
        deadline = time.monotonic() + limit
        while len(out) < n:
            line = proc.stdout.readline()
            if not line:
                self.fail(f"the consumer process ended (status {proc.wait()}) after {out!r}")
            if line.strip() != "done":
                out.append(json.loads(line))
            self.assertLess(time.monotonic(), deadline, "hang guard")
        return out

    def test_consumers_on_the_device_get_views_every_sample_once(self):
        """A producer of batch 32 on the device and three consumer processes
        on it, of batch 16 (two views per slot), 32 (one view per slot) and
        48 (straddling slots: copied on the device): three epochs each,
        every sample exactly once, checked by content, len() batches, all
        on the device; the device blob was read once per consumer, and
        batches of 16 and 32 were views of the ring's slots."""
        dl = tud.DataLoader(Images(), batch_size=32, shuffle=True)
        p = self.producer(dl)
        procs = {b: self.spawn(CONSUMER, b, self.device, 3) for b in (16, 32, 48)}
        for b, proc in procs.items():
            got = self.lines(proc, 3)
            for r in got:
                self.assertEqual(r["error"], None)
                self.assertEqual(r["delivery"], "device", f"batch {b}")
                self.assertEqual(sorted(r["ids"]), list(range(N)), f"batch {b}, epoch {r['epoch']}")
                self.assertEqual(len(r["sizes"]), r["len"])
                self.assertEqual(r["sizes"][:-1], [b] * (r["len"] - 1))
                self.assertEqual(r["devices"], [str(torch.empty(0, device=self.torch_device()).device)])
                self.assertEqual(r["blob_reads"], 1)
            if b in (16, 32):
                # Views: one storage per slot at most, whatever the batches.
                self.assertLessEqual(got[0]["storages"], self.slots, f"batch {b}")
            self.assertEqual(proc.wait(60), 0)
        self.assertEqual(p.delivery, "device")

    def test_a_held_view_blocks_its_slot_until_the_body_returns(self):
        """A ring of 2 slots: a consumer process holds its first batch (a
        view of slot 0) in its loop's body; the producer fills slot 1 and
        then waits (it publishes nothing more, and the held view's content
        stays the same), and once the body returns it goes on."""
        self.node.close()
        self.slots = 2
        self.setUp()
        dl = tud.DataLoader(Images(), batch_size=32)
        p = self.producer(dl)
        holder = self.spawn(HOLDER, 32, self.device, stdin=True)
        first = self.lines(holder, 1)[0]
        self.assertEqual((first["ids"], first["delivery"]), (list(range(32)), "device"))
        # Slot 0 is held: batch 2 cannot be granted while the body runs.
        # The node's stats count the producer's wait for a slot as it goes
        # on (wait_ns): half a second of it, and still 2 batches published.
        wait_until(lambda: self.stats()["wait_ns"] > 5e8, 60, "the producer waiting for the held slot")
        self.assertEqual(p.published, 2)
        holder.stdin.write("go\n")
        holder.stdin.flush()
        again, nxt = self.lines(holder, 2)
        self.assertEqual(again["ids"], list(range(32)), "the view did not change while held")
        self.assertEqual(nxt["ids"], list(range(32, 64)))
        wait_until(lambda: p.published >= 3, 60, "the producer went on once the body returned")

    def test_a_killed_consumer_frees_its_slots(self):
        """A consumer process holding a view is killed (kill -9): the node
        drops it, and a consumer on the device gets every sample of the
        next epochs."""
        self.node.close()
        self.slots = 2
        self.setUp()
        dl = tud.DataLoader(Images(), batch_size=32)
        self.producer(dl)
        holder = self.spawn(HOLDER, 32, self.device, stdin=True)
        self.assertEqual(self.lines(holder, 1)[0]["delivery"], "device")
        other = self.spawn(CONSUMER, 16, self.device, 2)
        holder.send_signal(signal.SIGKILL)
        holder.wait()
        for r in self.lines(other, 2):
            self.assertEqual(sorted(r["ids"]), list(range(N)))
            self.assertEqual(r["delivery"], "device")
        wait_until(lambda: self.stats()["dropped"] >= 1, 60, "the killed consumer dropped")

    def test_a_consumer_on_another_device_takes_the_host_path(self):
        """A consumer asking for another device than the producer's gets
        copies through host memory, moved to its device: every sample once,
        and no device blob read."""
        dl = tud.DataLoader(Images(), batch_size=32, shuffle=True)
        self.producer(dl)
        r = self.lines(self.spawn(CONSUMER, 20, self.other, 1), 1)[0]
        self.assertEqual(r["delivery"], "host")
        self.assertEqual(r["blob_reads"], 0)
        self.assertEqual(sorted(r["ids"]), list(range(N)))
        self.assertEqual(r["devices"], [str(torch.empty(0, device=self.other_torch_device()).device)])

    def test_bfloat16_on_both_paths(self):
        """bfloat16 tensors (numpy has no such dtype: the host ring holds
        their bits) come out as bfloat16 with their values, as views and by
        the host path."""
        x = (torch.arange(N, dtype=torch.float32) / 4).to(torch.bfloat16)
        dl = tud.DataLoader(tud.TensorDataset(x.reshape(N, 1), torch.arange(N)), batch_size=32)
        self.producer(dl)
        for dev, delivery in ((self.device, "device"), (self.other, "host")):
            c = loader.Consumer(self.node.addr, "train", 32, token=TOKEN, root=self.node.root, device=dev,
                                timeout=60)
            self.addCleanup(c.close)
            got = {}
            for v, i in c:
                self.assertEqual(v.dtype, torch.bfloat16)
                got.update(zip(i.tolist(), v[:, 0].float().tolist()))
            self.assertEqual(c.delivery, delivery)
            self.assertEqual(got, dict(zip(range(N), x.float().tolist())))
            # Left open, it would hold the next consumer's epoch until the
            # node dropped it as silent (a minute of this test's time).
            c.close()

    def test_batches_straddling_three_slots_of_a_ring_of_two(self):
        """A ring of 2 slots of 32 and consumer batches of 60, the second of
        which spans producer batches 1, 2 and 3: copied on the device piece
        by piece, each slot released once copied, so the ring of 2 serves
        it (holding the pieces until the batch is whole would wait for a
        third slot until the node dropped the consumer). Two epochs, every
        sample once, nobody dropped."""
        self.node.close()
        self.slots = 2
        self.setUp()
        dl = tud.DataLoader(Images(), batch_size=32)
        self.producer(dl)
        c = loader.Consumer(self.node.addr, "train", 60, token=TOKEN, root=self.node.root, device=self.device,
                            timeout=60)
        self.addCleanup(c.close)
        for _ in range(2):
            sizes, ids = [], []
            for b in c:
                sizes.append(len(b["label"]))
                ids += ids_of({k: v.cpu() for k, v in b.items()})
            self.assertEqual((sizes, sorted(ids)), ([60, 60, 30], list(range(N))))
            self.assertEqual(c.delivery, "device")
        st = self.stats()
        self.assertEqual((st["dropped"], st["dropped_slow"]), (0, 0))

    def stats(self):
        with Client(self.node.addr, token=TOKEN) as cl:
            return cl.call("loader.stats", {"name": "train"}, timeout=30)

    def torch_device(self):
        return "cpu" if self.device.startswith("shm") else self.device

    def other_torch_device(self):
        return "cpu" if self.other.startswith("shm") or self.other == "cpu" else self.other


@unittest.skipIf(torch is None, "needs torch")
class TestDeviceStandIn(DeviceCase, unittest.TestCase):
    """The CPU stand-in "shm:0"; the other device is "shm:1"."""

    device = "shm:0"
    other = "shm:1"

    def test_bytes_producer_has_no_device_ring(self):
        """A producer by bytes has no mapping to put the blob in: its
        delivery is "host", and a consumer on its device takes the host
        path."""
        dl = tud.DataLoader(Images(), batch_size=32)
        p = self.producer(dl, bytes_mode=True)
        r = self.lines(self.spawn(CONSUMER, 32, self.device, 1), 1)[0]
        self.assertEqual((r["delivery"], p.delivery), ("host", "host"))
        self.assertEqual(sorted(r["ids"]), list(range(N)))

    def test_a_device_error_reaches_the_consumers(self):
        """The device failing under the producer (its copy of batch 2
        raises) is the producer's failure, as a raising DataLoader's: the
        consumers' loop raises FailedError with it, and run raises it. It
        fails once the consumer has joined: one that joins after the
        producer is gone waits for the next producer instead."""
        import threading
        from unittest import mock
        from tensorwire import _device
        real, calls, joined = _device.Ring.fill, [], threading.Event()

        def fill(ring, slot, flat, rows):
            calls.append(slot)
            if len(calls) == 3:
                joined.wait(60)
                raise RuntimeError("the device fell over")
            return real(ring, slot, flat, rows)

        with mock.patch.object(_device.Ring, "fill", fill):
            p = self.producer(tud.DataLoader(Images(), batch_size=32))
            c = loader.Consumer(self.node.addr, "train", 32, token=TOKEN, root=self.node.root, device=self.device,
                                timeout=60)
            self.addCleanup(c.close)
            joined.set()
            with self.assertRaisesRegex(loader.FailedError, "RuntimeError: the device fell over"):
                for _ in c:
                    pass
            with self.assertRaisesRegex(RuntimeError, "the device fell over"):
                p.wait(60)

    def test_every_layout_by_every_delivery(self):
        """A producer's tuple, list and lone-tensor batches come back in that
        layout by each delivery: views of the device slots, copies through
        host memory moved to another device, and host tensors (no device).
        Each consumer gets every sample of its epoch once."""
        x = torch.arange(N * 3, dtype=torch.float32).reshape(N, 3)
        y = torch.arange(N)
        loaders = [
            ("tuple", tud.DataLoader(tud.TensorDataset(x, y), batch_size=32,
                                     collate_fn=lambda s: tuple(tud.default_collate(s)))),
            ("list", tud.DataLoader(tud.TensorDataset(x, y), batch_size=32)),
            ("tensor", tud.DataLoader(x, batch_size=32)),
        ]
        for layout, dl in loaders:
            self.node.close()
            self.setUp()
            p = self.producer(dl)
            for dev, delivery in ((self.device, "device"), (self.other, "host"), (None, "host")):
                with self.subTest(layout=layout, device=dev):
                    # Closed after its epoch: a consumer still joined but
                    # not reading would hold the producer up (max-wait).
                    with loader.Consumer(self.node.addr, "train", 20, token=TOKEN, root=self.node.root,
                                         device=dev, timeout=60) as c:
                        seen = []
                        for b in c:
                            if layout == "tensor":
                                self.assertIsInstance(b, torch.Tensor)
                                bx, by = b, (b[:, 0] / 3).long()
                            else:
                                self.assertIs(type(b), tuple if layout == "tuple" else list)
                                bx, by = b
                            self.assertEqual(str(bx.device), "cpu")  # shm's tensors are CPU tensors
                            torch.testing.assert_close(bx, x[by])
                            seen += by.tolist()
                        self.assertEqual(sorted(seen), list(range(N)))
                        self.assertEqual(c.delivery, delivery)
            self.assertEqual(p.layout, layout)

    def test_bad_device_is_an_argument_error(self):
        for bad in ("tpu:0", "cuda:x", "shm:-1"):
            with self.assertRaises(InvalidArgumentError):
                loader.Producer(self.node.addr, "train", [], token=TOKEN, device=bad)
            with self.assertRaises(InvalidArgumentError):
                loader.Consumer(self.node.addr, "train", 8, token=TOKEN, device=bad)


@unittest.skipIf(torch is None, "needs torch")
class TestDeviceBlob(unittest.TestCase):
    def test_blob_format_and_views(self):
        """device.msgpack as docs/loader.md's Files table says, written
        without following a link: a consumer's views rebuilt from it alias
        the producer's slots (a write there shows through them); in the
        producer's own process, found by the blob's "local" name, they are
        the producer's slots themselves (CUDA opens no IPC handle in the
        process that made it: the device run of 2026-11-30 took the host
        path there)."""
        import tempfile
        import msgpack
        from tensorwire import _device
        schema = [{"key": ["a", "x"], "dtype": "torch.int32", "shape": [2]},
                  {"key": ["y"], "dtype": "torch.bfloat16", "shape": []}]
        dev = _device.parse("shm:3")
        ring = _device.Ring(dev, schema, 4, 2)
        with tempfile.TemporaryDirectory() as d:
            os.symlink(os.path.join(d, "elsewhere"), os.path.join(d, _device.BLOB + ".link"))
            ring.write_blob(d, "r1")
            with open(os.path.join(d, _device.BLOB), "rb") as f:
                blob = msgpack.unpackb(f.read(), raw=False)
            self.assertEqual(set(blob), {"version", "ring", "kind", "device", "identity", "batch", "slots", "local"})
            self.assertEqual((blob["version"], blob["ring"], blob["kind"], blob["device"], blob["batch"]),
                             (1, "r1", "shm", "shm:3", 4))
            self.assertEqual(len(blob["slots"]), 2)
            self.assertEqual([e["key"] for e in blob["slots"][1]], [["a", "x"], ["y"]])
            self.assertEqual(set(blob["slots"][0][0]["share"]), {"manager", "handle", "size"})
            self.assertRegex(blob["local"], "^[0-9a-f]{32}$")
            mine = _device.views(dev, _device.read_blob(d), schema)
            self.assertIs(mine[1][("a", "x")], ring.slots[1][("a", "x")])
            self.assertIs(mine[0][("y",)], ring.slots[0][("y",)])
            other = dict(blob, local="0" * 32)  # as another process sees it: no ring of that name
            for views in (mine, _device.views(dev, other, schema)):
                ev = ring.fill(1, {("a", "x"): np.arange(8, dtype=np.int32).reshape(4, 2),
                                   ("y",): np.full(4, 0x3F80, np.uint16)}, 4)  # bfloat16 1.0
                dev.wait(ev)
                self.assertEqual(views[1][("a", "x")].tolist(), [[0, 1], [2, 3], [4, 5], [6, 7]])
                self.assertEqual(views[1][("y",)].dtype, torch.bfloat16)
                self.assertEqual(views[1][("y",)].tolist(), [1.0] * 4)
                self.assertEqual(views[0][("a", "x")].tolist(), [[0, 0]] * 4)
                ring.slots[1][("a", "x")].zero_()
            self.assertIsNot(_device.views(dev, other, schema)[1][("a", "x")], ring.slots[1][("a", "x")])
            os.replace(os.path.join(d, _device.BLOB + ".link"), os.path.join(d, _device.BLOB))
            with self.assertRaises(OSError):
                _device.read_blob(d)  # a link is not followed


@unittest.skipUnless(CUDA, "no CUDA device here (torch.cuda.is_available() is false): "
                           "GPU delivery runs on a GPU machine (scripts/device.sh)")
class TestDeviceCUDA(DeviceCase, unittest.TestCase):
    """cuda:0; the other device is the host ("cpu"), or cuda:1 when there
    is one."""

    device = "cuda:0"
    other = "cuda:1" if CUDA and torch.cuda.device_count() > 1 else "cpu"


if __name__ == "__main__":
    unittest.main()
