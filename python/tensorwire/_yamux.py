"""A yamux client session (https://github.com/hashicorp/yamux/blob/master/spec.md).

One TCP connection carries many streams. Frames have a 12-byte header
(version 0, type, flags, stream id, length; big-endian): Data (0) with a
payload of length bytes, Window Update (1) whose length is a window delta,
Ping (2) and Go Away (3) on stream 0. Flags: SYN 1, ACK 2, FIN 4, RST 8.
This side is the client: its streams have odd ids.

Flow control is per stream: each side may send at most the other's window,
256 KiB at first, raised by Window Update deltas. This side raises its
receive window to `window` when it opens a stream (a Window Update with SYN)
and gives back what the caller has consumed once that is half a window.

Threads. There is no dedicated reader thread on the hot path: a caller
waiting for something (a response's bytes, send window) reads the socket
itself while no one else does, and hands over to the next waiter when it
has what it waited for ("leader/follower"). A response therefore reaches
its caller without a thread switch, and the payload of a data frame that
arrives while its stream's caller waits in read_into goes straight into
the caller's memory (the stream's sink), not through a chunk of bytes
allocated, copied and freed. A keeper thread reads only while no
caller waits, so that the node's pings are answered and a closed connection
is noticed between calls.
"""

import collections
import os
import select
import socket
import struct
import threading
import time

from .errors import DeadlineExceededError, UnavailableError

VERSION = 0
TYPE_DATA, TYPE_WINDOW, TYPE_PING, TYPE_GOAWAY = 0, 1, 2, 3
SYN, ACK, FIN, RST = 1, 2, 4, 8
HEADER = struct.Struct(">BBHII")
INITIAL_WINDOW = 256 << 10
MAX_FRAME = 1 << 20  # the largest data frame this side sends
_RECV_CHUNK = 1 << 20
_WRITE_TIMEOUT = 30.0  # a write blocked this long fails the session (Go yamux's ConnectionWriteTimeout)
# The keeper reads only once no call has used the session for this long:
# while calls come, their callers read (a prefetched response waits in the
# socket for its caller). Waking the keeper for each response would hand
# the GIL back and forth between threads, which costs a scheduler time
# slice whenever the CPUs are busy.
KEEPER_IDLE = 0.25


def frame(typ, flags, sid, length):
    return HEADER.pack(VERSION, typ, flags, sid, length)


class Stream:
    """One yamux stream. Its methods are called by one thread at a time (a
    call owns its stream); the session's lock guards the fields the reader
    updates."""

    def __init__(self, session, sid, window):
        self.session = session
        self.id = sid
        self.chunks = collections.deque()  # received bytes not yet consumed
        self.buffered = 0
        # While a read waits with nothing buffered: its memoryview, and how
        # far the reader has filled it (read_into; the session's lock).
        self.sink = None
        self.sink_pos = 0
        self.recv_window = window  # what the node may still send
        self.unacked = 0  # consumed bytes not yet given back as window
        self.consumed = 0  # bytes read out of the stream in all (read_into), a failed read's too
        self.send_window = INITIAL_WINDOW
        self.remote_fin = False
        self.reset = False
        self.local_fin = False
        self.discard = False  # closed by this side: incoming data is dropped
        self.idle_since = 0.0

    # Reading.

    def read_exact(self, n, deadline):
        """n bytes, waiting for them until deadline (a time.monotonic value,
        or None)."""
        out = bytearray(n)
        self.read_into(memoryview(out), deadline)
        return bytes(out)

    def read_into(self, mv, deadline):
        """Fills the writable memoryview mv (of bytes) from the stream. What
        is buffered is copied out; the rest the session's reader writes
        straight into mv as it arrives (the stream's sink), with no chunk
        allocated and copied between. The window is given back every half
        window, so that a read larger than the window keeps the node
        sending. A read that fails (its deadline passed, the stream reset)
        has consumed the bytes it filled mv with: consumed counts them, so
        that a caller can continue where the read stopped."""
        mv = mv.cast("B") if mv.format != "B" or mv.ndim != 1 else mv
        n, pos = len(mv), 0
        s = self.session
        try:
            while True:
                update = 0
                with s.mu:
                    got = 0
                    if self.sink is not None:  # what the reader wrote in
                        got, pos = self.sink_pos - pos, self.sink_pos
                        self.sink = None
                    while self.chunks and pos < n:
                        c = self.chunks[0]
                        k = min(len(c), n - pos)
                        mv[pos:pos + k] = c[:k]
                        pos += k
                        got += k
                        if k == len(c):
                            self.chunks.popleft()
                        else:
                            self.chunks[0] = c[k:]
                        self.buffered -= k
                    self.unacked += got
                    self.consumed += got
                    if self.unacked >= s.window // 2 and not self.discard:
                        update, self.unacked = self.unacked, 0
                        self.recv_window += update
                    if pos < n:
                        if self.reset or self.remote_fin:
                            raise UnavailableError("stream reset by the node" if self.reset
                                                   else "the node closed the stream in the middle of a message")
                        self.sink, self.sink_pos = mv, pos
                if update:
                    s.send_frames([frame(TYPE_WINDOW, 0, self.id, update)])
                if pos >= n:
                    return
                until = min(n, pos + s.window // 2)
                s.wait(lambda: self.sink_pos >= until or self.chunks or self.remote_fin or self.reset, deadline)
        finally:
            if self.sink is not None:
                with s.mu:
                    if self.sink is not None:  # a failed read: nothing more goes into mv
                        got = self.sink_pos - pos  # what the reader wrote in since read_into last looked
                        self.unacked += got
                        self.consumed += got
                        self.sink = None

    # Writing.

    def write(self, parts, deadline):
        """Sends parts (bytes-like objects, C-contiguous) as data frames,
        within the node's window. Small parts are joined into one frame."""
        pending, pending_n = [], 0
        for p in parts:
            mv = memoryview(p)
            if mv.format != "B" or mv.ndim != 1:
                mv = mv.cast("B")
            if len(mv) <= 64 << 10:
                pending.append(mv)
                pending_n += len(mv)
                if pending_n < 64 << 10:
                    continue
                mv = memoryview(b"".join(pending))
                pending, pending_n = [], 0
            elif pending:
                self._send_data(memoryview(b"".join(pending)), deadline)
                pending, pending_n = [], 0
            self._send_data(mv, deadline)
        if pending:
            self._send_data(memoryview(b"".join(pending)), deadline)

    def _send_data(self, data, deadline):
        """Sends data as data frames of at most MAX_FRAME bytes, waiting for
        the node's window."""
        s = self.session
        sent, n = 0, len(data)
        while sent < n:
            s.wait(lambda: self.send_window > 0 or self.reset, deadline)
            with s.mu:
                if self.reset:
                    raise UnavailableError("stream reset by the node")
                k = min(self.send_window, n - sent, MAX_FRAME)
                self.send_window -= k
            s.send_frames([frame(TYPE_DATA, 0, self.id, k), data[sent:sent + k]])
            sent += k

    def half_close(self):
        """Sends FIN: this side sends nothing more; the node's side stays
        readable."""
        with self.session.mu:
            if self.local_fin:
                return
            self.local_fin = True
        try:
            self.session.send_frames([frame(TYPE_WINDOW, FIN, self.id, 0)])
        except UnavailableError:
            pass

    def reset_stream(self):
        """Resets the stream (RST): the node drops it at once (a message
        stream's cancellation, docs/protocol.md "Streams")."""
        s = self.session
        with s.mu:
            if self.reset:
                return
            self.reset = self.local_fin = self.discard = True
            self.chunks.clear()
            self.buffered = 0
            self.sink = None
            s.streams.pop(self.id, None)
        try:
            s.send_frames([frame(TYPE_WINDOW, RST, self.id, 0)])
        except UnavailableError:
            pass

    def close(self):
        """Half-closes the stream (FIN) and drops what arrives on it until the
        node closes its side."""
        s = self.session
        with s.mu:
            if self.discard:
                return
            fin_sent = self.local_fin
            self.local_fin = True
            self.discard = True
            self.chunks.clear()
            self.sink = None
            credit, self.unacked = self.unacked + self.buffered, 0
            self.buffered = 0
            done = self.remote_fin or self.reset
            if done:
                s.streams.pop(self.id, None)
            elif credit:
                self.recv_window += credit  # given back below: the node may send that much more
        frames = [] if fin_sent else [frame(TYPE_WINDOW, FIN, self.id, 0)]
        if credit and not done:
            frames.insert(0, frame(TYPE_WINDOW, 0, self.id, credit))
        if not frames:
            return
        try:
            s.send_frames(frames)
        except UnavailableError:
            pass


class Session:
    """A yamux client session over a connected socket (its handshake done).

    keepalive: a node silent that long while a caller waits is pinged; one
    silent for 1.5 of it makes a passed deadline Unavailable rather than
    DeadlineExceeded; one silent for 5 of it fails the session."""

    def __init__(self, sock, window=16 << 20, keepalive=1.0):
        self.sock = sock
        self.window = max(window, INITIAL_WINDOW)
        self.keepalive = keepalive
        self.mu = threading.Lock()
        self.cond = threading.Condition(self.mu)
        self.wmu = threading.Lock()
        self.streams = {}
        self.next_id = 1
        self.reading = False
        self.waiters = 0
        self.err = None  # why the session died; None while it lives
        self.goaway = False
        self.last_read = time.monotonic()
        self.last_use = time.monotonic()  # when a caller last sent or waited
        self.ping_out = None  # (opaque, sent at) of our unanswered ping
        self.ping_id = 0
        # The receive state machine: a partial header, or the payload of a
        # data frame still to come.
        self.hdr = bytearray()
        self.payload_left = 0
        self.payload_stream = None
        self.buf = bytearray(_RECV_CHUNK)
        self.bufmv = memoryview(self.buf)
        sock.settimeout(_WRITE_TIMEOUT)  # reads wait in poll; this bounds writes
        # One poll object for the reader of the moment, one for the keeper:
        # a poll object cannot be polled from two threads at once.
        self.poller = select.poll()
        self.poller.register(sock.fileno(), select.POLLIN)
        self.keep_poller = select.poll()
        self.keep_poller.register(sock.fileno(), select.POLLIN)
        self.keeper = threading.Thread(target=self._keep, name="tensorwire-yamux", daemon=True)
        self.keeper.start()

    @property
    def closed(self):
        return self.err is not None or self.goaway

    def open_stream(self):
        """A new stream; its SYN goes out at once, raising the node's view of
        this side's receive window."""
        with self.mu:
            if self.err is not None:
                raise self.err
            if self.goaway:
                raise UnavailableError("the node is going away")
            sid = self.next_id
            if sid > 0xFFFFFFFF:
                raise UnavailableError("stream ids exhausted")
            self.next_id += 2
            st = Stream(self, sid, self.window)
            self.streams[sid] = st
        self.send_frames([frame(TYPE_WINDOW, SYN, sid, self.window - INITIAL_WINDOW)])
        return st

    def send_frames(self, bufs):
        """Writes bufs (frames, and payloads) in one go, atomically with
        respect to other writers."""
        if self.err is not None:
            raise self.err
        self.last_use = time.monotonic()
        with self.wmu:
            try:
                _sendall(self.sock, bufs)
            except OSError as e:
                self.fail(UnavailableError(f"connection to the node broken: {e}"))
                raise self.err from None

    def fail(self, err):
        """Ends the session: every waiting caller gets err."""
        with self.mu:
            if self.err is None:
                self.err = err
            self.cond.notify_all()
        try:
            self.sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass

    def abandon(self):
        """In a child forked from the process: the session is the parent's.
        Fails it here and closes this process's descriptor of the socket,
        nothing sent and no shutdown (which would end the parent's
        connection too); its locks may be held by a parent's thread, so
        none is taken."""
        if self.err is None:
            self.err = UnavailableError("the connection is the parent process's (this is a forked child)")
        try:
            self.sock.close()
        except OSError:
            pass

    def close(self):
        if self.err is None:
            try:
                self.send_frames([frame(TYPE_GOAWAY, 0, 0, 0)])
            except UnavailableError:
                pass
        self.fail(UnavailableError("the connection was closed"))
        with self.mu:
            while self.reading:
                self.cond.wait(1.0)
        self.sock.close()

    # Waiting and reading.

    def wait(self, pred, deadline):
        """Returns once pred() (evaluated under mu) holds, reading the socket
        meanwhile when no one else does. Raises the session's error once it
        died, or DeadlineExceededError (UnavailableError if the node had
        fallen silent) when deadline passes."""
        self.last_use = time.monotonic()
        with self.mu:
            if pred():
                return
            self.waiters += 1
        try:
            while True:
                with self.mu:
                    while True:
                        if pred():
                            return
                        if self.err is not None:
                            raise self.err
                        if not self.reading:
                            self.reading = True
                            break
                        left = self._left(deadline)
                        self.cond.wait(min(left, 0.5) if left is not None else 0.5)
                try:
                    self._read(deadline)
                finally:
                    with self.mu:
                        self.reading = False
                        self.cond.notify_all()
        finally:
            with self.mu:
                self.waiters -= 1

    def _left(self, deadline):
        """Seconds until deadline; raises once it has passed."""
        if deadline is None:
            return None
        left = deadline - time.monotonic()
        if left <= 0:
            silent = time.monotonic() - self.last_read
            if self.keepalive > 0 and silent > 1.5 * self.keepalive:
                raise UnavailableError(f"the node has been silent for {silent:.1f}s")
            raise DeadlineExceededError("deadline exceeded")
        return left

    def _read(self, deadline):
        """Reads what the socket has, waiting for it at most until deadline or
        a keep-alive interval; the caller holds the reader's role."""
        left = self._left(deadline)
        wait = self.keepalive if self.keepalive > 0 else 1.0
        if left is not None:
            wait = min(wait, left)
        if not self.poller.poll(max(wait, 0) * 1000):
            self._silence()
            return
        self._recv()

    def _recv(self):
        try:
            n = self.sock.recv_into(self.buf)
        except (BlockingIOError, InterruptedError, socket.timeout):
            return
        except OSError as e:
            self.fail(UnavailableError(f"connection to the node broken: {e}"))
            return
        if n == 0:
            self.fail(UnavailableError("the node closed the connection"))
            return
        self.last_read = time.monotonic()
        out = []
        with self.mu:
            try:
                self._dispatch(self.bufmv[:n], out)
            except _ProtocolViolation as e:
                err = UnavailableError(f"yamux: {e}")
                if self.err is None:
                    self.err = err
                self.cond.notify_all()
                out = [frame(TYPE_GOAWAY, 0, 0, 1)]
        if out:
            try:
                self.send_frames(out)
            except UnavailableError:
                pass
        if self.err is not None:
            try:
                self.sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def _silence(self):
        """Nothing was read for a while: ping the node, and give up on it after
        5 keep-alive intervals of silence."""
        if self.keepalive <= 0 or self.waiters == 0:
            return
        silent = time.monotonic() - self.last_read
        if silent >= 5 * self.keepalive:
            self.fail(UnavailableError(f"the node has been silent for {silent:.1f}s"))
        elif silent >= self.keepalive and self.ping_out is None:
            self.ping_id = (self.ping_id + 1) & 0xFFFFFFFF
            self.ping_out = (self.ping_id, time.monotonic())
            try:
                self.send_frames([frame(TYPE_PING, SYN, 0, self.ping_id)])
            except UnavailableError:
                pass

    def _dispatch(self, mv, out):
        """Processes received bytes; called with mu held. Control frames to
        send go to out."""
        pos, n = 0, len(mv)
        while pos < n:
            if self.payload_left:
                k = min(self.payload_left, n - pos)
                st = self.payload_stream
                if st is not None and not st.discard:
                    j = 0
                    if st.sink is not None and not st.chunks:
                        # A read waits: straight into its memoryview.
                        j = min(k, len(st.sink) - st.sink_pos)
                        st.sink[st.sink_pos:st.sink_pos + j] = mv[pos:pos + j]
                        st.sink_pos += j
                    if j < k:
                        st.chunks.append(bytes(mv[pos + j:pos + k]))
                        st.buffered += k - j
                elif st is not None:
                    out.append(frame(TYPE_WINDOW, 0, st.id, k))  # dropped: give the window back
                    st.recv_window += k
                pos += k
                self.payload_left -= k
                continue
            need = 12 - len(self.hdr)
            if need == 12 and n - pos >= 12:
                h = HEADER.unpack_from(mv, pos)
                pos += 12
            else:
                k = min(need, n - pos)
                self.hdr += mv[pos:pos + k]
                pos += k
                if len(self.hdr) < 12:
                    break
                h = HEADER.unpack(bytes(self.hdr))
                self.hdr.clear()
            self._frame(*h, out)
        self.cond.notify_all()

    def _frame(self, version, typ, flags, sid, length, out):
        if version != VERSION:
            raise _ProtocolViolation(f"frame of version {version}")
        if typ == TYPE_PING:
            if flags & SYN:
                out.append(frame(TYPE_PING, ACK, 0, length))
            elif self.ping_out is not None and self.ping_out[0] == length:
                self.ping_out = None
            return
        if typ == TYPE_GOAWAY:
            self.goaway = True
            if length != 0 and self.err is None:
                self.err = UnavailableError(f"the node ended the session (go away, code {length})")
            return
        if typ not in (TYPE_DATA, TYPE_WINDOW):
            raise _ProtocolViolation(f"frame of type {typ}")
        st = self.streams.get(sid)
        if st is None:
            if flags & SYN:  # the node opening a stream: this client serves none
                out.append(frame(TYPE_WINDOW, RST, sid, 0))
            if typ == TYPE_DATA and length:
                self.payload_left, self.payload_stream = length, None
            return
        if typ == TYPE_WINDOW:
            st.send_window += length
        elif length:
            if length > st.recv_window:
                raise _ProtocolViolation(f"stream {sid}: {length} bytes beyond the receive window")
            st.recv_window -= length
            self.payload_left, self.payload_stream = length, st
        if flags & FIN:
            st.remote_fin = True
        if flags & RST:
            st.reset = True
        if (st.remote_fin and st.local_fin) or st.reset:
            # Data frames carrying FIN still deliver their payload, which
            # the state machine writes to st (or drops) as it arrives.
            self.streams.pop(sid, None)

    def _keep(self):
        """The keeper: reads once no caller has used the session for
        KEEPER_IDLE, so pings are answered and a closed connection is noticed
        between calls."""
        while True:
            with self.mu:
                if self.err is not None:
                    return
                busy = self.reading or self.waiters > 0
            quiet = time.monotonic() - self.last_use
            if busy or quiet < KEEPER_IDLE:
                # A sleep, not the condition: the readers' notifications
                # must not wake this thread on every frame.
                time.sleep(KEEPER_IDLE if busy else KEEPER_IDLE - quiet)
                continue
            try:
                ready = self.keep_poller.poll(1000)
            except (OSError, ValueError):
                return
            if not ready:
                continue
            with self.mu:
                if self.err is not None:
                    return
                if self.reading or self.waiters > 0:
                    continue
                self.reading = True
            try:
                self._recv()
            finally:
                with self.mu:
                    self.reading = False
                    self.cond.notify_all()

    def drain(self):
        """Reads, without waiting, what the socket holds (a FIN on an idle
        stream, say)."""
        with self.mu:
            if self.reading or self.err is not None:
                return
            self.reading = True
        try:
            while self.err is None and self.poller.poll(0):
                self._recv()
        finally:
            with self.mu:
                self.reading = False
                self.cond.notify_all()


class _ProtocolViolation(Exception):
    pass


def _sendall(sock, bufs):
    """sock.sendall of several buffers, with one system call when it can."""
    bufs = [b for b in bufs if len(b)]
    if len(bufs) == 1:
        sock.sendall(bufs[0])
        return
    total = sum(len(b) for b in bufs)
    if total <= 64 << 10:
        sock.sendall(b"".join(bufs))
        return
    mvs = [memoryview(b).cast("B") for b in bufs]
    while mvs:
        n = sock.sendmsg(mvs[:_IOV_MAX])
        while n:
            if n >= len(mvs[0]):
                n -= len(mvs[0])
                mvs.pop(0)
            else:
                mvs[0] = mvs[0][n:]
                n = 0


_IOV_MAX = os.sysconf("SC_IOV_MAX") if hasattr(os, "sysconf") else 1024
