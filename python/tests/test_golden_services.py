"""The store, serve and loader services' golden bytes, from Python: the
messages of {store,serve,loader}/testdata/wire/messages.hex (which the Go
packages' golden_test.go check, and docs/protocol.md shows), as this
client's calls write them and read them.

The client is driven through its own methods against a fake rpc.Client that
encodes each argument as rpc.Client does (TDs by bytes) and answers with the
golden responses, decoded as rpc.Client decodes them (TDs built from a body).

Go writes an unsigned field (an id, a revision) in its smallest *unsigned*
msgpack form, this client every integer in its smallest signed one: where a
request carries such a field between 128 and 2**63-1 (the ids below), the
bytes differ in that integer alone, which signed() spells out; the Go node
reads both (the Go packages' TestGolden_PythonIntegers)."""

import io
import os
import random
import re
import struct
import threading
import time
import unittest
from unittest import mock

import numpy as np

from tensorwire import _msgpack, errors, loader, rpc, serve, store
from tensorwire._td import build, wire_bytes

from nodes import REPO
from test_golden import unhex

REQ_CLIENT = 0x1234567890ABCDEF  # store/golden_test.go's goldenReq.Client
TAKE = 0xFEDCBA9876543210
SERVE_CLIENT = 0x1234567890ABCDEF  # serve/golden_test.go's goldenClient


def parse(text):
    """{name: bytes} of a golden file's text ("# NAME" lines, then hex), and
    the names in order."""
    names, msgs, name, body = [], {}, None, []
    for line in text.split("\n") + [None]:
        if line is None or line.strip().startswith("# "):
            if name is not None:
                names.append(name)
                msgs[name] = unhex("\n".join(body))
            name, body = line and line.strip()[2:], []
        else:
            body.append(line)
    return names, msgs


def golden(service):
    with open(os.path.join(REPO, service, "testdata", "wire", "messages.hex")) as f:
        return parse(f.read())[1]


def signed(b, *values):
    """b with each of values written in its smallest signed form instead of
    its smallest unsigned one, as this client writes integers."""
    for v in values:
        assert 128 <= v < 1 << 63
        for fmt, tag in ((">B", 0xCC), (">H", 0xCD), (">I", 0xCE), (">Q", 0xCF)):
            if v < 1 << (8 * struct.calcsize(fmt)):
                unsigned = bytes((tag,)) + struct.pack(fmt, v)
                break
        assert unsigned in b, (unsigned.hex(), b.hex())
        b = b.replace(unsigned, _msgpack.pack_int(v))
    return b


def decode(raw, result_tds):
    """A result as rpc.Client returns it: msgpack decoded, the TDs at
    result_tds built from a body (zeros) of the size their wire forms say."""
    value = _msgpack.unpackb(raw)
    rtds = rpc._result_tds(value, result_tds)
    body = io.BytesIO(bytes(sum(wire_bytes(w) for _, _, w in rtds)))
    for parent, k, w in rtds:
        parent[k] = build(w, body.readinto)
    assert body.read() == b""
    return value


class _Done:
    """A call answered already, as rpc.Pending has one."""

    def __init__(self, value):
        self.value = value

    def wait(self, timeout=None):
        pass  # answered: Pending.wait returns at once

    def result(self):
        return self.value

    def cancel(self):
        pass


class _Stream:
    """A message stream: recv() the messages given, then StreamEnd."""

    def __init__(self, fake, messages, result_tds):
        self.fake, self.messages, self.result_tds = fake, list(messages), result_tds

    def recv(self, timeout=None, into=None):
        # into (where a real stream reads a message's rows) changes no byte
        # on the wire: the messages are decoded into new arrays here.
        if not self.messages:
            raise rpc.StreamEnd()
        return decode(self.messages.pop(0), self.result_tds)

    def send(self, arg, timeout=None):
        self.fake.encode("send", arg)

    def close_send(self):
        pass

    def close(self):
        pass


class Fake(rpc.Client):
    """An rpc.Client that records the bytes of the arguments it is given and
    answers with responses[method] (bytes; a stream: a list of messages)."""

    def __init__(self, responses, root=None, sharing="none"):
        self._root, self._closed, self._level = root, False, sharing
        self.responses = dict(responses)
        self.sent = []  # (method, argument bytes)
        self.mu = threading.Lock()
        self.on_call = {}  # method: called with the argument

    def sharing(self, timeout=None):
        return self._level

    def close(self):
        self._closed = True

    def encode(self, method, arg):
        arg = {} if arg is None else arg
        for td in rpc._find_tds(arg, []):
            td.prepare(None)
        b = _msgpack.packb(rpc._wire_form(arg))
        with self.mu:
            self.sent.append((method, b))
        if method in self.on_call:
            self.on_call[method](arg)
        return b

    def start(self, method, arg=None, timeout=None, result_tds=()):
        self.encode(method, arg)
        return _Done(decode(self.responses[method], result_tds))

    def call(self, method, arg=None, timeout=None, result_tds=(), into=None):
        return self.start(method, arg, timeout, result_tds).result()  # into: as _Stream.recv's

    def open_stream(self, method, arg=None, timeout=None, result_tds=()):
        self.encode(method, arg)
        return _Stream(self, self.responses[method], result_tds)

    def last(self, method):
        with self.mu:
            return [b for m, b in self.sent if m == method][-1]


def obs():
    return {"obs": np.zeros((2, 3), np.float32)}


class TestGoldenStore(unittest.TestCase):
    def setUp(self):
        self.g = golden("store")
        g = self.g
        self.fake = Fake({
            "store.info": g["store.info response"], "store.put": g["store.put response"],
            "store.append": g["store.put response"], "store.extend": g["store.put response"],
            "store.take": g["store.take response"],
            "store.ack": g["store.ack response"], "store.list": g["store.list response"],
            "store.delete": g["store.delete response"], "store.publish": g["store.publish response"],
            "store.read": g["store.read response"], "store.renew": g["store.renew response"],
            "store.release": g["store.release response"], "store.watch": [g["store.watch message"]],
            "store.stats": g["store.stats response"],
        })
        self.st = store.Store(self.fake, "main")
        self.st._req_client, self.st._seq = REQ_CLIENT, 6

    def tearDown(self):
        self.st.close()

    def test_info(self):
        g = self.g
        self.assertEqual(self.fake.last("store.info"), g["store.info request"])
        self.assertEqual(self.st.info, {"id": "0123456789abcdef0123456789abcdef", "dir": "stores/main",
                                        "inline_bytes": 4096, "max_value_bytes": 1 << 30, "lease_ms": 30000,
                                        "get_timeout_ms": 60000, "no_sync": True})
        self.assertEqual(self.st.mode, "bytes")

    def test_put_append_delete_publish(self):
        g = self.g
        self.assertEqual(self.st.put("data", obs(), batch_size=(2,)), 42)
        self.assertEqual(self.fake.last("store.put"), signed(g["store.put request"], REQ_CLIENT))
        self.st._seq = 6
        self.assertEqual(self.st.append("data", obs(), batch_size=(2,)), 42)
        self.assertEqual(self.fake.last("store.append"), signed(g["store.put request"], REQ_CLIENT))
        self.st._seq = 6
        self.assertEqual(self.st.extend("data", [obs(), obs()], batch_size=(2,)), 42)
        self.assertEqual(self.fake.last("store.extend"), signed(g["store.extend request"], REQ_CLIENT))
        self.st._seq = 6
        self.assertEqual(self.st.delete("data"), 45)
        self.assertEqual(self.fake.last("store.delete"), signed(g["store.delete request"], REQ_CLIENT))
        self.st._seq = 6
        self.assertEqual(self.st.publish("params", obs(), batch_size=(2,)), 3)
        self.assertEqual(self.fake.last("store.publish"), signed(g["store.publish request"], REQ_CLIENT))
        # A staged value this client never sends; it reads as one.
        v = _msgpack.unpackb(g["store.put request, staged"])["value"]
        self.assertEqual(v, {"td": None, "staged": "staging/0123456789abcdef0123456789abcdef"})

    def test_get(self):
        """A Get by reference: the take and the ack; the items by bytes and by path."""
        g = self.g
        self.st._ref, self.fake._root = True, "/root"
        with mock.patch.object(random, "getrandbits", return_value=TAKE), \
                mock.patch.object(store, "load_memmap", side_effect=lambda p: ("mapped", p)):
            items = self.st.get("data")
        self.assertEqual(self.fake.last("store.take"), g["store.take request"])
        # get acknowledges with drop false; a give-back (drop true) is the golden one.
        self.assertEqual(self.fake.last("store.ack"),
                         g["store.ack request"].replace(unhex('a4 "drop" c3'), unhex('a4 "drop" c2')))
        self.st._give_back(TAKE)
        self.assertEqual(self.fake.last("store.ack"), g["store.ack request"])
        self.assertEqual(len(items), 2)
        self.assertEqual(set(items[0]), {"obs"})
        self.assertEqual((items[0]["obs"].dtype, items[0]["obs"].shape), (np.float32, (2, 3)))
        self.assertEqual(items[1], ("mapped", os.path.join("/root", "stores", "main", "values", "0123456789abcdef")))

    def test_list_and_stats(self):
        g = self.g
        self.assertEqual(self.st.list(), ({"data": 3}, 44))
        self.assertEqual(self.fake.last("store.list"), g["store.info request"])
        self.assertEqual(self.st.stats(), {"revision": 47, "bins": 1, "items": 3, "inline_bytes": 72, "params": 1,
                                           "versions": 2, "leases": 1, "gets": 1, "log_bytes": 8192, "missing": 1,
                                           "stopped": "failed"})
        self.assertEqual(self.fake.last("store.stats"), g["store.info request"])

    def test_read_by_reference(self):
        """wait_newer by reference, its lease renewed (and found lost) and released."""
        g = self.g
        self.st._ref, self.fake._root = True, "/root"
        with mock.patch.object(store, "load_memmap", side_effect=lambda p: ("mapped", p)):
            p = self.st.wait_newer("params", 2)
        self.assertEqual(self.fake.last("store.read"), g["store.read request"])
        self.assertEqual((p.version, p.lease, p.td), (3, 9, ("mapped", os.path.join("/root", "stores", "main", "values",
                                                                                  "00000000000000a1"))))
        # The renewer: one round, after which the store counts as closed.
        self.fake.on_call["store.renew"] = lambda arg: setattr(self.st, "_closed", True)
        self.st._renew(3)
        self.assertEqual(self.fake.last("store.renew"), g["store.renew request"])
        self.assertIsInstance(p.err, store.ExpiredError)
        self.st._closed = False
        p.close()
        self.assertEqual(self.fake.last("store.release"), g["store.release request"])

    def test_read_by_bytes(self):
        self.fake.responses["store.read"] = self.g["store.read response, bytes"]
        p = self.st.latest("params")
        self.assertEqual((p.version, p.lease, set(p.td)), (3, 0, {"obs"}))
        self.assertEqual(p.td["obs"].shape, (2, 3))

    def test_watch(self):
        g = self.g
        with self.st.watch("da", after=40) as w:
            evs = list(w)
        self.assertEqual(self.fake.last("store.watch"), g["store.watch request"])
        self.assertEqual(evs, [store.Event(41, "append", "data", 3, 0), store.Event(46, "publish", "params", 0, 3)])
        self.assertEqual(w.after, 47)


class TestGoldenServe(unittest.TestCase):
    def setUp(self):
        g = self.g = golden("serve")
        self.fake = Fake({
            "serve.info": g["serve.info response"], "serve.register": g["serve.register response"],
            "serve.renew": g["serve.renew response"], "serve.unregister": g["serve.renew response"],
            "serve.predict": g["serve.predict response, bytes"], "serve.stats": g["serve.stats response"],
        })
        self.c = serve.Client(self.fake, "policy")

    def tearDown(self):
        self.c.close()

    def test_info_and_stats(self):
        g = self.g
        self.assertEqual(self.fake.last("serve.info"), g["serve.info request"])
        self.assertEqual((self.c.max_batch, self.c._in, self.c._out),
                         (256, [(("obs",), "torch.float32", (3,))], [(("action",), "torch.int64", ())]))
        self.assertEqual(self.c.info["policy"], "max_delay=2ms")
        self.assertEqual(self.c.stats(), {"requests": 1000, "queue_full": 2, "batches": 300, "rows": 998,
                                          "failed": 1, "failed_rows": 4, "replaced": 1, "switches": 2,
                                          "forward_ns": 1_500_000_000, "queued": 5, "version": 3,
                                          "sizes": [0, 100, 150, 50], "clients": 1})
        self.assertEqual(self.fake.last("serve.stats"), g["serve.info request"])

    def test_predict_by_bytes(self):
        g = self.g
        out, version = self.c.predict(np.zeros((2, 3), np.float32), return_version=True)
        self.assertEqual(self.fake.last("serve.predict"), g["serve.predict request, bytes"])
        self.assertEqual(version, 3)
        self.assertEqual((set(out), out["action"].dtype, out["action"].shape), ({"action"}, np.int64, (2,)))

    def test_by_reference(self):
        """A registration (this client registers no ring: "ring" false), its
        renewal, a predict request by reference, and the unregistration."""
        g = self.g
        c = self.c
        c._rel, c.slots = "clients/a", 512
        c._register(0, None)
        self.assertEqual(self.fake.last("serve.register"),
                         g["serve.register request"].replace(unhex('a4 "ring" c3'), unhex('a4 "ring" c2')))
        self.assertEqual((c._id, c._lease_ms), (SERVE_CLIENT, 30000))
        self.fake.on_call["serve.renew"] = lambda arg: c._stop.set()
        c._renew_every(0.001)
        self.assertEqual(self.fake.last("serve.renew"), signed(g["serve.renew request"], SERVE_CLIENT))
        c._ref = True
        req = c._request({"obs": np.zeros((2, 3), np.float32)}, None, False, True)
        req.reg, req.start = c._id, 300
        self.assertEqual(self.fake.encode("serve.predict", c._arg(req)),
                         signed(g["serve.predict request, by reference"], SERVE_CLIENT))
        resp = decode(g["serve.predict response, by reference"], ())
        self.assertEqual(resp, {"version": 3, "out": None})
        c._ref = False
        c.close()
        self.assertEqual(self.fake.last("serve.unregister"), signed(g["serve.renew request"], SERVE_CLIENT))

    def test_failure(self):
        """serve.failure is the bell's, which this client does not ring: its
        request reads back."""
        self.assertEqual(_msgpack.unpackb(self.g["serve.failure request"]),
                         {"name": "policy", "client": SERVE_CLIENT, "start": 300, "seq": 70000})


class TestGoldenLoader(unittest.TestCase):
    def setUp(self):
        g = self.g = golden("loader")
        self.fake = Fake({
            "loader.join": g["loader.join response"], "loader.leave": g["loader.leave response"],
            "loader.consume": [g["loader.consume message, bytes"], g["loader.consume message, by reference"]],
            "loader.stats": g["loader.stats response"],
        })
        self.c = loader.Consumer(self.fake, "mnist", 64)

    def tearDown(self):
        self.c.close()

    def test_join_and_consume(self):
        g = self.g
        self.assertEqual(self.fake.last("loader.join"), g["loader.join request"])
        self.assertEqual(self.fake.last("loader.consume"), g["loader.consume request"])
        self.assertEqual((self.c.mode, self.c.samples, len(self.c), self.c.epoch), ("bytes", 60000, 938, 2))
        self.assertEqual(self.c.schema, [{"key": ["images"], "dtype": "torch.uint8", "shape": [28, 28]},
                                         {"key": ["labels"], "dtype": "torch.int64", "shape": []}])
        s = self.c._sess
        self.assertEqual((s.info["ring"], s.info["consumer"], s.info["prefix"], s.info["batch"], s.info["slots"],
                          s.info["heartbeat_ms"]),
                         ("0123456789abcdef0123456789abcdef", 3, "loaders/mnist", 256, 8, 5000))
        # The bytes message's announcement is kept small (2 rows) and is not
        # one the joined producer sends (batch 5 of batches of 256 has 256):
        # the consumer refuses it (_check_announcement); its bytes decode so.
        with self.assertRaises(errors.InternalError) as cm:
            self.c._next(s, 2, 5)
        self.assertIn("this one of 256 rows", str(cm.exception))
        m = decode(g["loader.consume message, bytes"], ("rows",))
        a, rows = m["batch"], m["rows"]
        self.assertEqual(a, {"epoch": 2, "index": 5, "count": 235, "slot": 5, "word": 1000 << 2 | 2, "rows": 2})
        self.assertEqual((set(rows), rows["images"].dtype, rows["images"].shape), ({"images"}, np.uint8, (2, 28, 28)))
        s.bytes = False  # by reference: the rows are in the ring
        a, rows = self.c._next(s, 2, 234)
        s.bytes = True
        self.assertEqual((a, rows), ({"epoch": 2, "index": 234, "count": 235, "slot": 2, "word": 1229 << 2 | 2,
                                      "rows": 96}, None))
        # The ack: done with every batch before index 6.
        s.release(2, 6)
        deadline = time.monotonic() + 10
        while not [b for m, b in self.fake.sent if m == "send"] and time.monotonic() < deadline:
            time.sleep(0.01)
        self.assertEqual(self.fake.last("send"), g["loader.consume ack"])

    def test_leave_and_stats(self):
        g = self.g
        self.c._leave(self.c._sess.info)
        self.assertEqual(self.fake.last("loader.leave"), g["loader.leave request"])
        st = self.c.stats()
        self.assertEqual(self.fake.last("loader.stats"), g["loader.stats request"])
        self.assertEqual(st, {"consumers": 2, "joined": 4, "dropped": 1, "dropped_slow": 1, "left": 1, "epoch": 2,
                              "running": True, "window": True, "published": 475, "in_epoch": 5, "epochs": 2,
                              "cut_short": 1, "wait_ns": 1_500_000, "samples": 60000, "batch": 256, "slots": 8,
                              "failed": "source: read: EIO"})


class TestGoldenProducer(unittest.TestCase):
    """The Producer (a producer process of a remote loader) writes and reads
    loader.produce's golden messages."""

    def run_producer(self, batches, messages):
        g = golden("loader")
        fake = Fake({"loader.produce": [g[m] for m in messages]})
        p = loader.Producer(fake, "mnist", batches, samples=2, epochs=1)
        return g, fake, p

    def test_produce_bytes(self):
        g, fake, p = self.run_producer([{"images": np.zeros((2, 28, 28), np.uint8)}],
                                       ["loader.produce message, attached", "loader.produce message, grant"])
        p.run()
        self.assertEqual(fake.last("loader.produce"), g["loader.produce request"])
        self.assertEqual(fake.last("send"), g["loader.produce published, bytes"])
        self.assertEqual((p.mode, p.layout, p.batch_size, p.samples, p.epochs_done), ("bytes", "dict", 2, 2, 1))

    def test_produce_error(self):
        def failing():
            yield {"images": np.zeros((2, 28, 28), np.uint8)}
            raise ValueError("sample 37 is corrupt")
        g, fake, p = self.run_producer(_Reiterable(failing), ["loader.produce message, attached",
                                                              "loader.produce message, grant"])
        with self.assertRaises(ValueError):
            p.run()
        self.assertEqual(fake.last("send"), g["loader.produce error"])

    def test_reads_by_reference_and_layout(self):
        """The published message by reference, and a join response with a
        layout, read back."""
        g = golden("loader")
        self.assertEqual(_msgpack.unpackb(g["loader.produce published, by reference"]),
                         {"error": "", "published": {"count": 1, "epoch": 2, "index": 0, "rows": 2, "slot": 5},
                          "rows": None})
        fake = Fake({"loader.join": g["loader.join response, a producer process's"], "loader.consume": []})
        c = loader.Consumer(fake, "mnist", 2)  # its ring holds 16 rows
        try:
            out = c._out({("0",): np.zeros((2, 28, 28), np.uint8)}, 2)
            self.assertIsInstance(out, tuple)
            self.assertEqual(len(out), 1)
        finally:
            c.close()


class _Reiterable:
    def __init__(self, gen):
        self.gen = gen

    def __iter__(self):
        return self.gen()


class TestGoldenDoc(unittest.TestCase):
    def test_protocol_doc(self):
        """docs/protocol.md shows each service's golden file, message for message."""
        with open(os.path.join(REPO, "docs", "protocol.md")) as f:
            doc = f.read()
        for service in ("store", "serve", "loader"):
            m = re.search(r"<!-- begin %s messages -->\n```\n(.*?)```\n<!-- end %s messages -->" % (service, service),
                          doc, re.S)
            self.assertIsNotNone(m, service)
            with open(os.path.join(REPO, service, "testdata", "wire", "messages.hex")) as f:
                self.assertEqual(parse(m.group(1)), parse(f.read()), service)


if __name__ == "__main__":
    unittest.main()
