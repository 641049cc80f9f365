"""The collective sidecar pipe's golden frames, from Python: this client's
encode_frame writes the bytes of cmd/tensorwire/testdata/collective_pipe.hex
(which cmd/tensorwire/collective_test.go pins from Go, and docs/protocol.md
shows), and reads the replies there."""

import os
import struct
import types
import unittest

import numpy as np

from tensorwire import collective

from nodes import REPO

# The golden requests (cmd/tensorwire/testdata/collective_pipe.hex) as the
# pipe's maps.
REQUESTS = [
    ("req-allreduce", {"id": 7, "op": "allreduce", "red": collective.MPI_SUM, "has": True, "dtype": "float32",
                       "shape": [2, 3], "size": 1 << 20, "timeout": 0}),
    ("req-scatter", {"id": 8, "op": "scatter", "has": True, "dtype": "float64", "shape": [6, 2], "numelem": 0,
                     "root": 1, "size": 1 << 20, "timeout": 30000, "axis": 0}),
    ("req-allreduce-at", {"at": 4096, "id": 10, "op": "allreduce", "red": collective.MPI_SUM, "has": True,
                          "dtype": "float32", "shape": [2, 3], "size": 1 << 20, "timeout": 0}),
    ("req-allgather-room", {"at": 4096, "id": 11, "op": "allgather", "has": True, "dtype": "float32",
                            "shape": [2, 3], "room": 8192, "size": 1 << 20, "timeout": 0}),
    ("req-allreduce-out-at", {"at": 4096, "id": 12, "op": "allreduce", "out_at": 0, "red": collective.MPI_SUM,
                              "has": True, "dtype": "float32", "shape": [2, 3], "size": 1 << 20, "timeout": 0}),
    ("req-irecv-keep", {"at": 8192, "id": 13, "keep": True, "op": "irecv", "peer": 1, "has": True, "dtype": "float32",
                        "shape": [2, 3], "size": 1 << 20, "timeout": 0}),
    ("req-isend-quiet", {"at": 8192, "id": 14, "keep": True, "op": "isend", "peer": 1, "quiet": True, "has": True,
                         "dtype": "float32", "shape": [2, 3], "size": 1 << 20, "timeout": 0}),
    ("req-wait", {"id": 9, "op": "wait", "req": 8, "size": 1 << 20}),
]


def golden():
    out, name = {}, None
    with open(os.path.join(REPO, "cmd", "tensorwire", "testdata", "collective_pipe.hex")) as f:
        for line in f:
            line = line.strip()
            if line.startswith("# ") and ":" in line and " " not in line[2:line.index(":")]:
                name = line[2:line.index(":")]
            elif line and not line.startswith("#"):
                out[name] = bytes.fromhex(line)
    return out


class TestCollectiveGolden(unittest.TestCase):
    def setUp(self):
        self.g = golden()

    def test_requests(self):
        for name, req in REQUESTS:
            with self.subTest(name):
                self.assertEqual(collective.encode_frame(req).hex(), self.g[name].hex())

    def test_templates(self):
        """A communicator's calls encode their requests from cached templates
        (the request without its id, the input's dtype and shape added),
        filling in the id and the data file's size: the same bytes."""
        for name, req in REQUESTS:
            with self.subTest(name):
                call = {k: v for k, v in req.items() if k not in ("size", "has", "dtype", "shape")}
                a = np.zeros(req["shape"], req["dtype"]) if req.get("has") else None
                sidecar = types.SimpleNamespace(_templates={})
                t = collective._Sidecar._template(sidecar, call, a)
                self.assertEqual(t.frame(req["id"], req["size"]).hex(), self.g[name].hex())
                self.assertIs(collective._Sidecar._template(sidecar, dict(call, id=99), a), t)  # cached

    def test_bell(self):
        """The bell file's words (join(spin=...)): the request's id at
        offset 0, the reply's at 64, as the sidecar reads and writes them."""
        page = bytearray(collective._BELL_SIZE)
        words = memoryview(page).cast("I")
        words[collective._BELL_REQ] = 7
        words[collective._BELL_RESP] = 7
        words.release()
        self.assertEqual(bytes(page[:68]).hex(), self.g["bell-7"].hex())
        self.assertFalse(any(page[68:]))

    def test_replies(self):
        def body(name):
            b = self.g[name]
            self.assertEqual(struct.unpack(">I", b[:4])[0], len(b) - 4)
            return collective.decode_frame(b[4:])
        self.assertEqual(body("resp-out"), {"id": 7, "out": True, "dtype": "float32", "shape": [2, 3], "size": 1 << 20})
        self.assertEqual(body("resp-out-at"), {"id": 10, "off": 4096, "out": True, "dtype": "float32", "shape": [2, 3],
                                               "size": 1 << 20})
        self.assertEqual(body("resp-hello"), {"pipe": 5, "rank": 2, "world": 4, "transport": "shm"})
        err = body("resp-error")
        e = collective.from_wire(err["code"], err["msg"], err["reason"])
        self.assertIsInstance(e, collective.MismatchError)
        self.assertIn("ranks disagree", str(e))


if __name__ == "__main__":
    unittest.main()
