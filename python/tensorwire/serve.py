"""A model served by a tensorwire node, from Python (docs/serve.md): batched
predictions.

    c = tensorwire.serve.Client("127.0.0.1:7070", "policy", token=token, root="/mnt/shared")
    out = c.predict({"obs": obs})              # obs: [n, 64] float32; out["logits"]: [n, 16]
    fut = c.predict_async({"obs": obs})        # a concurrent.futures.Future
    out = await c.apredict({"obs": obs})       # in asyncio
    c.close()

The node gathers the requests of all its clients into batches for the
model's replicas (its dynamic batching), so a client gains by keeping many
predictions in flight: predict_async and apredict send the request at once
and return; one thread of the client's collects the responses of all of
them, whichever comes first.

When the client shares the node's root (root=, the same .tensorwire-fsid),
its rows travel through files ("ref" mode): the client keeps input and
output slots, two tensordict memmaps in a folder of its own under the root
(.tensorwire-serve/clients/ID), registered with the node; a request carries
only (client, first row, rows), and the node writes the outputs into the
client's output slots before it answers. Otherwise ("bytes" mode) the rows
travel with the calls. On Linux x86-64 a request by reference goes by
bell, as the Go client's do: appended to a ring file the client shares with
the node, the node woken with a futex, and the request's record waited on
with a futex (predict), or with futex_waitv on all of them at once by the
collector thread of predict_async and apredict (Linux 5.16 and later);
elsewhere requests by reference are calls (docs/serve.md, "Python clients
by bell").

Calls ride out the node restarting as the Go client's do: a request that
finds the node unreachable is sent again, with a backoff from 20 ms to 1 s,
until its timeout; predictions hold no state, so sending one again is always
safe. A client whose registration the node lost registers again by itself.
"""

import asyncio
import collections
import concurrent.futures
import errno
import logging
import os
import re
import shutil
import socket
import stat
import sys
import threading
import time

import numpy as np

from . import _bell, _exit, errors as _errors
from ._serve_bell import _BELL_QUIET, BellRequests
from ._fields import answer, uint
from ._td import DTYPES, TD, NonTensorData, as_array, dtype_name, flatten, marked, tree_to_torch
from .dataset import escape_key
from .errors import (AlreadyExistsError, ClientClosedError, DeadlineExceededError, FailedPreconditionError,
                     InternalError, InvalidArgumentError, NotFoundError, ResourceExhaustedError, UnavailableError,
                     register_reason)
from .errors import NotFoundError as _CodeNotFound
from .rpc import Client as _RPCClient, Sharing, _rebuild

try:
    import fcntl
except ImportError:  # not Unix: no process-owned locks, so no ref mode
    fcntl = None

__all__ = ["Client", "SchemaError", "QueueFullError", "ForwardError", "ParamsError", "NoParamsError", "VersionError",
           "StoppedError", "ClosedError", "NotFoundError", "ExistsError", "NotRegisteredError", "ConfigError",
           "CLIENTS_DIR", "MAX_ROWS", "Replica", "NoReplicaError"]

CLIENTS_DIR = ".tensorwire-serve/clients"
_NODES_DIR = ".tensorwire-serve/nodes"
MAX_ROWS = 1 << 20
_ID_RE = re.compile(r"^[0-9a-f]{16}$")


# The serve service's errors: each Go sentinel's code and reason
# (docs/serve.md, "Errors").

@register_reason
class SchemaError(InvalidArgumentError):
    """Inputs whose keys, dtypes or row shapes are not the model's, that are
    not a batch of 1 to max_batch rows; nothing was sent (or, from the node,
    nothing was queued)."""
    reason = "serve.schema"


@register_reason
class QueueFullError(ResourceExhaustedError):
    """The node's queue for the model is full; nothing was queued. Back off
    and try again."""
    reason = "serve.queue_full"


@register_reason
class ForwardError(InternalError):
    """The model failed (or panicked) on the batch the request was in; the
    replica was replaced. The message says how."""
    reason = "serve.forward"


@register_reason
class ParamsError(InvalidArgumentError):
    reason = "serve.params"


@register_reason
class NoParamsError(FailedPreconditionError):
    """The node's model has no parameters loaded yet (its weights would be
    its constructor's zeros); nothing was queued."""
    reason = "serve.no_params"


@register_reason
class VersionError(FailedPreconditionError):
    reason = "serve.version"


@register_reason
class StoppedError(UnavailableError):
    """The node's manager closed (the node is stopping); retried as the node
    being unreachable is."""
    reason = "serve.stopped"


@register_reason
class ClosedError(FailedPreconditionError):
    """The client is closed."""
    reason = "serve.closed"


@register_reason
class NotFoundError(NotFoundError):  # noqa: F811 (serve.NotFoundError is an errors.NotFoundError)
    """No model by that name on the node."""
    reason = "serve.not_found"


@register_reason
class ExistsError(AlreadyExistsError):
    reason = "serve.exists"


@register_reason
class NotRegisteredError(_CodeNotFound):
    """The node does not hold the client's registration (it restarted, or
    the lease ran out); the client registers again by itself."""
    reason = "serve.not_registered"


@register_reason
class ConfigError(InvalidArgumentError):
    reason = "serve.config"


@register_reason
class NoReplicaError(FailedPreconditionError):
    """The model's replicas are all attached processes (tensorwire.serve.Replica,
    a node's replicas=0), and none was attached within the node's attach-wait;
    nothing was run."""
    reason = "serve.no_replica"


def _parse_schema(s, what):
    """A row schema from serve.info: a list of (key path, dtype name, row
    shape), in the node's order."""
    if not isinstance(s, list) or not s:
        raise InternalError(f"serve: the node describes the model's {what} as {s!r}")
    out, seen = [], set()
    for f in s:
        try:
            key = tuple(k if isinstance(k, str) else k.decode() for k in f["key"])
            dt = f["dtype"]
            dt = dt if isinstance(dt, str) else dt.decode()
            shape = tuple(int(x) for x in (f.get("shape") or ()))
        except (KeyError, TypeError, ValueError, AttributeError):
            raise InternalError(f"serve: the node describes a field of the model's {what} as {f!r}") from None
        if not key or dt not in DTYPES or any(x < 0 for x in shape) or key in seen:
            raise InternalError(f"serve: the node describes a field of the model's {what} as {f!r}")
        seen.add(key)
        out.append((key, dt, shape))
    return out


def _schema_dicts(schema):
    return [{"key": list(k), "dtype": dt, "shape": list(shape)} for k, dt, shape in schema]


def _row_bytes(schema):
    return [DTYPES[dt].itemsize * int(np.prod(shape, dtype=np.int64)) for _, dt, shape in schema]


class _Req:
    """A prediction: its inputs (arrays in the input schema's order), its
    rows, and where it stands."""

    __slots__ = ("arrays", "n", "deadline", "future", "as_torch", "with_version", "start", "reg", "pending",
                 "wait", "err", "admitted", "holds", "rung", "gen", "probe")

    def __init__(self, arrays, n, deadline, as_torch, with_version):
        self.arrays = arrays
        self.n = n
        self.deadline = deadline
        self.future = None
        self.as_torch = as_torch
        self.with_version = with_version
        self.start = -1  # ref mode: the first of its rows in the slots; -1 while it has none
        self.reg = 0  # ref mode: the registration it was sent under
        self.pending = None  # the rpc call in flight
        self.wait = 0.02  # the next backoff
        self.err = None  # the error of its last attempt, when it is sent again
        self.admitted = None  # a predict waiting to be admitted waits for this Event
        self.holds = False  # admitted: it counts in the client's requests in flight (and holds slots)
        self.rung = 0  # by bell: the sequence number of the request last rung, until its record says done
        self.gen = 0  # by bell, asynchronous: the registrations it was rung under
        self.probe = 0.0  # by bell, asynchronous: when to ask the node whether it holds the registration


class _Slots:
    """Which rows of the client's slots are free: first fit over sorted free
    runs. Not thread-safe: the client's lock guards it."""

    def __init__(self, n):
        self.free = [(0, n)]  # (start, length), sorted, never adjacent

    def take(self, n):
        for i, (s, k) in enumerate(self.free):
            if k >= n:
                if k == n:
                    del self.free[i]
                else:
                    self.free[i] = (s + n, k - n)
                return s
        return -1

    def put(self, start, n):
        f = self.free
        i = 0
        while i < len(f) and f[i][0] < start:
            i += 1
        f.insert(i, (start, n))
        if i + 1 < len(f) and f[i][0] + f[i][1] == f[i + 1][0]:  # merge with the next
            f[i] = (f[i][0], f[i][1] + f[i + 1][1])
            del f[i + 1]
        if i > 0 and f[i - 1][0] + f[i - 1][1] == f[i][0]:  # and the previous
            f[i - 1] = (f[i - 1][0], f[i - 1][1] + f[i][1])
            del f[i]


class Client(BellRequests):
    """The model served as name by a node.

    node: the node's address "HOST:PORT", or a tensorwire.Client to share.
    token, root: as tensorwire.Client takes them; root is this side's view
    of the node's shared root, which makes ref mode possible. bytes_mode:
    rows travel with the calls even when the root is shared. slots: how many
    rows the client's slots hold in ref mode (default: 64 max batches, at
    most 4096 rows and at least one max batch). max_in_flight: how many
    requests the client sends at once (the node refuses more than 256
    streams from one connection, docs/protocol.md); requests beyond it, or
    beyond the free slots, wait in the client, in order, for earlier ones
    to finish. timeout: seconds the first connection and the model's
    description may take.

    Timeouts of predictions are seconds; None (the default) waits and
    retries as long as it takes, as a Go call with context.Background()
    does. A Client is safe for use from several threads and from asyncio;
    close() it when done (it unregisters and removes its slots).
    """

    def __init__(self, node, name, token=None, root=None, bytes_mode=False, slots=None, max_in_flight=128,
                 timeout=30.0):
        self._inherited = False  # a forked child's copy (_forked): the registration is the parent's
        _exit.reset_at_fork(self)
        self._made = ((node, name), {"token": token, "root": root, "bytes_mode": bytes_mode, "slots": slots,
                                     "max_in_flight": max_in_flight, "timeout": timeout})
        if not isinstance(max_in_flight, int) or max_in_flight < 1:
            raise ConfigError(f"serve: max_in_flight={max_in_flight!r}; want at least 1")
        if isinstance(node, _RPCClient):
            self._client, self._own = node, False
        else:
            self._client, self._own = _RPCClient(node, token=token, root=root, timeout=timeout), True
        self.name = name
        self.max_in_flight = max_in_flight
        self._mu = threading.Lock()
        self._cv = threading.Condition(self._mu)
        self._closed = False
        self._flight = ()  # requests sent whose response the collector waits for (a tuple, replaced whole)
        self._waiting = collections.deque()  # requests waiting to be admitted, in order
        # (deadline, threading.Timer): fails the asynchronous requests still
        # waiting to be admitted at their deadline (_expire); None when none waits with one.
        self._expiry = None
        self._admitted = 0  # requests admitted and not yet released
        self._collector = None
        self._retry_pool = None
        self._bell_flight = {}  # asynchronous requests rung whose records the bell collector watches (in order)
        self._bell_collector = None
        self._watch = None  # the bell collector's own word (_bell.Watch): a new request changes it
        self._bell_sleeping = False  # the bell collector sleeps (or is about to) on the words it read
        self._probing = False  # a probe runs for the bell collector
        self._reg_mu = threading.Lock()
        self._id = 0  # the node's registration; 0 while there is none
        self._dir = None  # ref mode: the slots' folder
        self._lock_fd = None
        self._stop = threading.Event()
        self._renewer = None
        self._rel = None  # ref mode: the slots' folder, relative to the root
        self._in_mm = self._out_mm = None  # ref mode: the slots' tensors, in the schemas' order
        self._ring = None  # ref mode on Linux x86-64: the ring of requests by bell (_bell.py)
        self._lease_ms = 0
        self._ref = False
        self._sharing = Sharing.NONE
        self.registrations = 0  # registrations made (a new one after the node lost one)
        try:
            deadline = _deadline(timeout)
            info = self._call("serve.info", {"name": name}, deadline)
            self.info = info
            self._in = _parse_schema(info.get("input"), "input")
            self._out = _parse_schema(info.get("output"), "output")
            self.max_batch = _uint(info, "max_batch")
            if not 1 <= self.max_batch <= MAX_ROWS:
                raise InternalError(f"serve: the node says the model's max batch is {self.max_batch}")
            # The slots are rewritten in place: by reference only when the
            # node's page cache is this side's (coherent).
            self._sharing = self._client.sharing(timeout)
            shared = False
            if self._client.root and not bytes_mode and fcntl is not None:
                shared = self._sharing == Sharing.COHERENT
            self._ref = shared
            if slots is None:
                slots = max(self.max_batch, min(64 * self.max_batch, 4096))
            if not isinstance(slots, int) or not 1 <= slots <= MAX_ROWS:
                raise ConfigError(f"serve: {slots!r} slots; want 1 to {MAX_ROWS}")
            self.slots = slots
            self._limit = min(self.max_batch, slots) if shared else self.max_batch
            if shared:
                self._free = _Slots(slots)
                self._make_slots()
                self._register(0, deadline)
                lease = (self._lease_ms or _uint(info, "lease_ms") or 30000) / 1000.0
                self._renewer = threading.Thread(target=self._renew_every, args=(max(lease / 4, 0.05),),
                                                 name="tensorwire-serve-lease", daemon=True)
                self._renewer.start()
                _exit.close_at_exit(self, _exit.CLIENTS)  # its folder goes at exit, if not closed before
        except BaseException:
            self._teardown()
            raise

    # Properties.

    @property
    def mode(self):
        """"ref" when the rows go through slots in files under the shared
        root, "bytes" when they travel with the calls."""
        return "ref" if self._ref else "bytes"

    @property
    def bell(self):
        """Whether predict() goes by bell: in ref mode on Linux x86-64, a
        request is an entry in a ring file shared with the node and a futex
        wake-up, and its answer a record waited on with a futex, rather
        than a call over TCP (docs/serve.md, "Python clients by bell").
        predict_async and apredict go by bell too where the kernel has
        futex_waitv (Linux 5.16), else by call."""
        r = self._ring
        return r is not None and r.bell is not None

    @property
    def sharing(self):
        """How much of the node's root the connection shared when the mode
        was picked: "coherent", "storage" or "none" (tensorwire.Sharing)."""
        return self._sharing

    @property
    def input_schema(self):
        """The model's input fields: a list of {key, dtype, shape} (shape of
        one row)."""
        return _schema_dicts(self._in)

    @property
    def output_schema(self):
        return _schema_dicts(self._out)

    # Predictions.

    def predict(self, inputs, timeout=None, as_torch=False, return_version=False):
        """Runs the model on inputs and returns its outputs: a dict of new
        numpy arrays of n rows (torch tensors sharing their memory with
        as_torch), and with return_version (outputs, version), the version of
        the parameters that produced them.

        inputs: a dict (nested dicts allowed) of arrays, numpy or torch, each
        of n rows, 1 <= n <= max_batch, with the model's input keys, dtypes
        and row shapes; or one array when the model has one input. A request
        is never split: its rows run in one batch.

        Raises SchemaError before anything is sent when inputs do not fit;
        QueueFullError (back off), ForwardError, ClosedError,
        DeadlineExceededError when timeout passed, UnavailableError when the
        node stayed unreachable until then."""
        self._mine()
        req = self._request(inputs, timeout, as_torch, return_version)
        try:
            self._acquire(req)
            out = self._run(req)
        except BaseException as e:
            self._release(req, e)
            raise
        self._release(req, None)
        return out

    def predict_async(self, inputs, timeout=None, as_torch=False, return_version=False):
        """Starts predict(inputs) and returns a concurrent.futures.Future of
        its result at once: the request is sent now (or, in ref mode, as
        soon as slots are free) and the client's collector thread sets the
        future when the response comes. Any number may be in flight at once.
        Raises SchemaError at once, before anything is sent; the other
        errors are the future's. Callbacks added to the future run on the
        collector thread: keep them short. timeout counts from now, the
        time the request waits in the client included: one still waiting
        for earlier ones (max_in_flight, or the slots) at it fails with
        DeadlineExceededError then, as predict's does."""
        self._mine()
        req = self._request(inputs, timeout, as_torch, return_version)
        req.future = concurrent.futures.Future()
        req.future.set_running_or_notify_cancel()
        with self._mu:
            if self._closed:
                raise ClosedError("serve: closed")
            if self._waiting or not self._admit_locked(req):
                self._waiting.append(req)
                if req.deadline is not None:
                    self._expire_at_locked(req.deadline)
                return req.future
        self._copy_in(req)
        self._launch(req)
        return req.future

    async def apredict(self, inputs, timeout=None, as_torch=False, return_version=False):
        """predict for asyncio: awaits the prediction without blocking the
        event loop (the request is sent before the first await; gather many
        to keep them in flight at once)."""
        return await asyncio.wrap_future(self.predict_async(inputs, timeout, as_torch, return_version))

    def stats(self, timeout=None):
        """The model's counters on the node (a dict: requests, batches, rows,
        sizes, queue_full, failed, version, clients, ...)."""
        self._mine()
        return self._call("serve.stats", {"name": self.name}, _deadline(timeout))

    def __reduce__(self):
        """Pickled, a new Client of the same model and node, with the same
        options, made where it is unpickled (by reference: its own
        registration and slots)."""
        return _rebuild, (type(self),) + self._made

    def _forked(self):
        """In a child just forked (_exit.reset_at_fork): the registration,
        slots, threads and locks (a parent's thread may have held one at
        the fork) are the parent's."""
        self._inherited = True

    def _mine(self):
        """Raises ClosedError in a child forked from the process that made
        the Client: a child's rows in the parent's slots would give either
        the other's outputs. Checked before any lock."""
        if self._inherited:
            raise ClosedError("serve: the Client belongs to the process this one was forked from: make a Client "
                              "of its own")

    # Closing.

    def close(self):
        """Unregisters the client and removes its slots; closes the connection
        when the Client made it. Predictions in flight fail with ClosedError.
        In a child forked from the process that made it, only marks it
        closed: the registration and the slots stay the parent's."""
        if self._inherited:
            self._closed = True
            return
        with self._mu:
            if self._closed:
                return
            self._closed = True
            flight, self._flight = self._flight, ()
            bells = list(self._bell_flight)
            self._bell_flight.clear()
            waiting = list(self._waiting)
            self._waiting.clear()
            expiry, self._expiry = self._expiry, None
            self._cv.notify_all()
        if expiry is not None:
            expiry[1].cancel()
        if self._ring is not None:
            self._ring.wake_all()  # predictions waiting by bell find the client closed
        if self._watch is not None:
            self._watch.wake()  # and the bell collector
        for r in list(flight) + bells + waiting:
            if r.pending is not None:
                r.pending.cancel()
            if r.admitted is not None:
                r.admitted.set()  # a predict waiting to be admitted: it finds the client closed
            _fail(r, ClosedError("serve: closed"))
        self._teardown()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __del__(self):
        try:
            if not self._closed:
                self.close()
        except Exception:  # noqa: BLE001 (interpreter shutdown)
            pass

    def _teardown(self):
        self._closed = True
        self._stop.set()
        if self._id:
            try:
                self._client.call("serve.unregister", {"name": self.name, "client": self._id}, timeout=1.0)
            except _errors.TensorwireError:
                pass  # the lease runs out by itself
            self._id = 0
        if self._own:
            self._client.close()
        if self._retry_pool is not None:
            self._retry_pool.shutdown(wait=False)
        self._in_mm = self._out_mm = None
        if self._dir is not None:
            shutil.rmtree(self._dir, ignore_errors=True)
            self._dir = None
        if self._lock_fd is not None:
            os.close(self._lock_fd)  # drops the flock
            self._lock_fd = None

    # Requests.

    def _request(self, inputs, timeout, as_torch, with_version):
        """Checks inputs against the input schema (SchemaError, before anything
        is sent) and makes the request."""
        if self._closed:
            raise ClosedError("serve: closed")
        if not isinstance(inputs, dict):
            if len(self._in) != 1:
                raise SchemaError(f"serve: the model has {len(self._in)} inputs: give a dict of them")
            inputs = _nest(self._in[0][0], inputs)
        got = {}
        for path, v in flatten(inputs):
            if isinstance(v, dict):
                continue
            if isinstance(v, NonTensorData):
                raise SchemaError(f"serve: {'.'.join(path)}: a model's input holds tensors only")
            try:
                a = as_array(v, ".".join(path))
                got[path] = (a, dtype_name(a))
            except InvalidArgumentError as e:
                raise SchemaError(f"serve: {e}") from None
        want = {k: (dt, shape) for k, dt, shape in self._in}
        for path in got:
            if path not in want:
                raise SchemaError(f"serve: input {'.'.join(path)!r} is not one of the model's: "
                                  f"{', '.join('.'.join(k) for k, _, _ in self._in)}")
        n = None
        arrays = []
        for k, dt, shape in self._in:
            if k not in got:
                raise SchemaError(f"serve: the inputs lack {'.'.join(k)!r}")
            a, name = got[k]
            if name != dt:
                raise SchemaError(f"serve: input {'.'.join(k)!r} is {name}; the model takes {dt}")
            if a.ndim != len(shape) + 1 or tuple(a.shape[1:]) != shape:
                raise SchemaError(f"serve: input {'.'.join(k)!r} has shape {list(a.shape)}; the model takes "
                                  f"[n, {', '.join(map(str, shape))}]" if shape else
                                  f"serve: input {'.'.join(k)!r} has shape {list(a.shape)}; the model takes [n]")
            if n is None:
                n = a.shape[0]
            elif a.shape[0] != n:
                raise SchemaError(f"serve: input {'.'.join(k)!r} has {a.shape[0]} rows, the others {n}")
            arrays.append(a)
        if not 1 <= n <= self._limit:
            raise SchemaError(f"serve: a request of {n} rows; want 1 to {self._limit}"
                              + (" (the max batch)" if self._limit == self.max_batch else " (the client's slots)"))
        return _Req(arrays, n, _deadline(timeout), as_torch, with_version)

    def _arg(self, req):
        """The serve.predict request of req, in the order of the method's
        fields."""
        if self._ref:
            return {"name": self.name, "client": req.reg, "start": req.start, "n": req.n, "in": None}
        td = {}
        for (k, _, _), a in zip(self._in, req.arrays):
            d = td
            for p in k[:-1]:
                d = d.setdefault(p, {})
            d[k[-1]] = a
        return {"name": self.name, "client": 0, "start": 0, "n": req.n, "in": TD(td, batch=[req.n])}

    def _send(self, req):
        """Sends req's request (registering first in ref mode if the client
        holds no registration); sets req.pending."""
        if self._closed:
            raise ClosedError("serve: closed")
        left = _left(req.deadline)
        if left is not None and left <= 0:
            raise DeadlineExceededError("serve: predict: deadline exceeded" +
                                        (f" ({req.err})" if req.err is not None else ""))
        if self._ref:
            if isinstance(req.err, NotRegisteredError):
                self._register(req.reg, req.deadline)
            elif self._id == 0:
                self._register(0, req.deadline)
            req.reg = self._id
        req.pending = self._client.start("serve.predict", self._arg(req), timeout=_left(req.deadline),
                                         result_tds=() if self._ref else ("out",))

    def _result(self, req, resp):
        """The outputs of req from its response."""
        if not isinstance(resp, dict):
            raise InternalError(f"serve: the node answered {resp!r}")
        version = _uint(resp, "version")
        if self._ref:
            return self._slot_outputs(req, version)
        out = resp.get("out")
        if not isinstance(out, dict):
            raise InternalError("serve: the node sent no outputs")
        flat = {p: v for p, v in flatten(out) if not isinstance(v, dict)}
        for k, dt, shape in self._out:
            a = flat.get(k)
            if not isinstance(a, np.ndarray) or a.dtype != DTYPES[dt] or a.shape != (req.n,) + shape:
                raise InternalError(f"serve: the node's output {'.'.join(k)!r} is not {dt} "
                                    f"{[req.n] + list(shape)}")
        return self._give(req, out, version)

    def _slot_outputs(self, req, version):
        """Ref mode: the outputs of req, copied out of its output slots."""
        out = {}
        for (k, dt, _), mm in zip(self._out, self._out_mm):
            _set(out, k, marked(np.array(mm[req.start:req.start + req.n]), dt))
        return self._give(req, out, version)

    @staticmethod
    def _give(req, out, version):
        """What predict returns for req: out (as torch tensors with
        as_torch), and the version with return_version."""
        if req.as_torch:
            out = tree_to_torch(out)
        return (out, version) if req.with_version else out

    def _run(self, req):
        """Sends req and waits for its response, sending it again while the
        node is unreachable and registering again when the node lost the
        registration; returns the outputs. By bell when the node gave the
        client one, else by call."""
        if self._ring is not None and self._ring.bell is not None:
            out = self._run_bell(req)
            if out is not None:
                return out
        while True:
            try:
                self._send(req)
                if not self._own:
                    self._await(req)
                resp = req.pending.result()
                req.pending = None
                return self._result(req, resp)
            except BaseException as e:
                req.pending = None
                err = self._retryable(req, e)
                if err is not None:
                    raise err from None
                self._backoff(req)

    def _await(self, req):
        """Waits for req's call to be answered on a connection this Client
        shares (and close() does not close), in slices, so that close()
        fails it (ClosedError) rather than leave it waiting for the node."""
        p = req.pending
        while True:
            if self._closed:
                p.cancel()
                raise ClosedError("serve: closed")
            left = _left(req.deadline)
            if left is not None and left <= 0:
                return  # result() says the deadline passed
            try:
                p.wait(0.25 if left is None else min(0.25, left))
                return
            except DeadlineExceededError:
                continue
            except UnavailableError:
                return  # result() says what

    def _backoff(self, req):
        """Waits before req is sent again: not at all when the node lost the
        registration (_send registers again), else the next backoff."""
        if not isinstance(req.err, NotRegisteredError):
            left = _left(req.deadline)
            time.sleep(req.wait if left is None else max(min(req.wait, left), 0))
            req.wait = min(2 * req.wait, 1.0)

    def _retryable(self, req, e):
        """None when req may be sent again after e (the node unreachable, the
        registration lost), else the error to give the caller; records e."""
        req.err = e
        if self._closed or isinstance(e, ClientClosedError):
            return ClosedError("serve: closed")
        if isinstance(e, NotRegisteredError):
            return None
        if isinstance(e, UnavailableError):
            left = _left(req.deadline)
            if left is not None and left <= req.wait:
                return UnavailableError(f"{e.message}; gave up at the deadline, the node was unreachable")
            return None
        return e

    # The asynchronous path: requests sent at once, responses collected by one thread.

    def _launch(self, req):
        """Sends req and hands it to the collector (by bell where it can,
        _ring_async); on an error it may retry after, hands it to the retry
        pool."""
        if self._ring is not None and self._ring.bell is not None and _bell.waitv_supported():
            try:
                if self._ring_async(req):
                    return
            except BaseException as e:  # noqa: BLE001 (delivered through the future, not to whoever started it)
                self._finish(req, err=e)
                return
        try:
            self._send(req)
        except BaseException as e:  # noqa: BLE001 (delivered through the future)
            self._retry_later(req, e)
            return
        with self._mu:
            if self._closed:
                req.pending.cancel()
                _fail(req, ClosedError("serve: closed"))
                return
            self._flight = self._flight + (req,)
            if self._collector is None:
                self._collector = threading.Thread(target=self._collect, name="tensorwire-serve-collector",
                                                   daemon=True)
                self._collector.start()
            self._cv.notify()

    def _retry_later(self, req, e):
        req.pending = None
        err = self._retryable(req, e)
        if err is not None:
            self._finish(req, err=err)
            return
        self._submit(self._retry, req)

    def _submit(self, fn, req):
        """Runs fn(req) on the retry pool, which finishes req; fails req
        with ClosedError once the client is closed."""
        with self._mu:
            if self._closed:
                pool = None
            else:
                if self._retry_pool is None:
                    self._retry_pool = concurrent.futures.ThreadPoolExecutor(
                        max_workers=8, thread_name_prefix="tensorwire-serve-retry")
                pool = self._retry_pool
        if pool is None:
            self._finish(req, err=ClosedError("serve: closed"))
            return
        try:
            pool.submit(fn, req)
        except RuntimeError:  # shut down by close meanwhile
            self._finish(req, err=ClosedError("serve: closed"))

    def _retry(self, req):
        """A retry pool thread: waits out the backoff (unless the node lost
        the registration) and runs req to its end."""
        self._run_async(req, backoff=True)

    def _run_async(self, req, backoff=False):
        """A retry pool thread: runs req to its end (after the backoff, with
        backoff), its future set with what it came to, whatever fails."""
        try:
            if backoff:
                self._backoff(req)
            out = self._run(req)
        except BaseException as e:  # noqa: BLE001 (delivered through the future)
            self._finish(req, err=e)
            return
        self._finish(req, value=out)

    def _collect(self):
        """The collector: waits for whichever request in flight has its
        response first, and finishes it. Should it stop on an error of its
        own, its requests fail with it rather than wait (_collector_stopped)."""
        try:
            self._collect_calls()
        except BaseException as e:  # noqa: BLE001 (a bug, or no memory: no request may hang on it)
            self._collector_stopped(e)

    def _collector_stopped(self, e):
        """The collector stopped on e: its requests fail with InternalError,
        and the next request starts a collector anew."""
        with self._mu:
            flight, self._flight = self._flight, ()
            self._collector = None
        _log.error("serve: the collector of asynchronous predictions failed (%r); %d of them fail with it", e,
                   len(flight), exc_info=e)
        for r in flight:
            if r.pending is not None:
                r.pending.cancel()
                r.pending = None
            self._finish(r, err=InternalError(f"serve: the collector of asynchronous predictions failed: {e!r}"),
                         abandoned=True)

    def _collect_calls(self):
        while True:
            with self._mu:
                while not self._flight and not self._closed:
                    self._cv.wait()
                if self._closed:
                    return
                flight = self._flight
            sess = flight[-1].pending.session
            deadlines = [r.deadline for r in flight if r.deadline is not None]
            first = min(deadlines) if deadlines else None

            def ready(flight=flight, sess=sess):
                f = self._flight
                if f is not flight or self._closed:
                    return True  # requests came or went: look again
                now = time.monotonic()
                for r in f:
                    if r.pending.ready() or r.pending.session is not sess:
                        return True
                    if r.deadline is not None and now >= r.deadline:
                        return True
                return False

            if not sess.closed:
                try:
                    sess.wait(ready, first)
                except _errors.TensorwireError:
                    pass  # a deadline passed, or the session died: sorted out below
            now = time.monotonic()
            done = []
            with self._mu:
                keep = []
                for r in self._flight:
                    p = r.pending
                    dead = p.session.closed
                    with p.session.mu:
                        rd = p.ready()
                    if rd or dead or (r.deadline is not None and now >= r.deadline):
                        done.append(r)
                    else:
                        keep.append(r)
                self._flight = tuple(keep)
            for r in done:
                self._complete(r)

    def _complete(self, req):
        """Finishes a request the collector took: reads its response, or
        retries it, or fails it."""
        p = req.pending
        if not p.ready() and not p.session.closed:
            # Its deadline passed, no response.
            p.cancel()
            req.pending = None
            self._finish(req, err=DeadlineExceededError("serve: predict: deadline exceeded"))
            return
        try:
            resp = p.result()
        except BaseException as e:  # noqa: BLE001
            self._retry_later(req, e)
            return
        req.pending = None
        try:
            out = self._result(req, resp)
        except BaseException as e:  # noqa: BLE001
            self._finish(req, err=e)
            return
        self._finish(req, value=out)

    def _finish(self, req, value=None, err=None, abandoned=False):
        """Sets req's future and frees its slots, which may start requests
        waiting for them (abandoned: see _release)."""
        self._release(req, err, abandoned)
        if err is not None:
            _fail(req, err)
        elif not req.future.done():
            req.future.set_result(value)

    # Admission: requests in flight (at most max_in_flight) and, in ref mode, slots.

    def _admit_locked(self, req):
        """Admits req if it can go now (a request in flight and, in ref mode,
        slots are free); self._mu is held. The caller sees that no one waits
        before it."""
        if self._admitted >= self.max_in_flight:
            return False
        if self._ref:
            req.start = self._free.take(req.n)
            if req.start < 0:
                return False
        self._admitted += 1
        req.holds = True
        return True

    def _acquire(self, req):
        """Blocks until req is admitted (in order behind those waiting), and
        copies its inputs into its slots in ref mode."""
        with self._mu:
            if self._closed:
                raise ClosedError("serve: closed")
            if self._waiting or not self._admit_locked(req):
                req.admitted = threading.Event()
                self._waiting.append(req)
        if req.admitted is not None:
            left = _left(req.deadline)
            if not req.admitted.wait(left):
                with self._mu:
                    gone = not req.holds and not self._closed
                    if gone:
                        # Those behind it may fit what it leaves.
                        self._waiting.remove(req)
                        ready = self._admit_waiting_locked()
                if gone:
                    self._start(ready)
                    raise DeadlineExceededError("serve: predict: still waiting for the requests before it "
                                                "at the deadline")
            if self._closed:
                raise ClosedError("serve: closed")
        self._copy_in(req)

    def _expire_at_locked(self, deadline):
        """Has _expire run at deadline, unless it runs by then already: one
        timer for all the asynchronous requests waiting to be admitted, set
        for the first of their deadlines (a sleeping thread, no polling);
        self._mu is held."""
        if self._expiry is not None:
            if self._expiry[0] <= deadline:
                return
            self._expiry[1].cancel()
        t = threading.Timer(max(deadline - time.monotonic(), 0.0), self._expire)
        t.name = "tensorwire-serve-expiry"
        t.daemon = True
        self._expiry = (deadline, t)
        t.start()

    def _expire(self):
        """The expiry timer (_expire_at_locked): fails with
        DeadlineExceededError the asynchronous requests still waiting to be
        admitted whose deadline passed, admits those behind them that fit
        now, and sets the timer for the next deadline of those left."""
        with self._mu:
            if self._expiry is not None and self._expiry[1] is threading.current_thread():
                self._expiry = None
            if self._closed:
                return
            now = time.monotonic()
            expired = [r for r in self._waiting if r.future is not None and r.deadline is not None
                       and r.deadline <= now]
            ready = []
            if expired:
                gone = set(map(id, expired))
                keep = [r for r in self._waiting if id(r) not in gone]
                self._waiting.clear()
                self._waiting.extend(keep)
                ready = self._admit_waiting_locked()
            left = [r.deadline for r in self._waiting if r.future is not None and r.deadline is not None]
            if left:
                self._expire_at_locked(min(left))
        for r in expired:
            _fail(r, DeadlineExceededError("serve: predict: still waiting for the requests before it at the "
                                           "deadline"))
        self._start(ready)

    def _copy_in(self, req):
        if self._ref:
            s = req.start
            for mm, a in zip(self._in_mm, req.arrays):
                mm[s:s + req.n] = a

    def _release(self, req, err, abandoned=False):
        """Ends req's admission once it ended with err (None: done), giving
        its slots back. The node may still write the outputs of a call
        abandoned mid-way (a deadline, a broken connection, or abandoned
        set: canceled by the client): its slots are kept a second more, the
        node's handler having ended by then (its deadline is the call's,
        and a broken connection or a canceled call cancels it)."""
        with self._mu:
            if not req.holds:
                return
            req.holds = False
            rung = req.rung if err is not None else 0
            late = self._ref and err is not None and (
                abandoned or isinstance(err, (DeadlineExceededError, UnavailableError))
                or not isinstance(err, _errors.TensorwireError)) and not rung
            self._admitted -= 1
            if self._ref and not late and not rung:
                self._free.put(req.start, req.n)
            ready = self._admit_waiting_locked()
        if rung:
            self._quiet(req.start, req.n, rung, time.monotonic() + _BELL_QUIET)
        elif late:
            t = threading.Timer(1.0, self._put_slots, args=(req.start, req.n))
            t.daemon = True
            t.start()
        self._start(ready)

    def _put_slots(self, start, n):
        with self._mu:
            if self._closed:
                return
            self._free.put(start, n)
            ready = self._admit_waiting_locked()
        self._start(ready)

    def _admit_waiting_locked(self):
        """Admits the requests waiting, in order, while they can go."""
        ready = []
        while self._waiting and not self._closed:
            r = self._waiting.popleft()
            if not self._admit_locked(r):
                self._waiting.appendleft(r)
                break
            ready.append(r)
        return ready

    def _start(self, ready):
        """Starts the requests just admitted: wakes a waiting predict, sends
        an asynchronous one."""
        for r in ready:
            if r.admitted is not None:
                r.admitted.set()
            else:
                self._copy_in(r)
                self._launch(r)

    def _make_slots(self):
        """Makes the client's folder under the root, holding its lock: first
        under a temporary name, renamed into place once locked and filled, so
        that no one takes it for a dead client's. Removes the folders of dead
        clients found there."""
        root = self._client.root
        parent = os.path.join(root, *CLIENTS_DIR.split("/"))
        try:
            os.makedirs(parent, exist_ok=True)
        except OSError as e:
            if e.errno == errno.ENOSPC:
                raise ResourceExhaustedError(f"serve: no space left under the root to make {parent}") from e
            raise
        _check_no_link(root, CLIENTS_DIR)  # no slots made, nor folders removed, through a link
        _remove_dead(root, CLIENTS_DIR)
        _remove_dead(root, _NODES_DIR)
        name = os.urandom(8).hex()
        tmp = os.path.join(parent, ".tmp-" + name)
        os.mkdir(tmp)
        try:
            self._lock_fd = _lock(os.path.join(tmp, "lock"))
            if self._lock_fd is None:
                raise InternalError(f"serve: the lock of {tmp}, a folder this client just made, is held")
            _create_td(os.path.join(tmp, "in"), self._in, self.slots)
            _create_td(os.path.join(tmp, "out"), self._out, self.slots)
            if _bell.SUPPORTED:
                _bell.Ring.make(os.path.join(tmp, "ring"), self.slots, _reserve)
            final = os.path.join(parent, name)
            os.rename(tmp, final)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        self._dir = final
        self._rel = CLIENTS_DIR + "/" + name
        self._in_mm = _map_td(os.path.join(final, "in"), self._in, self.slots)
        self._out_mm = _map_td(os.path.join(final, "out"), self._out, self.slots)
        if _bell.SUPPORTED:
            self._ring = _bell.Ring(os.path.join(final, "ring"), self.slots)

    def _register(self, old, deadline):
        """Registers the slots with the node, unless the registration held is
        no longer old (another thread registered again meanwhile)."""
        with self._reg_mu:
            if self._id != old:
                return
            r = self._call("serve.register", {"name": self.name, "prefix": self._rel, "slots": self.slots,
                                              "ring": self._ring is not None}, deadline)
            cid = _uint(r, "client")
            if cid == 0:
                raise InternalError("serve: the node registered the client as 0")
            self._lease_ms = _uint(r, "lease_ms")
            if self._ring is not None:
                self._use_bell(r.get("bell") or "")
            self._id = cid
            self.registrations += 1

    def _renew_every(self, every):
        """Renews the registration every quarter of the lease, registering
        again when the node lost it, until close."""
        while not self._stop.wait(every):
            self._probe(every)

    def _call(self, method, arg, deadline):
        """A call, retried while the node cannot be reached."""
        wait = 0.02
        while True:
            if self._closed:
                raise ClosedError("serve: closed")
            try:
                return answer(self._client.call(method, arg, timeout=_left(deadline)), "serve", method)
            except ClientClosedError:
                raise ClosedError("serve: closed") from None
            except UnavailableError as e:
                if self._closed:
                    raise ClosedError("serve: closed") from None
                left = _left(deadline)
                if left is not None and left <= wait:
                    raise UnavailableError(f"{e.message}; gave up at the deadline, the node was unreachable") from None
                time.sleep(wait)
                wait = min(2 * wait, 1.0)




_log = logging.getLogger("tensorwire.serve")


def _uint(r, key):
    return uint(r, key, "serve", 0)


def _fail(req, err):
    if req.future is not None and not req.future.done():
        req.future.set_exception(err)


def _nest(key, value):
    d = out = {}
    for p in key[:-1]:
        d = d.setdefault(p, {})
    d[key[-1]] = value
    return out


def _set(td, key, value):
    d = td
    for p in key[:-1]:
        d = d.setdefault(p, {})
    d[key[-1]] = value


def _lock(path):
    """An exclusive flock on path, taken without waiting (what Go's
    internal/lockfile takes, and the node tests): the open descriptor, or
    None when another holds it. The holder's pid, host and program go into
    the file, as lockfile writes them."""
    if os.path.islink(path):
        raise OSError(errno.ELOOP, f"{path} is a symbolic link (to {os.readlink(path)}): a lock file is never "
                      "followed through a link; remove the link", path)
    fd = os.open(path, os.O_RDWR | os.O_CREAT | getattr(os, "O_NOFOLLOW", 0), 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        return None
    except BaseException:
        os.close(fd)
        raise
    prog = os.path.basename(sys.argv[0]) if sys.argv and sys.argv[0] else "python"
    info = f"pid {os.getpid()}\nhost {socket.gethostname()}\nprogram {prog}\n".encode()
    os.ftruncate(fd, 0)
    os.pwrite(fd, info, 0)
    return fd


def _check_no_link(root, rel):
    """Raises OSError naming the first folder of rel (slash-separated) under
    root that is a symbolic link, or not a folder: serve follows no link in
    the folders its clients and nodes make, as the Go client and node do."""
    p = root
    for part in rel.split("/"):
        p = os.path.join(p, part)
        st = os.lstat(p)
        if stat.S_ISLNK(st.st_mode):
            raise OSError(errno.ELOOP, f"{p} is a symbolic link (to {os.readlink(p)}): serve follows no link "
                          "in the folders its clients and nodes make; remove it", p)
        if not stat.S_ISDIR(st.st_mode):
            raise OSError(errno.ENOTDIR, f"{p} is not a folder", p)


def _remove_dead(root, rel):
    """Removes the folders under rel, under root (16 hex digits), whose lock
    is free: those of processes that died. Nothing is reached through a
    link: a link on the way, or in a folder's place, is left."""
    try:
        _check_no_link(root, rel)
    except OSError:
        return
    parent = os.path.join(root, *rel.split("/"))
    try:
        names = os.listdir(parent)
    except OSError:
        return
    for name in names:
        d = os.path.join(parent, name)
        try:
            if not _ID_RE.match(name) or not stat.S_ISDIR(os.lstat(d).st_mode):
                continue
            fd = _lock(os.path.join(d, "lock"))
        except OSError:
            continue
        if fd is None:
            continue
        try:
            shutil.rmtree(d, ignore_errors=True)  # removes links inside, never follows them
        finally:
            os.close(fd)


_TD_TYPE = "<class 'tensordict._td.TensorDict'>"


def _reserve(f, size, path):
    """Reserves size bytes of disk for f, as the Go side does, so that a
    full disk is a ResourceExhaustedError now rather than a SIGBUS at a
    store through the mapping later (a sparse file on a full disk). Where
    the filesystem cannot reserve, the file stays sparse."""
    try:
        os.posix_fallocate(f.fileno(), 0, size)
    except OSError as e:
        if e.errno == errno.ENOSPC:
            raise ResourceExhaustedError(
                f"serve: no space left to make this client's slots ({size} bytes for {path}): "
                "free space under the root, or work by bytes (root=None)") from e
        if e.errno not in (errno.EOPNOTSUPP, errno.EINVAL, errno.ENOSYS):
            raise
    except AttributeError:  # no posix_fallocate (macOS)
        pass


def _create_td(prefix, schema, rows):
    """Creates a TensorDict memmap of batch size [rows] with schema's fields,
    zeros, in tensordict's format (docs/format.md): what the node maps as a
    client's slots."""
    import json
    tree = {}
    for k, dt, shape in schema:
        _set(tree, k, (dt, shape))

    def write(d, node):
        os.makedirs(d, exist_ok=True)
        meta = {}
        for key, v in node.items():
            if isinstance(v, dict):
                write(os.path.join(d, escape_key(key)), v)
                meta[key] = {"type": "TensorDict"}
                continue
            dt, shape = v
            full = [rows] + list(shape)
            size = DTYPES[dt].itemsize * int(np.prod(full, dtype=np.int64))
            if size:
                path = os.path.join(d, escape_key(key) + ".memmap")
                with open(path, "wb") as f:
                    f.truncate(size)
                    _reserve(f, size, path)
            meta[key] = {"device": "cpu", "shape": full, "dtype": dt, "is_nested": False}
        meta.update({"shape": [rows], "device": "cpu", "_type": _TD_TYPE})
        with open(os.path.join(d, "meta.json"), "w", encoding="utf-8") as f:
            json.dump(meta, f, separators=(",", ":"), ensure_ascii=False)

    write(prefix, tree)


def _map_td(prefix, schema, rows):
    """The tensors of the TensorDict _create_td made, mapped read-write, in
    schema's order."""
    out = []
    for k, dt, shape in schema:
        d = prefix
        for p in k[:-1]:
            d = os.path.join(d, escape_key(p))
        full = (rows,) + tuple(shape)
        if int(np.prod(full, dtype=np.int64)) == 0:
            out.append(np.zeros(full, dtype=DTYPES[dt]))
            continue
        # A plain ndarray over the mapping (which it keeps alive): slicing a
        # np.memmap makes memmap objects, a few microseconds a request.
        out.append(np.memmap(os.path.join(d, escape_key(k[-1]) + ".memmap"), dtype=DTYPES[dt], mode="r+",
                             shape=full).view(np.ndarray))
    return out


def _deadline(timeout):
    return None if timeout is None else time.monotonic() + timeout


def _left(deadline):
    return None if deadline is None else deadline - time.monotonic()


from .replica import Replica  # noqa: E402 (replica.py uses this module's helpers)
