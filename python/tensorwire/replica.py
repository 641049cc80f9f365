"""A replica of a served model in this process: any torch.nn.Module runs the
batches a tensorwire node gathers from its clients (docs/serve.md, "Replicas
in other processes").

    module = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(), torch.nn.Linear(256, 16))
    with tensorwire.serve.Replica("127.0.0.1:7070", "policy", module, token=token, root="/mnt/shared",
                                  follow=(store, "policy")) as r:
        r.run()        # until close() from another thread, or Ctrl-C; or r.start() for a thread

The node keeps clients, queue, batching and leases; this process attaches to
the model as one more replica over the serve.replica message stream, and
runs each batch it is given: the module's forward under
torch.inference_mode(), the inputs a dict of tensors of batch size [n]
(nested keys as nested dicts; a model of one input field of a one-part key
gets that tensor alone unless plain=False), the outputs a dict of tensors
(or one tensor for a model of one output field), checked against the model's
output schema. When this side shares the node's page cache (root=, the
node's .tensorwire-fsid, "coherent") the rows go through two tensordict
memmaps in a folder of the replica's under the root, which the module reads
without a copy (torch.from_numpy over the mapping); otherwise they travel
with the messages as bytes.

By reference the batches and answers also skip the stream: the replica
makes two FIFOs in its folder (a lane, docs/protocol.md "serve.replica
lanes"), and each batch is a 16-byte frame (batch, row, n) it reads from
one and each answer a 24-byte frame (batch, version, error length) it
writes into the other, where the stream would cost a msgpack message in a
yamux frame on TCP each way; the stream then carries only its end.
lane=False keeps them on the stream; a node from before lanes, or one
that cannot open them, uses the stream anyway.

window=2 (to 4) lets the node keep that many batches in flight to the
replica, so that the next batch waits in the stream while this process
answers the last, rather than behind a round trip; the replica still runs
them one at a time, in order. The default is 1: on 2 busy cores (CPU-bound,
docs/benchmarks.md, 2026-11-29) a window of 2 made batches smaller (mean 2.9
rows against 4.4 at 8 clients) and requests/s no higher; it is for a replica
whose process waits on the node rather than on its CPU. A node older than
windows sends one at a time by bytes, but refuses the folder of
window*max_batch rows by reference: leave window=1 with such a node.

A batch the module fails (it raised, or its outputs are not the model's)
fails on the node with ForwardError carrying the message, and the node
detaches the replica; the replica attaches again by itself, after a backoff
(50 ms doubling to 5 s, reset by a batch that succeeds), as the node's own
replicas are replaced. If the process dies mid-batch the node runs the
batches it held on another replica; with none left, on the next one to
attach within the node's attach-wait (a replica restarted), else they fail
with ForwardError.

follow=(store, name), store a tensorwire.store.Store or its address: the
replica loads every new version of the parameter set name that a trainer
publishes (store.publish(name, module.state_dict())) into the module, only
between two batches, and every answer says the version that computed it.
"""

import logging
import os
import select
import shutil
import struct
import threading
import time

import numpy as np

from . import _exit, serve as _serve
from ._fields import is_int
from .errors import DeadlineExceededError, InternalError, InvalidArgumentError, TensorwireError
from .rpc import Client as _RPCClient, Sharing, StreamEnd
from ._td import TD, _BF16, as_array, marked, to_torch

__all__ = ["Replica"]

# The most batches a node keeps in flight to a replica (serve/replica.go's
# maxWindow): a larger window would only ask for rows the node leaves unused.
MAX_WINDOW = 4

_log = logging.getLogger("tensorwire.serve")


class Replica:
    """A replica of the model served as name by node, running module.

    node: the node's address "HOST:PORT", a tensorwire.Client, or a
    tensorwire.Node. module: a torch.nn.Module (or any callable of tensors).
    device: where the module runs ("cpu", "cuda:0"); inputs are moved there
    (from pinned host memory on CUDA) and outputs back. token, root: as
    tensorwire.Client takes them. follow: (store, name) to load new versions
    of a parameter set between batches. bytes_mode: rows travel with the
    messages even when the root is shared. plain: None (auto), True or
    False: whether a model of one input field is called with the tensor
    itself rather than a dict. reattach: attach again after the node
    detached this replica or the connection broke (default True). window:
    the batches the node may keep in flight to it (1 to 4; 1: one at a
    time, each after the last was answered). lane: by reference, take
    the batches through FIFOs in the replica's folder rather than on the
    stream (default True where the system has FIFOs).

    run() serves in the foreground until close() or KeyboardInterrupt;
    start() on a thread. Use it as a context manager, or close() it.
    batches counts the batches run; version is the parameter version the
    module holds (0: its own until a first version is loaded); lane is
    whether the node sends the batches of the current (or last) attachment
    through the lane."""

    def __init__(self, node, name, module, device="cpu", token=None, root=None, follow=None, bytes_mode=False,
                 plain=None, reattach=True, timeout=30.0, window=1, lane=True):
        import torch
        if not 1 <= int(window) <= MAX_WINDOW:
            raise InvalidArgumentError(f"serve: window={window}; want 1 to {MAX_WINDOW}")
        self.window = int(window)
        self._torch = torch
        addr = getattr(node, "address", node)
        if isinstance(addr, _RPCClient):
            self._client, self._own = addr, False
        else:
            if root is None:
                root = getattr(node, "root", None)
            if token is None:
                token = getattr(node, "token", None)
            self._client, self._own = _RPCClient(addr, token=token, root=root, timeout=timeout), True
        self.name = name
        self.module = module
        self.device = torch.device(device)
        self.bytes_mode = bytes_mode
        self.reattach = reattach
        self.batches = 0
        self.version = 0
        self.attachments = 0  # streams opened (a new one after each detachment)
        self._closed = threading.Event()
        self._mu = threading.Lock()
        self._inherited = False  # a forked child's copy (_forked): the attachment is the parent's
        _exit.reset_at_fork(self)
        self._stream = None
        self._thread = None
        self._dir = self._lock_fd = None
        self._in_mm = self._out_mm = None
        self._follow = None
        self._pending = None  # the newest Param not yet loaded
        self._held = None  # the Param the module was loaded from (its lease)
        self._follower = None
        try:
            self._setup(name, bytes_mode, timeout, plain, lane, follow)
        except BaseException:
            self.close()  # its connection, a follower started, a folder made
            raise

    def _setup(self, name, bytes_mode, timeout, plain, lane, follow):
        """__init__'s part that may fail once the connection is made."""
        info = self._client.call("serve.info", {"name": name}, timeout=timeout)
        if not isinstance(info, dict):
            raise InternalError(f"serve: the node described the model as {info!r:.200}")
        self.info = info
        self._in = _serve._parse_schema(info.get("input"), "input")
        self._out = _serve._parse_schema(info.get("output"), "output")
        self.max_batch = info.get("max_batch", 0)
        if not is_int(self.max_batch) or self.max_batch < 1:
            raise InternalError(f"serve: the node says the model's max batch is {self.max_batch!r}")
        self._plain = plain if plain is not None else (len(self._in) == 1 and len(self._in[0][0]) == 1)
        self._plain_out = len(self._out) == 1
        self._ref = bool(self._client.root) and not bytes_mode and _serve.fcntl is not None and \
            self._client.sharing(timeout) == Sharing.COHERENT
        self._pinned = None
        self._lane = bool(lane) and self._ref and hasattr(os, "mkfifo")
        self.lane = False
        self._lane_fds = None  # the current stream's lane's FIFO ends
        # Weights: a thread waits for new versions; the serving loop loads
        # the newest between two batches.
        if follow is not None:
            st, pname = follow
            if isinstance(st, str):
                raise InvalidArgumentError("serve: follow=(store, name) wants a tensorwire.store.Store; "
                                           f"got the address {st!r}: open the Store first")
            self._follow = (st, pname)
            self._load_latest()
            self._follower = threading.Thread(target=self._follow_loop, name="tensorwire-replica-follow",
                                              daemon=True)
            self._follower.start()
        if self._ref:
            self._make_folder()

    # The public methods.

    @property
    def mode(self):
        """"ref" when the rows go through the replica's folder under the
        shared root, else "bytes"."""
        return "ref" if self._ref else "bytes"

    def run(self):
        """Serves batches until close() (or KeyboardInterrupt, which closes
        the replica and returns)."""
        wait = 0.05
        try:
            while not self._closed.is_set():
                try:
                    ok = self._attach_once()
                except StreamEnd:
                    ok = True
                except TensorwireError as e:
                    if self._closed.is_set():
                        break
                    if not self.reattach:
                        raise
                    _log.warning("serve replica %s: detached (%s); attaching again in %.2fs", self.name, e, wait)
                    ok = False
                if self._closed.is_set():
                    break
                if not self.reattach:
                    break
                if ok:
                    wait = 0.05
                self._closed.wait(wait)
                wait = min(wait * 2, 5.0)
        except KeyboardInterrupt:
            self.close()

    def start(self):
        """Runs run() on a thread of its own, and returns self. A replica
        started so and still running when the interpreter exits is closed
        then, before a tensorwire.Node of the same process stops."""
        if self._thread is None:
            _exit.close_at_exit(self, _exit.REPLICAS)
            self._thread = threading.Thread(target=self.run, name="tensorwire-replica", daemon=True)
            self._thread.start()
        return self

    def _forked(self):
        """In a child just forked (_exit.reset_at_fork): the attachment,
        its thread, its folder and its locks are the parent's. The
        child's copies of the lane's FIFO ends are closed, so that the
        node still reads the lane's end when the parent dies."""
        self._inherited = True
        _close_lane(self._lane_fds)
        self._lane_fds = None

    def close(self):
        """Detaches from the node and stops run(); removes the replica's
        folder. In a child forked from the process that started it, does
        nothing: the attachment, its thread and the folder are the
        parent's (and so may be the locks, held at the fork)."""
        if self._inherited:
            return
        if self._closed.is_set():
            return
        self._closed.set()
        with self._mu:
            st = self._stream
        if st is not None:
            try:
                st.close()
            except Exception:
                pass
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(10)
        for p in (self._pending, self._held):
            if p is not None:
                p.close()
        if self._own:
            self._client.close()
        if self._dir is not None:
            shutil.rmtree(self._dir, ignore_errors=True)
            self._dir = None
        if self._lock_fd is not None:
            os.close(self._lock_fd)
            self._lock_fd = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    # Serving.

    def _attach_once(self):
        """Attaches, serves batches until the stream ends; True when at
        least one batch succeeded."""
        self._lane_fds = self._make_lane() if self._lane else None
        try:
            return self._attach(self._lane_fds)
        finally:
            _close_lane(self._lane_fds)
            self._lane_fds = None

    def _attach(self, lane):
        """_attach_once with the lane's FIFO ends made (or None)."""
        st = self._client.open_stream("serve.replica", _request(self.name, self._rel if self._ref else "",
                                                                self.window, lane is not None),
                                      result_tds=("in",))
        with self._mu:
            if self._closed.is_set():
                st.close()
                return False
            self._stream = st
        self.attachments += 1
        served = False
        try:
            msg = st.recv()
            self.lane = lane is not None and _is_request(msg) and msg.get("batch", 0) == 0 and msg.get("n", 0) == 0
            if self.lane:
                return self._serve_lane(st, lane)  # the node took the lane
            while True:  # a node from before lanes, or one that could not open it: the stream
                if not _is_request(msg):
                    # Not a batch: the node is not speaking the protocol. The
                    # stream is given up (run attaches again, or raises).
                    raise InternalError(f"serve: the node sent {msg!r:.200} for a batch")
                self._switch()
                ans = self._run_batch(msg)
                if not ans["error"]:
                    self.batches += 1
                    served = True
                st.send(ans)
                msg = st.recv()
        finally:
            with self._mu:
                self._stream = None
            try:
                st.close()
            except Exception:
                pass
        return served

    def _make_lane(self):
        """The lane's FIFOs, made anew in the folder for a stream (nothing
        of the last stream's is left in them), and this side's ends: the
        batches' for reading and the answers' for reading and writing, so
        that neither open waits for the node (which opens the other ends
        when the stream's request arrives). None where FIFOs cannot be
        made here: the batches go on the stream."""
        fds = []
        try:
            for name in (_LANE_BATCHES, _LANE_ANSWERS):
                path = os.path.join(self._dir, name)
                try:
                    os.unlink(path)
                except FileNotFoundError:
                    pass
                os.mkfifo(path, 0o600)
            fds.append(os.open(os.path.join(self._dir, _LANE_BATCHES), os.O_RDONLY | os.O_NONBLOCK))
            fds.append(os.open(os.path.join(self._dir, _LANE_ANSWERS), os.O_RDWR))
        except OSError as e:
            for fd in fds:
                os.close(fd)
            _log.warning("serve replica %s: no lane (%s); the batches go on the stream", self.name, e)
            self._lane = False
            return None
        return fds

    def _serve_lane(self, st, lane):
        """Serves the batches of the lane until it ends (the node closed
        its end: the stream's end, or its error, follows) or close(); True
        when at least one batch succeeded. The stream's socket is watched
        too, to answer the node's keep-alive pings and see its end. close()
        cancels the stream, so the node closes the lane at once; the wait
        also looks at close() every second, for a node that does not."""
        fb, fa = lane
        lane_only = select.poll()
        lane_only.register(fb, select.POLLIN)
        with_sock = select.poll()
        with_sock.register(fb, select.POLLIN)
        sock = st.fileno()
        with_sock.register(sock, select.POLLIN)
        served = False
        while True:
            try:
                frame = os.read(fb, _LANE_BATCH.size)
            except BlockingIOError:
                frame = None
            if frame:
                if len(frame) != _LANE_BATCH.size:
                    raise InternalError(f"serve: a lane frame of {len(frame)} bytes from the node")
                bid, row, n = _LANE_BATCH.unpack(frame)
                self._switch()
                ans = self._run_batch({"batch": bid, "n": n, "row": row})
                if not ans["error"]:
                    self.batches += 1  # before the answer: its callers may read the count
                    served = True
                os.write(fa, _lane_answer(bid, ans["version"], ans["error"]))
                continue
            if frame == b"":  # the node closed the lane: the stream ends too
                msg = st.recv(timeout=10)
                raise InternalError(f"serve: the node ended the lane and sent {msg!r:.200} on the stream")
            if self._closed.is_set():
                return served
            if any(fd == sock for fd, _ in with_sock.poll(1000)):
                if st.ready():
                    msg = st.recv(timeout=10)  # the stream's end (raised), or a message the node would not send
                    raise InternalError(f"serve: the node sent {msg!r:.200} on the stream of a lane")
                # ready() read the pings, or another thread of a shared
                # client reads the socket: only the lane for a moment, so
                # that what that thread has yet to read is no busy loop.
                lane_only.poll(20)

    def _run_batch(self, msg):
        torch = self._torch
        bid = msg.get("batch", 0)
        n = msg.get("n", 0)
        row = msg.get("row") or 0  # by reference: its rows in the folder are [row, row+n)
        if not 1 <= n <= self.max_batch:
            return _answer(bid, self.version, f"a batch of {n} rows; the max batch is {self.max_batch}")
        if self._ref and not (0 <= row and row + n <= self.window * self.max_batch):
            return _answer(bid, self.version, f"a batch of rows [{row}, {row + n}); the folder has "
                                              f"{self.window * self.max_batch}")
        try:
            if self._ref:
                tensors = [t[row:row + n] for t in self._in_t]
            else:
                src = msg.get("in") or {}
                tensors = []
                for k, dt, shape in self._in:
                    v = src
                    for p in k:
                        v = v[p]
                    tensors.append(to_torch(marked(v, dt)))
            inputs = {}
            for (k, dt, shape), t in zip(self._in, tensors):
                _serve._set(inputs, k, self._to_device(t, k))
            arg = _only(inputs) if self._plain else inputs
            with torch.inference_mode():
                out = self.module(arg)
            outs = self._check(out, n)
        except Exception as e:  # the module's failure fails its batch, not this process
            return _answer(bid, self.version, f"{type(e).__name__}: {e}")
        if self._ref:
            for dst, t in zip(self._out_t, outs):
                dst[row:row + n].copy_(t)
            return _answer(bid, self.version)
        data = {}
        for (k, dt, _), t in zip(self._out, outs):
            _serve._set(data, k, marked(np.ascontiguousarray(as_array(t)), dt))
        return _answer(bid, self.version, out=TD(data, batch=[n]))

    def _to_device(self, t, key):
        if self.device.type == "cpu":
            return t
        if self.device.type == "cuda":
            if self._pinned is None:
                self._pinned = {}
            buf = self._pinned.get(key)
            if buf is None or buf.shape[1:] != t.shape[1:] or buf.dtype != t.dtype:
                buf = self._torch.empty((self.max_batch,) + tuple(t.shape[1:]), dtype=t.dtype).pin_memory()
                self._pinned[key] = buf
            b = buf[:t.shape[0]]
            b.copy_(t)
            return b.to(self.device, non_blocking=True)
        return t.to(self.device)

    def _check(self, out, n):
        """The module's outputs as CPU tensors in the output schema's order,
        or ValueError saying what does not fit."""
        torch = self._torch
        if isinstance(out, torch.Tensor):
            if not self._plain_out:
                raise ValueError(f"the module returned one tensor; the model's output has {len(self._out)} fields "
                                 f"({', '.join('/'.join(k) for k, _, _ in self._out)}): return a dict")
            got = {self._out[0][0]: out}
        elif isinstance(out, dict) or hasattr(out, "items"):
            got = {}
            _flatten(out, (), got)
        else:
            raise ValueError(f"the module returned a {type(out).__name__}; want a dict of tensors or a tensor")
        want = {k for k, _, _ in self._out}
        missing = [("/".join(k)) for k in want if k not in got]
        extra = [("/".join(k)) for k in got if k not in want]
        if missing or extra:
            raise ValueError(f"the module's outputs have keys missing {missing} and not in the schema {extra}")
        res = []
        for k, dt, shape in self._out:
            t = got[k]
            if not isinstance(t, torch.Tensor):
                raise ValueError(f"output {'/'.join(k)} is a {type(t).__name__}, not a tensor")
            tn = str(t.dtype)
            if tn != dt:
                raise ValueError(f"output {'/'.join(k)} has dtype {tn}, want {dt}")
            if tuple(t.shape) != (n,) + tuple(shape):
                raise ValueError(f"output {'/'.join(k)} has shape {list(t.shape)}, want {[n] + list(shape)}")
            res.append(t.detach().to("cpu"))
        return res

    # Weights.

    def _load_latest(self):
        from .store import NotFoundError as _NotFound
        st, pname = self._follow
        try:
            p = st.latest(pname)
        except _NotFound:
            return
        self._pending = p
        self._switch()

    def _follow_loop(self):
        st, pname = self._follow
        v = self.version
        while not self._closed.is_set():
            try:
                p = st.wait_newer(pname, v, timeout=1.0)
            except DeadlineExceededError:
                continue  # no newer version within the second: ask again
            except TensorwireError:
                # The store failed at once (its node unreachable past the
                # call's retries, or an answer it could not use): not again
                # at once, which would spin this thread on the node.
                self._closed.wait(_FOLLOW_RETRY)
                continue
            if self._closed.is_set():
                p.close()
                return
            with self._mu:
                old, self._pending = self._pending, p
            if old is not None:
                old.close()
            v = p.version

    def _switch(self):
        """Loads the newest version a trainer published, between batches."""
        with self._mu:
            p, self._pending = self._pending, None
        if p is None or p.version <= self.version:
            if p is not None:
                p.close()
            return
        torch = self._torch
        sd = {}
        _flatten_sd(p.td, "", sd)
        # load_state_dict copies every tensor into the module's own: an array
        # torch may share (one that came as bytes, or a writeable mapping the
        # held Param keeps mapped until the next switch) is not copied first;
        # a read-only one is (torch does not take non-writeable arrays).
        state = {k: to_torch(v if v.flags.writeable else np.array(v), isinstance(v, _BF16)) for k, v in sd.items()}
        try:
            self.module.load_state_dict(state)
        except Exception as e:
            _log.error("serve replica %s: version %d of the parameters does not fit the module: %s", self.name,
                       p.version, e)
            p.close()
            return
        old, self._held = self._held, p
        self.version = p.version
        if old is not None:
            old.close()

    # The folder.

    def _make_folder(self):
        """Makes the replica's folder under the root, as a client's slots
        (serve.Client): ClientsDir/ID/{in,out,lock}, window*max_batch rows
        each (a batch in flight's rows are [k*max_batch, (k+1)*max_batch)
        for some k, the node's "row")."""
        root = self._client.root
        parent = os.path.join(root, *_serve.CLIENTS_DIR.split("/"))
        os.makedirs(parent, exist_ok=True)
        _serve._check_no_link(root, _serve.CLIENTS_DIR)
        _serve._remove_dead(root, _serve.CLIENTS_DIR)
        name = os.urandom(8).hex()
        tmp = os.path.join(parent, ".tmp-" + name)
        os.mkdir(tmp)
        try:
            self._lock_fd = _serve._lock(os.path.join(tmp, "lock"))
            if self._lock_fd is None:
                raise InternalError(f"serve: the lock of {tmp}, a folder this replica just made, is held")
            rows = self.window * self.max_batch
            _serve._create_td(os.path.join(tmp, "in"), self._in, rows)
            _serve._create_td(os.path.join(tmp, "out"), self._out, rows)
            final = os.path.join(parent, name)
            os.rename(tmp, final)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        self._dir = final
        self._rel = _serve.CLIENTS_DIR + "/" + name
        self._in_mm = _serve._map_td(os.path.join(final, "in"), self._in, rows)
        self._out_mm = _serve._map_td(os.path.join(final, "out"), self._out, rows)
        # Tensors over the mappings, made once: a batch's are views of its
        # rows (torch.from_numpy shares the mapping's memory).
        torch = self._torch
        self._in_t = [to_torch(np.asarray(a), dt == "torch.bfloat16") for (_, dt, _), a in zip(self._in, self._in_mm)]
        self._out_t = [to_torch(np.asarray(a), dt == "torch.bfloat16") for (_, dt, _), a in zip(self._out, self._out_mm)]


def _request(name, prefix, window, lane=False):
    """serve.replica's request: the model, the replica's folder under the
    root ("" for rows as bytes), the batches it takes in flight and, by
    reference, whether the folder has a lane's FIFOs."""
    r = {"name": name, "prefix": prefix, "window": window}
    if lane:
        r = {"lane": True, **r}  # the keys in the order the Go side writes them
    return r


# The lane (serve/lane.go): its FIFOs in the replica's folder and its
# frames, little-endian: a batch (batch, row, n), an answer (batch,
# version, error length, 0) and the error's bytes, each written whole.
_LANE_BATCHES = "batches"
_LANE_ANSWERS = "answers"
_LANE_BATCH = struct.Struct("<QII")
_LANE_ANSWER = struct.Struct("<QQII")
_MAX_LANE_ERROR = 4096 - _LANE_ANSWER.size


def _lane_answer(batch, version, error=""):
    """An answer frame: the error's UTF-8 bytes cut at _MAX_LANE_ERROR."""
    e = error.encode("utf-8", "replace")[:_MAX_LANE_ERROR]
    return _LANE_ANSWER.pack(batch, version, len(e), 0) + e


def _close_lane(lane):
    if lane is not None:
        for fd in lane:
            try:
                os.close(fd)
            except OSError:
                pass


# How long the weights' follower waits after a store call failed at once.
_FOLLOW_RETRY = 0.5


def _is_request(msg):
    """Whether msg is a batch as the node sends one: a map whose batch, n and
    row (absent or None: 0) are integers."""
    return isinstance(msg, dict) and all(is_int(v) for v in (msg.get("batch", 0), msg.get("n", 0),
                                                             msg.get("row") or 0))


def _answer(batch, version, error="", out=None):
    """An answer to a batch: its number, the parameter version, the error
    ("" for none) and, by bytes, the outputs (a TD)."""
    return {"batch": batch, "version": version, "error": error, "out": out}


def _only(d):
    """The one tensor of a dict of one key."""
    (v,) = d.values()
    return v


def _flatten(d, prefix, out):
    for k, v in d.items():
        if isinstance(v, dict) or (hasattr(v, "items") and not hasattr(v, "shape")):
            _flatten(v, prefix + (k,), out)
        else:
            out[prefix + (k,)] = v


def _flatten_sd(d, prefix, out):
    for k, v in d.items():
        if isinstance(v, dict):
            _flatten_sd(v, prefix + k + ".", out)
        else:
            out[prefix + k] = v

