"""A client of a tensorwire node: docs/protocol.md.

    import tensorwire
    c = tensorwire.Client("127.0.0.1:7070", token=open("token", "rb").read().strip())
    print(c.call("tensorwire.stats", {}))

A Client keeps one connection (a yamux session) and a pool of idle streams
on it, and dials again, transparently, when the connection has died and a
new call comes. A call is never retried by the Client once its request may
have reached the node: a call cut off by the connection failing raises
UnavailableError, and the caller decides (the replay client retries the
calls it can retry safely). A Client is safe for use from several threads;
calls run in parallel on their own streams.
"""

import os
import socket
import struct
import threading
import time

from . import _msgpack, _wire, _yamux
from ._td import TD, build, wire_bytes
from .errors import (CanceledError, ClientClosedError, InternalError, InvalidArgumentError, TensorwireError,
                     UnauthenticatedError, UnavailableError)

__all__ = ["Client", "TD", "read_token"]

HANDSHAKE_TIMEOUT = 10.0
_ALIVE_CHECK_AFTER = 1.0  # an idle stream older than this is checked before reuse
_MAX_IDLE_STREAMS = 64


def read_token(path):
    """The token in a token file, as `tensorwire node --token-file` reads it:
    the file's bytes without trailing CR and LF."""
    with open(path, "rb") as f:
        token = f.read().rstrip(b"\r\n")
    if not token:
        raise ValueError(f"token file {path} is empty")
    return token


def _split_addr(addr):
    host, sep, port = addr.rpartition(":")
    if not sep or not port.isdigit():
        raise InvalidArgumentError(f"address {addr!r}: want HOST:PORT")
    return host.strip("[]") or "localhost", int(port)


class _Conn:
    """One connection: its session, whether the node shares this side's
    root, and its idle streams."""

    def __init__(self, session, shared):
        self.session = session
        self.shared = shared
        self.idle = []
        self.mu = threading.Lock()

    def stream(self):
        while True:
            with self.mu:
                st = self.idle.pop() if self.idle else None
            if st is None:
                return self.session.open_stream()
            if time.monotonic() - st.idle_since > _ALIVE_CHECK_AFTER:
                self.session.drain()
            with self.session.mu:
                alive = not (st.remote_fin or st.reset or st.buffered)
            if alive:
                return st
            st.close()

    def put(self, st):
        st.idle_since = time.monotonic()
        with self.mu:
            if len(self.idle) < _MAX_IDLE_STREAMS and not self.session.closed:
                self.idle.append(st)
                return
        st.close()


class Client:
    """A connection to one node.

    addr: "HOST:PORT". token: the node's shared secret (bytes or str; see
    read_token), or None for a node without one. root: this side's view of
    the node's shared root, if it has one: tensors under it travel as
    references when the node shares it (equal filesystem identities,
    .tensorwire-fsid). timeout: seconds the first dial may take (raises
    UnavailableError, or UnauthenticatedError for a token problem).
    keepalive: seconds of silence after which a node a call waits for is
    pinged; after 5 of them it is taken for gone (UnavailableError).
    """

    def __init__(self, addr, token=None, root=None, timeout=30.0, keepalive=1.0, window=16 << 20):
        self.addr = addr
        self._host, self._port = _split_addr(addr)
        if isinstance(token, str):
            token = token.encode()
        self._token = token or None
        self._root = os.path.realpath(root) if root else None
        if self._root and not os.path.isdir(self._root):
            raise InvalidArgumentError(f"root {root!r} is not a folder")
        self._fsid = _wire.read_fsid(self._root) if self._root else _wire.ZERO_FSID
        self._keepalive = keepalive
        self._window = window
        self._mu = threading.Lock()
        self._dialing = threading.Condition(self._mu)
        self._is_dialing = False
        self._conn = None
        self._closed = False
        self.connections = 0  # connections made so far (a new one after each failure)
        self._connection(time.monotonic() + timeout if timeout else None)

    @property
    def root(self):
        return self._root

    def shared_fs(self, timeout=None):
        """Whether the current connection's node shares this client's root
        (equal filesystem identities). Dials if there is no connection."""
        return self._connection(_deadline(timeout)).shared

    def close(self):
        """Closes the connection; calls in flight fail with UnavailableError,
        later ones with ClientClosedError."""
        with self._mu:
            self._closed = True
            conn, self._conn = self._conn, None
        if conn is not None:
            conn.session.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __del__(self):
        # A Client dropped without close: end its connection (its keeper
        # thread holds the session, not the Client).
        try:
            if not self._closed:
                self.close()
        except Exception:  # noqa: BLE001 (interpreter shutdown)
            pass

    # Connections.

    def _connection(self, deadline):
        with self._mu:
            while True:
                if self._closed:
                    raise ClientClosedError("client is closed")
                c = self._conn
                if c is not None and not c.session.closed:
                    return c
                if not self._is_dialing:
                    self._is_dialing = True
                    break
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    raise UnavailableError(f"dial {self.addr}: deadline exceeded")
                self._dialing.wait(left)
        try:
            c = self._dial(deadline)
        finally:
            with self._mu:
                self._is_dialing = False
                self._dialing.notify_all()
        with self._mu:
            if self._closed:
                c.session.close()
                raise ClientClosedError("client is closed")
            old, self._conn = self._conn, c
            self.connections += 1
        if old is not None:
            old.session.close()
        return c

    def _dial(self, deadline):
        limit = HANDSHAKE_TIMEOUT
        if deadline is not None:
            limit = min(limit, deadline - time.monotonic())
            if limit <= 0:
                raise UnavailableError(f"dial {self.addr}: deadline exceeded")
        try:
            sock = socket.create_connection((self._host, self._port), timeout=limit)
        except OSError as e:
            raise UnavailableError(f"dial {self.addr}: {e}") from None
        try:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            sock.settimeout(limit)
            shared = self._handshake(sock)
            sock.settimeout(None)
        except TensorwireError:
            sock.close()
            raise
        except (OSError, _wire.ProtocolError, EOFError) as e:
            sock.close()
            raise UnavailableError(f"handshake with {self.addr}: {e or type(e).__name__}") from None
        return _Conn(_yamux.Session(sock, self._window, self._keepalive), shared)

    def _handshake(self, sock):
        """The client's side of the handshake (docs/protocol.md); returns
        whether the node shares this side's root."""
        flags = _wire.FLAG_TOKEN if self._token else 0
        mine = _wire.hello(flags, os.urandom(32), self._fsid)
        sock.sendall(mine)
        theirs = _recv_exact(sock, _wire.HELLO_SIZE)
        _, their_flags, _, their_fsid = _wire.parse_hello(theirs)
        if self._token and their_flags & _wire.FLAG_TOKEN:
            sock.sendall(_wire.proof(self._token, _wire.CLIENT_PROOF_LABEL, mine, theirs))
        code = _recv_exact(sock, 1)[0]
        if code != 0:
            (n,) = struct.unpack(">H", _recv_exact(sock, 2))
            if n > _wire.MAX_STATUS_MSG:
                raise _wire.ProtocolError(f"status message of {n} bytes")
            msg = _recv_exact(sock, n).decode("utf-8", "replace")
            raise _wire.refusal(code, msg)
        if self._token:
            if not their_flags & _wire.FLAG_TOKEN:
                raise UnauthenticatedError("server has no token and cannot prove who it is")
            got = _recv_exact(sock, _wire.PROOF_SIZE)
            want = _wire.proof(self._token, _wire.SERVER_PROOF_LABEL, mine, theirs)
            if not _hmac_equal(got, want):
                raise UnauthenticatedError("server does not know the token")
        return self._fsid != _wire.ZERO_FSID and their_fsid == self._fsid

    # Calls.

    def call(self, method, arg=None, timeout=None, result_tds=()):
        """Calls method with arg (a dict, encoded as msgpack; TD values in it
        travel as TensorDicts) and returns the node's result, decoded. The
        fields named in result_tds are the result's TensorDicts: they come
        back as dicts of numpy arrays. timeout: seconds, or None for no
        limit. Errors are TensorwireError subclasses: the node's, by code and
        reason; UnavailableError when the node could not be reached or the
        connection broke; DeadlineExceededError when timeout passed."""
        return self.start(method, arg, timeout=timeout, result_tds=result_tds).result()

    def start(self, method, arg=None, timeout=None, result_tds=()):
        """Sends the request of a call and returns a Pending call at once;
        Pending.result() reads its response. The node works on it meanwhile:
        a caller can send the next request before it gathers this one's
        rows, say. The timeout counts from now."""
        deadline = _deadline(timeout)
        arg = {} if arg is None else arg
        conn = self._connection(deadline)
        tds = _find_tds(arg, [])
        for td in tds:
            td.prepare(self._root if conn.shared else None)
        args = _msgpack.packb(_wire_form(arg))
        parts = [p for td in tds for p in td.parts]
        body_len = sum(p.nbytes for p in parts)
        try:
            st = conn.stream()
        except UnavailableError:
            # The session died before anything was sent: dial again, once.
            conn = self._connection(deadline)
            st = conn.stream()
        timeout_us = 0
        if deadline is not None:
            timeout_us = max(int((deadline - time.monotonic()) * 1e6), 1)
        hdr = _wire.request_header(method, timeout_us, len(args), body_len)
        try:
            st.write([hdr, args] + parts, deadline)
        except BaseException:
            st.close()
            raise
        return Pending(self, conn, st, method, deadline, tds, result_tds)

    # Built-in methods.

    def stats(self, timeout=None):
        """The node's counters (tensorwire.stats)."""
        return self.call("tensorwire.stats", {}, timeout=timeout)

    def describe(self, prefix, timeout=None):
        """The schema of the TensorDict stored at prefix under the node's
        root: batch, fields (key, dtype, shape) and bytes."""
        return self.call("tensorwire.describe", {"prefix": prefix}, timeout=timeout)

    def read(self, prefix, rows=None, timeout=None):
        """Rows (all when None) of the TensorDict stored at prefix under the
        node's root, as a dict of numpy arrays."""
        r = self.call("tensorwire.read", {"prefix": prefix, "rows": None if rows is None else list(rows),
                                          "into": None}, timeout=timeout, result_tds=("td",))
        return r["td"]

    def fill(self, td, value=0.0, rows=None, timeout=None):
        """Has the node fill rows of td (a dict of arrays; all rows when None)
        with value; by reference, the node writes into the shared files,
        else the filled rows come back into td. Returns the rows filled."""
        t = TD(td, rows=rows, out=True)
        return self.call("tensorwire.fill", {"td": t, "value": float(value), "src": None},
                         timeout=timeout)["rows"]


class Pending:
    """A call whose request has been sent (Client.start)."""

    def __init__(self, client, conn, st, method, deadline, tds, result_tds):
        self._client, self._conn, self._st = client, conn, st
        self.method = method
        self._deadline = deadline
        self._tds = tds
        self._result_tds = result_tds
        self._done = False
        self._value = None
        self._error = None

    def result(self):
        """The call's result; raises its error. Call it once, from one thread
        (later calls return the same)."""
        if not self._done:
            self._done = True
            try:
                self._value = self._read()
            except TensorwireError as e:
                self._error = e
            except _wire.ProtocolError as e:
                self._conn.session.fail(UnavailableError(f"{self.method}: {e}"))
                self._error = InternalError(f"{self.method}: {e}")
            finally:
                self._st = None
        if self._error is not None:
            raise self._error
        return self._value

    def cancel(self):
        """Abandons the call: its stream is closed, which the node takes as
        the caller leaving (it cancels the handler)."""
        if not self._done:
            self._done = True
            self._error = CanceledError(f"{self.method}: canceled")
            self._st.close()
            self._st = None

    def _read(self):
        st, d = self._st, self._deadline
        ok = False
        try:
            (n,) = struct.unpack(">I", st.read_exact(4, d))
            if n == 0 or n > _wire.MAX_HEADER_BYTES:
                raise _wire.ProtocolError(f"response header of {n} bytes (limit {_wire.MAX_HEADER_BYTES})")
            r = _wire.parse_response_header(st.read_exact(n, d))
            if r.code != 0:
                if r.arg_len or r.body_len:
                    raise InternalError(f"{self.method}: error response with a payload")
                # The node closes a stream it refused for being over its limit.
                ok = r.code != 8
                raise r.error()
            raw = st.read_exact(r.arg_len, d)
            try:
                value = _msgpack.unpackb(raw) if raw else None
            except Exception as e:
                st_left = r.body_len
                _skip(st, st_left, d)
                ok = True
                raise InternalError(f"{self.method}: response: {e}") from None
            wires = [td for td in self._tds if td.comes_back()]
            rtds = []
            for k in self._result_tds:
                w = value.get(k) if isinstance(value, dict) else None
                rtds.append((k, w))
            need = sum(wire_bytes(td.wire) for td in wires) + sum(wire_bytes(w) for _, w in rtds if w)
            if need != r.body_len:
                _skip(st, r.body_len, d)
                ok = True
                raise InternalError(f"{self.method}: response: the TensorDicts need {need} body bytes, "
                                    f"the body has {r.body_len}")

            def fill(mv):
                st.read_into(mv, d)

            for td in wires:
                td.write_back(build(td.wire, fill))
            for k, w in rtds:
                value[k] = build(w, fill)
            ok = True
            return value
        finally:
            if ok:
                self._conn.put(st)
            else:
                st.close()


def _skip(st, n, deadline):
    while n > 0:
        k = min(n, 1 << 20)
        st.read_exact(k, deadline)
        n -= k


def _find_tds(v, tds):
    """Appends the TDs in v to tds in the order met, dicts in insertion
    order, lists in order, and returns tds. That order is the body's: a
    caller builds a request's dict in the order its method declares its
    fields (docs/protocol.md, "Messages")."""
    if isinstance(v, TD):
        tds.append(v)
    elif isinstance(v, dict):
        for x in v.values():
            _find_tds(x, tds)
    elif isinstance(v, (list, tuple)):
        for x in v:
            _find_tds(x, tds)
    return tds


def _wire_form(v):
    """v with every TD replaced by its wire form (TD.prepare made it)."""
    if isinstance(v, TD):
        return v.wire
    if isinstance(v, dict):
        return {k: _wire_form(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [_wire_form(x) for x in v]
    return v


def _deadline(timeout):
    return None if timeout is None else time.monotonic() + timeout


def _recv_exact(sock, n):
    buf = bytearray(n)
    mv = memoryview(buf)
    got = 0
    while got < n:
        k = sock.recv_into(mv[got:])
        if k == 0:
            raise EOFError("connection closed by the node")
        got += k
    return bytes(buf)


def _hmac_equal(a, b):
    import hmac
    return hmac.compare_digest(a, b)
