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

import logging
import os
import socket
import struct
import threading
import time

from . import _exit, _lz4, _msgpack, _wire, _yamux
from ._td import TD, build, build_into, fits, wire_entries
from .errors import (CanceledError, ClientClosedError, DeadlineExceededError, FailedPreconditionError,
                     InternalError, InvalidArgumentError, TensorwireError, UnauthenticatedError,
                     UnavailableError)

__all__ = ["Client", "TD", "MessageStream", "StreamEnd", "Sharing", "read_token"]

log = logging.getLogger("tensorwire")

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


class Sharing:
    """How much of a node's root a connection's two sides share, decided at
    the handshake (docs/protocol.md, "Sharing"): str constants, in order
    NONE < STORAGE < COHERENT (compare them with Sharing.at_least).

    A shared filesystem shares bytes, not mappings: files that someone
    changes in place (a replay buffer's storage, a loader's ring, serve's
    slots, fill and read's TDs) go by reference only at COHERENT (one kernel,
    one mount: one page cache); write-once files (published store values)
    at STORAGE too (the same files through another page cache: another
    machine on NFS, another FUSE mount); at NONE (no root on a side, another
    root, or a copy of the node's) everything travels as bytes."""

    NONE = _wire.NONE
    STORAGE = _wire.STORAGE
    COHERENT = _wire.COHERENT
    LEVELS = _wire.LEVELS

    @staticmethod
    def at_least(level, least):
        """Whether level is least or above."""
        return _wire.LEVELS.index(level) >= _wire.LEVELS.index(least)


def _split_addr(addr):
    host, sep, port = addr.rpartition(":")
    if not sep or not port.isdigit():
        raise InvalidArgumentError(f"address {addr!r}: want HOST:PORT")
    return host.strip("[]") or "localhost", int(port)


class _Conn:
    """One connection: its session, how much of the node's root it shares
    with this side (sharing; shared: coherent, so TDs under the root go by
    reference), and its idle streams."""

    def __init__(self, session, sharing, why, version):
        self.session = session
        self.sharing = sharing
        self.why = why
        self.shared = sharing == Sharing.COHERENT
        self.version = version
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


def _rebuild(cls, args, kwargs):
    """Unpickles a client (Client, and the services' clients over it): a
    new one made as the pickled one was, with a connection of its own,
    dialled in the process that unpickles it (Reverb's Client pickles so)."""
    return cls(*args, **kwargs)


class Client:
    """A connection to one node. A child forked from the process dials
    its own connection at its first call (the parent's stays the
    parent's). Pickled (to a spawned worker, say), a Client becomes a new
    one to the same node with the same token and root, dialled where it
    is unpickled; the pickle holds the token.

    addr: "HOST:PORT". token: the node's shared secret (bytes or str; see
    read_token), or None for a node without one. root: this side's view of
    the node's shared root, if it has one: tensors under it travel as
    references when the connection's sharing (decided at each dial,
    docs/protocol.md "Sharing") is coherent: the node found this root to be
    its own (the node's probe file read through it, so not a copy) on the
    same kernel and mount. timeout: seconds the first dial may take (raises
    UnavailableError, or UnauthenticatedError for a token problem).
    keepalive: seconds of silence after which a node a call waits for is
    pinged; after 5 of them it is taken for gone (UnavailableError).
    compression: True lets the node send bodies by bytes as LZ4 frames
    where a sample of them compresses (docs/protocol.md, "Compression"), as
    Go's clients have it: a few times fewer bytes on a slow link for rows
    that compress (images), at the CPU of compressing and decompressing them
    (on one host, rows by bytes come slower: docs/benchmarks.md, "Python
    clients and LZ4"). It needs the lz4 package (PyPI's lz4, Debian's
    python3-lz4): InvalidArgumentError without it. False (the default):
    every body comes as it is.
    """

    def __init__(self, addr, token=None, root=None, timeout=30.0, keepalive=1.0, window=16 << 20,
                 compression=False):
        if compression and not _lz4.available():
            raise InvalidArgumentError("compression=True needs the lz4 package (pip install lz4, or Debian's "
                                       "python3-lz4)")
        self._made = ((addr,), {"token": token, "root": root, "timeout": timeout, "keepalive": keepalive,
                                "window": window, "compression": compression})
        self.compression = bool(compression)
        self.addr = addr
        self._host, self._port = _split_addr(addr)
        if isinstance(token, str):
            token = token.encode()
        self._token = token or None
        self._root = os.path.realpath(root) if root else None
        if self._root and not os.path.isdir(self._root):
            raise InvalidArgumentError(f"root {root!r} is not a folder")
        # A client reads its root's identity and never creates one: a folder
        # no node has made a root is left as it is (its sharing is NONE).
        self._fsid = _wire.read_fsid(self._root, create=False) if self._root else _wire.ZERO_FSID
        self._where = _wire.host_id(self._root)  # (boot id, device, inode) for the where messages
        self._logged = None  # the (sharing, why) last logged at INFO
        self._keepalive = keepalive
        self._window = window
        self._mu = threading.Lock()
        self._dialing = threading.Condition(self._mu)
        self._is_dialing = False
        self._conn = None
        self._closed = False
        self.connections = 0  # connections made so far (a new one after each failure)
        # os.fork and multiprocessing's fork copy the Client, and a child's
        # calls on the parent's socket would put both out of step (or hang
        # on a lock a parent's thread held at the fork): _forked.
        _exit.reset_at_fork(self)
        self._connection(time.monotonic() + timeout if timeout else None)

    @property
    def root(self):
        return self._root

    def shared_fs(self, timeout=None):
        """Whether the current connection's node shares this client's page
        cache (sharing() is coherent), so that TDs under the root, and
        anything a service changes in place, travel as references. Dials if
        there is no connection."""
        return self._connection(_deadline(timeout)).shared

    def sharing(self, timeout=None):
        """How much of the node's root the current connection shares with
        this client: Sharing.COHERENT ("coherent"), Sharing.STORAGE
        ("storage") or Sharing.NONE ("none"), as its handshake decided (a
        reconnection decides again). Dials if there is no connection."""
        return self._connection(_deadline(timeout)).sharing

    def __reduce__(self):
        return _rebuild, (type(self),) + self._made

    def _forked(self):
        """In a child just forked: the connection is the parent's (a socket
        both processes hold, its stream ids and its locks the parent's, a
        lock perhaps held at the fork by a thread that is not here). Let
        go of it, saying nothing to the node, and dial one of this
        process's own at the next call."""
        self._mu = threading.Lock()
        self._dialing = threading.Condition(self._mu)
        self._is_dialing = False
        conn, self._conn = self._conn, None
        if conn is not None:
            conn.session.abandon()

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
        version = _wire.NEWEST_VERSION
        while True:
            try:
                sock = socket.create_connection((self._host, self._port), timeout=limit)
            except OSError as e:
                raise UnavailableError(f"dial {self.addr}: {e}") from None
            try:
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                sock.settimeout(limit)
                sharing, why = self._handshake(sock, version)
                sock.settimeout(None)
            except _OlderNode as e:
                # A node that speaks an older version answers in it and
                # refuses: dial again in its version (docs/protocol.md,
                # "Versioning").
                sock.close()
                version = e.version
                continue
            except TensorwireError:
                sock.close()
                raise
            except (OSError, _wire.ProtocolError, EOFError) as e:
                sock.close()
                raise UnavailableError(f"handshake with {self.addr}: {e or type(e).__name__}") from None
            self._log_sharing(sharing, why)
            return _Conn(_yamux.Session(sock, self._window, self._keepalive), sharing, why, version)

    def _log_sharing(self, sharing, why):
        """Says why references are off, once (again only when the reason
        changes), when this client has a root but is not coherent with the
        node; else at DEBUG."""
        if self._root and sharing != Sharing.COHERENT and self._logged != (sharing, why):
            self._logged = (sharing, why)
            log.info("tensorwire: connected to %s with sharing %s; references to files changed in place are "
                     "off, bytes travel instead: %s", self.addr, sharing, why)
        else:
            log.debug("tensorwire: connected to %s with sharing %s: %s", self.addr, sharing, why)

    def _handshake(self, sock, version):
        """The client's side of the handshake (docs/protocol.md) in version;
        returns the connection's sharing and why."""
        flags = _wire.FLAG_TOKEN if self._token else 0
        mine = _wire.hello(flags, os.urandom(32), self._fsid, version)
        sock.sendall(mine)
        theirs = _recv_exact(sock, _wire.HELLO_SIZE)
        their_version, their_flags, _, their_fsid = _wire.parse_hello(theirs)
        if self._token and their_flags & _wire.FLAG_TOKEN:
            sock.sendall(_wire.proof(self._token, _wire.CLIENT_PROOF_LABEL, mine, theirs))
        code = _recv_exact(sock, 1)[0]
        if code != 0:
            (n,) = struct.unpack(">H", _recv_exact(sock, 2))
            if n > _wire.MAX_STATUS_MSG:
                raise _wire.ProtocolError(f"status message of {n} bytes")
            msg = _recv_exact(sock, n).decode("utf-8", "replace")
            if code == 9 and 1 <= their_version < version:
                raise _OlderNode(their_version)
            raise _wire.refusal(code, msg)
        if self._token:
            if not their_flags & _wire.FLAG_TOKEN:
                raise UnauthenticatedError("server has no token and cannot prove who it is")
            got = _recv_exact(sock, _wire.PROOF_SIZE)
            want = _wire.proof(self._token, _wire.SERVER_PROOF_LABEL, mine, theirs)
            if not _hmac_equal(got, want):
                raise UnauthenticatedError("server does not know the token")
        if version >= _wire.SESSION_VERSION:
            # How to attach side connections; this client opens none.
            _wire.parse_session(_recv_exact(sock, _wire.SESSION_MSG_SIZE))
        if version < _wire.SHARING_VERSION:
            # Older nodes: equal identities were taken as shared, which is
            # right on one host only.
            if self._fsid != _wire.ZERO_FSID and their_fsid == self._fsid:
                return Sharing.COHERENT, f"protocol version {version}: equal root identities are taken for one page cache"
            return Sharing.NONE, f"protocol version {version}: the root identities differ, or a side has no root"
        return self._where_exchange(sock)

    def _where_exchange(self, sock):
        """The client's side of the where messages (version 4): reads the
        node's, looks for its probe under this client's root, and answers
        with the level decided. Returns (level, why)."""
        nboot, ndev, nino, probe = _wire.parse_server_where(_recv_exact(sock, _wire.SERVER_WHERE_SIZE))
        if not self._root:
            level, why = Sharing.NONE, "this client has no root"
        elif self._fsid == _wire.ZERO_FSID:
            level, why = Sharing.NONE, f"this client's root has no {_wire.FSID_FILE}: no node has made it a root"
        elif probe == bytes(16):
            level, why = Sharing.NONE, ("the node made no probe: it has no root, or its root's identity "
                                        "(.tensorwire-fsid) is not this client's")
        else:
            level, why = _wire.decide_sharing(_wire.read_probe(self._root, probe), (nboot, ndev, nino), self._where)
        boot, dev, ino = self._where
        sock.sendall(_wire.client_where(boot, dev, ino, level))
        return level, why

    # Calls.

    def call(self, method, arg=None, timeout=None, result_tds=(), into=None):
        """Calls method with arg (a dict, encoded as msgpack; TD values in it
        travel as TensorDicts) and returns the node's result, decoded. The
        fields named in result_tds are the result's TensorDicts: they come
        back as dicts of numpy arrays. into maps some of those fields (a
        top-level key, or the path as result_tds gives it) to dicts of
        arrays the caller holds: such a TensorDict is read from the
        connection into them when it fits (the same keys, dtypes and shapes,
        C-contiguous writeable arrays, no non-tensor data), and the result
        then holds that very dict; one that does not fit comes in new
        arrays and leaves it as it was (Go's rpc.CallInto). timeout:
        seconds, or None for no limit. Errors are TensorwireError
        subclasses: the node's, by code and reason; UnavailableError when
        the node could not be reached or the connection broke;
        DeadlineExceededError when timeout passed."""
        return self.start(method, arg, timeout=timeout, result_tds=result_tds, into=into).result()

    def start(self, method, arg=None, timeout=None, result_tds=(), into=None):
        """Sends the request of a call and returns a Pending call at once;
        Pending.result() reads its response (into as call's). The node works
        on it meanwhile: a caller can send the next request before it
        gathers this one's rows, say. The timeout counts from now."""
        deadline = _deadline(timeout)
        arg = {} if arg is None else arg
        conn = self._connection(deadline)
        tds = _find_tds(arg, [])
        for td in tds:
            td.prepare(self._root if conn.shared else None)
        args = _msgpack.packb(_wire_form(arg))
        parts = [p for td in tds for p in td.parts]
        body_len = sum(p.nbytes for p in parts)
        parts, body_len, raw_len = self._seal(conn, parts, body_len)
        try:
            st = conn.stream()
        except UnavailableError:
            # The session died before anything was sent: dial again, once.
            conn = self._connection(deadline)
            st = conn.stream()
        timeout_us = 0
        if deadline is not None:
            timeout_us = max(int((deadline - time.monotonic()) * 1e6), 1)
        # Version 2 nodes compress bodies unless asked not to: a client
        # that cannot or will not decode them asks (docs/protocol.md,
        # "Compression").
        hdr = _wire.request_header(method, timeout_us, len(args), body_len,
                                   uncompressed=conn.version >= 2 and not self.compression, raw_len=raw_len)
        try:
            st.write([hdr, args] + parts, deadline)
        except BaseException:
            st.close()
            raise
        return Pending(self, conn, st, method, deadline, tds, result_tds, into)

    def _seal(self, conn, parts, body_len):
        """(parts, body_len, raw_len) of a body to send: its LZ4 frame where
        this client compresses, the node reads frames (version 2) and a
        sample pays (_lz4.seal), else parts as they are and raw_len 0."""
        if self.compression and conn.version >= 2 and body_len:
            z = _lz4.seal(parts, body_len)
            if z is not None:
                return [z], len(z), body_len
        return parts, body_len, 0

    def open_stream(self, method, arg=None, timeout=None, result_tds=()):
        """Opens a message stream (protocol version 2, docs/protocol.md
        "Streams"): sends the opening request and returns a MessageStream at
        once. timeout bounds the whole stream (the handler's deadline);
        result_tds names the TensorDicts of the node's messages, as for call.
        FailedPreconditionError on a connection in version 1."""
        deadline = _deadline(timeout)
        arg = {} if arg is None else arg
        conn = self._connection(deadline)
        if conn.version < 2:
            raise FailedPreconditionError(f"{method}: the node speaks protocol version {conn.version}, without message streams")
        tds = _find_tds(arg, [])
        for td in tds:
            td.prepare(self._root if conn.shared else None)
        args = _msgpack.packb(_wire_form(arg))
        parts = [p for td in tds for p in td.parts]
        parts, body_len, raw_len = self._seal(conn, parts, sum(p.nbytes for p in parts))
        st = conn.session.open_stream()
        timeout_us = 0 if deadline is None else max(int((deadline - time.monotonic()) * 1e6), 1)
        hdr = _wire.request_header(method, timeout_us, len(args), body_len,
                                   stream=True, uncompressed=not self.compression, raw_len=raw_len)
        try:
            st.write([hdr, args] + parts, deadline)
        except BaseException:
            st.reset_stream()
            raise
        return MessageStream(self, conn, st, method, deadline, result_tds)

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

    def __init__(self, client, conn, st, method, deadline, tds, result_tds, into=None):
        self._client, self._conn, self._st = client, conn, st
        self.method = method
        self._deadline = deadline
        self._tds = tds
        self._result_tds = result_tds
        self._into = {_path_key(k): v for k, v in (into or {}).items()}
        self._done = False
        self._value = None
        self._error = None

    def result(self):
        """The call's result; raises its error. Call it once, from one thread
        (later calls return the same, or raise the same error: whatever
        the first raised, an error of this client's own too)."""
        if not self._done:
            self._done = True
            try:
                self._value = self._read()
            except _wire.ProtocolError as e:
                self._conn.session.fail(UnavailableError(f"{self.method}: {e}"))
                self._error = InternalError(f"{self.method}: {e}")
            except Exception as e:  # noqa: BLE001 (a TensorwireError, or a bug's: recorded all the same)
                self._error = e
            except BaseException as e:
                # Interrupted mid-way (KeyboardInterrupt): the response is lost.
                self._error = CanceledError(f"{self.method}: interrupted by {type(e).__name__} while reading "
                                            "the response")
                raise
            finally:
                self._st = None
        if self._error is not None:
            raise self._error
        return self._value

    def wait(self, timeout=None):
        """Waits, reading the connection meanwhile, until result() would find
        the start of the response (or the stream's end) arrived rather than
        wait for the node, for at most timeout seconds (None: as long as
        it takes). At the timeout it raises DeadlineExceededError
        (UnavailableError if the node had fallen silent) and the call stays
        pending: wait again, take its result() or cancel() it. Raises the
        connection's error once the connection failed (result() then
        raises too). Returns at once for a call done. From the thread that
        takes the result."""
        if self._done:
            return
        self._conn.session.wait(self.ready, _deadline(timeout))

    @property
    def session(self):
        """The yamux session the call's stream is on."""
        return self._conn.session

    def ready(self):
        """Whether result() would find the start of the response (or the
        stream's end) already arrived, rather than wait for the node. Call
        it with the session's lock held (as a Session.wait predicate does);
        True once the call is done."""
        st = self._st
        return st is None or st.buffered >= 4 or st.remote_fin or st.reset

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
                wires = [td for td in self._tds if td.comes_back()]
                rtds, rpaths = _result_tds(value, self._result_tds, with_paths=True)
                wchecked = [wire_entries(td.wire) for td in wires]
                rchecked = [wire_entries(w) for _, _, w in rtds]
                need = sum(n for _, n in wchecked) + sum(n for _, n in rchecked)
                fill = _body_filler(st, r, d, self._client.compression, need)
            except (_msgpack.DecodeError, InternalError) as e:
                # The body is skipped whole: the stream stays in step.
                _skip(st, r.body_len, d)
                ok = True
                raise InternalError(f"{self.method}: response: {e}") from None
            except _lz4.FrameError as e:
                ok = True  # the frame was read whole: the stream is in step
                raise InternalError(f"{self.method}: response: {e}") from None

            for td, (entries, _) in zip(wires, wchecked):
                td.write_back(build(td.wire, fill, entries))
            filled = set()  # a path of several TDs ("*") fills its dict once
            for (parent, k, w), (entries, _), path in zip(rtds, rchecked, rpaths):
                dst = self._into.get(path)
                if dst is not None and path not in filled and fits(entries, dst):
                    filled.add(path)
                    parent[k] = build_into(dst, fill, entries)
                else:
                    parent[k] = build(w, fill, entries)
            ok = True
            return value
        finally:
            if ok:
                self._conn.put(st)
            else:
                st.close()


def _path_key(path):
    """A result TD's path as into's keys name it: a key, or a tuple of keys
    ("a" and ("a",) alike)."""
    if isinstance(path, str):
        return path
    path = tuple(path)
    return path[0] if len(path) == 1 else path


def _result_tds(value, paths, with_paths=False):
    """(container, key, wire TD) of every TensorDict of a decoded result at
    paths: each a key, or a tuple of keys where "*" stands for every element
    of a list (("items", "*", "td")). In body order: paths in order, list
    elements in order; nil TDs have no bytes and are left as None. With
    with_paths, also each one's path as paths gave it (for into)."""
    out, given = [], []
    for path in paths:
        as_given = _path_key(path)
        path = (path,) if isinstance(path, str) else tuple(path)
        nodes = [value]
        for k in path[:-1]:
            nxt = []
            for n in nodes:
                if k == "*" and isinstance(n, list):
                    nxt.extend(n)
                elif isinstance(n, dict) and n.get(k) is not None:
                    nxt.append(n[k])
            nodes = nxt
        for n in nodes:
            if isinstance(n, dict) and isinstance(n.get(path[-1]), dict):
                out.append((n, path[-1], n[path[-1]]))
                given.append(as_given)
    if with_paths:
        return out, given
    return out


class StreamEnd(EOFError):
    """A message stream's handler ended it without an error: there are no more
    messages."""


class MessageStream:
    """A message stream opened by Client.open_stream (protocol version 2):
    recv() the node's messages, send() the caller's; close() when done. Use
    it from one thread at a time."""

    def __init__(self, client, conn, st, method, deadline, result_tds):
        self._client, self._conn, self._st = client, conn, st
        self.method = method
        self._deadline = deadline
        self._result_tds = result_tds
        self._ended = None  # the handler's end: None while it has not ended, else its error or StreamEnd
        self._sent_end = False
        self._incoming = None  # the message recv reads (_Incoming), kept when a recv is cut short

    def recv(self, timeout=None, into=None):
        """The node's next message (its decoded argument, TensorDicts at
        result_tds as dicts of arrays). Raises StreamEnd once the handler
        ended the stream without an error, or the handler's error. into, as
        Client.call's, maps some of result_tds to dicts of numpy arrays the
        caller holds: a message's TensorDict there is read from the
        connection straight into them when it fits (the same keys, dtypes
        and shapes), and is then that very dict; else it is made as without
        into, and the caller's arrays are untouched.

        A message that is not one this client can decode (its TensorDicts'
        description, or non-tensor data that is not JSON) is that recv's
        InternalError: its body is skipped, and the next recv reads the next
        message. timeout (seconds) bounds this recv only: at it recv raises
        DeadlineExceededError and leaves the stream as it was, also in the
        middle of a message, whose bytes read so far are kept, the next recv
        going on with it (into the arrays the first recv chose, with its
        into). Once the stream's own deadline passed, the stream is ended."""
        if self._ended is not None:
            raise self._ended
        d = _min_deadline(self._deadline, _deadline(timeout))
        if self._incoming is None:
            self._incoming = _Incoming()
        try:
            value, err = self._read(self._incoming, d, into)
        except _wire.ProtocolError as e:
            self._conn.session.fail(UnavailableError(f"{self.method}: {e}"))
            self._ended = UnavailableError(f"{self.method}: {e}")
            raise self._ended from None
        except DeadlineExceededError:
            if self._deadline is not None and time.monotonic() >= self._deadline:
                self._ended = DeadlineExceededError(f"{self.method}: the stream's deadline passed")
                self._st.reset_stream()
            raise
        except TensorwireError as e:
            if self._ended is None:
                self._ended = e
            raise
        self._incoming = None
        if err is not None:
            raise err
        return value

    def _read(self, m, d, into):
        """Reads the message m (an _Incoming) on from where it stands, until
        deadline d: (value, None), or (None, its InternalError) for a
        message this client cannot decode, its body skipped. A read cut
        short (DeadlineExceededError, an interrupt) leaves m where it
        stopped."""
        st = self._st
        r = m.r
        if r is None:
            if m.n is None:
                (n,) = struct.unpack(">I", self._fill(m, 4, d))
                if n == 0 or n > _wire.MAX_HEADER_BYTES:
                    raise _wire.ProtocolError(f"stream frame header of {n} bytes")
                m.n = n
            r = _wire.parse_stream_header(self._fill(m, m.n, d))
            if r.end:
                self._ended = StreamEnd(self.method) if r.code == 0 else r.error()
                raise self._ended
            m.r = r
        if m.raw is None:
            m.raw = self._fill(m, r.arg_len, d)
        if m.views is None and m.err is None:
            # The TensorDicts are made (their arrays allocated, or into's
            # taken) before any byte of the body is read, so that a message
            # that fails to decode is one whose body is skipped whole.
            try:
                value = _msgpack.unpackb(m.raw) if m.raw else None
                rtds, rpaths = _result_tds(value, self._result_tds, with_paths=True)
                checked = [wire_entries(w) for _, _, w in rtds]
                _check_body(r, self._client.compression, sum(n for _, n in checked))
                views = []
                into = {_path_key(k): v for k, v in (into or {}).items()}
                filled = set()  # a path of several TDs ("*") fills its dict once
                for (parent, k, w), (entries, _), path in zip(rtds, checked, rpaths):
                    dst = into.get(path)
                    if dst is not None and path not in filled and fits(entries, dst):
                        filled.add(path)
                        parent[k] = build_into(dst, views.append, entries)
                    else:
                        parent[k] = build(w, views.append, entries)
            except (_msgpack.DecodeError, InternalError) as e:
                m.err, m.skip = InternalError(f"{self.method}: {e}"), r.body_len
            else:
                m.value, m.views = value, views
        if m.err is not None:
            while m.skip > 0:
                k = min(m.skip, 1 << 20)
                c0 = st.consumed
                try:
                    st.read_exact(k, d)
                finally:
                    m.skip -= st.consumed - c0
            return None, m.err
        if r.raw_len:
            frame = self._fill(m, r.body_len, d) if r.body_len else b""
            try:
                fill = _lz4.filler(_lz4.decompress(frame, r.raw_len))
            except _lz4.FrameError as e:
                return None, InternalError(f"{self.method}: {e}")  # the frame was read whole
            for mv in m.views:
                fill(mv)
            return m.value, None
        while m.i < len(m.views):
            self._fill_into(m, m.views[m.i], d)
            m.i += 1
        return m.value, None

    def _fill(self, m, n, d):
        """The next n bytes of the stream (a bytes), those a read cut short
        left in m included."""
        if m.buf is None:
            m.buf = bytearray(n)
        self._fill_into(m, memoryview(m.buf), d)
        b, m.buf = bytes(m.buf), None
        return b

    def _fill_into(self, m, mv, d):
        """Fills mv (bytes) from the stream on from m.off, what a read cut
        short filled; m.off is 0 again once mv is full."""
        if m.off < len(mv):
            st = self._st
            c0 = st.consumed
            try:
                st.read_into(mv[m.off:], d)
            except BaseException:
                m.off += st.consumed - c0
                raise
        m.off = 0

    def send(self, arg, timeout=None):
        """Sends a message (arg, a dict; TD values travel as TensorDicts)."""
        if self._sent_end:
            raise FailedPreconditionError(f"{self.method}: send after close_send")
        tds = _find_tds(arg, [])
        for td in tds:
            td.prepare(self._client._root if self._conn.shared else None)
        args = _msgpack.packb(_wire_form(arg))
        parts = [p for td in tds for p in td.parts]
        parts, body_len, raw_len = self._client._seal(self._conn, parts, sum(p.nbytes for p in parts))
        hdr = _wire.stream_message_header(len(args), body_len, raw_len)
        self._st.write([hdr, args] + parts, _min_deadline(self._deadline, _deadline(timeout)))

    def fileno(self):
        """The connection's socket, for a caller that polls it beside
        descriptors of its own while no message is expected (then
        ready())."""
        return self._conn.session.sock.fileno()

    def ready(self):
        """Reads what the connection holds, without waiting (nothing when
        another thread is reading it), and says whether recv() would
        return at once: a message or the stream's end has arrived, or the
        connection failed. It also answers the node's keep-alive pings,
        which a caller that waits elsewhere would leave unanswered."""
        sess = self._conn.session
        sess.drain()
        st = self._st
        return self._ended is not None or sess.err is not None or st.buffered > 0 or st.remote_fin or st.reset

    def close_send(self):
        """Ends this side's messages: an end frame of code 0, then FIN."""
        if not self._sent_end:
            self._sent_end = True
            try:
                self._st.write([_wire.stream_end_header()], self._deadline)
            finally:
                self._st.half_close()

    def close(self):
        """Ends the stream: cancels it (RST) if the handler has not ended it,
        else ends this side."""
        if self._ended is None:
            self._ended = TensorwireError(f"{self.method}: closed", code=1)
            self._st.reset_stream()
            return
        try:
            self.close_send()
        except TensorwireError:
            pass
        self._st.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


class _Incoming:
    """A message of a message stream as far as recv has read it, so that a
    recv cut short (its timeout) leaves the next one to go on with it: the
    frame header's length n and header r; its argument raw; then either
    its decoded value and the memoryviews of its TensorDicts' arrays, in
    body order, filled up to views[i], or the error of a message that
    could not be decoded and the body bytes left to skip. buf and off: the
    buffer being filled and how far."""

    __slots__ = ("n", "r", "raw", "value", "views", "i", "err", "skip", "buf", "off")

    def __init__(self):
        self.n = self.r = self.raw = self.value = self.views = self.err = self.buf = None
        self.i = self.skip = self.off = 0


def _min_deadline(a, b):
    if a is None:
        return b
    if b is None:
        return a
    return min(a, b)


class _OlderNode(Exception):
    def __init__(self, version):
        super().__init__(version)
        self.version = version


def _body_filler(st, r, deadline, compression, need):
    """The read_into function (as _td.build takes) of the body of header r,
    whose TensorDicts need `need` bytes (InternalError, the body unread,
    when that is not its length, or when it is an LZ4 frame a client
    without compression did not ask for): reads from the stream as the
    TensorDicts are filled, or, for an LZ4 frame (raw_len set), reads the
    frame whole first and hands out its bytes decompressed
    (_lz4.FrameError when it is not one frame of exactly raw_len bytes)."""
    _check_body(r, compression, need)
    if not r.raw_len:
        def fill(mv):
            st.read_into(mv, deadline)
        return fill
    frame = bytearray(r.body_len)
    if r.body_len:
        st.read_into(memoryview(frame), deadline)
    return _lz4.filler(_lz4.decompress(frame, r.raw_len))


def _check_body(r, compression, need):
    """InternalError unless the body of header r has the `need` bytes its
    TensorDicts need, and is not an LZ4 frame a client without compression
    did not ask for."""
    if r.raw_len and not compression:
        raise InternalError("an lz4-compressed body; this client asked for uncompressed ones")
    if need != (r.raw_len or r.body_len):
        raise InternalError(f"the TensorDicts need {need} body bytes, the body has {r.raw_len or r.body_len}")


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
