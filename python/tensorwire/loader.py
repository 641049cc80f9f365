"""A consumer of a tensorwire node's loader, from Python (docs/loader.md):
one producer's batches shared by several training processes, iterated as a
PyTorch DataLoader is.

    dl = tensorwire.loader.Consumer("127.0.0.1:7070", "fmnist", batch_size=128, token=token,
                                    root="/mnt/shared", as_torch=True)
    for epoch in range(10):
        for batch in dl:            # one epoch, len(dl) batches, every sample once
            loss = model(batch["images"]) ...
    dl.close()

Each `for` over the consumer iterates one epoch and ends with it. When the
consumer shares the node's root it copies each batch's rows out of its own
read-only mapping of the producer's ring and checks the slot's word after
the copy (a batch rewritten meanwhile is DroppedError, never torn data);
otherwise the rows travel with the stream's messages. A heartbeat thread
keeps the consumer joined while the loop's body trains.

With device="cuda:N" batches come as tensors on that GPU: views of the
producer's device slots when it put them there (docs/loader.md, "GPU
delivery"), held until the loop's body returns, else copied there.

The node restarting is ridden out as the Go consumer does: an iteration
begun while the node is unreachable joins again after a backoff with full
jitter (its bound 20 ms doubling to 1 s) until the node answers, for up to
the consumer's timeout, then yields the epoch the producer serves it (a
restarted producer begins at the epoch after the last one it began). Only
an epoch of which batches were yielded cannot be resumed: its loop raises
UnavailableError, and the next iteration waits for the node.
"""

import math
import os
import random
import threading
import time

import numpy as np

from . import _device, _exit
from . import errors as _errors
from ._fields import is_int
from ._td import DTYPES, set_path, to_torch
from .dataset import _prefault, load_memmap
from .errors import (AbortedError, AlreadyExistsError, FailedPreconditionError, InvalidArgumentError,
                     NotFoundError, UnavailableError, register_reason)
from .replay import _FENCE_OK, _fence
from .rpc import Client, Sharing, StreamEnd

__all__ = ["Consumer", "ConfigError", "DatasetError", "ArgumentError", "NotFoundError", "DroppedError",
           "ClosedError", "FailedError", "InUseError", "ExistsError", "Producer", "NoProducerError"]


@register_reason
class ConfigError(InvalidArgumentError):
    reason = "loader.config"


@register_reason
class DatasetError(FailedPreconditionError):
    reason = "loader.dataset"


@register_reason
class ArgumentError(InvalidArgumentError):
    """A batch size of 0 or less, or larger than the producer's ring."""
    reason = "loader.argument"


@register_reason
class NotFoundError(NotFoundError):  # noqa: F811 (loader.NotFoundError is an errors.NotFoundError)
    reason = "loader.not_found"


@register_reason
class DroppedError(AbortedError):
    """The producer dropped this consumer (silent, too slow, its batch
    rewritten) or restarted; the next iteration joins again."""
    reason = "loader.dropped"


@register_reason
class ClosedError(FailedPreconditionError):
    reason = "loader.closed"


@register_reason
class FailedError(FailedPreconditionError):
    reason = "loader.failed"


@register_reason
class InUseError(FailedPreconditionError):
    reason = "loader.in_use"


@register_reason
class ExistsError(AlreadyExistsError):
    reason = "loader.exists"


@register_reason
class NoProducerError(UnavailableError):
    """The loader's producer is a process (a Producer) and none is attached:
    not yet, or it went away; consumers wait for one, as for a node that
    restarts."""
    reason = "loader.no_producer"


class _Session:
    """One membership of the producer: a join, its consume stream and its
    heartbeat thread, until a drop or close."""

    def __init__(self, consumer, info, ring, stream, bytes_mode):
        self.c = consumer
        self.info = info
        self.ring = ring  # (storage leaves by path, slot table) by reference; None by bytes
        self.stream = stream
        self.bytes = bytes_mode
        self.folder = None  # the ring's folder, by reference
        self.rows_buf = None  # by bytes: arrays a producer batch's rows are received into, again and again
        self.views = None  # the device slots' views, once resolved (_resolve): [] for the host path
        self.err = None  # why the stream ended
        self.mu = threading.Lock()
        self.rel = (info["epoch"], 0)  # done with every batch before this (epoch, index)
        self.sent = self.rel
        self.ack_every = max(1, info["slots"] // 4)
        self.kick = threading.Event()
        self.stop = threading.Event()
        self.beat = threading.Thread(target=self._heartbeat, name="tensorwire-loader-heartbeat", daemon=True)
        self.beat.start()

    def rows_into(self):
        """By bytes, the arrays (the rows' nested dict) a full producer
        batch's rows are read into from the connection: made at the first
        message and used again for every later one, since each batch's rows
        are copied into the consumer's batches before the next message is
        read (Consumer._next, _copy). A message they do not fit (an epoch's
        short last batch) comes in new memory."""
        if self.rows_buf is None:
            buf = {}
            for f in self.info["schema"]:
                set_path(buf, tuple(f["key"]),
                         np.empty((self.info["batch"],) + tuple(f.get("shape") or ()), DTYPES[f["dtype"]]))
            self.rows_buf = buf
        return self.rows_buf

    def release(self, epoch, index):
        with self.mu:
            if (epoch, index) > self.rel:
                self.rel = (epoch, index)
            urgent = self.rel[0] != self.sent[0] or self.rel[1] - self.sent[1] >= self.ack_every
        if urgent:
            self.kick.set()

    def _heartbeat(self):
        """Sends the release position when it moved a quarter of the ring or to
        another epoch, and at least four times per heartbeat period."""
        every = max(self.info.get("heartbeat_ms", 5000) / 4000, 0.001)
        while not self.stop.is_set():
            self.kick.wait(every)
            self.kick.clear()
            if self.stop.is_set():
                return
            with self.mu:
                e, i = self.rel
            try:
                self.stream.send({"epoch": e, "index": i}, timeout=4 * every)
            except _errors.TensorwireError:
                return  # the stream is over; recv says why
            with self.mu:
                if (e, i) > self.sent:
                    self.sent = (e, i)

    def end(self):
        """Ends the stream (the producer counts the consumer gone), and the
        heartbeat."""
        self.stop.set()
        self.kick.set()
        if self.err is None:
            try:
                self.stream.close_send()
                deadline = time.monotonic() + 1
                while time.monotonic() < deadline:
                    self.stream.recv(timeout=max(deadline - time.monotonic(), 0.001))
            except (StreamEnd, _errors.TensorwireError):
                pass
        self.stream.close()
        self.beat.join(5)


class Consumer:
    """A consumer of the loader served as name by a node, iterated like a
    PyTorch DataLoader: each `for` iterates the next epoch, len() batches of
    batch_size rows (the last one short unless drop_last), every sample of
    the epoch exactly once, in the producer's order. Batches are dicts of new
    numpy arrays (torch tensors sharing their memory with as_torch).

    node: "HOST:PORT" or a tensorwire.Client; token, root as Client takes
    them (root: the node's root as this machine mounts it, for reading the
    ring by reference); bytes_mode: rows with the messages even so.
    rank, world_size: a data-parallel job's share of each epoch, as
    DistributedSampler splits it (positions rank, rank + world_size, ...
    of the producer's order, padded to ceil(samples / world_size) from
    the epoch's first); state_dict/load_state_dict resume a restarted
    job's share mid-epoch without a sample twice. as_torch: tensors
    rather than numpy arrays; None: tensors for a producer process's
    batches (tensorwire.loader.Producer), which come back in its layout
    (dict, tuple, list or tensor), numpy for a dataset's.
    device: "cuda:N" (or "shm:N", the CPU stand-in) delivers batches as
    tensors on that device: views of the producer's device slots when the
    producer put them on this very device and this consumer maps the ring
    (delivery "device"; a view is valid until the loop's body returns, and
    read-only by contract), else copies through host memory and
    .to(device) (delivery "host"). See docs/loader.md, "GPU delivery".
    ArgumentError for a batch size the producer's ring cannot hold. Use it
    from one thread at a time; close() when done."""

    def __init__(self, node, name, batch_size, token=None, root=None, bytes_mode=False, drop_last=False,
                 as_torch=None, timeout=30.0, rank=None, world_size=None, device=None):
        if not isinstance(batch_size, int) or batch_size <= 0:
            raise ArgumentError(f"batch size {batch_size!r}: want at least 1")
        if (rank is None) != (world_size is None) or world_size is not None and not (
                isinstance(world_size, int) and isinstance(rank, int) and 0 <= rank < world_size):
            raise ArgumentError(f"rank {rank!r} of world size {world_size!r}: want 0 <= rank < world_size, or neither")
        self.rank, self.world_size = rank or 0, world_size or 1
        self._dev = _device.parse(device)
        self._dev_cache = (None, None)  # (ring id, its device views): the blob is read once per ring
        self.blob_reads = 0  # device blobs read and rebuilt (one per ring)
        self.device_error = None  # why a device blob found could not be rebuilt (then the host path serves)
        self._resume = None  # (epoch, samples of the share to skip in it): load_state_dict
        self._state = {"epoch": 0, "samples": 0}
        if isinstance(node, Client):
            self._client, self._own = node, False
        else:
            self._client, self._own = Client(node, token=token, root=root, timeout=timeout), True
        self.name = name
        self.batch_size = batch_size
        self.drop_last = drop_last
        self.as_torch = as_torch
        self._bytes_mode = bytes_mode
        self._timeout = timeout
        self._sess = None
        _exit.reset_at_fork(self)  # a forked child's loops are its own: _forked
        self._closed = False
        self._epoch = 0
        self._info = None
        self._bf16_of = None  # (schema, its bfloat16 keys)
        self._sharing = Sharing.NONE
        try:
            wait = _Backoff(timeout)
            while True:
                try:
                    self._session()
                    break
                except NoProducerError as e:  # a producer process yet to attach: waited for
                    wait.wait(e)
        except BaseException:
            if self._own:
                self._client.close()
            raise

    @property
    def mode(self):
        """"ref" when batches are read from the ring's shared files, "bytes" when
        they come with the messages."""
        return "bytes" if self._sess is None or self._sess.bytes else "ref"

    @property
    def delivery(self):
        """How the current session's batches come, one of:

        - "device": views of the producer's device slots. Only with a
          device, once the session's first batch found the producer's
          device blob for this very ring and device and rebuilt it here.
        - "host": copies through host memory (then .to(device) when a
          device was asked for). Without a device, from the join on; with
          one, once the session's first batch found no blob to use (by
          bytes, a producer without a device or on another one, a blob
          that did not rebuild here: device_error says why).
        - None: no session (closed, or the last one ended with an error and
          no iteration has joined again yet); or, with a device, the
          session's first batch not yet taken. An epoch iterated as a
          share (world_size > 1) or resumed mid-epoch (load_state_dict)
          takes the host path without deciding: it leaves None as it is.

        A new session (a join after a drop or the node's restart) decides
        again, at its first batch."""
        s = self._sess
        if s is None:
            return None
        if self._dev is None:
            return "host"
        return None if s.views is None else "device" if s.views else "host"

    @property
    def sharing(self):
        """How much of the node's root the connection shared when the
        current session joined: "coherent", "storage" or "none"
        (tensorwire.Sharing); ref mode needs coherent."""
        return self._sharing

    @property
    def epoch(self):
        """The epoch the next iteration yields."""
        return self._epoch

    @property
    def samples(self):
        return self._info["samples"]

    @property
    def schema(self):
        """A row's schema: a list of {key, dtype, shape}."""
        return self._info["schema"]

    def _share(self):
        """The samples of this rank's share of an epoch: DistributedSampler's
        ceil(samples / world_size), the last ones padded from the epoch's
        first."""
        return math.ceil(self._info["samples"] / self.world_size)

    def __len__(self):
        n = self._share()
        return n // self.batch_size if self.drop_last else math.ceil(n / self.batch_size)

    def state_dict(self):
        """Where this consumer is: {"epoch": the epoch iterated, "samples":
        the samples of its share of it yielded, "rank", "world_size": whose
        share that is}. A consumer made again (a restarted job) with
        load_state_dict(state) skips those samples if it joins that epoch
        again; joining a later epoch it iterates that one whole. Either way
        no sample of the saved epoch comes twice. The Go client's
        loader.State has the same JSON."""
        return dict(self._state, rank=self.rank, world_size=self.world_size)

    def load_state_dict(self, state):
        """Resumes from state_dict()'s state (see there). The state of
        another share (another rank or world size) raises ArgumentError and
        changes nothing: skipping another share's count would drop samples
        of this one. A state without rank and world size is taken as it is."""
        epoch, samples = int(state["epoch"]), int(state["samples"])
        if state.get("world_size") is not None and (int(state.get("rank") or 0), int(state["world_size"])) != (
                self.rank, self.world_size):
            raise ArgumentError(f"loader: the state is rank {state.get('rank')} of {state['world_size']}'s share, "
                                f"this consumer is rank {self.rank} of {self.world_size}")
        if samples < 0:
            raise ArgumentError(f"loader: {samples} samples yielded: want 0 or more")
        self._resume = (epoch, samples)

    def _session(self, wait=None):
        """The current session, joining the producer if there is none. A
        session that ended since the last call is its error, once. With wait
        (a _Backoff: iterations), the node being unreachable is ridden out:
        a join that finds it so is tried again after the backoff, and a
        session whose stream broke so while no loop ran is no error."""
        if self._closed:
            raise ClosedError("loader: closed")
        s = self._sess
        if s is not None and s.err is None:
            return s
        if s is not None:
            # The session ended while no loop ran: say so once; the next
            # iteration joins again. The node having gone away is no loss
            # of an epoch: wait for it instead.
            self._sess = None
            s.end()
            if wait is None or not _unreachable(s.err):
                raise s.err
        while True:
            try:
                s = self._join()
                break
            except _errors.UnavailableError as e:
                if wait is None or not _unreachable(e):
                    raise
                if self._closed:
                    raise ClosedError("loader: closed") from None
                wait.wait(e)
        self._sess = s
        self._epoch, self._info = s.info["epoch"], s.info
        return s

    def _join(self):
        c = self._client
        # The ring is rewritten in place: by reference only when the node's
        # page cache is this side's (coherent).
        self._sharing = c.sharing(self._timeout)
        shared = bool(c.root) and not self._bytes_mode and _FENCE_OK and self._sharing == Sharing.COHERENT
        info = c.call("loader.join", {"name": self.name, "batch": self.batch_size, "bytes": not shared},
                      timeout=self._timeout)
        _check_join(info, self.batch_size)
        prefix = info.get("prefix") or ""
        bytes_mode = not shared or not prefix or prefix.startswith("/") or ".." in prefix.split("/")
        ring = None
        if not bytes_mode:
            try:
                ring = _map_ring(os.path.join(c.root, *prefix.split("/")), info)
            except Exception as e:
                self._leave(info)
                if info.get("layout") and not os.path.isdir(os.path.join(c.root, *prefix.split("/"))):
                    # A producer process's ring removed under the join: it
                    # detached meanwhile.
                    self._ring_gone(info, e)
                raise
        folder = None if bytes_mode else os.path.join(c.root, *prefix.split("/"))
        stream = c.open_stream("loader.consume", {"name": self.name, "ring": info["ring"], "consumer": info["consumer"],
                                                  "epoch": info["epoch"], "index": 0, "bytes": bytes_mode},
                               result_tds=("rows",))
        s = _Session(self, info, ring, stream, bytes_mode)
        s.folder = folder
        return s

    def _ring_gone(self, info, err):
        """Raises why the ring of a join (info) went away as it was mapped:
        the failure of the producer process that wrote it (FailedError),
        which the node records before it removes the ring and tells a
        consume stream of that ring, or else NoProducerError, waited out for
        the next process (as Go's Consumer does)."""
        try:
            st = self._client.open_stream("loader.consume", {"name": self.name, "ring": info["ring"],
                                                             "consumer": info["consumer"], "epoch": info["epoch"],
                                                             "index": 0, "bytes": True}, timeout=10)
            try:
                st.recv()
            finally:
                st.close()
        except FailedError:
            raise
        except _errors.TensorwireError:
            pass
        raise NoProducerError(f"loader: the ring {info.get('prefix')} went away as it was mapped: {err}") from None

    def _leave(self, info):
        try:
            self._client.call("loader.leave", {"name": self.name, "ring": info["ring"], "consumer": info["consumer"]},
                              timeout=1)
        except _errors.TensorwireError:
            pass

    def __iter__(self):
        wait = _Backoff(self._timeout)
        s = self._session(wait)
        epoch = self._epoch
        self._epoch += 1
        return self._epochs(s, epoch, wait)

    def _epochs(self, s, epoch, wait):
        """Iterates epoch on session s; a break of the node before the
        epoch's first batch is ridden out by joining again, once the node is
        back, and iterating the epoch it serves."""
        while True:
            resume = self._resume  # back if nothing of the epoch is yielded
            it = self._iterate(s, epoch)
            try:
                first = next(it)
            except StopIteration:
                return
            except _errors.UnavailableError as e:
                if not _unreachable(e) or self._closed:
                    raise
                self._resume = resume
                wait.wait(e)
                s = self._session(wait)
                epoch = self._epoch
                self._epoch += 1
                continue
            try:
                yield first
                yield from it
            finally:
                it.close()  # a loop given up: gives up the rest of the epoch
            return

    def _iterate(self, s, epoch):
        skip = 0
        if self._resume is not None:
            if epoch == self._resume[0]:
                skip = self._resume[1]
            if epoch >= self._resume[0]:
                self._resume = None
        self._state = {"epoch": epoch, "samples": skip}
        if self.world_size > 1 or skip:
            yield from self._iterate_share(s, epoch, skip)
            return
        if self._dev is not None:
            yield from self._iterate_device(s, epoch)
            return
        yield from self._iterate_all(s, epoch)

    def _iterate_share(self, s, epoch, skip):
        """_iterate_all for rank's share of the epoch (DistributedSampler's:
        positions rank, rank + world_size, ..., padded to
        ceil(samples / world_size) from the epoch's first positions), less
        its first skip samples."""
        B, ws, r = self.batch_size, self.world_size, self.rank
        fields = [(tuple(f["key"]), DTYPES[f["dtype"]], tuple(f.get("shape") or ())) for f in s.info["schema"]]
        N, Bp = s.info["samples"], s.info["batch"]
        pad = math.ceil(N / ws) * ws - N
        # The epoch positions repeated at the end: position N + j is j's,
        # wrapping round (DistributedSampler repeats the epoch as often as a
        # world larger than it needs).
        padded = [j % N for j in range(pad) if (N + j) % ws == r]
        stash = {k: np.empty((len(padded),) + shape, dt) for k, dt, shape in fields}
        cur, pos, index, taken = None, 0, 0, 0
        complete = False

        def feed(src):  # (dict of rows) -> batches, skipping the first skip of the share
            nonlocal cur, pos, taken
            n = len(next(iter(src.values()))) if src else 0
            off = 0
            if taken < skip:
                d = min(skip - taken, n)
                taken += d
                off = d
            while off < n:
                if cur is None:
                    cur = {k: np.empty((B,) + shape, dt) for k, dt, shape in fields}
                take = min(B - pos, n - off)
                for k in cur:
                    cur[k][pos:pos + take] = src[k][off:off + take]
                pos += take
                off += take
                taken += take
                if pos == B:
                    out, cur, pos = cur, None, 0
                    self._state = {"epoch": epoch, "samples": taken}
                    yield self._out(out, B)

        try:
            while True:
                a, rows = self._next(s, epoch, index)
                first = a["index"] * Bp
                sel = np.arange((r - first) % ws, a["rows"], ws)
                got = self._copy_sel(s, a, rows, sel)
                st = [o for o in range(min(a["rows"], max(pad - first, 0))) if first + o in padded]
                if st:
                    more = self._copy_sel(s, a, rows, np.asarray(st))
                    for i, o in enumerate(st):
                        for k in stash:
                            stash[k][padded.index(first + o)] = more[k][i]
                s.release(epoch, a["index"] + 1)
                yield from feed(got)
                index = a["index"] + 1
                if index == a["count"]:
                    complete = True
                    if padded:
                        yield from feed(stash)
                    if pos > 0 and not self.drop_last:
                        self._state = {"epoch": epoch, "samples": taken}
                        yield self._out(cur, pos)
                    self._state = {"epoch": epoch + 1, "samples": 0}
                    return
        except _errors.TensorwireError as e:
            self._end_on(s, e)
            raise
        finally:
            if not complete and s.err is None:
                s.release(epoch + 1, 0)  # gives up the rest of the epoch

    def _end_on(self, s, e):
        """Ends session s after error e if e ends it (dropped, the node or
        producer gone, or the session failed already): the next iteration
        joins again."""
        if isinstance(e, (DroppedError, _errors.UnavailableError)) or s.err is not None:
            if s.err is None:
                s.err = e
            if self._sess is s:
                self._sess = None
            s.end()

    def _copy_sel(self, s, a, rows, sel):
        """Rows sel (offsets in batch a) of batch a, as {key: new array}: from
        the message's rows, or from the ring, then checking the slot's word."""
        if rows is not None:
            return {key: np.ascontiguousarray(arr[sel]) for key, arr in _flat(rows)}
        leaves, table = s.ring
        start = a["slot"] * s.info["batch"]
        out = {key: src[start + sel] for key, src in leaves.items()}
        _fence()
        if int(table[a["slot"], 0]) != a["word"]:
            raise DroppedError(f"loader: batch {a['index']} of epoch {a['epoch']} was overwritten while it was read")
        return out

    def _iterate_all(self, s, epoch, first=None):
        B = self.batch_size
        fields = [(tuple(f["key"]), DTYPES[f["dtype"]], tuple(f.get("shape") or ())) for f in s.info["schema"]]
        cur, pos, index, yielded = None, 0, 0, 0
        complete = False
        try:
            while True:
                a, rows = first if first is not None else self._next(s, epoch, index)
                first = None
                off = 0
                while off < a["rows"]:
                    if cur is None:
                        cur = {k: np.empty((B,) + shape, dt) for k, dt, shape in fields}
                    take = min(B - pos, a["rows"] - off)
                    self._copy(s, cur, pos, a, rows, off, take)
                    pos += take
                    off += take
                    if pos == B:
                        out, cur, pos = cur, None, 0
                        yielded += B
                        self._state = {"epoch": epoch, "samples": yielded}
                        yield self._out(out, B)
                s.release(epoch, a["index"] + 1)
                index = a["index"] + 1
                if index == a["count"]:
                    complete = True
                    if pos > 0 and not self.drop_last:
                        self._state = {"epoch": epoch, "samples": yielded + pos}
                        yield self._out(cur, pos)
                    self._state = {"epoch": epoch + 1, "samples": 0}
                    return
        except _errors.TensorwireError as e:
            self._end_on(s, e)
            raise
        finally:
            if not complete and s.err is None:
                s.release(epoch + 1, 0)  # gives up the rest of the epoch

    def _to_device(self, v):
        """The host path's last step: host tensor v on the consumer's device,
        through pinned memory for CUDA (the copy is asynchronous; torch's
        pinned allocator keeps the buffer until it is done)."""
        if self._dev.kind == "cuda":
            return v.pin_memory().to(self._dev.torch_device, non_blocking=True)
        return v.to(self._dev.torch_device)

    def _resolve(self, s):
        """Decides, at the session's first batch, how it is delivered: the
        device slots' views when the producer wrote a device blob for this
        very ring (it does so before it publishes any batch) on this very
        device, else [] (the host path). The blob is read and rebuilt once
        per ring, and cached across sessions of that ring."""
        if s.views is not None:
            return s.views
        s.views = []
        ring = s.info["ring"]
        if self._dev_cache[0] == ring:
            s.views = self._dev_cache[1]
            return s.views
        if s.bytes or s.folder is None:
            return s.views
        blob = _device.read_blob(s.folder)
        if blob is None or blob.get("version") != _device.VERSION or blob.get("ring") != ring or \
                blob.get("kind") != self._dev.kind or blob.get("identity") != self._dev.identity() or \
                blob.get("batch") != s.info["batch"] or len(blob.get("slots") or ()) != s.info["slots"]:
            return s.views
        try:
            s.views = _device.views(self._dev, blob, s.info["schema"])
        except Exception as e:  # noqa: BLE001 (the handles did not open here: the host path serves)
            self.device_error = f"{type(e).__name__}: {e}"
            s.views = []
            return s.views
        self.blob_reads += 1
        self._dev_cache = (ring, s.views)
        return s.views

    def _iterate_device(self, s, epoch):
        """_iterate_all on a consumer with a device. A batch that lies within
        one producer batch is a view of its device slot, held (not
        released) until the loop's body returns and the device has done
        the work queued meanwhile (an event): the node grants no slot a
        consumer holds (Producer.takeSlot, loader/producer.go), so the
        producer cannot rewrite it under the body. A batch straddling
        producer batches is copied on the device piece by piece, each
        producer batch released once its piece is copied. Releases wait for the
        device's events only when the consumer would otherwise hold more
        than half the ring while it waits for the next batch."""
        try:
            first = self._next(s, epoch, 0)
            views = self._resolve(s)
        except _errors.TensorwireError as e:
            self._end_on(s, e)
            raise
        if not views:
            yield from self._iterate_all(s, epoch, first)
            return
        dev = self._dev
        B = self.batch_size
        hold = max(1, s.info["slots"] // 2)
        cur, pos, yielded = None, 0, 0  # a batch straddling producer batches, copied on the device so far
        pend = []  # (event, release through, announcement to check): work maybe still queued on a slot
        released = 0  # batches of the epoch before this one released
        complete = False

        def check(a):
            if int(s.ring[1][a["slot"], 0]) != a["word"]:
                raise DroppedError(f"loader: batch {a['index']} of epoch {a['epoch']} was overwritten while "
                                   f"its device slot was read")

        def flush(next_index):
            # Releases the batches whose readers' device work is done; waits
            # for it while the consumer would hold more than half the ring.
            nonlocal released
            while pend:
                ev, through, a = pend[0]
                if not dev.done(ev):
                    if next_index - released <= hold:
                        return
                    dev.wait(ev)
                pend.pop(0)
                _fence()
                check(a)
                if through > released:
                    released = through
                    s.release(epoch, through)

        try:
            a, index = first[0], 0
            while True:
                slot, off = views[a["slot"]], 0
                while off < a["rows"]:
                    take = min(B - pos, a["rows"] - off)
                    last = index + 1 == a["count"] and off + take == a["rows"]
                    if pos == 0 and (take == B or last):
                        # Within this producer batch: a view of its slot,
                        # held until the body returns and its work is done.
                        off += take
                        if take < B and self.drop_last:
                            break
                        out = {k: t[off - take:off] for k, t in slot.items()}
                        _fence()
                        check(a)  # not rewritten before the body begins
                        yielded += take
                        self._state = {"epoch": epoch, "samples": yielded}
                        yield self._shape(out)
                        pend.append((dev.record(), a["index"] + (1 if off == a["rows"] else 0), a))
                        flush(index + 1)
                        continue
                    # Straddling producer batches: copied on the device piece
                    # by piece, each producer batch released once its copy
                    # is done.
                    if cur is None:
                        import torch
                        cur = {k: torch.empty((B,) + tuple(t.shape[1:]), dtype=t.dtype, device=t.device)
                               for k, t in slot.items()}
                    for k, t in slot.items():
                        cur[k][pos:pos + take].copy_(t[off:off + take])
                    pos += take
                    off += take
                    if pos < B and not last:
                        continue
                    n, out, cur, pos = pos, cur, None, 0
                    if n < B and self.drop_last:
                        break
                    pend.append((dev.record(), a["index"] + (1 if off == a["rows"] else 0), a))
                    dev.wait(pend[-1][0])
                    flush(index + 1)  # checks the slot's word after the copy: it was whole
                    yielded += n
                    self._state = {"epoch": epoch, "samples": yielded}
                    yield self._shape({k: v[:n] for k, v in out.items()})
                if cur is not None:  # this producer batch is copied into the batch under way
                    pend.append((dev.record(), a["index"] + 1, a))
                index += 1
                if index == a["count"]:
                    complete = True
                    flush(1 << 62)  # waits for every reader
                    s.release(epoch, index)
                    self._state = {"epoch": epoch + 1, "samples": 0}
                    return
                flush(index)
                a, _ = self._next(s, epoch, index)
        except _errors.TensorwireError as e:
            self._end_on(s, e)
            raise
        finally:
            if not complete and s.err is None:
                dev.wait(dev.record())  # a loop given up: its body's work on the view it held
                s.release(epoch + 1, 0)  # gives up the rest of the epoch

    def _next(self, s, epoch, index):
        """The announcement of batch index of epoch and, by bytes, its rows;
        batches before it (of an epoch given up) are passed over."""
        while True:
            try:
                m = s.stream.recv(into={"rows": s.rows_into()} if s.bytes else None)
            except StreamEnd:
                s.err = DroppedError("loader: the producer ended the consumer's stream")
                raise s.err from None
            except _errors.TensorwireError as e:
                s.err = e
                raise
            a = m.get("batch") if isinstance(m, dict) else None
            if not isinstance(a, dict) or not all(is_int(a.get(k)) for k in ("epoch", "index")):
                raise _errors.InternalError(f"loader: waiting for batch {index} of epoch {epoch}, got {m!r:.200}")
            if (a["epoch"], a["index"]) < (epoch, index):
                continue
            if (a["epoch"], a["index"]) != (epoch, index):
                raise _errors.InternalError(f"loader: waiting for batch {index} of epoch {epoch}, "
                                            f"got {a['index']} of {a['epoch']}")
            _check_announcement(s.info, a)
            rows = None
            if s.bytes:
                rows = m.get("rows")
                if rows is None:
                    raise _errors.InternalError(f"loader: batch {index} of epoch {epoch} came without its rows")
                _check_rows(s.info, a, rows)
            return a, rows

    def _copy(self, s, dst, pos, a, rows, off, n):
        """Copies rows [off, off+n) of batch a into dst at pos: from the
        message's rows, or from the ring, then checking the slot's word."""
        if rows is not None:
            for key, arr in _flat(rows):
                dst[key][pos:pos + n] = arr[off:off + n]
            return
        leaves, table = s.ring
        start = a["slot"] * s.info["batch"] + off
        for key, src in leaves.items():
            dst[key][pos:pos + n] = src[start:start + n]
        _fence()
        if int(table[a["slot"], 0]) != a["word"]:
            raise DroppedError(f"loader: batch {a['index']} of epoch {a['epoch']} was overwritten while it was read")

    def _shape(self, flat):
        """A batch ({key path: array or tensor}) in the producer's layout:
        nested dicts ("dict", and a dataset's batches), its one tensor
        ("tensor"), or its tensors by position ("tuple", "list")."""
        td = {}
        for key, v in flat.items():
            set_path(td, key, v)
        layout = self._info.get("layout") or "dict"
        if layout == "dict":
            return td
        if layout == "tensor":
            return td["0"]
        items = [td[str(i)] for i in range(len(td))]
        return tuple(items) if layout == "tuple" else items

    def _out(self, flat, n):
        """The batch of the first n rows of flat ({key path: numpy array}),
        copied through host memory: numpy arrays, or tensors with as_torch
        (None: for a producer process's batches, which come back as it gave
        them) or a device (then .to(device))."""
        as_torch = self.as_torch
        if as_torch is None:
            as_torch = bool(self._info.get("layout"))
        bf16 = self._bf16() if as_torch or self._dev is not None else ()
        out = {}
        for key, arr in flat.items():
            v = arr if n == len(arr) else arr[:n]
            if as_torch or self._dev is not None:
                v = to_torch(v, key in bf16)
                if self._dev is not None:
                    v = self._to_device(v)
            out[key] = v
        return self._shape(out)

    def _bf16(self):
        """The keys of the schema's bfloat16 tensors (kept per schema)."""
        schema = self._info["schema"]
        if self._bf16_of is None or self._bf16_of[0] is not schema:
            self._bf16_of = (schema, {tuple(f["key"]) for f in schema if f["dtype"] == "torch.bfloat16"})
        return self._bf16_of[1]

    def stats(self, timeout=None):
        """The producer's figures (loader.stats)."""
        return self._client.call("loader.stats", {"name": self.name}, timeout=timeout)

    def _forked(self):
        """In a child just forked: the membership (the session, its stream
        and heartbeat) is the parent's. Forget it, saying nothing to the
        node; the child's next loop joins as a consumer of its own."""
        self._sess = None

    def __reduce__(self):
        raise TypeError("a loader.Consumer cannot be pickled: its membership and its place in the epoch are this "
                        "process's; make a Consumer in the other process (state_dict and load_state_dict carry a "
                        "place from one to another)")

    def close(self):
        """Leaves the producer and closes the connection (when this Consumer
        made it)."""
        if self._closed:
            return
        self._closed = True
        s, self._sess = self._sess, None
        if s is not None:
            s.end()
        if self._own:
            self._client.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def _unreachable(e):
    """Whether e says the node could not be reached or the connection broke
    (what a node restarting looks like), rather than that the client is
    closed."""
    return isinstance(e, _errors.UnavailableError) and not isinstance(e, _errors.ClientClosedError)


class _Backoff:
    """The waits of one iteration's retries: full jitter, each drawn
    uniformly below a bound of 20 ms doubling to 1 s, for up to limit
    seconds from the first (then the last error is raised). stop: a
    threading.Event that ends a wait early once set (its owner closed);
    the caller looks at why it woke."""

    def __init__(self, limit, stop=None):
        self.limit = limit
        self.bound = 0.02
        self.give_up = None
        self.stop = stop

    def wait(self, err):
        now = time.monotonic()
        if self.give_up is None:
            self.give_up = now + (self.limit if self.limit is not None else math.inf)
        if now >= self.give_up:
            raise _errors.UnavailableError(f"{err.message}; gave up after {self.limit:g}s, "
                                           f"the node was unreachable") from None
        t = min(random.uniform(0, self.bound), self.give_up - now)
        if self.stop is not None:
            self.stop.wait(t)
        else:
            time.sleep(t)
        self.bound = min(2 * self.bound, 1.0)


def _flat(td, prefix=()):
    for k, v in td.items():
        if isinstance(v, dict):
            yield from _flat(v, prefix + (k,))
        else:
            yield prefix + (k,), v


_INT64_MAX = (1 << 63) - 1
_MAX_HEARTBEAT_MS = 1 << 40  # as Go's maxHeartbeatMS
_STATE_PUBLISHED = 2  # a slot word's state (its low 2 bits): holds a whole batch, announced


def _check_join(info, batch):
    """Checks that the node's answer to join is one a producer gives a
    consumer of batch rows a batch, as Go's checkJoin: a ring of 1 to 2^31
    rows that holds a consumer batch, samples whose batches can be counted,
    a first epoch of 0 or more, a heartbeat period that is not negative, and
    a schema of rows (each field a key, a dtype name and a row shape).
    InternalError otherwise: nothing of it is used."""
    def bad(what):
        return _errors.InternalError(f"loader: the node's answer to join is no producer's: {what}")

    if not isinstance(info, dict):
        raise bad(f"{info!r:.200}")
    for k in ("slots", "batch", "samples", "epoch", "heartbeat_ms", "consumer"):
        if not is_int(info.get(k)):
            raise bad(f"{k} {info.get(k)!r:.100}")
    slots, rbatch, samples = info["slots"], info["batch"], info["samples"]
    if not (1 <= slots <= 1 << 31 and 1 <= rbatch <= 1 << 31 and slots * rbatch <= 1 << 31):
        raise bad(f"a ring of {slots} slots of {rbatch} rows")
    if batch > slots * rbatch:
        raise bad(f"a ring of {slots * rbatch} rows for a consumer of batch {batch}")
    if not 1 <= samples <= _INT64_MAX - max(rbatch, batch):
        raise bad(f"{samples} samples")
    if not 0 <= info["epoch"] < _INT64_MAX:
        raise bad(f"epoch {info['epoch']}")
    if not 0 <= info["heartbeat_ms"] <= _MAX_HEARTBEAT_MS:
        raise bad(f"a heartbeat of {info['heartbeat_ms']} ms")
    if not isinstance(info.get("ring"), str) or not isinstance(info.get("prefix") or "", str) \
            or not isinstance(info.get("layout") or "", str):
        raise bad(f"ring {info.get('ring')!r:.100}, prefix {info.get('prefix')!r:.100}, "
                  f"layout {info.get('layout')!r:.100}")
    schema = info.get("schema")
    if not isinstance(schema, list):
        raise bad(f"schema {schema!r:.200}")
    keys = set()
    for f in schema:
        key = f.get("key") if isinstance(f, dict) else None
        shape = (f.get("shape") or []) if isinstance(f, dict) else None
        if (not isinstance(key, list) or not key or not all(isinstance(k, str) for k in key)
                or f.get("dtype") not in DTYPES or not isinstance(shape, list)
                or not all(is_int(d) and d >= 0 for d in shape) or tuple(key) in keys):
            raise bad(f"schema field {f!r:.200}")
        keys.add(tuple(key))


def _check_announcement(info, a):
    """Checks that a announces batch a["index"] of an epoch as the producer
    the consumer joined does, as Go's checkAnnouncement: the epoch's count
    of batches, the batch's rows, a slot of the ring and a published slot
    word. InternalError otherwise (a slot out of range would index another
    slot's rows)."""
    count = -(-info["samples"] // info["batch"])
    idx = a["index"]
    rows = min(info["batch"], info["samples"] - idx * info["batch"]) if 0 <= idx < count else 0
    slot, word = a.get("slot"), a.get("word")
    if (a.get("count") != count or a.get("rows") != rows or not is_int(slot) or not 0 <= slot < info["slots"]
            or not is_int(word) or word & 3 != _STATE_PUBLISHED):
        raise _errors.InternalError(
            f"loader: the node announced batch {idx} of epoch {a['epoch']} as {a!r:.200}; a producer of "
            f"{info['samples']} samples in batches of {info['batch']}, with {info['slots']} slots, announces "
            f"{count} batches, this one of {rows} rows, in a published slot")


def _check_rows(info, a, rows):
    """Checks that rows sent in bytes mode are the batch's, in the joined
    schema: every field, its dtype, a["rows"] rows of its row shape, and no
    other (Go's schema.Match). numpy would broadcast rows of another shape
    into the batch, and convert another dtype, without a word."""
    got = {key: arr for key, arr in _flat(rows)} if isinstance(rows, dict) else None
    want = {tuple(f["key"]): f for f in info["schema"]}
    ok = got is not None and set(got) == set(want)
    if ok:
        for key, f in want.items():
            arr = got[key]
            if (not isinstance(arr, np.ndarray) or arr.dtype != DTYPES[f["dtype"]]
                    or arr.shape != (a["rows"],) + tuple(f.get("shape") or ())):
                ok = False
                break
    if not ok:
        have = None if got is None else {"/".join(k): (str(v.dtype), v.shape) for k, v in got.items()
                                         if isinstance(v, np.ndarray)}
        raise _errors.InternalError(f"loader: the rows of batch {a['index']} of epoch {a['epoch']} are not the "
                                    f"joined schema's: {have!r:.300}")


def _map_ring(path, info):
    """The ring's storage leaves (read-only) and slot table, checked against
    the join's description. A ring that is not there as described (gone,
    short, not a TensorDict) is InternalError, the node's description
    wrong, with the cause chained."""
    try:
        storage = load_memmap(os.path.join(path, "storage"))
    except (OSError, ValueError) as e:  # dataset.FormatError is a ValueError
        raise _errors.InternalError(f"loader: the ring at {path} cannot be mapped: {e}") from e
    flat = dict(_flat(storage))
    rows = info["slots"] * info["batch"]
    leaves = {}
    for f in info["schema"]:
        key, dt, shape = tuple(f["key"]), DTYPES[f["dtype"]], tuple(f.get("shape") or ())
        a = flat.get(key)
        if a is None or a.dtype != dt or a.shape != (rows,) + shape:
            raise _errors.InternalError(f"loader: the ring at {path} does not hold {'/'.join(key)} {f['dtype']} "
                                        f"{[rows] + list(shape)}")
        leaves[key] = a
    table_path = os.path.join(path, "slots.memmap")
    try:
        if os.path.getsize(table_path) < info["slots"] * 32:
            raise _errors.InternalError(f"loader: the slot table {table_path} is short")
        table = np.memmap(table_path, dtype="<u8", mode="r", shape=(info["slots"], 4))
    except (OSError, ValueError) as e:
        raise _errors.InternalError(f"loader: the slot table {table_path} cannot be mapped: {e}") from e
    _prefault(leaves.values())  # the ring's pages now, not in the first epoch's reads
    return leaves, table


from .producer import Producer  # noqa: E402 (producer.py uses this module's errors)
