"""Real Go nodes for the tests: `tensorwire node` processes.

The binary is $TENSORWIRE_BIN when set (the Go test that runs this suite
builds it once), else built here with `go build ./cmd/tensorwire` into a
temporary folder, once per test process.
"""

import atexit
import os
import random
import shutil
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
PYDIR = os.path.dirname(HERE)  # python/, which holds the tensorwire package
REPO = os.path.dirname(PYDIR)
TOKEN = b"python-suite-secret"

_bin = None
_bin_lock = threading.Lock()


def binary():
    """The tensorwire command."""
    global _bin
    with _bin_lock:
        if _bin is None:
            _bin = os.environ.get("TENSORWIRE_BIN")
            if not _bin:
                d = tempfile.mkdtemp(prefix="tensorwire-pytest-bin-")
                atexit.register(shutil.rmtree, d, True)
                _bin = os.path.join(d, "tensorwire")
                subprocess.run(["go", "build", "-o", _bin, "./cmd/tensorwire"], cwd=REPO, check=True)
        return _bin


_goclient = None


def goclient():
    """The Go serve client of the serve tests (tests/goclient): $TENSORWIRE_GOCLIENT
    when set (the Go test that runs this suite builds it), else built here."""
    global _goclient
    with _bin_lock:
        if _goclient is None:
            _goclient = os.environ.get("TENSORWIRE_GOCLIENT")
            if not _goclient:
                d = tempfile.mkdtemp(prefix="tensorwire-pytest-goclient-")
                atexit.register(shutil.rmtree, d, True)
                _goclient = os.path.join(d, "goclient")
                subprocess.run(["go", "build", "-o", _goclient, "./python/tests/goclient"], cwd=REPO, check=True)
        return _goclient


def write_state_dict(prefix, sd):
    """Writes sd (a dict of float32 arrays) as PyTorch's
    TensorDict(model.state_dict(), batch_size=[]).memmap_(prefix) lays it out
    (docs/format.md): what `tensorwire node --serve NAME,params=P` loads."""
    import json
    import numpy as np
    os.makedirs(prefix)
    meta = {}
    for k, a in sd.items():
        a = np.ascontiguousarray(a, dtype="<f4")
        a.tofile(os.path.join(prefix, k + ".memmap"))
        meta[k] = {"device": "cpu", "shape": list(a.shape), "dtype": "torch.float32", "is_nested": False}
    meta.update({"shape": [], "device": "cpu", "_type": "<class 'tensordict._td.TensorDict'>"})
    with open(os.path.join(prefix, "meta.json"), "w") as f:
        json.dump(meta, f, separators=(",", ":"))


def python_env():
    """The environment of a Python child that imports this tensorwire."""
    env = dict(os.environ)
    env["PYTHONPATH"] = PYDIR + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    return env


def wait_until(pred, limit=60.0, what="condition"):
    """Polls pred every 10 ms until it holds, failing after limit seconds (a
    generous bound: the machine may be busy)."""
    deadline = time.monotonic() + limit
    while True:
        v = pred()
        if v:
            return v
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: not within {limit}s")
        time.sleep(0.01)


def _stable_range():
    """[lo, hi): up to 10,000 ports, from 10,000 up, below the kernel's
    first ephemeral port (Go's proctest.Listen of port 0 uses the same)."""
    first = 32768  # Linux's default
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            first = int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        pass
    return max(10000, first - 10000), max(10000, first)


def stable_port():
    """A loopback port free a moment ago, below the kernel's ephemeral range:
    the kernel gives none of those to a listener on port 0 or to an
    outgoing connection, so a node killed and restarted on it finds it
    free, where a port from :0 may be another test's node by then (CI saw a
    restarted node's clients reach another test's node, "this node has no
    token"). Only a process that names the port can take it; callers pick
    at random among thousands. The kernel's own (:0) where there is no
    room below the range."""
    lo, hi = _stable_range()
    for _ in range(200 if hi > lo else 0):
        port = random.randrange(lo, hi)
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Node:
    """A `tensorwire node` on 127.0.0.1 with a root, a token file (unless
    token is None) and the given --buffer flags. start() runs it;
    kill() (SIGKILL) or stop() (SIGTERM) ends it; start() again runs a new
    process on the same address."""

    def __init__(self, root=None, token=TOKEN, buffers=(), extra=()):
        self.dir = tempfile.mkdtemp(prefix="tensorwire-pytest-")
        self.root = root or os.path.join(self.dir, "root")
        os.makedirs(self.root, exist_ok=True)
        self.token = token
        self.token_file = None
        if token is not None:
            self.token_file = os.path.join(self.dir, "token")
            fd = os.open(self.token_file, os.O_WRONLY | os.O_CREAT, 0o600)
            os.write(fd, token + b"\n")
            os.close(fd)
        self.buffers = list(buffers)
        self.extra = list(extra)
        self.addr = None  # a stable_port() at the first start, kept for restarts
        self.proc = None
        self.log = os.path.join(self.dir, "node.log")

    def start(self):
        """Runs the node: on a stable_port() the first time (another if that
        one was taken meanwhile), on the same address after that (waiting
        while a killed process's port is still held)."""
        first = self.addr is None
        deadline, tries = time.monotonic() + 60, 0
        while True:
            if first:
                self.addr = f"127.0.0.1:{stable_port()}"
            # --parent: a suite killed midway leaves no node behind.
            args = [binary(), "node", "--listen", self.addr, "--root", self.root, "--parent", str(os.getpid())]
            if self.token_file:
                args += ["--token-file", self.token_file]
            for b in self.buffers:
                args += ["--buffer", b]
            args += self.extra
            logf = open(self.log, "ab")
            self.proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=logf, stdin=subprocess.DEVNULL)
            logf.close()
            line = self.proc.stdout.readline().decode()
            if line.startswith("listening on "):
                self.addr = line.split()[-1]
                threading.Thread(target=_drain, args=(self.proc.stdout,), daemon=True).start()
                return self
            self.proc.wait()
            self.proc.stdout.close()
            tries += 1
            if time.monotonic() > deadline or (first and tries >= 5):
                if first:
                    self.addr = None
                raise RuntimeError(f"the node did not start: {line!r}; log:\n{self.read_log()}")
            time.sleep(0.1)

    def read_log(self):
        try:
            with open(self.log, "rb") as f:
                return f.read().decode("utf-8", "replace")
        except OSError:
            return ""

    def kill(self):
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait()

    def stop(self):
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                self.kill()

    def close(self):
        self.stop()
        shutil.rmtree(self.dir, ignore_errors=True)

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.close()


def stateless_view(src, test):
    """Mounts internal/testkit/twoview's pathfs.py view of src (Debian's
    python3 with python3-fusepy) and returns it, unmounted at test's
    cleanup: another page cache whose open files go stale once unlinked
    through another view, as an NFS client's do when the server deletes
    them (a mapping through it faults at its next unread page). Skips as
    bindfs_view does, and without fusepy or the script."""
    import unittest
    script = os.path.join(os.path.dirname(__file__), "..", "..", "internal", "testkit", "twoview", "pathfs.py")
    fusermount = shutil.which("fusermount3") or shutil.which("fusermount")
    if os.geteuid() != 0 or not os.path.exists("/dev/fuse") or not fusermount or not os.path.exists(script):
        raise unittest.SkipTest("the stateless view needs root, /dev/fuse, fusermount and the repository's pathfs.py")
    if subprocess.run(["/usr/bin/python3", "-c", "import fusepy"], capture_output=True).returncode != 0:
        raise unittest.SkipTest("the stateless view needs Debian's python3-fusepy")
    d = tempfile.mkdtemp(prefix="tensorwire-pytest-stateless-")
    view = os.path.join(d, "view")
    os.mkdir(view)
    r = subprocess.run(["/usr/bin/python3", script, src, view], capture_output=True, timeout=60)
    if r.returncode != 0 or not os.path.ismount(view):
        shutil.rmtree(d, ignore_errors=True)
        raise unittest.SkipTest(f"pathfs.py {src} {view}: {r.returncode} {r.stderr.decode(errors='replace')}")
    test.addCleanup(_unmount, fusermount, view, d)
    return view


def _unmount(fusermount, view, d):
    for _ in range(50):
        if subprocess.run([fusermount, "-u", view], capture_output=True).returncode == 0:
            break
        time.sleep(0.1)
    else:
        subprocess.run([fusermount, "-u", "-z", view], capture_output=True)
    shutil.rmtree(d, ignore_errors=True)


def bindfs_view(src, test):
    """Mounts a bindfs (FUSE) view of src in a new folder and returns it,
    unmounted at test's cleanup: the same files through another mount (its
    own device number, its own page cache), as another machine on one NFS
    export sees them. Skips test where it cannot mount (not root, no
    /dev/fuse, no bindfs or fusermount: apt-get install bindfs fuse3)."""
    import unittest
    bindfs = shutil.which("bindfs")
    fusermount = shutil.which("fusermount3") or shutil.which("fusermount")
    if os.geteuid() != 0 or not os.path.exists("/dev/fuse") or not bindfs or not fusermount:
        raise unittest.SkipTest("a bindfs view needs root, /dev/fuse, bindfs and fusermount")
    d = tempfile.mkdtemp(prefix="tensorwire-pytest-view-")
    view = os.path.join(d, "view")
    os.mkdir(view)
    r = subprocess.run([bindfs, src, view], capture_output=True, timeout=60)
    if r.returncode != 0 or not os.path.ismount(view):
        shutil.rmtree(d, ignore_errors=True)
        raise unittest.SkipTest(f"bindfs {src} {view}: {r.returncode} {r.stderr.decode(errors='replace')}")

    if isinstance(test, type):
        test.addClassCleanup(_unmount, fusermount, view, d)
    else:
        test.addCleanup(_unmount, fusermount, view, d)
    return view


def _drain(f):
    """Reads f (a node's stdout) to its end and closes it."""
    with f:
        f.read()


class CountingProxy:
    """A TCP proxy in front of addr that counts the bytes each way."""

    def __init__(self, addr):
        host, port = addr.rsplit(":", 1)
        self.target = (host, int(port))
        self.lsock = socket.socket()
        self.lsock.bind(("127.0.0.1", 0))
        self.lsock.listen(16)
        self.addr = "127.0.0.1:%d" % self.lsock.getsockname()[1]
        self.up = 0
        self.down = 0
        self.socks = []
        self.mu = threading.Lock()
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self):
        while True:
            try:
                c, _ = self.lsock.accept()
            except OSError:
                return
            s = socket.create_connection(self.target)
            with self.mu:
                self.socks += [c, s]
            threading.Thread(target=self._pipe, args=(c, s, "up"), daemon=True).start()
            threading.Thread(target=self._pipe, args=(s, c, "down"), daemon=True).start()

    def _pipe(self, a, b, way):
        while True:
            try:
                d = a.recv(1 << 16)
            except OSError:
                d = b""
            if not d:
                try:
                    b.shutdown(socket.SHUT_WR)
                except OSError:
                    pass
                return
            with self.mu:
                setattr(self, way, getattr(self, way) + len(d))
            try:
                b.sendall(d)
            except OSError:
                return

    def counts(self):
        with self.mu:
            return self.up, self.down

    def close(self):
        self.lsock.close()
        with self.mu:
            for s in self.socks:
                s.close()


def run_python(code, *args, timeout=120):
    """Runs code in a new /usr/bin/python3 (this interpreter) that imports
    this tensorwire; returns the CompletedProcess."""
    return subprocess.run([sys.executable, "-c", code, *args], env=python_env(), capture_output=True,
                          timeout=timeout)


class _SocketNode:
    """What ScriptedNode and HandlerNode share: a listener on a free
    loopback port (addr), a thread accepting connections and running
    self._conn(c) on a thread of its own for each, and close(), which
    shuts every connection down."""

    def _listen(self):
        self.ls = socket.socket()
        self.ls.bind(("127.0.0.1", 0))
        self.ls.listen(8)
        self.addr = "127.0.0.1:%d" % self.ls.getsockname()[1]
        self.conns = []
        threading.Thread(target=self._serve, daemon=True).start()

    def close(self):
        self.ls.close()
        for c in self.conns:
            try:
                c.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            c.close()

    def _serve(self):
        while True:
            try:
                c, _ = self.ls.accept()
            except OSError:
                return
            self.conns.append(c)
            threading.Thread(target=self._conn, args=(c,), daemon=True).start()

    @staticmethod
    def _read(c, n):
        b = b""
        while len(b) < n:
            k = c.recv(n - len(b))
            if not k:
                raise EOFError
            b += k
        return b


class ScriptedNode(_SocketNode):
    """A node played from a script, in protocol version newest (2 or 3)
    without a token: the handshake (a newer hello is refused, as
    docs/protocol.md's "Versioning" says; from version 3 a session message
    says there are no side connections), then yamux. It answers every call
    with the next of its scripted responses (argument bytes, body bytes,
    and, when there is a third, the raw_len of a body that is an LZ4 frame;
    an empty map past the script), and a message stream with all of its
    scripted messages (the same) and an end. hellos: the versions offered
    to it."""

    def __init__(self, responses=(), messages=(), newest=3, fsid=None):
        self.responses = list(responses)
        self.messages = list(messages)  # a message stream's, then its end
        self.newest = newest
        self.hellos = []
        self.fsid = fsid or os.urandom(16)
        self._listen()

    def _conn(self, c):
        from tensorwire import _wire
        try:
            h = self._read(c, 64)
            version = h[4]
            self.hellos.append(version)
            if version > self.newest:
                c.sendall(_wire.hello(0, os.urandom(32), self.fsid, self.newest) + _wire.status(9, "unsupported version"))
                c.close()
                return
            c.sendall(_wire.hello(0, os.urandom(32), self.fsid, version) + _wire.status(0)
                      + (bytes(40) if version >= 3 else b""))
            pending = {}  # stream id: bytes of requests so far
            streams = set()  # message streams' ids: what the client sends on them is read and dropped
            while True:
                _, typ, flags, sid, length = struct.unpack(">BBHII", self._read(c, 12))
                if typ == 2:  # ping
                    if flags & 1:
                        c.sendall(struct.pack(">BBHII", 0, 2, 2, 0, length))
                    continue
                if typ != 0 or not length:
                    continue
                buf = pending.get(sid, b"") + self._read(c, length)
                if sid in streams:
                    continue
                while len(buf) >= 4:
                    (n,) = struct.unpack(">I", buf[:4])
                    if len(buf) < 4 + n:
                        break
                    hdr = _wire.parse_request_header(buf[4:4 + n])
                    end = 4 + n + hdr.get("arg_len", 0) + hdr.get("body_len", 0)
                    if len(buf) < end:
                        break
                    buf = buf[end:]
                    if hdr.get("stream"):
                        out = b"".join(_wire.stream_message_header(len(m[0]), len(m[1]), *m[2:]) + m[0] + m[1]
                                       for m in self.messages) + _wire.stream_end_header(0)
                        self.messages = []
                        streams.add(sid)
                        buf = b""
                    else:
                        # Calls past the script (a consumer's leave, say) get an empty map.
                        arg, body, *raw = self.responses.pop(0) if self.responses else (b"\x80", b"")
                        out = _wire.response_header(0, "", "", len(arg), len(body), *raw) + arg + body
                    c.sendall(struct.pack(">BBHII", 0, 0, 2, sid, len(out)) + out)
                pending[sid] = buf
        except (EOFError, OSError):
            return


class HandlerNode(_SocketNode):
    """A node over a socket whose handler decides, request by request, what
    to send and when (ScriptedNode only replays a script, at once): the
    handshake in protocol version 3 without a token and with no side
    connections, then yamux. handler(node, conn, sid, header, arg, body)
    is called on a thread of its own for each request (a call's, or a
    message stream's opening one; header and arg decoded), and sends what
    it likes with node.send(conn, sid, bytes), or nothing."""

    def __init__(self, handler):
        self.handler = handler
        self.wmu = threading.Lock()
        self._listen()

    def send(self, c, sid, data, flags=0):
        """Sends data on stream sid as one data frame."""
        with self.wmu:
            c.sendall(struct.pack(">BBHII", 0, 0, flags, sid, len(data)) + data)

    @staticmethod
    def response(value):
        """A call's response without a body: value as its argument."""
        from tensorwire import _msgpack, _wire
        raw = _msgpack.packb(value)
        return _wire.response_header(0, "", "", len(raw), 0) + raw

    def _conn(self, c):
        from tensorwire import _msgpack, _wire
        try:
            h = self._read(c, 64)
            if h[4] > 3:
                c.sendall(_wire.hello(0, os.urandom(32), os.urandom(16), 3) + _wire.status(9, "unsupported version"))
                c.close()
                return
            c.sendall(_wire.hello(0, os.urandom(32), os.urandom(16), h[4]) + _wire.status(0)
                      + (bytes(40) if h[4] >= 3 else b""))
            pending, streams = {}, set()
            while True:
                _, typ, flags, sid, length = struct.unpack(">BBHII", self._read(c, 12))
                if typ == 2:  # ping
                    if flags & 1:
                        with self.wmu:
                            c.sendall(struct.pack(">BBHII", 0, 2, 2, 0, length))
                    continue
                if typ != 0 or not length:
                    continue
                buf = pending.get(sid, b"") + self._read(c, length)
                if sid in streams:
                    continue  # what the client sends on a message stream is dropped
                while len(buf) >= 4:
                    (n,) = struct.unpack(">I", buf[:4])
                    if len(buf) < 4 + n:
                        break
                    hdr = _wire.parse_request_header(buf[4:4 + n])
                    a, b = hdr.get("arg_len", 0), hdr.get("body_len", 0)
                    end = 4 + n + a + b
                    if len(buf) < end:
                        break
                    arg = _msgpack.unpackb(buf[4 + n:4 + n + a]) if a else None
                    body = buf[4 + n + a:end]
                    buf = buf[end:]
                    if hdr.get("stream"):
                        streams.add(sid)
                    threading.Thread(target=self.handler, args=(self, c, sid, hdr, arg, body), daemon=True).start()
                pending[sid] = buf
        except (EOFError, OSError):
            return
