"""serve.replica's golden bytes from Python (serve/testdata/wire/messages.hex,
which serve/golden_test.go pins): what tensorwire.serve.Replica sends, byte
for byte, and what it reads of the node's batches."""

import os
import re
import unittest

import numpy as np

from tensorwire import _msgpack, rpc, replica
from tensorwire._td import TD

from test_golden_services import decode, golden


class TestGoldenReplica(unittest.TestCase):
    def setUp(self):
        self.g = golden("serve")

    def pack(self, arg):
        for td in rpc._find_tds(arg, []):
            td.prepare(None)
        return _msgpack.packb(rpc._wire_form(arg))

    def test_requests(self):
        g = self.g
        self.assertEqual(self.pack(replica._request("policy", "", 2)), g["serve.replica request, bytes"])
        self.assertEqual(self.pack(replica._request("policy", ".tensorwire-serve/clients/00112233aabbccdd", 2)),
                         g["serve.replica request, by reference"])
        self.assertEqual(self.pack(replica._request("policy", ".tensorwire-serve/clients/00112233aabbccdd", 1, True)),
                         g["serve.replica request, by reference, with a lane"])

    def test_batches(self):
        b = decode(self.g["serve.replica batch, bytes"], ("in",))
        self.assertEqual((b["batch"], b["n"], b["row"]), (7, 2, 0))
        self.assertEqual((b["in"]["obs"].dtype, b["in"]["obs"].shape), (np.float32, (2, 3)))
        b = decode(self.g["serve.replica batch, by reference"], ("in",))
        self.assertEqual((b["batch"], b["n"], b["row"], b["in"]), (7, 2, 16, None))
        ack = decode(self.g["serve.replica batch 0, the lane's ack"], ("in",))
        self.assertTrue(replica._is_request(ack))
        self.assertEqual((ack["batch"], ack["n"]), (0, 0))

    def test_lane_frames(self):
        """docs/protocol.md's lane frames, which serve/lane_test.go checks
        the Go side against."""
        doc = open(os.path.join(os.path.dirname(__file__), "..", "..", "docs", "protocol.md")).read()
        block = doc.split("<!-- begin serve lane frames -->")[1].split("<!-- end serve lane frames -->")[0]
        frames = {m.group(1): bytes.fromhex(m.group(2)) for m in re.finditer(r"^# ([^:]+): ([0-9a-f ]+)$", block, re.M)}
        self.assertEqual(set(frames), {"batch", "answer", "answer, error"})
        self.assertEqual(replica._LANE_BATCH.unpack(frames["batch"]), (7, 16, 2))
        self.assertEqual(replica._lane_answer(7, 3), frames["answer"])
        self.assertEqual(replica._lane_answer(7, 3, "ValueError: boom"), frames["answer, error"])
        long = replica._lane_answer(7, 3, "x" * 10000)
        self.assertEqual(len(long), 4096)  # one atomic pipe write

    def test_answers(self):
        g = self.g
        self.assertEqual(self.pack(replica._answer(7, 3)), g["serve.replica answer, by reference"])
        self.assertEqual(self.pack(replica._answer(7, 3, "ValueError: boom")), g["serve.replica answer, error"])
        out = TD({"action": np.zeros(2, np.int64)}, batch=[2])
        self.assertEqual(self.pack(replica._answer(7, 3, out=out)), g["serve.replica answer, bytes"])


if __name__ == "__main__":
    unittest.main()
