"""The protocol's golden bytes, from Python: the same hex as rpc/golden_test.go
(each block below is checked to appear there too), written and read by this
client's codec."""

import os
import re
import tempfile
import unittest

import numpy as np

import tensorwire
from tensorwire import _msgpack, _wire
from tensorwire._td import TD

from nodes import REPO

GO_GOLDEN = os.path.join(REPO, "rpc", "golden_test.go")
GO_SHARING = os.path.join(REPO, "rpc", "sharing_test.go")


def unhex(s):
    """Hex with spaces and newlines, and quoted ASCII ("arg_len") as
    docs/protocol.md writes it, as bytes."""
    s = re.sub(r'"([^"]*)"', lambda m: m.group(1).encode().hex(), s)
    return bytes.fromhex("".join(s.split()))


def norm(s):
    return "".join(s.split())


HELLO = """
    54575250 01 01 0000
    000102030405060708090a0b0c0d0e0f101112131415161718191a1b1c1d1e1f
    a0a1a2a3a4a5a6a7a8a9aaabacadaeaf
    0000000000000000"""

REQUEST = """0000003b
    84
    a7 6172675f6c656e 03
    a8 626f64795f6c656e 00
    a6 6d6574686f64 af 74656e736f72776972652e66696c6c
    aa 74696d656f75745f7573 d2 004c4b40
    010203"""

ERROR_RESPONSE = """00000026
    84
    a7 6172675f6c656e 00
    a8 626f64795f6c656e 00
    a4 636f6465 03
    a7 6d657373616765 a3 626164"""

REASON_RESPONSE = """00000040
    85
    a7 6172675f6c656e 00
    a8 626f64795f6c656e 00
    a4 636f6465 0a
    a7 6d657373616765 a7 65787069726564
    a6 726561736f6e ae 7265706c61792e65787069726564"""

FILL = """
    83
    a3 737263 c0
    a2 7464 85
      a5 6261746368 91 d103e8
      a7 656e7472696573 91 86
        a4 64617461 c0
        a5 6474797065 ab 746f7263682e75696e7438
        a3 6b6579 91 a6 6d656d6d6170
        a4 6b696e64 a6 74656e736f72
        a3 726566 83
          a4 66696c65 94 d103e8 d10280 d10280 03
          a6 6f6666736574 00
          a4 70617468 b0 74642f6d656d6d61702e6d656d6d6170
        a5 7368617065 94 d103e8 d10280 d10280 03
      a8 6761746865726564 c2
      a3 6f7574 c3
      a4 726f7773 92 00 d103e7
    a5 76616c7565 cb 3ff0000000000000"""

DESCRIBE = """
    83
    a5 6261746368 91 d200011170
    a5 6279746573 d203567e00
    a6 6669656c6473 92
      83
        a5 6474797065 ab 746f7263682e75696e7438
        a3 6b6579 91 a6 696d61676573
        a5 7368617065 93 d200011170 1c 1c
      83
        a5 6474797065 ab 746f7263682e696e743634
        a3 6b6579 91 a6 6c6162656c73
        a5 7368617065 91 d200011170"""

# Version 2 (rpc/golden_test.go's TestGolden_Version2).
STREAM_OPEN = """00000049
    86
    a7 6172675f6c656e 01
    a8 626f64795f6c656e 00
    a6 6d6574686f64 ab 73746f72652e7761746368
    a6 73747265616d c3
    aa 74696d656f75745f7573 00
    ac 756e636f6d70726573736564 c3
    80"""

STREAM_MESSAGE = """00000016
    82
    a7 6172675f6c656e 02
    a8 626f64795f6c656e d1 6e40
    8101"""

# Compressed bodies (rpc/golden_test.go's TestGolden_Compressed): the headers
# a node writes before an LZ4 frame, which a client made with
# compression=True reads (python/tensorwire/_lz4.py).
REQUEST_COMPRESSED = """0000004a
    85
    a7 6172675f6c656e 03
    a8 626f64795f6c656e d1 0fa0
    a6 6d6574686f64 af 74656e736f72776972652e66696c6c
    a7 7261775f6c656e d2 005dc000
    aa 74696d656f75745f7573 d2 004c4b40
    010203"""

RESPONSE_COMPRESSED = """00000032
    85
    a7 6172675f6c656e 01
    a8 626f64795f6c656e d1 012c
    a4 636f6465 00
    a7 6d657373616765 a0
    a7 7261775f6c656e d2 00015f90
    80"""

STREAM_MESSAGE_COMPRESSED = """00000021
    83
    a7 6172675f6c656e 02
    a8 626f64795f6c656e d1 01f4
    a7 7261775f6c656e d1 6e40
    8101"""

STREAM_END = """00000015
    83
    a4 636f6465 00
    a3 656e64 c3
    a7 6d657373616765 a0"""

STREAM_END_REASON = """00000032
    84
    a4 636f6465 0a
    a3 656e64 c3
    a7 6d657373616765 a7 65787069726564
    a6 726561736f6e ae 7265706c61792e65787069726564"""

# Version 4 (rpc/sharing_test.go's TestGolden_Version4): the where messages.
SERVER_WHERE = "000102030405060708090a0b0c0d0e0f 0000000000000031 0000000000001234 a0a1a2a3a4a5a6a7a8a9aaabacadaeaf"
CLIENT_WHERE = "000102030405060708090a0b0c0d0e0f 000000000000002c 0000000000001234 01 00000000000000"
# Version 3's session message, as docs/protocol.md shows it.
SESSION = "000102030405060708090a0b0c0d0e0f101112131415161718191a1b1c1d1e1f 0008 000000000000"

CLIENT_PROOF = "306ff1061344549ca480bad7264e192ac43e4f4010a1ebd9d2957234ebfd01ee"
SERVER_PROOF = "b7aa7ac2bd5d596e7244fe21d8bc6a2c29771c2f893bb67246b0c8e1927d592f"
REFUSAL = "10 000b 77726f6e6720746f6b656e"


def golden_hello():
    return _wire.hello(1, bytes(range(32)), bytes(0xA0 + i for i in range(16)))


class TestGolden(unittest.TestCase):
    def test_blocks_are_go_s(self):
        """Every block here is in rpc/golden_test.go, byte for byte."""
        with open(GO_GOLDEN) as f:
            go = norm(f.read())
        for name, block in [("hello", HELLO), ("request", REQUEST), ("error response", ERROR_RESPONSE),
                            ("reason response", REASON_RESPONSE), ("fill", FILL), ("describe", DESCRIBE),
                            ("client proof", CLIENT_PROOF), ("server proof", SERVER_PROOF), ("refusal", REFUSAL),
                            ("stream open", STREAM_OPEN), ("stream message", STREAM_MESSAGE),
                            ("stream end", STREAM_END), ("stream end with a reason", STREAM_END_REASON),
                            ("request with a compressed body", REQUEST_COMPRESSED),
                            ("response with a compressed body", RESPONSE_COMPRESSED),
                            ("stream message, compressed", STREAM_MESSAGE_COMPRESSED)]:
            self.assertIn(norm(block), go, f"the {name} block is not rpc/golden_test.go's")
        with open(GO_SHARING) as f:
            go = norm(f.read())
        for name, block in [("node's where", SERVER_WHERE), ("client's where", CLIENT_WHERE)]:
            self.assertIn(norm(block), go, f"the {name} block is not rpc/sharing_test.go's")

    def test_hello(self):
        h = golden_hello()
        self.assertEqual(h, unhex(HELLO))
        version, flags, nonce, fsid = _wire.parse_hello(h)
        self.assertEqual((version, flags, nonce, fsid), (1, 1, bytes(range(32)), bytes(0xA0 + i for i in range(16))))

    def test_hello_refused(self):
        h = bytearray(golden_hello())
        for i, v in [(0, ord("X")), (5, 3), (6, 1), (60, 1)]:
            bad = bytearray(h)
            bad[i] = v
            with self.assertRaises(_wire.ProtocolError):
                _wire.parse_hello(bytes(bad))

    def test_proof(self):
        c = golden_hello()
        s = bytearray(c)
        s[8] = 0xFF  # the server's nonce starts with ff
        s = bytes(s)
        self.assertEqual(_wire.proof(b"secret", _wire.CLIENT_PROOF_LABEL, c, s).hex(), CLIENT_PROOF)
        self.assertEqual(_wire.proof(b"secret", _wire.SERVER_PROOF_LABEL, c, s).hex(), SERVER_PROOF)

    def test_status(self):
        self.assertEqual(_wire.status(0), b"\x00")
        self.assertEqual(_wire.status(16, "wrong token"), unhex(REFUSAL))
        e = _wire.refusal(16, "wrong token")
        self.assertIsInstance(e, tensorwire.UnauthenticatedError)

    def test_request(self):
        got = _wire.request_header("tensorwire.fill", 5_000_000, 3, 0) + b"\x01\x02\x03"
        self.assertEqual(got, unhex(REQUEST))

    def test_responses(self):
        self.assertEqual(_wire.response_header(3, "bad"), unhex(ERROR_RESPONSE))
        self.assertEqual(_wire.response_header(10, "expired", "replay.expired"), unhex(REASON_RESPONSE))
        r = _wire.parse_response_header(unhex(REASON_RESPONSE)[4:])
        self.assertEqual((r.code, r.message, r.reason, r.arg_len, r.body_len), (10, "expired", "replay.expired", 0, 0))
        e = r.error()
        self.assertIsInstance(e, tensorwire.replay.ExpiredError)
        self.assertIsInstance(e, tensorwire.AbortedError)
        self.assertEqual((e.code, e.reason, e.message), (10, "replay.expired", "expired"))
        r = _wire.parse_response_header(unhex(ERROR_RESPONSE)[4:])
        e = r.error()
        self.assertIs(type(e), tensorwire.InvalidArgumentError)
        self.assertEqual(e.reason, "")

    def test_other_encodings(self):
        """A response another implementation wrote (the reason first, as
        str8, an unknown key), as rpc/golden_test.go's."""
        other = unhex("""86
            a6 726561736f6e d9 02 782e
            a4 636f6465 cc 05
            a7 6d657373616765 a0
            a5 6c61746572 81 a1 6b c0
            a8 626f64795f6c656e 00
            a7 6172675f6c656e 00""")
        r = _wire.parse_response_header(other)
        self.assertEqual((r.code, r.reason, r.message), (5, "x.", ""))
        # An unregistered reason keeps its code's class.
        self.assertIs(type(r.error()), tensorwire.NotFoundError)
        # A registered reason with another code than its own matches by code.
        e = tensorwire.errors.from_wire(3, "m", "replay.expired")
        self.assertIs(type(e), tensorwire.InvalidArgumentError)
        for bad in ["", "80 00", "93 00 00 00", "81 a4 636f6465 a1 78"]:
            with self.assertRaises(_wire.ProtocolError):
                _wire.parse_response_header(bytes.fromhex(bad.replace(" ", "")))

    def test_version2(self):
        self.assertEqual(_wire.request_header("store.watch", 0, 1, 0, stream=True, uncompressed=True) + b"\x80",
                         unhex(STREAM_OPEN))
        self.assertEqual(_wire.stream_message_header(2, 28224) + b"\x81\x01", unhex(STREAM_MESSAGE))
        self.assertEqual(_wire.stream_end_header(), unhex(STREAM_END))
        self.assertEqual(_wire.stream_end_header(10, "expired", "replay.expired"), unhex(STREAM_END_REASON))
        r = _wire.parse_stream_header(unhex(STREAM_END_REASON)[4:])
        self.assertTrue(r.end)
        self.assertIsInstance(r.error(), tensorwire.replay.ExpiredError)
        r = _wire.parse_stream_header(unhex(STREAM_MESSAGE)[4:-2])
        self.assertEqual((r.end, r.arg_len, r.body_len), (False, 2, 28224))
        # Frames that mix the two kinds are refused, as rpc/golden_test.go's.
        for bad in ["82 a3 656e64 c3 a7 6172675f6c656e 01", "82 a7 6172675f6c656e 01 a4 636f6465 03"]:
            with self.assertRaises(_wire.ProtocolError):
                _wire.parse_stream_header(bytes.fromhex(bad.replace(" ", "")))
        h = _wire.hello(1, bytes(range(32)), bytes(0xA0 + i for i in range(16)), version=2)
        self.assertEqual(h, unhex(HELLO)[:4] + b"\x02" + unhex(HELLO)[5:])
        # Compressed bodies' headers: written as a node writes them, read
        # back with their raw_len.
        self.assertEqual(_wire.request_header("tensorwire.fill", 5_000_000, 3, 4000, raw_len=6_144_000) + b"\x01\x02\x03",
                         unhex(REQUEST_COMPRESSED))
        self.assertEqual(_wire.response_header(0, arg_len=1, body_len=300, raw_len=90000) + b"\x80",
                         unhex(RESPONSE_COMPRESSED))
        with self.assertRaises(_wire.ProtocolError):
            # 90,000 bytes from a frame of 300: past what any LZ4 frame
            # inflates to (255 x 300 + 1,024), refused before it is read.
            _wire.parse_response_header(unhex(RESPONSE_COMPRESSED)[4:-1])
        self.assertEqual(_wire.stream_message_header(2, 500, 28224) + b"\x81\x01", unhex(STREAM_MESSAGE_COMPRESSED))
        r = _wire.parse_stream_header(unhex(STREAM_MESSAGE_COMPRESSED)[4:-2])
        self.assertEqual((r.end, r.arg_len, r.body_len, r.raw_len), (False, 2, 500, 28224))

    def test_version4(self):
        """The where messages, as rpc/sharing_test.go pins them."""
        boot, probe = bytes(range(16)), bytes(0xA0 + i for i in range(16))
        self.assertEqual(_wire.server_where(boot, 0x31, 0x1234, probe), unhex(SERVER_WHERE))
        self.assertEqual(_wire.parse_server_where(unhex(SERVER_WHERE)), (boot, 0x31, 0x1234, probe))
        self.assertEqual(_wire.client_where(boot, 0x2C, 0x1234, "storage"), unhex(CLIENT_WHERE))
        self.assertEqual(_wire.parse_client_where(unhex(CLIENT_WHERE)), (boot, 0x2C, 0x1234, "storage"))
        self.assertEqual([_wire.client_where(boot, 1, 2, lv)[32] for lv in ("none", "storage", "coherent")], [0, 1, 2])
        # A level above 2 or reserved bytes set: refused, as the Go node refuses them.
        for at, v in [(32, 3), (33, 1), (39, 1)]:
            bad = bytearray(unhex(CLIENT_WHERE))
            bad[at] = v
            with self.assertRaises(_wire.ProtocolError):
                _wire.parse_client_where(bytes(bad))
        for size in (47, 49):
            with self.assertRaises(_wire.ProtocolError):
                _wire.parse_server_where(bytes(size))
        self.assertEqual(_wire.hello(1, bytes(range(32)), bytes(0xA0 + i for i in range(16)), version=4),
                         unhex(HELLO)[:4] + b"\x04" + unhex(HELLO)[5:])

    def test_session_message(self):
        self.assertEqual(_wire.parse_session(unhex(SESSION)), (bytes(range(32)), 8))
        bad = bytearray(unhex(SESSION))
        bad[39] = 1
        with self.assertRaises(_wire.ProtocolError):
            _wire.parse_session(bytes(bad))

    def test_decide_sharing(self):
        """rpc/sharing_test.go's decision table."""
        a = (bytes([1]) + bytes(15), 10, 99)
        for name, probed, node, client, want in [
            ("one kernel, one mount", True, a, a, "coherent"),
            ("another machine (boot ids differ)", True, a, (bytes([2]) + bytes(15), 10, 99), "storage"),
            ("another mount on one kernel", True, a, (a[0], 11, 99), "storage"),
            ("another inode on the same device", True, a, (a[0], 10, 98), "storage"),
            ("a side that cannot tell its kernel", True, (bytes(16), 10, 99), (bytes(16), 10, 99), "storage"),
            ("no file ids at all", True, (a[0], 0, 0), (a[0], 0, 0), "storage"),
            ("not the node's root (a copy)", False, a, a, "none"),
        ]:
            got, why = _wire.decide_sharing(probed, node, client)
            self.assertEqual(got, want, name)
            self.assertTrue(why, name)

    def test_probe(self):
        """A probe is read only as a node makes it: a regular, empty file
        named by its name in hex under .tensorwire-probe."""
        name = bytes(range(16))
        with tempfile.TemporaryDirectory() as root:
            self.assertFalse(_wire.read_probe(root, name))
            os.mkdir(os.path.join(root, _wire.PROBE_DIR))
            path = os.path.join(root, _wire.PROBE_DIR, name.hex())
            for text, ok in [("", True), (name.hex() + "\n", False)]:
                with open(path, "w") as f:
                    f.write(text)
                self.assertEqual(_wire.read_probe(root, name), ok, text)
            os.remove(path)
            os.mkdir(path)
            self.assertFalse(_wire.read_probe(root, name), "a folder")
            self.assertFalse(_wire.read_probe(root, bytes(16)))
            self.assertFalse(_wire.read_probe(None, name))

    def test_ints(self):
        """Integers in their smallest signed form, as go-msgpack writes them."""
        for v, want in [(0, "00"), (127, "7f"), (128, "d10080"), (-1, "ff"), (-32, "e0"), (-33, "d0df"),
                        (1000, "d103e8"), (70000, "d200011170"), (1 << 40, "d30000010000000000"),
                        ((1 << 64) - 1, "cfffffffffffffffff")]:
            self.assertEqual(_msgpack.pack_int(v).hex(), want, v)

    def test_fill_by_reference(self):
        """The seed's remote fill: a 1.2 GB TensorDict as 186 bytes. The TD is
        a np.memmap of a (sparse) file under the root."""
        with tempfile.TemporaryDirectory() as root:
            os.mkdir(os.path.join(root, "td"))
            path = os.path.join(root, "td", "memmap.memmap")
            with open(path, "wb") as f:
                f.truncate(1000 * 640 * 640 * 3)
            mm = np.memmap(path, dtype=np.uint8, mode="r+", shape=(1000, 640, 640, 3))
            td = TD({"memmap": mm}, rows=[0, 999], out=True)
            td.prepare(os.path.realpath(root))
            got = _msgpack.packb({"td": td.wire, "value": 1.0, "src": None})
            del mm
        self.assertEqual(got, unhex(FILL))
        self.assertEqual(len(got), 186)
        back = _msgpack.unpackb(got)
        self.assertEqual(back["td"]["entries"][0]["ref"]["path"], "td/memmap.memmap")

    def test_fill_by_bytes(self):
        """Outside the root the same TD travels as bytes: only its rows, gathered."""
        with tempfile.TemporaryDirectory() as root:
            a = np.arange(24, dtype=np.int32).reshape(6, 4)
            td = TD({"a": a, "sub": {"b": np.ones(6, np.float32)}}, rows=[5, 1])
            td.prepare(root)
            w = td.wire
            self.assertEqual((w["batch"], w["rows"], w["gathered"]), ([2], None, True))
            self.assertEqual([e["kind"] for e in w["entries"]], ["tensor", "dict", "tensor"])
            self.assertEqual([e["shape"] for e in w["entries"]], [[2, 4], [2], [2]])
            self.assertEqual(b"".join(p.tobytes() for p in td.parts),
                             a[[5, 1]].tobytes() + np.ones(2, np.float32).tobytes())

    def test_describe(self):
        resp = {"batch": [70000], "bytes": 56000000, "fields": [
            {"key": ["images"], "dtype": "torch.uint8", "shape": [70000, 28, 28]},
            {"key": ["labels"], "dtype": "torch.int64", "shape": [70000]},
        ]}
        self.assertEqual(_msgpack.packb(resp), unhex(DESCRIBE))
        self.assertEqual(_msgpack.unpackb(unhex(DESCRIBE)), resp)

    def test_protocol_doc_examples(self):
        """docs/protocol.md's examples are these bytes too."""
        with open(os.path.join(REPO, "docs", "protocol.md")) as f:
            doc = f.read()
        blocks = re.findall(r"```\n(.*?)```", doc, re.S)
        self.assertIn(norm(HELLO), [norm(b) for b in blocks])
        self.assertIn(norm(SESSION), [norm(b) for b in blocks])
        self.assertIn(norm(SERVER_WHERE + CLIENT_WHERE), [norm(b) for b in blocks])
        self.assertIn(unhex(REQUEST), [unhex(b) for b in blocks if b.strip().startswith("0000003b")])
        self.assertIn(unhex(REASON_RESPONSE), [unhex(b) for b in blocks if b.strip().startswith("00000040")])


if __name__ == "__main__":
    unittest.main()
