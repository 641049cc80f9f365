"""The replay buffer of a tensorwire node, from Python (docs/replay.md).

    buf = tensorwire.replay.Buffer("127.0.0.1:7070", "sig", token=token, root="/mnt/shared")
    idx = buf.extend({"obs": obs, "action": action, "reward": reward, "done": done})
    batch, info = buf.sample(256)                # dict of numpy arrays, SampleInfo
    buf.update_priority(info, new_priorities)

When the client shares the node's root and page cache (root=, and the
connection's sharing is coherent: one kernel and one mount, docs/protocol.md
"Sharing") and the buffer lives under it, no transition bytes cross the
network ("ref" mode): extend reserves slots, writes the rows into its own
numpy.memmap of the storage and commits them; sample gets slots and
generations from the node, gathers the rows from its own mapping and then
checks every row's slot word, so a row a writer overwrote meanwhile is
sampled again rather than returned torn. Otherwise ("bytes" mode) the rows
travel with the calls: so too with another machine on NFS or another mount
of the root ("storage" sharing), since the storage is rewritten in place and
another page cache would see stale rows, and with a copy of the root.

Calls ride out the node restarting as the Go client does: a call that finds
the node unreachable is tried again, with a backoff from 20 ms to 1 s,
until its timeout; extend never adds a batch twice (a commit retried after
a lost reply is recognised by the node, and a reservation lost with the
node makes extend start over).
"""

import os
import platform
import threading
import time

import numpy as np

from . import _exit, errors as _errors
from ._fields import answer, is_int, uint
from ._td import TD, DTYPES, NonTensorData, as_array, dtype_name, flatten, leaves, marked, set_path, tree_to_torch
from .dataset import load_memmap
from .errors import (AbortedError, AlreadyExistsError, ClientClosedError, DataLossError,
                     FailedPreconditionError, InvalidArgumentError, NotFoundError,
                     ResourceExhaustedError, UnavailableError, register_reason)
from .rpc import Client, Sharing, _rebuild

__all__ = [
    "Buffer", "SampleInfo", "SchemaError", "ExpiredError", "FullError", "ClosedError", "ConfigError",
    "ExistsError", "NotFoundError", "ContendedError", "InUseError", "StorageLostError", "ArgumentError",
]

STORAGE_DIR = "storage"
SLOTS_FILE = "slots.memmap"
STATE_COMMITTED = 2
MAX_SAMPLE = 1 << 20
MAX_RESAMPLES = 16


# The replay service's errors: each Go sentinel's code and reason
# (docs/replay.md, "Errors").

@register_reason
class SchemaError(InvalidArgumentError):
    """A batch or indices that do not fit the buffer; nothing written."""
    reason = "replay.schema"


@register_reason
class ExpiredError(AbortedError):
    """A reservation outlived its lease or the node restarted; extend starts
    over by itself."""
    reason = "replay.expired"


@register_reason
class FullError(ResourceExhaustedError):
    """Every slot is reserved by writers that have not committed."""
    reason = "replay.full"


@register_reason
class ClosedError(FailedPreconditionError):
    """The buffer or the client is closed."""
    reason = "replay.closed"


@register_reason
class ConfigError(InvalidArgumentError):
    """A configuration that cannot make a buffer."""
    reason = "replay.config"


@register_reason
class ExistsError(AlreadyExistsError):
    """A buffer exists at the prefix."""
    reason = "replay.exists"


@register_reason
class NotFoundError(NotFoundError):  # noqa: F811 (replay.NotFoundError is an errors.NotFoundError)
    """No buffer at the prefix, or by that name on the node."""
    reason = "replay.not_found"


@register_reason
class ContendedError(AbortedError):
    """A sample's rows kept being overwritten while copied; nothing sampled."""
    reason = "replay.contended"


@register_reason
class InUseError(FailedPreconditionError):
    """Another process holds the buffer."""
    reason = "replay.in_use"


@register_reason
class StorageLostError(DataLossError):
    """The buffer's files were deleted, replaced or truncated under it."""
    reason = "replay.storage_lost"


@register_reason
class ArgumentError(InvalidArgumentError):
    """A sample of n <= 0 or over 2^20 transitions."""
    reason = "replay.argument"


class SampleInfo:
    """What a sample returned, row by row: indices (the slots, int64), ids
    (the slots' generations when sampled, uint64) and weights (importance
    weights, float64; 1 unless the sampler is prioritized)."""

    __slots__ = ("indices", "ids", "weights")

    def __init__(self, indices, ids, weights):
        self.indices = np.asarray(indices, dtype=np.int64)
        self.ids = np.asarray(ids, dtype=np.uint64)
        self.weights = np.asarray(weights, dtype=np.float64)

    @classmethod
    def _from_wire(cls, m):
        if not isinstance(m, dict):
            raise _errors.InternalError(f"replay: the node sent sample info {m!r:.200}")
        try:
            info = cls(m.get("indices") or [], m.get("ids") or [], m.get("weights") or [])
        except (ValueError, TypeError, OverflowError) as e:  # not lists of numbers
            raise _errors.InternalError(f"replay: the node sent sample info {m!r:.200}: {e}") from None
        if info.indices.ndim != 1 or info.ids.ndim != 1 or info.weights.ndim != 1:
            raise _errors.InternalError(f"replay: the node sent sample info {m!r:.200}")
        return info

    def _wire(self):
        return {"indices": self.indices, "ids": self.ids, "weights": self.weights}

    def __len__(self):
        return len(self.indices)

    def __repr__(self):
        return f"SampleInfo(indices={self.indices!r}, ids={self.ids!r}, weights={self.weights!r})"


class _View:
    """The buffer as this client knows it: immutable, swapped whole when the
    node describes another buffer (created anew) or its schema becomes
    known. Users keep the one they started with; a replaced one is unmapped
    when the last user drops it."""

    def __init__(self, info, storage=None, slots=None):
        if not isinstance(info, dict):
            raise _errors.InternalError(f"replay: the node describes the buffer as {info!r:.200}")
        self.id = info.get("id", "")
        self.prefix = info.get("prefix", "")
        self.capacity = info.get("capacity", 0)
        lease_ms = info.get("lease_ms") or 0
        w = info.get("writer") or {}
        self.sampler = info.get("sampler", "")
        # A sample that finds rows overwritten picks all of it again (a lifo
        # or heap sampler, whose pick of k would be the first k again).
        self.resample_all = info.get("resample_all", False)
        if (not isinstance(self.id, str) or not isinstance(self.resample_all, bool) or not isinstance(self.prefix, str) or not isinstance(self.sampler, str)
                or not is_int(self.capacity) or self.capacity < 0
                or not isinstance(lease_ms, (int, float)) or isinstance(lease_ms, bool) or not lease_ms >= 0
                or not isinstance(w, dict) or not isinstance(w.get("kind") or "", str)
                or not isinstance(w.get("key") or [], list)):
            raise _errors.InternalError(f"replay: the node describes the buffer as {info!r:.300}")
        self.schema = _parse_schema(info.get("schema"))
        self.lease = lease_ms / 1000.0
        self.writer_kind = w.get("kind") or "round_robin"
        self.writer_key = tuple(w.get("key") or ())
        self.storage = storage  # {path tuple: np.memmap [capacity, ...]}, ref mode
        self.slots = slots  # np.memmap uint64 [capacity, 4], ref mode


def _parse_schema(s):
    """A schema from the wire, as a list of (path tuple, torch dtype name,
    row shape tuple), or None while the buffer has none."""
    if s is None:
        return None
    if not isinstance(s, list):
        raise _errors.InternalError(f"replay: the node describes the buffer's schema as {s!r}")
    out = []
    for f in s:
        try:
            key = tuple(f["key"])
            dt = f["dtype"]
            shape = tuple(int(x) for x in (f.get("shape") or ()))
        except (KeyError, TypeError, ValueError):
            raise _errors.InternalError(f"replay: the node describes a schema field as {f!r}") from None
        if not key or dt not in DTYPES or any(x < 0 for x in shape):
            raise _errors.InternalError(f"replay: the node describes a schema field as {f!r}")
        out.append((key, dt, shape))
    return out


def _schema_wire(schema):
    return [{"key": list(k), "dtype": dt, "shape": list(shape)} for k, dt, shape in schema]


def _batch_schema(batch):
    """The schema of a batch of transitions (rows without the batch
    dimension), its row count and its arrays by path. A SchemaError for
    anything that is not a batch of tensors with one first dimension."""
    if not isinstance(batch, dict):
        raise SchemaError(f"a batch is a dict of arrays, not {type(batch).__name__}")
    n = None
    schema, arrays = [], {}
    for path, v in flatten(batch):
        if isinstance(v, dict):
            continue
        if isinstance(v, NonTensorData):
            raise SchemaError(f"{'.'.join(path)}: non-tensor data is not stored in a replay buffer")
        try:
            a = as_array(v, ".".join(path))
            name = dtype_name(a)
        except InvalidArgumentError as e:
            raise SchemaError(str(e)) from None
        if a.ndim == 0:
            raise SchemaError(f"{'.'.join(path)} is a scalar; a batch needs a first dimension")
        if n is None:
            n = a.shape[0]
        elif a.shape[0] != n:
            raise SchemaError(f"{'.'.join(path)} has {a.shape[0]} rows, other tensors {n}")
        schema.append((path, name, tuple(a.shape[1:])))
        arrays[path] = a
    if n is None:
        raise SchemaError("a batch needs at least one tensor")
    if n == 0:
        raise SchemaError("empty batch")
    if n > MAX_SAMPLE:
        raise SchemaError(f"a batch of {n} transitions; at most {MAX_SAMPLE}")
    return schema, n, arrays


def _match(buffer_schema, batch_schema):
    """None if the batch's schema is the buffer's (in any key order), else
    what differs."""
    want = {k: (dt, shape) for k, dt, shape in buffer_schema}
    got = {k: (dt, shape) for k, dt, shape in batch_schema}
    for k, (dt, shape) in got.items():
        if k not in want:
            return f"key {'.'.join(k)!r} is not in the buffer's schema"
        if want[k] != (dt, shape):
            return (f"{'.'.join(k)!r} is {dt} {list(shape)} per transition; "
                    f"the buffer holds {want[k][0]} {list(want[k][1])}")
    for k in want:
        if k not in got:
            return f"the batch lacks {'.'.join(k)!r}"
    return None


def _check_priorities(p, n):
    if p is None:
        return None
    a = np.asarray(p, dtype=np.float64).reshape(-1)
    if a.shape[0] != n:
        raise SchemaError(f"{a.shape[0]} priorities for {n} transitions")
    bad = ~np.isfinite(a) | (a < 0)
    if bad.any():
        i = int(np.argmax(bad))
        raise SchemaError(f"priority {i} is {a[i]}; want a finite number >= 0")
    return a


# A full memory barrier between a gather's copies and the reads of the slot
# words that check them (docs/replay.md, "Memory order"). On x86-64 loads
# are not reordered with other loads, and the lock's acquire is a locked
# instruction, a full barrier anyway. Elsewhere (arm64) a lock's acquire and
# release are not a full barrier: reference mode is then refused, and the
# client works by bytes.
_FENCE_LOCK = threading.Lock()
_FENCE_OK = platform.machine().lower() in ("x86_64", "amd64", "i386", "i686", "x86")


def _fence():
    _FENCE_LOCK.acquire()
    _FENCE_LOCK.release()


class Buffer:
    """The replay buffer served as name by a node.

    node: the node's address "HOST:PORT", or a tensorwire.Client to share.
    token, root: as tensorwire.Client takes them; root is this side's view
    of the node's shared root, which makes ref mode possible when the
    connection's sharing is coherent (see sharing). bytes_mode:
    rows travel with the calls even when the root is shared. prefetch: in
    ref mode, sample asks the node for the next sample's picks before it
    gathers this one's rows, so the round trip overlaps the copy (the picks
    are counted by the rate limiter one sample early; the generation check
    catches rows overwritten meanwhile); with a uniform or prioritized
    sampler the prefetch also asks for a few spare picks (n/32, at least 4),
    which replace rows found overwritten without another round trip, and
    which the node counts as sampled like the others; a sample whose
    timeout passes while the node holds the prefetched picks back (an empty
    buffer, the rate limiter) raises DeadlineExceededError and leaves them
    for the next sample of as many. slices_ahead: in ref
    mode, sample_slices asks the node in one call for the slices of k
    samples (Reverb's samples in flight) and serves the next k-1 calls with
    the same arguments from them, as Go's replay.WithSlicesAhead does: all
    k samples' picks are made, and counted (rate limiter,
    max_times_sampled, an epoch without replacement), when asked for; a
    slice with a step overwritten since is caught by the word check and
    sampled again; a call with other arguments, and close, drop those left
    (counted as sampled all the same). k is cut so that the k samples fit
    one call; in bytes mode it does nothing. timeout: seconds the first
    connection may take.

    Timeouts of calls are in seconds; None (the default) waits and retries
    as long as it takes, as a Go call with context.Background() does. A
    Buffer is safe for use from several threads. Close it when done.
    """

    def __init__(self, node, name, token=None, root=None, bytes_mode=False, prefetch=False, timeout=30.0,
                 slices_ahead=0):
        self._made = ((node, name), {"token": token, "root": root, "bytes_mode": bytes_mode, "prefetch": prefetch,
                                     "timeout": timeout, "slices_ahead": slices_ahead})
        if not isinstance(slices_ahead, (int, np.integer)) or isinstance(slices_ahead, bool) or slices_ahead < 0:
            raise ArgumentError(f"slices_ahead={slices_ahead!r}: want an int >= 0")
        if isinstance(node, Client):
            self._client, self._own = node, False
        else:
            self._client, self._own = Client(node, token=token, root=root, timeout=timeout), True
        self.name = name
        self._prefetch = prefetch
        self._mu = threading.Lock()
        self._closed = False
        self._pending = None  # (n, Pending) of a prefetched sample
        self._slices_ahead = int(slices_ahead)
        self._sl_left = None  # (spec, buffer id, SliceInfo, next slice) asked for ahead
        self._connections = -1  # the client's connection count when the view was taken
        self._view = None
        self.resampled = 0  # rows this client found overwritten while it copied them, and sampled again
        _exit.reset_at_fork(self)  # a forked child's calls are its own: _forked
        try:
            deadline = None if timeout is None else time.monotonic() + timeout
            info = self._call("replay.info", {"name": name}, deadline)
            # The storage is rewritten in place: by reference only when the
            # node's page cache is this side's (coherent).
            self._sharing = self._client.sharing(timeout)
            shared = False
            if self._client.root and not bytes_mode and info.get("prefix"):
                shared = self._sharing == Sharing.COHERENT
            if shared and not _FENCE_OK:
                shared = False  # see _fence
            self._bytes = not shared
            self._adopt(info)
        except BaseException:
            if self._own:
                self._client.close()
            raise

    @property
    def mode(self):
        """"ref" when rows stay in the shared storage, "bytes" when they travel
        with the calls."""
        return "bytes" if self._bytes else "ref"

    @property
    def sharing(self):
        """How much of the node's root the connection shared when the mode
        was picked: "coherent", "storage" or "none" (tensorwire.Sharing)."""
        return self._sharing

    @property
    def schema(self):
        """The buffer's schema as a list of dicts {key, dtype, shape} (shape
        per transition), or None until its first batch. ClosedError once
        the buffer is closed."""
        v = self._open_view()
        return None if v.schema is None else _schema_wire(v.schema)

    @property
    def capacity(self):
        """The buffer's slots. ClosedError once the buffer is closed."""
        return self._open_view().capacity

    def _forked(self):
        """In a child just forked: a fresh lock (a parent's thread may have
        held this one at the fork), and none of the parent's calls in
        flight (a prefetched sample, slices asked for ahead), which went
        over the parent's connection."""
        self._mu = threading.Lock()
        self._pending = None
        self._sl_left = None

    def __reduce__(self):
        """Pickled, a new Buffer of the same buffer, node, token, root and
        options, made where it is unpickled (its own connection), as
        Reverb's Client pickles."""
        return _rebuild, (type(self),) + self._made

    def close(self):
        """Closes the connection (when this Buffer made it) and drops the
        mappings. Later calls raise ClosedError."""
        with self._mu:
            if self._closed:
                return
            self._closed = True
            p, self._pending = self._pending, None
            self._sl_left = None
        if p is not None:
            p[1].cancel()
        if self._own:
            self._client.close()
        self._view = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    # Calls, retried while the node cannot be reached.

    def _check_open(self):
        if self._closed:
            raise ClosedError("replay: closed")

    def _open_view(self):
        """The view; ClosedError once the buffer is closed (close drops it)."""
        v = self._view
        if v is None or self._closed:
            raise ClosedError("replay: closed")
        return v

    def _call(self, method, arg, deadline, result_tds=(), into=None):
        self._check_open()
        wait = 0.02
        while True:
            try:
                return answer(self._client.call(method, arg, timeout=_left(deadline), result_tds=result_tds, into=into),
                              "replay", method)
            except ClientClosedError:
                if self._closed:
                    raise ClosedError("replay: closed") from None
                raise
            except UnavailableError as e:
                if self._closed:
                    raise ClosedError("replay: closed") from None
                left = _left(deadline)
                if left is not None and left <= wait:
                    raise UnavailableError(f"{e.message}; gave up at the deadline, the node was unreachable") from None
                time.sleep(wait)
                wait = min(2 * wait, 1.0)

    def _adopt(self, info):
        """Takes the node's description of the buffer: its schema and, in ref
        mode, mappings of its storage and slot table."""
        conns = self._client.connections
        old = self._view
        view = _View(info)
        if (old is not None and old.id == view.id and old.schema is not None
                and (self._bytes or old.storage is not None)):
            self._connections = conns
            return old
        if not self._bytes and view.schema is not None:
            prefix = os.path.join(self._client.root, *view.prefix.split("/"))
            view.storage, view.slots = _map(prefix, view)
        self._view, self._connections = view, conns
        return view

    def _refresh(self, buffer_id, deadline):
        """The view for a response that names buffer_id: the current one, or a
        new one if the node now describes another buffer."""
        v = self._view
        if v is not None and v.id == buffer_id and v.schema is not None and (self._bytes or v.storage is not None):
            return v
        return self._adopt(self._call("replay.info", {"name": self.name}, deadline))

    def _current(self, deadline):
        """The view, described again if the client has reconnected since it
        was taken (the node may serve a buffer made anew)."""
        self._check_open()
        if self._client.connections != self._connections:
            return self._adopt(self._call("replay.info", {"name": self.name}, deadline))
        return self._view

    # Extend.

    def extend(self, batch, priorities=None, timeout=None):
        """Adds a batch of transitions: a dict (nested dicts allowed) of
        arrays, numpy or torch, with one first dimension B. Returns the slot
        each transition went to (int64 [B]; -1 for one a top-k writer
        dropped). priorities: one per transition, finite and >= 0 (None: the
        largest so far).

        A batch whose keys, dtypes or per-transition shapes are not the
        buffer's raises SchemaError before anything is sent. Once extend
        returns, the batch is in the buffer exactly once; if it raises
        UnavailableError or DeadlineExceededError the batch may be in, whole,
        or not at all; any other error means it is not in."""
        deadline = _deadline(timeout)
        schema, n, arrays = _batch_schema(batch)
        prios = _check_priorities(priorities, n)
        view = self._current(deadline)
        if view.schema is not None:
            why = _match(view.schema, schema)
            if why is not None:
                raise SchemaError(f"replay: batch does not match the buffer: {why}")
        keys = None
        if view.writer_kind == "top_k":
            k = arrays.get(view.writer_key)
            if k is None or k.size != n:
                raise SchemaError(f"the top-k writer ranks by {list(view.writer_key)}: "
                                  f"want a tensor with one element per transition")
            keys = k.reshape(-1).astype(np.float64)
        req = {"name": self.name, "schema": _schema_wire(schema), "n": n, "keys": keys}
        while True:
            try:
                return self._extend_once(req, batch, arrays, n, prios, deadline)
            except ExpiredError:
                if _left(deadline) is not None and _left(deadline) <= 0:
                    raise

    def _extend_once(self, req, batch, arrays, n, prios, deadline):
        sent = time.monotonic()
        r = self._call("replay.reserve", req, deadline)
        slots, rid = r.get("slots") or [], r.get("rid")
        if not isinstance(slots, list) or len(slots) != n or not all(is_int(x) and x >= -1 for x in slots):
            raise _errors.InternalError(f"replay: the node reserved {slots!r:.200} for {n} transitions")
        if not is_int(rid):
            raise _errors.InternalError(f"replay: the node's reservation has the id {rid!r:.100}")
        commit = {"name": self.name, "rid": rid, "slots": slots,
                  "priorities": prios, "batch": None}
        if self._bytes:
            commit["batch"] = TD(batch, batch=[n])
            if self._view.schema is None:
                self._refresh(r.get("id"), deadline)  # the first batch gave the buffer its schema
        else:
            view = self._refresh(r.get("id"), deadline)
            if view.storage is None:
                raise _errors.InternalError("replay: no mapping of the buffer's storage")
            # The node expires the reservation a lease after it made it;
            # this side counts from before it asked, and keeps an eighth of
            # the lease in hand (docs/replay.md, "The lease").
            limit = sent + view.lease - view.lease / 8
            if time.monotonic() > limit:
                raise ExpiredError("replay: the lease ran out before the rows were written")
            _write_rows(view, np.asarray(slots, dtype=np.int64), arrays)
            if time.monotonic() > limit:
                raise ExpiredError("replay: the lease ran out while the rows were written")
        resp = self._call("replay.commit", commit, deadline)
        indices = resp.get("indices") or []
        if not isinstance(indices, list) or len(indices) != n or not all(is_int(x) and x >= -1 for x in indices):
            raise _errors.InternalError(f"replay: the node committed {n} transitions to {indices!r:.200}")
        return np.asarray(indices, dtype=np.int64)

    # Sample.

    def sample(self, n, timeout=None, as_torch=False):
        """n transitions chosen by the buffer's sampler, and what they are:
        (batch, SampleInfo), the batch a dict of new numpy arrays (torch
        tensors with as_torch, sharing their memory). Waits while the buffer
        cannot give n (the rate limiter's min size, an empty buffer) until
        timeout (DeadlineExceededError)."""
        _check_sample_size(n)
        deadline = _deadline(timeout)
        if self._bytes:
            view = self._current(deadline)
            r = self._call("replay.sample", {"name": self.name, "n": n, "bytes": True}, deadline, ("batch",))
            if r.get("batch") is None:
                raise _errors.InternalError("replay: the node sent no rows")
            batch, info = r["batch"], SampleInfo._from_wire(r.get("info"))
            _check_info(info, n, view.capacity)
        else:
            view = self._known_schema(deadline)
            batch = _zeros(view.schema, n)
            info = self._sample_ref(batch, n, deadline)
        return (tree_to_torch(batch) if as_torch else batch), info

    def sample_into(self, dst, timeout=None):
        """Sample into dst, a dict of arrays with the buffer's schema and a
        first dimension n (from an earlier sample, say), without allocating
        it (by bytes, an LZ4-compressed body is first decompressed into a
        buffer of its own: rpc.Client's compression). Returns the
        SampleInfo."""
        deadline = _deadline(timeout)
        n, arrays, into, view = self._into(dst, deadline, "sample_into")
        if self._bytes:
            r = self._call("replay.sample", {"name": self.name, "n": n, "bytes": True}, deadline, ("batch",),
                           into={"batch": into})
            if r.get("batch") is None:
                raise _errors.InternalError("replay: the node sent no rows")
            batch, info = r["batch"], SampleInfo._from_wire(r.get("info"))
            _check_info(info, n, view.capacity)
            _copy_in(arrays, batch, into)
            return info
        return self._sample_ref(dst, n, deadline)

    def _into(self, dst, deadline, what):
        """dst, a batch the caller samples into, checked against the buffer's
        schema (SchemaError, naming what): its rows, its arrays by path
        (torch tensors' as numpy views), the same arrays as a nested dict
        (what Client.call's into reads the rows into, by bytes, where they
        are the batch's: C-contiguous, of the schema's dtypes and shapes),
        and the buffer's view."""
        schema, n, arrays = _batch_schema(dst)
        view = self._known_schema(deadline) if not self._bytes else self._current(deadline)
        if view.schema is not None:
            why = _match(view.schema, schema)
            if why is not None:
                raise SchemaError(f"replay: {what}: {why}")
        into = {}
        for path, a in arrays.items():
            set_path(into, list(path), a)
        return n, arrays, into, view

    def _known_schema(self, deadline):
        """The view once the buffer has a schema, asking the node until it has
        one (its first batch) or the deadline passes."""
        wait = 0.01
        while True:
            view = self._current(deadline)
            if view.schema is not None:
                return view
            view = self._adopt(self._call("replay.info", {"name": self.name}, deadline))
            if view.schema is not None:
                return view
            left = _left(deadline)
            if left is not None and left <= wait:
                raise _errors.DeadlineExceededError("replay: the buffer has no schema yet (no batch was added)")
            time.sleep(wait)
            wait = min(2 * wait, 1.0)

    def _sample_call(self, n, deadline):
        return self._call("replay.sample", {"name": self.name, "n": n, "bytes": False}, deadline)

    def _pick(self, n, deadline):
        """The node's picks for a sample of n: the prefetched ones if there
        are, else from a call now. The prefetched call is waited for until
        the sample's deadline, as a call now would be: the node holds it
        back while the buffer cannot give it (empty, the rate limiter's min
        size). At the deadline it is kept for the next sample (as Go's
        Client.pick does) and DeadlineExceededError is raised."""
        with self._mu:
            p, self._pending = self._pending, None
        if p is not None:
            if p[0] == n:
                try:
                    p[1].wait(_left(deadline))
                except _errors.DeadlineExceededError:
                    self._keep_prefetch(p)
                    raise _errors.DeadlineExceededError(
                        "replay: sample: deadline exceeded (the node has not yet served the prefetched sample)"
                    ) from None
                except _errors.TensorwireError:
                    p[1].cancel()  # the connection failed, or the node fell silent: ask again
                else:
                    try:
                        return p[1].result()
                    except _errors.TensorwireError:
                        pass  # a failed prefetch (the node restarted, say): ask again
            else:
                p[1].cancel()
        return self._sample_call(n, deadline)

    def _keep_prefetch(self, p):
        """Puts back a prefetched sample a caller gave up waiting for, for the
        next sample; cancels it if the buffer was closed meanwhile or
        another prefetch is out."""
        with self._mu:
            if self._pending is None and not self._closed:
                self._pending = p
                return
        p[1].cancel()

    def _spares(self, n):
        """How many spare picks a prefetch asks for beyond n: with a uniform or
        prioritized sampler (independent draws), a few, which replace rows
        found overwritten without another round trip; none with samplers
        whose picks take the transitions away (FIFO, without replacement)."""
        v = self._view
        if v is None or not (v.sampler == "uniform" or v.sampler.startswith("prioritized")):
            return 0
        return min(max(4, n // 32), MAX_SAMPLE - n)

    def _start_prefetch(self, n):
        with self._mu:
            if self._pending is not None or self._closed:
                return
            k = n + self._spares(n)
            try:
                self._pending = (n, self._client.start("replay.sample", {"name": self.name, "n": k, "bytes": False}))
            except _errors.TensorwireError:
                self._pending = None

    def _sample_ref(self, dst, n, deadline):
        arrays = {p: a for p, a in leaves(dst)}
        resp = self._pick(n, deadline)
        if self._prefetch:
            self._start_prefetch(n)
        view = self._refresh(resp.get("id"), deadline)
        if view.storage is None:
            raise _errors.InternalError("replay: no mapping of the buffer's storage")
        info = SampleInfo._from_wire(resp.get("info"))
        spare = None
        if len(info) > n:  # a prefetch's spares (_spares)
            _check_info(info, len(info), view.capacity)
            info, spare = _split(info, n)
        _check_info(info, n, view.capacity)
        for path, src in view.storage.items():
            np.take(src, info.indices, axis=0, out=arrays[path], mode="clip")  # clip: checked above; "raise" would copy twice
        # Rows whose word held after they were copied were copied whole:
        # only the rows copied again are checked again.
        torn = None
        for _ in range(MAX_RESAMPLES):
            _fence()
            torn = _overwritten(view.slots, info, torn)
            if torn.size == 0:
                return info
            with self._mu:
                self.resampled += int(torn.size)
            if view.resample_all:
                torn = np.arange(n)
            if spare is not None and len(spare) >= torn.size:
                again, spare = _split(spare, int(torn.size))
            else:
                more = self._sample_call(int(torn.size), deadline)
                if more.get("id") != resp.get("id"):
                    raise ExpiredError("replay: the buffer was created anew while sampled")
                again = SampleInfo._from_wire(more.get("info"))
                _check_info(again, int(torn.size), view.capacity)
            for path, src in view.storage.items():
                arrays[path][torn] = src[again.indices]
            info.indices[torn], info.ids[torn], info.weights[torn] = again.indices, again.ids, again.weights
        raise ContendedError(f"replay: rows kept being overwritten while sampled; {MAX_RESAMPLES} attempts")

    # The rest.

    def update_priority(self, info, priorities, timeout=None):
        """Sets the priorities of sampled transitions, row by row of info (a
        SampleInfo); rows whose slot was overwritten since they were sampled
        are skipped. Returns how many were updated."""
        p = _check_priorities(priorities, len(info.indices))
        if p is None:
            raise SchemaError("no priorities")
        r = self._call("replay.update_priority", {"name": self.name, "info": info._wire(), "priorities": p},
                       _deadline(timeout))
        return uint(r, "updated", "replay", 0)

    def checkpoint(self, timeout=None):
        """Has the node checkpoint the buffer."""
        self._call("replay.checkpoint", {"name": self.name}, _deadline(timeout))

    def stats(self, timeout=None):
        """The buffer's counters, a dict: capacity, size, inserted, sampled,
        pending, expired, resampled, sampler, node_heap, storage_lost."""
        return self._call("replay.stats", {"name": self.name}, _deadline(timeout))

    # Trajectories (docs/replay.md, "Trajectories and slices").

    def sample_slices(self, batch_size=None, slice_len=None, num_slices=None, strict_length=True,
                      prioritized=False, without_replacement=False, timeout=None, as_torch=False):
        """Slices of episodes, with torchrl's SliceSampler's meaning: give
        slice_len or num_slices, and batch_size (steps in all) or both.
        Each slice is slice_len consecutive steps of one episode, never
        crossing its boundary: an episode is chosen uniformly among those
        that hold a slice, then the start uniformly. With strict_length
        False, episodes shorter than slice_len are sampled too, whole, and
        padded at the end with zero rows (SliceInfo.mask False). Returns
        (batch, SliceInfo), the batch of num_slices*slice_len rows, slice
        after slice. No step is torn (the node samples a slice again, whole,
        when a step of it was overwritten while copied). The buffer needs a
        trajectory key (--buffer ...,traj-key=K). In ref mode the node sends
        the picks and this client gathers the rows from its mapping and
        checks every step's word. prioritized: torchrl's
        PrioritizedSliceSampler, start steps drawn by priority among those
        that can start a slice, each row weighted by its start's importance
        weight (the buffer's sampler must be prioritized; update_priority
        with the unpadded rows sets priorities). without_replacement:
        torchrl's SliceSamplerWithoutReplacement, in epochs that cut every
        episode into consecutive slices and return each once."""
        slice_len, num_slices = _slice_shape(batch_size, slice_len, num_slices)
        batch, info = self._sample_slices(slice_len, num_slices, strict_length, prioritized, without_replacement,
                                          _deadline(timeout), None)
        return (tree_to_torch(batch) if as_torch else batch), info

    def sample_slices_into(self, dst, slice_len=None, num_slices=None, strict_length=True, prioritized=False,
                           without_replacement=False, timeout=None):
        """sample_slices into dst, a dict of arrays (or torch tensors) with
        the buffer's schema and num_slices*slice_len rows (from an earlier
        sample_slices, say), without allocating it: give slice_len or
        num_slices, the other is dst's rows over it. By bytes the rows are
        read from the connection straight into dst's arrays where they are
        the batch's (C-contiguous, of the schema's dtypes and shapes), else
        copied in; by reference they are gathered into them. Padding rows
        (strict_length False) are zeroed, as sample_slices' are. Returns the
        SliceInfo."""
        deadline = _deadline(timeout)
        n, arrays, into, _ = self._into(dst, deadline, "sample_slices_into")
        if slice_len is not None and num_slices is not None:
            slice_len, num_slices = _slice_shape(None, slice_len, num_slices)
            if slice_len * num_slices != n:
                raise ArgumentError(f"a batch of {n} rows for {num_slices} slices of {slice_len} steps")
        else:
            slice_len, num_slices = _slice_shape(n, slice_len, num_slices)
        batch, info = self._sample_slices(slice_len, num_slices, strict_length, prioritized, without_replacement,
                                          deadline, into)
        _copy_in(arrays, batch, into)
        return info

    def _sample_slices(self, slice_len, num_slices, strict_length, prioritized, without_replacement, deadline, into):
        """sample_slices' batch and SliceInfo; into (a nested dict of numpy
        arrays of the batch's rows, or None) is where the rows go when they
        fit, and is then the batch returned."""

        def call(k, by_bytes):
            req = _slices_request(self.name, slice_len, k, strict_length, prioritized, without_replacement, by_bytes,
                                  packed=True)
            r = self._call("replay.sample_slices", req, deadline, ("batch",) if by_bytes else (),
                           into={"batch": into} if by_bytes and into is not None else None)
            info = SliceInfo._from_wire(r, slice_len)
            if len(info.indices) != k * slice_len or len(info.mask) != k * slice_len or len(info.episodes) != k:
                raise _errors.InternalError(f"replay: the node sent {len(info.indices)} rows for {k} slices of {slice_len}")
            return r, info

        if self._bytes:
            r, info = call(num_slices, True)
            if r.get("batch") is None:
                raise _errors.InternalError("replay: the node sent no rows")
            return r["batch"], info
        view = self._known_schema(deadline)
        spec = (slice_len, num_slices, bool(strict_length), bool(prioritized), bool(without_replacement))
        r, info = self._slice_picks(spec, lambda k: call(k, False))
        view = self._refresh(r.get("id"), deadline)
        if view.storage is None:
            raise _errors.InternalError("replay: no mapping of the buffer's storage")
        batch = into if into is not None else _zeros(view.schema, num_slices * slice_len)
        self._gather_slices(view, batch, info, slice_len, lambda k: call(k, False), r.get("id"))
        return batch, info

    def _slice_picks(self, spec, call):
        """The node's picks for a sample of slices of spec (slice_len,
        num_slices, strict, prioritized, without replacement) and the
        response they came in (its "id" the buffer's): from those asked for
        ahead (slices_ahead) if enough are left for spec, else from a call
        now, which asks for the next samples' too."""
        slice_len, num_slices = spec[0], spec[1]
        ahead = min(self._slices_ahead, MAX_SAMPLE // (slice_len * num_slices))
        if ahead <= 1:
            return call(num_slices)
        with self._mu:
            got = self._take_slices(spec)
        if got is not None:
            return got
        r, all_info = call(num_slices * ahead)
        with self._mu:
            self._sl_left = (spec, r.get("id"), all_info, 0)
            return self._take_slices(spec)

    def _take_slices(self, spec):
        """The next num_slices slices asked for ahead, as ({"id": ...},
        SliceInfo) sharing no array with what is kept, or None if fewer are
        left or they were asked for another spec; self._mu is held."""
        if self._sl_left is None:
            return None
        left_spec, buffer_id, info, nxt = self._sl_left
        k, L = spec[1], spec[0]
        if left_spec != spec or nxt + k > len(info.episodes):
            return None
        a, b = nxt * L, (nxt + k) * L
        out = SliceInfo(info.indices[a:b].copy(), info.ids[a:b].copy(), info.weights[a:b].copy(),
                        info.mask[a:b].copy(), info.episodes[nxt:nxt + k].copy(), L)
        self._sl_left = (left_spec, buffer_id, info, nxt + k)
        return {"id": buffer_id}, out

    def _gather_slices(self, view, dst, info, slice_len, more, buffer_id):
        """Copies the slices info names from this side's mapping into dst,
        zero rows for padding, then checks every step's word; slices with a
        torn step are replaced by slices from more(k), copied and checked
        again."""
        arrays = {p: a for p, a in leaves(dst)}
        _check_slice_picks(info, view.capacity)
        todo = np.arange(len(info.episodes))
        L = slice_len
        for _ in range(MAX_RESAMPLES):
            rows = (todo[:, None] * L + np.arange(L)[None, :]).reshape(-1)
            idx = info.indices[rows]
            for path, src in view.storage.items():
                a = arrays[path]
                a[rows] = src[np.maximum(idx, 0)]
                a[rows[idx < 0]] = 0
            _fence()
            steps = rows[idx >= 0]
            bad = _overwritten(view.slots, SampleInfo(info.indices[steps], info.ids[steps], info.weights[steps]), None)
            if bad.size == 0:
                return
            torn = np.unique(steps[bad] // L)
            with self._mu:
                self.resampled += int(torn.size)
            r, again = more(int(torn.size))
            if r.get("id") != buffer_id:
                raise ExpiredError("replay: the buffer was created anew while sampled")
            _check_slice_picks(again, view.capacity)
            for j, sl in enumerate(torn):
                dst_rows = slice(sl * L, (sl + 1) * L)
                src_rows = slice(j * L, (j + 1) * L)
                info.indices[dst_rows], info.ids[dst_rows] = again.indices[src_rows], again.ids[src_rows]
                info.weights[dst_rows], info.mask[dst_rows] = again.weights[src_rows], again.mask[src_rows]
                info.episodes[sl] = again.episodes[j]
            todo = torn
        raise ContendedError(f"replay: slices kept being overwritten while sampled; {MAX_RESAMPLES} attempts")

    def as_dataset(self, batch_size, slice_len=None, num_slices=None, strict_length=True, prefetch=2, timeout=None):
        """A torch IterableDataset over this buffer (torchrl's as_dataset,
        Reverb's dataset): tensordict-like dicts of torch tensors, samples
        of batch_size transitions, or slices when slice_len or num_slices is
        given, with `prefetch` samples fetched ahead by one thread. See
        tensorwire.replay_seq.ReplayDataset."""
        from tensorwire.replay_seq import ReplayDataset
        return ReplayDataset(self, batch_size, slice_len=slice_len, num_slices=num_slices,
                             strict_length=strict_length, prefetch=prefetch, timeout=timeout)

    # Reverb's table controls (docs/replay.md, "Table controls").

    def delete(self, info, timeout=None):
        """Removes transitions from the buffer: info is a SampleInfo (rows
        whose slot was overwritten since they were sampled are skipped) or
        a sequence of slot indices (whatever the slots hold). Rows already
        out of sampling (consumed, or sampled max-times-sampled times) are
        skipped too. Returns how many were removed. A sample never returns
        a removed row afterwards."""
        capacity = self._open_view().capacity  # ClosedError, as every call of a closed buffer
        r = self._call("replay.delete", _delete_request(self.name, info, capacity), _deadline(timeout))
        return uint(r, "deleted", "replay", 0)

    def reset(self, timeout=None):
        """Empties the buffer (Reverb's reset, torchrl's empty): every
        transition is removed and the rate limiter's counts start again.
        Unlike the other calls it is not retried when the node cannot be
        reached: sent again, it could empty what writers added since. The
        UnavailableError says so, and the caller decides."""
        self._check_open()
        self._client.call("replay.reset", {"name": self.name}, timeout=timeout)

    empty = reset


class SliceInfo(SampleInfo):
    """What a sample of slices returned: row by row (slice after slice)
    indices, ids and weights as SampleInfo (-1 and 0 for padding), mask
    (bool: False for padding), and per slice its episode's key
    (episodes, int64); slice_len."""

    __slots__ = ("mask", "episodes", "slice_len")

    def __init__(self, indices, ids, weights, mask, episodes, slice_len):
        super().__init__(indices, ids, weights)
        self.mask = np.asarray(mask, dtype=bool)
        self.episodes = np.asarray(episodes, dtype=np.int64)
        self.slice_len = int(slice_len)

    @classmethod
    def _from_wire(cls, r, slice_len):
        picks = r.get("picks")
        try:
            if picks is not None:  # packed: 16 bytes a row, slot and generation; weights 1 unless sent
                w = r.get("pick_weights")
                if (not isinstance(picks, bytes) or not isinstance(w or b"", bytes) or len(picks) % 16
                        or (w and len(w) != len(picks) // 2)):
                    raise _errors.InternalError(f"replay: the node sent picks {picks!r:.100} and weights {w!r:.100}")
                rows = np.frombuffer(picks, dtype=[("slot", "<i8"), ("id", "<u8")])
                indices = rows["slot"].astype(np.int64)
                weights = np.frombuffer(w, "<f8").astype(np.float64) if w else np.ones(len(rows))
                info = cls(indices, rows["id"].astype(np.uint64), weights, indices >= 0, r.get("episodes") or [],
                           slice_len)
            else:
                i = SampleInfo._from_wire(r.get("info"))
                info = cls(i.indices, i.ids, i.weights, r.get("mask") or [], r.get("episodes") or [], slice_len)
        except (ValueError, TypeError, OverflowError) as e:  # not lists of numbers
            raise _errors.InternalError(f"replay: the node sent slices {r!r:.200}: {e}") from None
        if info.mask.ndim != 1 or info.episodes.ndim != 1:
            raise _errors.InternalError(f"replay: the node sent slices {r!r:.200}")
        return info

    def __repr__(self):
        return (f"SliceInfo(episodes={self.episodes!r}, slice_len={self.slice_len}, indices={self.indices!r}, "
                f"mask={self.mask!r})")


def _copy_in(arrays, batch, into):
    """Copies batch into the caller's arrays (by path) unless it was read
    into them already (batch is into, Client.call's into)."""
    if batch is not into:
        for path, a in leaves(batch):
            arrays[path][...] = a


def _slice_shape(batch_size, slice_len, num_slices):
    """(slice_len, num_slices) from torchrl's arguments."""
    def whole(name, v):
        if v is not None and (not isinstance(v, (int, np.integer)) or isinstance(v, bool) or v <= 0):
            raise ArgumentError(f"{name}={v!r}: want a positive int")
    whole("batch_size", batch_size)
    whole("slice_len", slice_len)
    whole("num_slices", num_slices)
    if (slice_len is None) == (num_slices is None) and batch_size is not None:
        raise ArgumentError("give one of slice_len and num_slices with batch_size (torchrl's SliceSampler)")
    if slice_len is None and num_slices is None:
        raise ArgumentError("give slice_len or num_slices")
    if batch_size is not None:
        known = slice_len if slice_len is not None else num_slices
        if batch_size % known:
            raise ArgumentError(f"batch_size {batch_size} is not a multiple of {known}")
        if slice_len is None:
            slice_len = batch_size // known
        else:
            num_slices = batch_size // known
    if num_slices is None or slice_len is None:
        raise ArgumentError("give batch_size, or both slice_len and num_slices")
    if slice_len * num_slices > MAX_SAMPLE:
        raise ArgumentError(f"{num_slices} slices of {slice_len}: at most {MAX_SAMPLE} steps in one call")
    return int(slice_len), int(num_slices)


def _slices_request(name, slice_len, num_slices, strict_length, prioritized=False, without_replacement=False,
                    by_bytes=True, packed=False):
    """replay.sample_slices's request, its keys in Go's order; "packed" (the
    picks as bin values, docs/protocol.md) only when asked, as Go leaves it
    out when false."""
    r = {"bytes": bool(by_bytes), "name": name, "num_slices": num_slices}
    if packed:
        r["packed"] = True
    r.update({"pad_short": not strict_length, "prioritized": bool(prioritized), "slice_len": slice_len,
              "without_replacement": bool(without_replacement)})
    return r


def _check_slice_picks(info, capacity):
    """The node's picks of slices, checked before they index this side's
    mappings: a slot in range for a step, -1 for padding."""
    i = info.indices
    if ((i < -1) | (i >= capacity)).any() or ((i >= 0) != info.mask).any():
        raise _errors.InternalError(f"replay: the node sampled slots outside 0..{capacity - 1}")


def _delete_request(name, info, capacity=None):
    """replay.delete's request: info a SampleInfo, or slot indices (ids
    nil: whatever the slots hold)."""
    if isinstance(info, SampleInfo):
        indices, ids = info.indices, info.ids
        if len(ids) != len(indices):
            raise SchemaError(f"{len(ids)} ids for {len(indices)} indices")
    else:
        indices, ids = np.asarray(info, dtype=np.int64).reshape(-1), None
    if capacity is not None and len(indices) and (indices.min() < 0 or indices.max() >= capacity):
        raise SchemaError(f"indices {indices.tolist()} outside the buffer's {capacity} slots")
    return {"name": name, "info": {"indices": indices, "ids": ids, "weights": np.zeros(0, np.float64)}}


def _map(prefix, view):
    """Maps a buffer's storage (read-write: writers write rows into it) and
    slot table (read-only: only the node writes it), checking them against
    the view's schema and capacity."""
    try:
        storage = load_memmap(os.path.join(prefix, STORAGE_DIR), mode="r+")
    except (OSError, ValueError) as e:
        raise _errors.InternalError(f"replay: mapping the shared storage: {e}") from None
    flat = {p: a for p, a in flatten(storage) if isinstance(a, np.ndarray)}
    out = {}
    for key, dt, shape in view.schema:
        a = flat.get(key)
        if a is None or a.shape != (view.capacity,) + shape or a.dtype != DTYPES[dt]:
            raise _errors.InternalError(f"replay: the shared storage at {prefix} does not hold "
                                        f"{'.'.join(key)} {dt} {[view.capacity] + list(shape)}")
        out[key] = a
    path = os.path.join(prefix, SLOTS_FILE)
    try:
        if os.path.getsize(path) < view.capacity * 32:
            raise _errors.InternalError(f"replay: the slot table {path} is shorter than {view.capacity} slots")
        slots = np.memmap(path, dtype="<u8", mode="r", shape=(view.capacity, 4))
    except OSError as e:
        raise _errors.InternalError(f"replay: mapping the slot table: {e}") from None
    return out, slots


def _write_rows(view, slots, arrays):
    """Writes the batch's rows into the storage at slots; rows whose slot is
    -1 (dropped by a top-k writer) are not written."""
    keep = slots >= 0
    if not keep.all():
        rows = np.nonzero(keep)[0]
        slots = slots[keep]
        if slots.size == 0:
            return
        arrays = {p: a[rows] for p, a in arrays.items()}
    if slots.size and slots.max() >= view.capacity:
        raise _errors.InternalError(f"replay: the node reserved slot {slots.max()} of {view.capacity}")
    for path, dst in view.storage.items():
        a = arrays[path]
        if slots.size > 1 and np.all(np.diff(slots) == 1):
            dst[slots[0]:slots[-1] + 1] = a  # a run of slots: one copy
        else:
            dst[slots] = a


def _overwritten(slots, info, rows):
    """The rows (all of info's when rows is None) whose slot's word is no
    longer the one the sample recorded: committed, in the row's generation."""
    if rows is None:
        words = slots[info.indices, 0]
        return np.nonzero(words != ((info.ids << np.uint64(2)) | np.uint64(STATE_COMMITTED)))[0]
    words = slots[info.indices[rows], 0]
    return rows[words != ((info.ids[rows] << np.uint64(2)) | np.uint64(STATE_COMMITTED))]


def _split(info, n):
    """The first n rows of info, and the rest."""
    return (SampleInfo(info.indices[:n], info.ids[:n], info.weights[:n]),
            SampleInfo(info.indices[n:], info.ids[n:], info.weights[n:]))


def _check_info(info, n, capacity):
    if len(info.indices) != n or len(info.ids) != n or len(info.weights) != n:
        raise _errors.InternalError(f"replay: the node sampled {len(info.indices)} rows for {n}")
    if n and (info.indices.min() < 0 or info.indices.max() >= capacity):
        raise _errors.InternalError(f"replay: the node sampled slots outside 0..{capacity - 1}")


def _check_sample_size(n):
    if not isinstance(n, (int, np.integer)) or isinstance(n, bool):
        raise ArgumentError(f"batch size {n!r}: want an int")
    if n <= 0:
        raise ArgumentError(f"batch size must be positive, not {n}")
    if n > MAX_SAMPLE:
        raise ArgumentError(f"batch size {n}; at most {MAX_SAMPLE} in one call")


def _zeros(schema, n):
    td = {}
    for key, dt, shape in schema:
        d = td
        for k in key[:-1]:
            d = d.setdefault(k, {})
        d[key[-1]] = marked(np.zeros((n,) + shape, dtype=DTYPES[dt]), dt)
    return td


def _deadline(timeout):
    return None if timeout is None else time.monotonic() + timeout


def _left(deadline):
    return None if deadline is None else deadline - time.monotonic()

