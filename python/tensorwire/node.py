"""A tensorwire node started from Python: torch_spread's
`with NetworkManager(...)` in one statement (docs/serve.md, "Replicas in
other processes").

    with tensorwire.Node(root="/dev/shm/tw", serve=["policy,replicas=0,input=obs:float32:64,output=logits:float32:16"],
                         store=["main"]) as node:
        replica = tensorwire.serve.Replica(node, "policy", module).start()
        client = tensorwire.serve.Client(node.address, "policy", token=node.token, root=node.root)

Node runs the `tensorwire node` binary (binary=, else $TENSORWIRE_BIN, else
the one bundled in this package by a wheel built with Go, else `tensorwire`
on PATH: _binary.find_binary; BinaryNotFoundError if none), waits until it listens, and
stops it on exit (SIGTERM, then SIGKILL after stop_timeout). The node also
stops with the Python process that started it, however that process ends
(kill -9 included): it is given this process's pid (`tensorwire node
--parent PID`) and stops cleanly, as on SIGTERM, once that process exits
(a pidfd on Linux 5.3 on; elsewhere it looks every 250 ms whether its
parent changed). Until 2026-12-01 the kernel SIGKILLed it instead
(prctl(PR_SET_PDEATHSIG)), when the *thread* that started it ended, so a
Node started from a thread that then finished died under its clients.
"""

import os
import shutil
import signal
import subprocess
import tempfile
import threading
import time
import weakref

from . import _exit
from ._binary import BinaryNotFoundError, find_binary
from .errors import TensorwireError

__all__ = ["Node", "NodeHandle", "BinaryNotFoundError", "NodeStartError"]


class NodeStartError(TensorwireError):
    """The node exited, or did not listen in time; the message holds the end
    of its log."""


class Node:
    """A `tensorwire node` process. root: the folder it serves (a temporary
    one, removed at exit, when None); serve, store, buffer, loader: lists of
    the --serve, --store, --buffer and --loader specs (the command's
    NAME,k=v form, README); token: the shared secret (bytes or str; None on
    loopback: no token); listen: HOST:PORT (127.0.0.1:0 picks a free port);
    extra: more command-line arguments; binary: the binary's path (default:
    $TENSORWIRE_BIN, the bundled one, PATH's; BinaryNotFoundError if none).

    start() (or `with`) runs it and returns once it listens; address is then
    "HOST:PORT". stop() (or leaving the `with`) stops it. Pickled (a
    spawned worker's argument), a started Node becomes a NodeHandle: its
    address, root and token, which the clients and Replica take as they
    take the Node, while the node stays this process's."""

    def __init__(self, root=None, serve=(), store=(), buffer=(), loader=(), token=None, listen="127.0.0.1:0",
                 extra=(), binary=None, start_timeout=60.0, stop_timeout=30.0):
        self._bin = find_binary(binary, "tensorwire.Node")
        self._tmp = None
        if root is None:
            self._tmp = _TempDir("tensorwire-node-", self)
            root = os.path.join(self._tmp.path, "root")
        os.makedirs(root, exist_ok=True)
        self.root = os.path.abspath(root)
        self.token = token.encode() if isinstance(token, str) else token
        self.listen = listen
        self.args = []
        for flag, specs in (("--serve", serve), ("--store", store), ("--buffer", buffer), ("--loader", loader)):
            if isinstance(specs, str):
                specs = [specs]
            for s in specs:
                self.args += [flag, s]
        self.args += list(extra)
        self.start_timeout = start_timeout
        self.stop_timeout = stop_timeout
        self.address = None
        self.proc = None
        self._dir = None
        self.log_path = None
        _exit.close_at_exit(self, _exit.NODES)  # whole: it may be stopped at exit
        _exit.reset_at_fork(self)  # a forked child lets go of it: _forked

    def start(self):
        """Runs the node and waits until it listens; returns self."""
        if self.proc is not None:
            return self
        self._dir = _TempDir("tensorwire-node-run-", self)
        # --parent: the node stops cleanly once this process exits, however
        # it exits (killed too). Before, PR_SET_PDEATHSIG had the kernel
        # SIGKILL it when the *thread* that started it ended, so a Node
        # started from a thread that then finished died under its clients.
        args = [self._bin, "node", "--listen", self.listen, "--root", self.root, "--parent", str(os.getpid())]
        if self.token is not None:
            tf = os.path.join(self._dir.path, "token")
            fd = os.open(tf, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            os.write(fd, self.token + b"\n")
            os.close(fd)
            args += ["--token-file", tf]
        args += self.args
        self.log_path = os.path.join(self._dir.path, "node.log")
        with open(self.log_path, "ab") as logf:
            self.proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=logf, stdin=subprocess.DEVNULL)
        line = [None]

        def first():
            line[0] = self.proc.stdout.readline().decode(errors="replace")

        t = threading.Thread(target=first, daemon=True)
        t.start()
        t.join(self.start_timeout)
        got = line[0] or ""
        if not got.startswith("listening on "):
            log = self.log()
            self.stop()
            raise NodeStartError(f"tensorwire.Node: the node did not start ({got.strip() or 'no word'}); "
                                 f"its log ends:\n{log[-4000:]}")
        self.address = got.split()[-1]
        threading.Thread(target=_drain, args=(self.proc.stdout,), daemon=True).start()
        return self

    def log(self):
        """The node's log (its stderr) so far."""
        try:
            with open(self.log_path, "rb") as f:
                return f.read().decode("utf-8", "replace")
        except (OSError, TypeError):
            return ""

    def stop(self):
        """Stops the node (SIGTERM; SIGKILL after stop_timeout) and removes
        the temporary folders it made. In a child forked from the process
        that started the node it does nothing (_forked let go of them)."""
        p, self.proc = self.proc, None
        if p is not None and p.poll() is None:
            p.send_signal(signal.SIGTERM)
            try:
                p.wait(self.stop_timeout)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
        if p is not None and p.stdout is not None:
            p.stdout.close()
        if self._dir is not None:
            self._dir.remove()
            self._dir = None
        if self._tmp is not None:
            self._tmp.remove()
            self._tmp = None

    def _forked(self):
        """In a child just forked (_exit.reset_at_fork): the node and its
        folders are the parent's. Let go of them, and of the folders'
        removal when this copy is collected."""
        for d in (self._dir, self._tmp):
            if d is not None:
                d.forget()
        self.proc = self._dir = self._tmp = None

    close = stop

    def __reduce__(self):
        if self.address is None:
            raise TypeError("tensorwire.Node: start it before handing it to another process")
        return NodeHandle, (self.address, self.root, self.token)

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.stop()

    def __del__(self):
        try:
            if self.proc is not None:
                self.stop()
        except Exception:
            pass


class NodeHandle:
    """A running Node as another process sees it: what a Node pickles to (a
    spawned worker's argument, say). address, root and token are the
    Node's, and the clients and Replica take a handle as they take the
    Node; the node stays its starter's, so stop() and close() here do
    nothing."""

    def __init__(self, address, root, token):
        self.address, self.root, self.token = address, root, token

    def stop(self):
        pass

    close = stop

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        pass

    def __repr__(self):
        return f"NodeHandle({self.address!r}, root={self.root!r})"


class _TempDir:
    """A temporary folder a Node made: removed by remove() (its Node's
    stop, at exit too: _exit), or when its Node is collected unstopped
    (weakref.finalize)."""

    def __init__(self, prefix, owner):
        self.path = tempfile.mkdtemp(prefix=prefix)
        self._collected = weakref.finalize(owner, shutil.rmtree, self.path, ignore_errors=True)
        self._collected.atexit = False  # _exit's, after the node stopped

    def forget(self):
        """Lets go of the folder without removing it (a forked child's)."""
        self._collected.detach()

    def remove(self):
        # Not self._collected(): a finalizer called once weakref's own exit
        # hook ran (before _exit's, registered earlier) does nothing.
        self._collected.detach()
        shutil.rmtree(self.path, ignore_errors=True)


def _drain(f):
    try:
        while f.read(1 << 16):
            pass
    except (OSError, ValueError):
        pass
