"""A loader's producer in a Python process, over any DataLoader
(docs/loader.md, "A producer in another process"):

    # the node: tensorwire node --root /dev/shm/tw --loader train,producer=remote
    dl = torch.utils.data.DataLoader(dataset, batch_size=64, shuffle=True, num_workers=4)
    with tensorwire.loader.Producer("127.0.0.1:7070", "train", dl, token=token, root="/dev/shm/tw") as p:
        p.run()          # serves epoch after epoch while consumers take part (epochs=N: N of them)

The node keeps the ring, the consumers, their acks and heartbeats, epochs
and drops; this process iterates the data loader (its workers, transforms,
shuffling) once per epoch and writes each batch into the ring slot the
node grants it: straight into its own mapping of the ring when it shares
the node's page cache (Sharing.COHERENT), else as bytes after the
message's header. Consumers (tensorwire.loader.Consumer, Go's
loader.Consumer) iterate the batches as they would the DataLoader, with
their own batch sizes.

Batches are what default_collate makes: a dict of tensors or numpy arrays
(nested dicts too), a tuple or list of them, or one tensor. The first
batch gives the schema (each tensor's dtype and per-row shape) and the
batch size; every later batch must have the same keys, dtypes and row
shapes, and the batch size's rows, but for an epoch's last, which has the
rest. A tuple's or list's tensors are keyed by position ("0", "1", ...); a
lone tensor is "0"; consumers get back the same structure.
"""

import os
import threading
import time

import numpy as np

from . import _device
from . import errors as _errors
from ._fields import is_int
from ._td import DTYPES, TD, as_array, dtype_name, set_path
from .dataset import _prefault, load_memmap
from .loader import _FENCE_OK, ArgumentError, InUseError, NoProducerError, _Backoff, _flat, _unreachable
from .rpc import Client, Sharing, StreamEnd

__all__ = ["Producer"]


def _layout_of(batch):
    """The batch's layout and its tensors as {key path: array}."""
    if isinstance(batch, dict):
        layout, td = "dict", batch
    elif isinstance(batch, (tuple, list)):
        layout, td = ("tuple" if isinstance(batch, tuple) else "list"), {str(i): v for i, v in enumerate(batch)}
    else:
        layout, td = "tensor", {"0": batch}
    flat = {}
    for path, v in _flat(td):
        if not all(isinstance(k, str) for k in path):
            raise ArgumentError(f"loader: a batch key {list(path)} that is not a string")
        try:
            a = as_array(v, "/".join(path))
        except _errors.TensorwireError as e:
            raise ArgumentError(f"loader: batch key {'/'.join(path)}: {e.message}") from None
        if a.ndim == 0:
            raise ArgumentError(f"loader: batch key {'/'.join(path)} is a scalar, not a batch of rows")
        flat[path] = a
    if not flat:
        raise ArgumentError("loader: a batch of no tensors")
    return layout, flat


def _samples_of(data_loader, batch):
    """The rows an epoch of data_loader holds, when it can tell."""
    ds = getattr(data_loader, "dataset", None)
    drop_last = bool(getattr(data_loader, "drop_last", False))
    n_batches = None
    try:
        n_batches = len(data_loader)
    except TypeError:
        pass
    if ds is not None and getattr(data_loader, "batch_sampler", None) is not None and hasattr(ds, "__len__") \
            and getattr(data_loader, "batch_size", None) == batch:
        try:
            n = len(ds)
            sampler = getattr(data_loader, "sampler", None)
            if sampler is not None and hasattr(sampler, "__len__"):
                n = len(sampler)
            return (n // batch) * batch if drop_last else n
        except TypeError:
            pass
    if n_batches is not None and drop_last:
        return n_batches * batch
    return None


class Producer:
    """The producer of the loader a node serves as name (its --loader
    NAME,producer=remote), over data_loader: any iterable of batches that
    can be iterated again for each epoch (a torch DataLoader).

    node: "HOST:PORT" or a tensorwire.Client; token, root as Client takes
    them (root: the node's root as this machine mounts it, to write the
    ring in place); bytes_mode: send the rows as bytes even so. samples:
    the rows of an epoch, when data_loader cannot say (an iterable without
    len; a DataLoader says it). epochs: how many epochs to produce before
    run returns (None: until close). run() produces in this thread, start()
    in a thread of its own; close() detaches (consumers wait for the next
    producer, or get UnavailableError mid-epoch).

    The node going away (restarted, or the connection broken) is ridden
    out as consumers ride it out: the producer attaches again, waiting for
    the node with backoff for up to timeout seconds (then run raises the
    UnavailableError), and serves the epochs the node grants from then on
    with a fresh iterator of the data loader; the epoch it was serving is
    lost (its consumers' loop raises NoProducerError), and only whole
    epochs count toward `epochs`. reattach=False raises at once instead.

    device: "cuda:N" puts each batch on that GPU once, into a ring of device
    slots beside the node's host ring, which consumers on the same GPU
    receive views of (docs/loader.md, "GPU delivery"); "shm:N" is the CPU
    stand-in that goes through the same code. It needs the ring by
    reference (root, coherent): by bytes the producer has no device ring
    (delivery is "host") and every consumer takes the host path."""

    def __init__(self, node, name, data_loader, token=None, root=None, epochs=None, samples=None,
                 bytes_mode=False, timeout=30.0, reattach=True, device=None):
        if epochs is not None and (not isinstance(epochs, int) or epochs < 1):
            raise ArgumentError(f"loader: epochs {epochs!r}: want at least 1, or None")
        dev = _device.parse(device)
        if isinstance(node, Client):
            self._client, self._own = node, False
        else:
            self._client, self._own = Client(node, token=token, root=root, timeout=timeout), True
        self.name = name
        self.data_loader = data_loader
        self.epochs = epochs
        self._samples = samples
        self._bytes_mode = bytes_mode
        self._timeout = timeout
        self._reattach = reattach
        self._dev = dev
        self._dring = self._dring_old = None  # the device slots (_device.Ring) of this attachment and the last
        self.delivery = None  # "device" when this attachment has device slots, else "host"
        self._failed = False  # this side told the node it failed (_fail): never attach again
        self._stream = None
        self._closed = False
        self._stop = threading.Event()  # set by close: ends a backoff's wait at once
        self._thread = None
        self.error = None  # what stopped a start()ed producer, if not close
        self.mode = None  # "ref" or "bytes", once attached
        self.layout = None
        self.schema = None
        self.batch_size = None
        self.samples = None
        self.epochs_done = 0  # epochs whose every batch was published
        self.published = 0  # batches published
        self.attached = 0  # times it attached to the node

    def start(self):
        """Runs the producer in a thread of its own; wait() for it, or close()."""
        self._thread = threading.Thread(target=self._run_caught, name="tensorwire-loader-producer", daemon=True)
        self._thread.start()
        return self

    def _run_caught(self):
        try:
            self.run()
        except BaseException as e:  # kept for wait()
            if not self._closed:
                self.error = e

    def wait(self, timeout=None):
        """Waits for a start()ed producer to end (epochs done, or an error,
        which it raises). Returns whether it ended."""
        t = self._thread
        if t is not None:
            t.join(timeout)
            if t.is_alive():
                return False
        if self.error is not None:
            raise self.error
        return True

    def run(self):
        """Attaches to the node and produces epochs while consumers take part:
        `epochs` of them (then it detaches and returns), or until close
        (from another thread: it raises ClientClosedError, and attaches no
        more, even while it waits to attach again). An
        exception from the data loader is sent to the node, which fails the
        loader's consumers with it (FailedError), and raised here; a batch
        whose keys, dtypes or row shapes are not the first batch's is
        ArgumentError naming the key, the same way."""
        it = iter(self.data_loader)
        try:
            first = next(it)
        except StopIteration:
            raise ArgumentError("loader: the data loader yields no batch") from None
        layout, flat = _layout_of(first)
        batch = len(next(iter(flat.values())))
        for path, a in flat.items():
            if len(a) != batch:
                raise ArgumentError(f"loader: the first batch's {'/'.join(path)} has {len(a)} rows, "
                                    f"its {'/'.join(next(iter(flat)))} {batch}")
        samples = self._samples if self._samples is not None else _samples_of(self.data_loader, batch)
        if samples is None:
            raise ArgumentError("loader: the data loader does not say how many samples an epoch holds: pass samples=")
        self.layout, self.batch_size, self.samples = layout, batch, samples
        self.schema = [{"dtype": dtype_name(a), "key": list(path), "shape": list(a.shape[1:])} for path, a in flat.items()]
        wait = None  # the backoff of an outage: from the first failure to the next attachment
        while True:
            try:
                self._attach_and_serve(it, first)
                return
            except _errors.TensorwireError as e:
                # Attaching again, the node may not yet have seen this
                # process's last stream break: it counts it attached still
                # (InUseError), which is waited out too.
                again = wait is not None and isinstance(e, InUseError)
                if not self._reattach or self._closed or self._failed or isinstance(e, NoProducerError) or \
                        not (_unreachable(e) or again):
                    raise
                if wait is None or self.mode is not None:  # it had attached since the last failure
                    wait = _Backoff(self._timeout, self._stop)
                wait.wait(e)
                self._check_open()  # closed while it waited: no attaching again
                # The epoch under way is lost: the node begins another,
                # which a fresh iterator serves.
                it, first = iter(self.data_loader), None

    def _attach_and_serve(self, it, first):
        """One attachment: opens the loader.produce stream and serves it.
        ClientClosedError once the producer is closed, before or as the
        stream opens (close() closes a stream it finds in _stream; one
        opened as it ran is closed here)."""
        self._check_open()
        c = self._client
        self.mode = None
        shared = bool(c.root) and not self._bytes_mode and _FENCE_OK and \
            c.sharing(self._timeout) == Sharing.COHERENT
        st = c.open_stream("loader.produce", {"batch": self.batch_size, "bytes": not shared, "layout": self.layout,
                                              "name": self.name, "samples": self.samples, "schema": self.schema})
        self._stream = st
        if self._closed:  # after setting _stream: close() saw the stream, or this sees _closed
            self._stream = None
            st.close()
            self._check_open()
        try:
            self._serve(st, it, first, shared)
        finally:
            self._stream = None
            # Ends its side, then reads what the node still sends (a grant
            # already on its way) until the node ends the stream: closing
            # before would reset it, and the node could lose this side's
            # last message (an error for the consumers).
            try:
                st.close_send()
                deadline = time.monotonic() + 5
                while time.monotonic() < deadline:
                    st.recv(timeout=max(deadline - time.monotonic(), 0.001))
            except (StreamEnd, _errors.TensorwireError, OSError):
                pass
            st.close()

    def _serve(self, st, it, pending, shared):
        att = _field(self._recv(st), "attached")
        try:
            _check_attached(att)
        except _errors.InternalError as x:
            raise self._fail(st, x) from None
        self.attached += 1
        prefix = att.get("prefix") or ""
        leaves, dring = None, None
        if shared and prefix and not prefix.startswith("/") and ".." not in prefix.split("/"):
            folder = os.path.join(self._client.root, *prefix.split("/"))
            try:
                leaves = self._map(folder, att["slots"])
            except _errors.InternalError as x:
                raise self._fail(st, x) from x
            try:
                dring = self._device_ring(folder, att)
            except Exception as x:  # the device's memory, say: the consumers are told, as for the data loader's
                raise self._fail(st, x, f"{type(x).__name__}: {x}") from x
        self.mode = "bytes" if leaves is None else "ref"
        self.delivery = "host" if dring is None else "device"
        B = self.batch_size
        cur, want = None, 0  # the epoch it iterates (None: a fresh iterator, for the next one), its next batch
        while True:
            g = _field(self._recv(st), "grant")
            bad = _bad_grant(g, att["slots"], B)
            if bad:
                raise self._fail(st, _errors.InternalError(f"loader: the node granted {g!r:.200}: {bad}"))
            e, k = g["epoch"], g["index"]
            if cur is not None and e != cur:
                # The node cut the epoch short (every consumer left it): a
                # fresh iterator for this one.
                it, pending = iter(self.data_loader), None
            if cur != e:
                cur, want = e, 0
            if k != want:
                raise self._fail(st, _errors.InternalError(f"loader: the node granted batch {k} of epoch {e}, "
                                                           f"want {want}"))
            try:
                b = pending if pending is not None else next(it)
            except StopIteration:
                raise self._fail(st, ArgumentError(f"loader: the data loader's epoch ended after {k} batches; "
                                                   f"{self.samples} samples of {B} make {g['count']}")) from None
            except Exception as x:
                raise self._fail(st, x, f"{type(x).__name__}: {x}") from x
            pending = None
            flat = self._check(st, b, g)
            if leaves is not None:
                start = g["slot"] * B
                try:
                    ev = None
                    if dring is not None:  # copied to the device while the host ring is written
                        ev = dring.fill(g["slot"], flat, g["rows"])
                    for path, a in flat.items():
                        leaves[path][start:start + g["rows"]] = a
                    if dring is not None:
                        dring.dev.wait(ev)  # on the device before it is published
                except _errors.TensorwireError:
                    raise
                except Exception as x:  # a device error
                    raise self._fail(st, x, f"{type(x).__name__}: {x}") from x
                st.send({"error": "", "published": g, "rows": None})
            else:
                st.send({"error": "", "published": g, "rows": TD(_nest(flat))})
            self.published += 1
            want = k + 1
            if want < g["count"]:
                try:
                    pending = next(it)  # while the consumers read: the next grant may come at once
                except StopIteration:
                    pending = None  # found when granted
                except Exception as x:
                    raise self._fail(st, x, f"{type(x).__name__}: {x}") from x
                continue
            # The epoch's end: the data loader must be at its end too.
            try:
                next(it)
            except StopIteration:
                pass
            except Exception as x:
                raise self._fail(st, x, f"{type(x).__name__}: {x}") from x
            else:
                raise self._fail(st, ArgumentError(f"loader: the data loader yields more than {g['count']} batches "
                                                   f"an epoch ({self.samples} samples of {B})"))
            self.epochs_done += 1
            if self.epochs is not None and self.epochs_done >= self.epochs:
                return
            it, pending, cur = iter(self.data_loader), None, None

    def _device_ring(self, folder, att):
        """The device slots for the ring at folder, their blob written there
        before any batch is published (consumers read it at their first
        batch); None without a device. Each attachment gets slots of its
        own, as it gets a host ring of its own: the node guards a ring's
        slots by that ring's consumers' acks only. The previous
        attachment's slots are kept until the next one: a consumer of the
        earlier ring may still be reading a view of them when it learns
        that the producer went away."""
        if self._dev is None:
            return None
        self._dring_old = self._dring
        self._dring = _device.Ring(self._dev, self.schema, self.batch_size, att["slots"])
        self._dring.write_blob(folder, att["ring"])
        return self._dring

    def _check(self, st, b, g):
        """The batch's tensors, checked against the schema and the grant's rows."""
        try:
            layout, flat = _layout_of(b)
        except ArgumentError as x:
            raise self._fail(st, x) from None
        keys = [tuple(f["key"]) for f in self.schema]
        bad = None
        if layout != self.layout:
            bad = f"a {layout} batch after {self.layout} ones"
        else:
            for f, key in zip(self.schema, keys):
                a = flat.get(key)
                shape = [g["rows"]] + f["shape"]
                if a is None:
                    bad = f"the batch has no {'/'.join(key)}"
                elif dtype_name(a) != f["dtype"] or list(a.shape) != shape:
                    bad = f"{'/'.join(key)} is {dtype_name(a)} {list(a.shape)}, want {f['dtype']} {shape}"
                if bad:
                    break
            if not bad:
                for key in flat:
                    if key not in keys:
                        bad = f"the batch has {'/'.join(key)}, which its first batch had not"
                        break
        if bad:
            raise self._fail(st, ArgumentError(f"loader: batch {g['index']} of epoch {g['epoch']}: {bad}"))
        return flat

    def _fail(self, st, exc, msg=None):
        """Tells the node the producer failed (its consumers get FailedError
        with msg) and returns exc to raise."""
        self._failed = True
        try:
            st.send({"error": msg or str(exc), "published": None, "rows": None})
        except (_errors.TensorwireError, OSError):
            pass
        return exc

    def _check_open(self):
        if self._closed:
            raise _errors.ClientClosedError("loader: the producer was closed")

    def _recv(self, st):
        try:
            return st.recv()
        except StreamEnd:
            raise _errors.UnavailableError(f"loader: the node ended the producer's stream of {self.name!r}") from None
        except _errors.TensorwireError:
            if self._closed:
                raise _errors.ClientClosedError("loader: the producer was closed") from None
            raise

    def _map(self, path, nslots):
        """The ring's storage leaves, writable, checked against the schema;
        InternalError (the cause chained) for a ring not there as the node
        described it."""
        try:
            storage = load_memmap(os.path.join(path, "storage"), mode="r+")
        except (OSError, ValueError) as e:  # dataset.FormatError is a ValueError
            raise _errors.InternalError(f"loader: the ring at {path} cannot be mapped: {e}") from e
        flat = dict(_flat(storage))
        rows = nslots * self.batch_size
        leaves = {}
        for f in self.schema:
            key = tuple(f["key"])
            a = flat.get(key)
            # By the numpy dtype (DTYPES): a bfloat16 leaf maps as its raw bits.
            if a is None or a.dtype != DTYPES[f["dtype"]] or a.shape != (rows,) + tuple(f["shape"]):
                raise _errors.InternalError(f"loader: the ring at {path} does not hold {'/'.join(key)} "
                                            f"{f['dtype']} {[rows] + f['shape']}")
            leaves[key] = a
        _prefault(leaves.values())  # the ring's pages now, not in the first lap of writes
        return leaves

    def close(self):
        """Detaches from the node (a run in another thread ends) and closes
        the connection when this Producer made it."""
        if self._closed:
            return
        self._closed = True
        self._stop.set()  # a run waiting to attach again wakes, and stops
        st = self._stream
        if st is not None:
            try:
                st.close()
            except (_errors.TensorwireError, OSError):
                pass
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(5)
        if self._own:
            self._client.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def _field(m, key):
    """Field key of a message of the node's, None when m is not a map."""
    return m.get(key) if isinstance(m, dict) else None


def _check_attached(att):
    """Checks the node's first message on the produce stream: a ring of 1 to
    2^31 slots, its id and folder as strings. InternalError otherwise."""
    if (not isinstance(att, dict) or not is_int(att.get("slots")) or not 1 <= att["slots"] <= 1 << 31
            or not isinstance(att.get("ring"), str) or not isinstance(att.get("prefix") or "", str)):
        raise _errors.InternalError(f"loader: the node attached the producer as {att!r:.200}")


def _bad_grant(g, slots, batch):
    """What is wrong with a grant for a producer of batches of batch rows
    into a ring of slots (a slot outside it would write over another
    slot's batch, which its consumers may be reading), or ""."""
    if not isinstance(g, dict) or not all(is_int(g.get(k)) for k in ("epoch", "index", "count", "slot", "rows")):
        return "not a grant"
    if g["epoch"] < 0 or not 0 <= g["index"] < g["count"]:
        return f"batch {g['index']} of {g['count']} in epoch {g['epoch']}"
    if not 0 <= g["slot"] < slots:
        return f"slot {g['slot']} of a ring of {slots}"
    if not 1 <= g["rows"] <= batch:
        return f"{g['rows']} rows for batches of {batch}"
    return ""


def _nest(flat):
    """{key path: array} as nested dicts of contiguous arrays."""
    out = {}
    for path, a in flat.items():
        set_path(out, path, np.ascontiguousarray(a))
    return out

