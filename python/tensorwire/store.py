"""The store of a tensorwire node, from Python (docs/store.md): bins of
TensorDicts, watches, versioned parameters.

    st = tensorwire.store.Store("127.0.0.1:7070", "main", token=token, root="/mnt/shared")
    rev = st.append("data", {"obs": obs, "reward": reward})
    rev = st.extend("data", [step0, step1, step2])  # several items, one call and one operation
    items = st.get("data")                      # the bin's items, removed once this side has them
    v = st.publish("parameters", {"w": w})      # version 1, 2, ...
    with st.latest("parameters") as p:          # p.version, p.td (read-only np.memmap by reference)
        ...
    for ev in st.watch("data", after=rev):      # events as they happen, an iterator
        print(ev.rev, ev.op, ev.name, ev.items)

Values are dicts of arrays (nested dicts allowed), numpy or torch, with no
batch dimensions unless batch_size says so. They are sent as bytes; a client
that shares the node's root reads large values (prefixes under the store's
folder) by reference, mapping them read-only. Those files are written once
(synced and renamed into place, never rewritten), so sharing the node's
files is enough: "storage" sharing (another machine on NFS, another mount)
as well as "coherent" (docs/protocol.md, "Sharing"). At "storage", get and
peek copy each large value into memory before they return: the node deletes
a value's files its trash grace after the item leaves the bin, and a mapping
on another host faults then. Calls that find the node unreachable are tried
again until their timeout, and Put, Append, Extend, Delete and Publish carry
a request id, so that a retried one is applied once.
"""

import collections
import os
import random
import threading
import time

import numpy as np

from . import _exit, errors as _errors
from ._fields import answer, is_int, uint
from .dataset import FormatError as _MemmapFormatError, load_memmap
from .errors import (AbortedError, AlreadyExistsError, DataLossError, FailedPreconditionError,
                     InvalidArgumentError, NotFoundError, OutOfRangeError, ResourceExhaustedError, UnavailableError,
                     ClientClosedError, register_reason)
from ._td import TD, dtype_name, leaves, marked
from .rpc import Client, Sharing, StreamEnd, _rebuild

__all__ = ["Store", "Param", "Event", "Watch", "FROM_NOW", "OPS", "NameError_", "TooLargeError", "NotFoundError",
           "CompactedError", "ExpiredError", "LockedError", "ClosedError", "NotStagedError", "FormatError",
           "CorruptError", "FailedError", "ConfigError"]

FROM_NOW = (1 << 64) - 1  # Watch's after: only events from now on
ACK_WAIT = 30.0  # seconds a get's acknowledgement of items it has may outlast its timeout
_MAX_EXTEND = 4096  # values in one extend (the node refuses more)
_MAX_LOGGED = 1 << 30  # bytes of an extend's values the node keeps in its log (smaller than inline_bytes)
_test_after_take = None  # a test's hook, run between a get's two calls
_test_before_map = None  # a test's hook, run before an item by reference is mapped


class _Gone(_MemmapFormatError):
    """An item's folder that is gone: a get removed it after the node
    answered a peek (which peeks again). A get's items are held for it:
    for a get, one gone is the dataset.FormatError it always was."""


OPS = {1: "put", 2: "append", 3: "get", 4: "delete", 5: "publish"}


# The store service's errors (docs/store.md, "Errors").

@register_reason
class NameError_(InvalidArgumentError):
    """A bad bin or parameter name."""
    reason = "store.name"


@register_reason
class TooLargeError(ResourceExhaustedError):
    """A value over the store's MaxValueBytes; nothing stored."""
    reason = "store.too_large"


@register_reason
class NotFoundError(NotFoundError):  # noqa: F811 (store.NotFoundError is an errors.NotFoundError)
    """No store by that name on the node; no parameters published under the name."""
    reason = "store.not_found"


@register_reason
class CompactedError(OutOfRangeError):
    """A watch after a revision the store no longer keeps, never reached, or
    of a store created anew: read the state again and watch from its revision."""
    reason = "store.compacted"


@register_reason
class ExpiredError(AbortedError):
    """A Get whose items changed before its acknowledgement (get retries by
    itself); a request retried too late to tell."""
    reason = "store.expired"


@register_reason
class LockedError(FailedPreconditionError):
    reason = "store.locked"


@register_reason
class ClosedError(FailedPreconditionError):
    """The store or the client is closed."""
    reason = "store.closed"


@register_reason
class NotStagedError(InvalidArgumentError):
    reason = "store.not_staged"


@register_reason
class FormatError(InvalidArgumentError):
    """A value that cannot be stored or decoded."""
    reason = "store.format"


@register_reason
class CorruptError(DataLossError):
    reason = "store.corrupt"


@register_reason
class FailedError(FailedPreconditionError):
    """A write or sync of the store's log failed (a full disk)."""
    reason = "store.failed"


@register_reason
class ConfigError(InvalidArgumentError):
    reason = "store.config"


@register_reason
class ExistsError(AlreadyExistsError):
    """The node's store folder holds files that are not a store, or links."""
    reason = "store.exists"


@register_reason
class LostError(FailedPreconditionError):
    """The store's log (or folder) was removed under the node: it refuses
    every call until a person reopens it."""
    reason = "store.lost"


@register_reason
class MissingError(DataLossError):
    """A value's folder is missing: the item or version the message names
    is lost, the rest of the store whole."""
    reason = "store.missing"


Event = collections.namedtuple("Event", "rev op name items version")
Event.__doc__ = """A change of the store: rev (revision, from 1, no gaps), op ("put",
"append", "get", "delete", "publish"), name (the bin or parameter set), items
(in the bin after the event), version (a publish's)."""


def check_name(name):
    """NameError_ for a name the store refuses (docs/store.md, "Names"),
    before anything is sent."""
    if not isinstance(name, str):
        raise NameError_(f"a name is a str, not {type(name).__name__}")
    b = name.encode("utf-8", "surrogatepass")
    bad = (not 1 <= len(b) <= 255 or name in (".", "..") or any(c in name for c in "/\\")
           or any(ord(c) < 0x20 or ord(c) == 0x7F for c in name))
    if bad:
        raise NameError_(f"store: bad name {name[:40]!r}: 1 to 255 bytes of UTF-8 without /, \\ or control characters, "
                         "not . or ..")


class Param:
    """A version of a parameter set (Store.latest, Store.wait_newer): version,
    and td, a dict of arrays. By reference td maps the version read-only and
    the Param holds a lease on it, renewed in the background, until close();
    err is set once the lease was found lost. By bytes td is a copy and
    there is no lease.

    By reference, td's arrays (and torch.from_numpy of them) are valid until
    close(): keep a copy of what outlives it (load_state_dict copies). On
    the node's host a closed version's mapping stays readable; on another
    host (sharing "storage", NFS) it faults, killing the process with
    SIGBUS, once a newer version replaced it and the node's trash grace
    (one minute) has passed."""

    def __init__(self, store, name, version, td, lease):
        self._store = store
        self.name = name
        self.version = version
        self.td = td
        self.lease = lease
        self.err = None

    def close(self):
        if self.lease:
            self._store._release(self)
            self.lease = 0

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def _copied(td):
    """td with every array copied into memory (a value's mapping let go),
    bfloat16's bits marked as such still."""
    if isinstance(td, dict):
        return {k: _copied(v) for k, v in td.items()}
    if isinstance(td, np.ndarray):
        return marked(np.array(td), dtype_name(td))
    return td


def _num(r, key, default=None):
    return uint(r, key, "store", default)


def _watch_message(m):
    """The events and seen revision of a store.watch message; InternalError
    for one no node sends."""
    events = m.get("events") if isinstance(m, dict) else None
    if not isinstance(m, dict) or not isinstance(events or [], list) or not all(
            isinstance(e, dict) and isinstance(e.get("name", ""), str) for e in events or ()):
        raise _errors.InternalError(f"store: the node sent the watch message {m!r:.200}")
    evs = [Event(_num(e, "rev", 0), OPS.get(e.get("op"), e.get("op")), e.get("name", ""), _num(e, "items", 0),
                 _num(e, "version", 0)) for e in events or ()]
    return evs, _num(m, "seen", 0)


class Store:
    """The store served as name by a node. node: "HOST:PORT" or a
    tensorwire.Client to share; token, root: as tensorwire.Client takes them.
    bytes_mode: read values as bytes even when the root is shared (ref mode
    needs sharing storage or coherent; see sharing). Timeouts
    are seconds; None waits and retries as long as it takes. Safe for use
    from several threads; close() when done."""

    def __init__(self, node, name, token=None, root=None, bytes_mode=False, timeout=30.0):
        self._made = ((node, name), {"token": token, "root": root, "bytes_mode": bytes_mode, "timeout": timeout})
        if isinstance(node, Client):
            self._client, self._own = node, False
        else:
            self._client, self._own = Client(node, token=token, root=root, timeout=timeout), True
        self.name = name
        self._closed = False
        self._mu = threading.Lock()
        self._req_client = random.getrandbits(64) or 1
        self._seq = 0
        self._params = set()
        self._renewer = None
        _exit.reset_at_fork(self)  # a forked child's writes are its own: _forked
        try:
            self.info = self._call("store.info", {"store": name}, _deadline(timeout))
            # Values are write-once files: the same files through another
            # page cache (storage) are enough to read them by reference.
            self._sharing = self._client.sharing(timeout)
            shared = False
            if self._client.root and not bytes_mode and self.info.get("dir"):
                shared = Sharing.at_least(self._sharing, Sharing.STORAGE)
            self._ref = shared
        except BaseException:
            if self._own:
                self._client.close()
            raise

    @property
    def mode(self):
        """"ref" when large values are read from the shared files, "bytes" when
        they travel with the calls."""
        return "ref" if self._ref else "bytes"

    @property
    def sharing(self):
        """How much of the node's root the connection shared when the mode
        was picked: "coherent", "storage" or "none" (tensorwire.Sharing)."""
        return self._sharing

    def __reduce__(self):
        """Pickled, a new Store of the same store, node, token and root,
        made where it is unpickled (its own connection and client id)."""
        return _rebuild, (type(self),) + self._made

    def _forked(self):
        """In a child just forked: the requests it makes are its own. A
        write is applied once per (client, sequence number), so a child
        that went on with its parent's would have had one of two appends
        answered with the other's revision and dropped (found
        2026-12-01). A new client id, a new lock (a parent's thread may
        have held the old one at the fork), and none of the parent's
        leases (its Params stay the parent's; their close here releases
        nothing)."""
        self._mu = threading.Lock()
        self._req_client = random.getrandbits(64) or 1
        self._seq = 0
        for p in self._params:
            p.lease = 0  # the child's copy lets go: closing it releases nothing
        self._params = set()
        self._renewer = None

    def close(self):
        """Closes the connection when this Store made it; the Params still
        open are released. Later calls raise ClosedError, and so do its
        watches (once the events they hold are taken)."""
        with self._mu:
            if self._closed:
                return
            self._closed = True
            params = list(self._params)
        for p in params:
            p.close()
        if self._own:
            self._client.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    # Calls.

    def _call(self, method, arg, deadline, result_tds=(), into=None):
        if self._closed:
            raise ClosedError("store: closed")
        wait = 0.02
        while True:
            try:
                return answer(self._client.call(method, arg, timeout=_left(deadline), result_tds=result_tds, into=into),
                              "store", method)
            except ClientClosedError:
                raise ClosedError("store: closed") from None
            except UnavailableError as e:
                if self._closed:
                    raise ClosedError("store: closed") from None
                left = _left(deadline)
                if left is not None and left <= wait:
                    raise UnavailableError(f"{e.message}; gave up at the deadline, the node was unreachable") from None
                time.sleep(wait)
                wait = min(2 * wait, 1.0)

    def _req(self):
        with self._mu:
            self._seq += 1
            return {"client": self._req_client, "seq": self._seq}

    def _value(self, td, batch_size):
        if not isinstance(td, dict):
            raise FormatError(f"a value is a dict of arrays, not {type(td).__name__}")
        return {"td": TD(td, batch=list(batch_size)), "staged": ""}

    def put(self, bin, td, batch_size=(), timeout=None):
        """Replaces the bin's content with td, one item; returns the revision."""
        check_name(bin)
        r = self._call("store.put", {"store": self.name, "bin": bin, "value": self._value(td, batch_size),
                                     "req": self._req()}, _deadline(timeout))
        return _num(r, "rev")

    def append(self, bin, td, batch_size=(), timeout=None):
        """Adds td to the bin as an item; returns the revision."""
        check_name(bin)
        r = self._call("store.append", {"store": self.name, "bin": bin, "value": self._value(td, batch_size),
                                        "req": self._req()}, _deadline(timeout))
        return _num(r, "rev")

    def extend(self, bin, tds, batch_size=(), timeout=None):
        """Adds the values tds, in order, to the bin as one operation
        (torchrl's extend): one call, one revision (returned), one event;
        all of them or, on an error, none. batch_size is each value's.
        FormatError for no values or more than 4096; TooLargeError, before
        anything is sent, for values the node would keep in its log
        (smaller than its inline_bytes) of more than 1 GiB together."""
        check_name(bin)
        tds = list(tds)
        if not tds or len(tds) > _MAX_EXTEND:
            raise FormatError(f"store: {len(tds)} values to extend {bin!r} with; 1 to {_MAX_EXTEND}")
        values = [self._value(td, batch_size) for td in tds]
        inline = self.info.get("inline_bytes") or 0
        logged = sum(n for n in (sum(a.nbytes for _, a in leaves(td)) for td in tds) if n < inline)
        if logged > _MAX_LOGGED:
            raise TooLargeError(f"store: values of {logged} bytes to keep in the log in one extend; "
                                f"at most {_MAX_LOGGED} together")
        r = self._call("store.extend", {"store": self.name, "bin": bin, "values": values, "req": self._req()},
                       _deadline(timeout))
        return _num(r, "rev")

    def _items(self, msgs):
        if msgs is not None and not isinstance(msgs, list):
            raise _errors.InternalError(f"store: the node sent items {msgs!r:.200}")
        out = []
        for m in msgs or ():
            if not isinstance(m, dict):
                raise _errors.InternalError(f"store: the node sent the item {m!r:.200}")
            if m.get("td") is not None:
                out.append(m["td"])
            elif m.get("path"):
                path = m["path"]
                if not isinstance(path, str) or not path.startswith("values/") or "/" in path[len("values/"):]:
                    raise _errors.InternalError(f"store: the node sent the path {path!r}")
                if _test_before_map is not None:
                    _test_before_map()
                d = os.path.join(self._client.root, *self.info["dir"].split("/"), path)
                try:
                    td = load_memmap(d)
                except _MemmapFormatError:
                    if not os.path.lexists(d):
                        raise _Gone(f"store: the item at {path} is gone (removed after the node answered)") from None
                    raise
                if self._sharing != Sharing.COHERENT:
                    # Another page cache (another host, over NFS): the node
                    # unlinks the value's files its trash grace after the
                    # item leaves the bin, and a mapping here dies of SIGBUS
                    # at its next page then. The caller keeps items as long
                    # as it likes: copy them.
                    td = _copied(td)
                out.append(td)
            else:
                out.append({})
        return out

    def peek(self, bin, timeout=None):
        """The bin's items (dicts), which the bin keeps; [] for no such bin."""
        check_name(bin)
        deadline = _deadline(timeout)
        while True:
            r = self._call("store.take", {"store": self.name, "bin": bin, "take": 0, "refs": self._ref},
                           deadline, result_tds=(("items", "*", "td"),))
            try:
                return self._items(r.get("items"))
            except _Gone:
                continue  # a get removed an item meanwhile: peek again

    def get(self, bin, timeout=None):
        """The bin's items, removed from the store once this side has them
        (a take, then an acknowledgement: docs/store.md, "Get in two
        phases"); [] for no such bin.

        ``timeout`` bounds the wait for items. Once this side has them, their
        removal is acknowledged even if the timeout passes meanwhile (for at
        most ``ACK_WAIT`` seconds more), and they are returned: an item
        removed is an item the caller holds. A get that fails after the node
        may have held items for it gives them back at once, best effort,
        rather than after the node's get-timeout."""
        check_name(bin)
        deadline = _deadline(timeout)
        while True:
            take = random.getrandbits(64) or 1
            try:
                r = self._call("store.take", {"store": self.name, "bin": bin, "take": take, "refs": self._ref},
                               deadline, result_tds=(("items", "*", "td"),))
            except (TimeoutError, UnavailableError, KeyboardInterrupt):
                # The node may have held items for this take before the
                # wait for its reply ended: the deadline passed
                # (DeadlineExceededError, or UnavailableError when _call
                # gave up at it, the node unreachable since) or an
                # interrupt came. Given back, as Go's Client.Get gives a
                # take back once its ctx is done.
                self._give_back(take)
                raise
            if not r.get("take"):
                return []
            try:
                items = self._items(r.get("items"))
            except Exception:
                self._give_back(take)
                raise
            if _test_after_take is not None:
                _test_after_take()
            try:
                self._call("store.ack", {"store": self.name, "take": take, "drop": False},
                           _deadline(ACK_WAIT))
                return items
            except ExpiredError:
                if _left(deadline) is not None and _left(deadline) <= 0:
                    raise
                # The bin changed under the Get, or it was held too long: again.
            except BaseException:
                self._give_back(take)
                raise

    def _give_back(self, take):
        try:
            self._client.call("store.ack", {"store": self.name, "take": take, "drop": True}, timeout=5)
        except _errors.TensorwireError:
            pass

    def list(self, timeout=None):
        """({bin: items}, revision): the bins that hold items."""
        r = self._call("store.list", {"store": self.name}, _deadline(timeout))
        bins = r.get("bins") or {}
        if not isinstance(bins, dict):
            raise _errors.InternalError(f"store: the node listed the bins as {bins!r:.200}")
        return dict(bins), _num(r, "rev", 0)

    def delete(self, bin, timeout=None):
        """Removes the bin; returns the revision."""
        check_name(bin)
        return _num(self._call("store.delete", {"store": self.name, "bin": bin, "req": self._req()},
                               _deadline(timeout)), "rev")

    def publish(self, name, td, batch_size=(), timeout=None):
        """Publishes td as the next version of parameter set name; returns the
        version."""
        check_name(name)
        r = self._call("store.publish", {"store": self.name, "name": name, "value": self._value(td, batch_size),
                                         "req": self._req()}, _deadline(timeout))
        return _num(r, "version")

    def latest(self, name, timeout=None, into=None):
        """The latest version of parameter set name (a Param); NotFoundError if
        none was published. into: by bytes, a dict of numpy arrays (nested
        dicts for nested keys) the version is read into from the connection
        when its layout is theirs (the same keys, dtypes and shapes, each
        array C-contiguous and writeable), as Go's LatestInto does: a
        follower of a parameter set then allocates it once. The Param's td
        is into when it was read into it, else new arrays; by reference
        into is not used (td maps the version)."""
        return self._read(name, 0, False, timeout, into)

    def wait_newer(self, name, version, timeout=None, into=None):
        """The first version of name newer than version, waiting for it until
        timeout (DeadlineExceededError); into as latest's."""
        return self._read(name, version, True, timeout, into)

    def _read(self, name, after, wait, timeout, into=None):
        check_name(name)
        r = self._call("store.read", {"store": self.name, "name": name, "after": after, "wait": wait,
                                      "refs": self._ref}, _deadline(timeout), result_tds=("td",),
                       into={"td": into} if into is not None else None)
        version = _num(r, "version")
        if r.get("td") is not None:
            # Bytes: the lease covered the response on its way; it has arrived.
            p = Param(self, name, version, r["td"], _num(r, "lease", 0))
            p.close()
            return p
        if not self._ref:
            raise _errors.InternalError(f"store: the node sent {name} version {version} as a path to a client "
                                        "that reads by bytes")
        path = r.get("path") or ""
        if not isinstance(path, str) or not path.startswith("values/") or "/" in path[len("values/"):]:
            raise _errors.InternalError(f"store: the node sent the path {path!r}")
        td = load_memmap(os.path.join(self._client.root, *self.info["dir"].split("/"), path))
        p = Param(self, name, version, td, _num(r, "lease", 0))
        with self._mu:
            self._params.add(p)
            if self._renewer is None:
                self._renewer = threading.Thread(target=self._renew, args=(max(_num(r, "lease_ms", 10000), 300),),
                                                 name="tensorwire-store-leases", daemon=True)
                self._renewer.start()
        return p

    def _release(self, p):
        with self._mu:
            self._params.discard(p)
        try:
            self._client.call("store.release", {"store": self.name, "leases": [p.lease]}, timeout=5)
        except _errors.TensorwireError:
            pass  # the lease runs out by itself

    def _renew(self, lease_ms):
        """Renews the open Params' leases every third of the lease."""
        while True:
            time.sleep(lease_ms / 3000)
            with self._mu:
                if self._closed:
                    return
                params = [p for p in self._params if p.lease]
            if not params:
                continue
            try:
                r = self._client.call("store.renew", {"store": self.name, "leases": [
                    {"id": p.lease, "name": p.name, "version": p.version} for p in params]}, timeout=lease_ms / 3000)
            except _errors.TensorwireError:
                continue
            lost = r.get("lost") if isinstance(r, dict) else None
            if not isinstance(lost or [], list) or not all(is_int(x) for x in lost or ()):
                # An answer no node sends: as an error, the leases are
                # renewed again next time (a lost one is said lost then).
                continue
            lost = set(lost or ())
            for p in params:
                if p.lease in lost:
                    p.err = ExpiredError(f"store: the lease on {p.name} version {p.version} was lost")

    def watch(self, prefix="", after=FROM_NOW, timeout=None):
        """The events of bins and parameter sets whose names start with prefix,
        after revision after (FROM_NOW: from now on), in order, as they
        happen: an iterator (a Watch; close it, or leave a with block, to
        stop). It resumes by itself after the last revision it was given
        when the node restarts; CompactedError when the node no longer keeps
        the events after after; ClosedError once the Store is closed."""
        return Watch(self, prefix, after, _deadline(timeout))

    def stats(self, timeout=None):
        return self._call("store.stats", {"store": self.name}, _deadline(timeout))


class Watch:
    """An iterator of a store's Events (Store.watch), on a message stream of
    the client's own connection. It ends with StopIteration once closed,
    or when the node ends the stream; it raises ClosedError once its Store
    (or the Store's client) is closed, as the Store's calls do, rather than
    take it for the node restarting and open the stream again."""

    def __init__(self, store, prefix, after, deadline):
        self._store = store
        self.prefix = prefix
        self.after = after  # the revision to resume after
        self._deadline = deadline
        self._stream = None
        self._queue = collections.deque()
        self._closed = False

    def __iter__(self):
        return self

    def __next__(self):
        wait = 0.02
        while not self._queue:
            if self._closed:
                raise StopIteration
            if self._store._closed:
                raise self._store_closed()
            try:
                if self._stream is None:
                    self._stream = self._store._client.open_stream(
                        "store.watch", {"store": self._store.name, "id": self._store.info.get("id", ""),
                                        "prefix": self.prefix, "after": self.after}, timeout=_left(self._deadline))
                m = self._stream.recv()
                wait = 0.02
            except StreamEnd:
                self.close()
                raise StopIteration from None
            except UnavailableError as e:
                if self._closed:
                    # closed by its owner (from another thread, say) while
                    # waiting: the iteration ends, it did not fail.
                    raise StopIteration from None
                if self._store._closed or isinstance(e, ClientClosedError):
                    # The store (or its client) was closed: not the node
                    # restarting, nothing to resume.
                    raise self._store_closed() from None
                if self._stream is not None:
                    self._stream.close()
                self._stream = None
                left = _left(self._deadline)
                if left is not None and left <= wait:
                    raise
                time.sleep(wait)
                wait = min(2 * wait, 1.0)
                continue
            except BaseException:
                self.close()
                raise
            try:
                evs, seen = _watch_message(m)
            except _errors.InternalError:
                self.close()
                raise
            for ev in evs:
                self._queue.append(ev)
                self.after = ev.rev
            if seen and (self.after == FROM_NOW or seen > self.after):
                self.after = seen
        return self._queue.popleft()

    def _store_closed(self):
        """Closes the watch and returns the ClosedError to raise: its store
        or the store's client was closed."""
        self.close()
        return ClosedError("store: closed")

    def close(self):
        """Ends the watch: its stream is closed, and the iteration stops
        (StopIteration), a next() waiting in another thread too."""
        self._closed = True
        if self._stream is not None:
            self._stream.close()
            self._stream = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def _deadline(timeout):
    return None if timeout is None else time.monotonic() + timeout


def _left(deadline):
    return None if deadline is None else deadline - time.monotonic()
