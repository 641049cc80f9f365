"""serve.replica's golden bytes from Python (serve/testdata/wire/messages.hex,
which serve/golden_test.go pins): what tensorwire.serve.Replica sends, byte
for byte, and what it reads of the node's batches."""

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

    def test_batches(self):
        b = decode(self.g["serve.replica batch, bytes"], ("in",))
        self.assertEqual((b["batch"], b["n"], b["row"]), (7, 2, 0))
        self.assertEqual((b["in"]["obs"].dtype, b["in"]["obs"].shape), (np.float32, (2, 3)))
        b = decode(self.g["serve.replica batch, by reference"], ("in",))
        self.assertEqual((b["batch"], b["n"], b["row"], b["in"]), (7, 2, 16, None))

    def test_answers(self):
        g = self.g
        self.assertEqual(self.pack(replica._answer(7, 3)), g["serve.replica answer, by reference"])
        self.assertEqual(self.pack(replica._answer(7, 3, "ValueError: boom")), g["serve.replica answer, error"])
        out = TD({"action": np.zeros(2, np.int64)}, batch=[2])
        self.assertEqual(self.pack(replica._answer(7, 3, out=out)), g["serve.replica answer, bytes"])


if __name__ == "__main__":
    unittest.main()
