"""Hostile bytes against the client's decoders, each a fault found by an
audit: a peer's frame that got an exception other than the library's own
(numpy's ValueError), or that broke a connection a well-behaved node keeps
using. Direct calls of the decoders where they suffice; nodes.ScriptedNode
where the connection's state is the point."""

import socket
import unittest

import numpy as np

import tensorwire
from tensorwire import _msgpack, _td, _yamux
from tensorwire._td import TD, wire_entries
from tensorwire.errors import InternalError

from nodes import ScriptedNode


def _good_message():
    t = TD({"x": np.arange(8, dtype=np.uint8)})
    t.prepare(None)
    return _msgpack.packb({"td": t.wire}), t.parts[0].tobytes()


def _td_of_dims(ndim):
    """A wire TD holding one uint8 tensor of ndim dimensions of 1 (one
    body byte)."""
    return {"batch": [], "rows": None, "gathered": False, "out": False,
            "entries": [{"key": ["x"], "kind": "tensor", "dtype": "torch.uint8", "shape": [1] * ndim,
                         "ref": None, "data": None}]}


class TestTooManyDimensions(unittest.TestCase):
    """A tensor of more dimensions than numpy's arrays have (32 before
    numpy 2) passed _entries' checks, its byte count small; np.empty then
    raised numpy's ValueError: a call's error that is not the library's, and
    in a message stream a recv that raised it again at every later recv
    (the message was never skipped)."""

    def test_wire_entries_refuses_it(self):
        with self.assertRaises(InternalError) as cm:
            wire_entries(_td_of_dims(65))
        self.assertIn("shape", str(cm.exception))
        with self.assertRaises(InternalError):  # numpy's own limit here, 32 before numpy 2
            wire_entries(_td_of_dims(_td._MAX_DIMS + 1))
        entries, n = wire_entries(_td_of_dims(32))  # numpy's limit, every version: fine
        self.assertEqual(n, 1)

    def test_call_then_next_call(self):
        arg, body = _good_message()
        node = ScriptedNode([(_msgpack.packb({"td": _td_of_dims(65)}), b"\x07"), (arg, body)])
        try:
            with tensorwire.Client(node.addr, timeout=10) as c:
                with self.assertRaises(InternalError):
                    c.call("liar.get", {}, timeout=10, result_tds=("td",))
                got = c.call("liar.get", {}, timeout=10, result_tds=("td",))
                np.testing.assert_array_equal(got["td"]["x"], np.arange(8, dtype=np.uint8))
        finally:
            node.close()

    def test_stream_goes_on(self):
        arg, body = _good_message()
        node = ScriptedNode([], [(_msgpack.packb({"td": _td_of_dims(65)}), b"\x07"), (arg, body)])
        try:
            with tensorwire.Client(node.addr, timeout=10) as c:
                ms = c.open_stream("liar.watch", {}, timeout=10, result_tds=("td",))
                with self.assertRaises(InternalError):
                    ms.recv()
                got = ms.recv()
                np.testing.assert_array_equal(got["td"]["x"], np.arange(8, dtype=np.uint8))
                with self.assertRaises(tensorwire.rpc.StreamEnd):
                    ms.recv()
                ms.close()
        finally:
            node.close()


class TestClosedStreamWindow(unittest.TestCase):
    """A stream this side closed (Pending.cancel, a response abandoned
    mid-body) drops what still arrives on it and gives that window back to
    the node, as it gives back what was buffered when it closed; but the
    receive window it checks data frames against was not raised by those
    credits. A node that then sent, within the window it was given, more
    than one window's worth broke the whole session (a yamux protocol
    violation: every other call on the connection failed)."""

    def setUp(self):
        self.a, self.b = socket.socketpair()
        self.b.setblocking(False)
        self.s = _yamux.Session(self.a, window=_yamux.INITIAL_WINDOW, keepalive=0)
        self.st = self.s.open_stream()

    def tearDown(self):
        self.s.close()
        self.b.close()

    def feed(self, length):
        """A data frame of length bytes from the node on the stream."""
        out = []
        with self.s.mu:
            self.s._dispatch(memoryview(_yamux.frame(_yamux.TYPE_DATA, 0, self.st.id, length) + bytes(length)), out)
        return out

    def test_dropped_data_credited(self):
        w = _yamux.INITIAL_WINDOW
        self.st.close()
        for _ in range(3):  # each frame fills the window the node was given back
            out = self.feed(w)
            self.assertEqual(out, [_yamux.frame(_yamux.TYPE_WINDOW, 0, self.st.id, w)])
        self.assertIsNone(self.s.err)

    def test_buffered_credit_at_close(self):
        w = _yamux.INITIAL_WINDOW
        self.feed(100)  # buffered, never read
        self.st.close()  # gives those 100 bytes back: the node may send w again
        self.feed(w)
        self.assertIsNone(self.s.err)
        with self.assertRaises(_yamux._ProtocolViolation):
            self.feed(w + 1)  # past the window it was given: still refused


if __name__ == "__main__":
    unittest.main()
