"""Devices for the loader's device delivery (docs/loader.md, "GPU delivery").

A producer given device="cuda:N" keeps a ring of device slots beside the
node's host ring: one tensor set per ring slot, allocated once from the
first batch's schema. Each batch granted to slot s is copied into device
slot s (from a pinned staging buffer, one .to(device, non_blocking=True)
per tensor), and the producer waits for the copy's event before it says
the batch is published. The slots' storages are shared once, as a blob
(device.msgpack in the ring's folder) that consumers read once per ring
and cache; per batch only the slot number travels, in the announcement
every consumer already gets. A consumer on the same device rebuilds views
of the slots from the blob; any other consumer takes the host path and
.to(device).

Two kinds of device go through the same code:

- "cuda:N": the slots are CUDA tensors, shared as torch.multiprocessing
  shares them (storage._share_cuda_, UntypedStorage._new_shared_cuda: CUDA
  IPC memory handles); copies are asynchronous and ordered by events.
- "shm:N": the CPU stand-in, a device whose memory is the host's: the
  slots are CPU tensors in shared memory (torch's file_system strategy,
  storage._share_filename_cpu_ / _new_shared_filename_cpu), copies are
  synchronous and there are no events. It exists so that the whole path
  (the slot ring, the blob, the consumer's cache, the ack-guarded
  lifetime) runs across real processes on a machine without a GPU; its
  tensors are CPU tensors (.to("shm:N") is .to("cpu")).

The blob holds no pickle: plain integers, strings and bytes.
"""

import os
import secrets
import weakref

import msgpack

from ._td import to_torch
from .errors import InvalidArgumentError

BLOB = "device.msgpack"  # in the ring's folder, written once by the producer
VERSION = 1

# This process's rings by their blob's "local" name, a random string no
# other process's blob carries: a consumer in the producer's own process
# takes the producer's slots themselves, since CUDA opens no IPC handle in
# the process that made it (cudaIpcOpenMemHandle fails there). Weak: a ring
# lives as long as its producer keeps it (and, through the views they
# hold, its consumers).
_local = weakref.WeakValueDictionary()


def _boot_id():
    """This kernel's boot id: two processes on one device share it."""
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            return f.read().strip()
    except OSError:
        import socket
        return socket.gethostname()


def parse(spec):
    """The device of spec: None for None or "cpu" (host memory, no device
    ring), a CudaDevice for "cuda" or "cuda:N", a ShmDevice for "shm:N"."""
    if spec is None:
        return None
    s = str(spec)
    if s == "cpu":
        return None
    kind, _, idx = s.partition(":")
    if kind not in ("cuda", "shm") or (idx and not idx.isdigit()):
        raise InvalidArgumentError(f"loader: device {spec!r}: want cuda:N, shm:N (the CPU stand-in) or cpu")
    if kind == "cuda":
        import torch
        if not torch.cuda.is_available():
            raise InvalidArgumentError(f"loader: device {spec!r}: torch sees no CUDA device")
        n = int(idx) if idx else torch.cuda.current_device()
        if n >= torch.cuda.device_count():
            raise InvalidArgumentError(f"loader: device {spec!r}: torch sees {torch.cuda.device_count()} CUDA devices")
        return CudaDevice(n)
    return ShmDevice(int(idx or 0))


def torch_dtype(name):
    import torch
    return getattr(torch, name.split(".", 1)[1])


def fields(schema, batch):
    """The schema's fields as the device slots hold them: [(key path, torch
    dtype, [batch, *row shape])]. A field's shape may be left out (a
    scalar row): the join's schema leaves an empty one out."""
    return [(tuple(f["key"]), torch_dtype(f["dtype"]), [batch] + list(f.get("shape") or ())) for f in schema]


def _storage(t):
    return t.untyped_storage() if hasattr(t, "untyped_storage") else t.storage().untyped()


def _view(storage, dtype, shape, device):
    """A contiguous tensor of dtype and shape over the whole of storage."""
    import torch
    stride, n = [], 1
    for d in reversed(shape):
        stride.insert(0, n)
        n *= d
    return torch.empty(0, dtype=dtype, device=device).set_(storage, 0, tuple(shape), tuple(stride))


class Device:
    """A device of index: what differs between devices is allocation, the
    copy in and its event, and how a slot's storage is shared and rebuilt."""

    kind = None  # the spec's and the blob's name of the kind: "cuda", "shm"
    torch_type = None  # the torch device type of the slots' tensors

    def __init__(self, index):
        self.index = index
        self.name = f"{self.kind}:{index}"

    @property
    def torch_device(self):
        """The torch device of the slots' tensors: for "cuda", the GPU of
        index as this process numbers them; for "shm", the CPU (unnumbered)."""
        import torch
        return torch.device(self.torch_type, None if self.torch_type == "cpu" else self.index)

    def identity(self):
        """A string equal in two processes exactly when they use one device."""
        raise NotImplementedError

    def alloc(self, shape, dtype):
        raise NotImplementedError

    def staging(self, shape, dtype):
        """A host buffer device copies are made from (pinned for CUDA), or
        None to copy from the batch itself."""
        return None

    def copy_in(self, dst, src):
        """Starts copying host tensor src into device tensor dst."""
        dst.copy_(src, non_blocking=True)

    def record(self):
        """An event marking the work queued so far; None when there is none
        to wait for."""
        return None

    def wait(self, ev):
        pass

    def done(self, ev):
        return True

    def share(self, t):
        raise NotImplementedError

    def rebuild(self, share, dtype, shape):
        raise NotImplementedError


class CudaDevice(Device):
    kind = "cuda"
    torch_type = "cuda"

    def identity(self):
        import torch
        p = torch.cuda.get_device_properties(self.index)
        uuid = getattr(p, "uuid", None)
        return f"{_boot_id()}/cuda/{uuid if uuid is not None else self.index}"

    def alloc(self, shape, dtype):
        import torch
        return torch.empty(shape, dtype=dtype, device=self.torch_device)

    def staging(self, shape, dtype):
        import torch
        return torch.empty(shape, dtype=dtype, pin_memory=True)

    def record(self):
        import torch
        ev = torch.cuda.Event()
        ev.record(torch.cuda.current_stream(self.index))
        return ev

    def wait(self, ev):
        if ev is not None:
            ev.synchronize()

    def done(self, ev):
        return ev is None or ev.query()

    def share(self, t):
        (dev, handle, size, offset, ref, ref_off, event, sync) = _storage(t)._share_cuda_()
        return {"device": dev, "handle": handle, "size": size, "offset": offset, "ref": ref, "ref_offset": ref_off,
                "event": event, "sync": bool(sync)}

    def rebuild(self, s, dtype, shape):
        import torch
        torch.cuda._lazy_init()
        # This process's index of the GPU, not the producer's: the two may
        # number the GPUs differently (CUDA_VISIBLE_DEVICES); identity()
        # matched them by UUID.
        st = torch.UntypedStorage._new_shared_cuda(self.index, s["handle"], s["size"], s["offset"], s["ref"],
                                                   s["ref_offset"], s["event"], s["sync"])
        return _view(st, dtype, shape, self.torch_device)


class ShmDevice(Device):
    """The CPU stand-in: a "device" in the host's shared memory."""

    kind = "shm"
    torch_type = "cpu"

    def identity(self):
        return f"{_boot_id()}/shm/{self.index}"

    def alloc(self, shape, dtype):
        import torch
        t = torch.empty(shape, dtype=dtype)
        _storage(t)._share_filename_cpu_()  # moved into a shared-memory file, in place
        return t.zero_()  # its pages touched now rather than at the first batches

    def copy_in(self, dst, src):
        dst.copy_(src)

    def share(self, t):
        manager, handle, size = _storage(t)._share_filename_cpu_()
        return {"manager": manager, "handle": handle, "size": size}

    def rebuild(self, s, dtype, shape):
        import torch
        st = torch.UntypedStorage._new_shared_filename_cpu(s["manager"], s["handle"], s["size"])
        return _view(st, dtype, shape, self.torch_device)


class Ring:
    """A producer's device slots: slots[s] is {key path: tensor [batch, *row
    shape]} on the device, allocated once from the schema."""

    def __init__(self, dev, schema, batch, nslots):
        self.dev = dev
        self.batch = batch
        self.fields = fields(schema, batch)
        self.slots = [{k: dev.alloc(shape, dt) for k, dt, shape in self.fields} for _ in range(nslots)]
        self.stage = {k: dev.staging(shape, dt) for k, dt, shape in self.fields}
        self.local = secrets.token_hex(16)
        _local[self.local] = self

    def fill(self, slot, flat, rows):
        """Starts copying a batch ({key path: numpy array of rows rows}) into
        slot; returns the event to dev.wait() for before the batch is
        published."""
        import torch
        for k, dt, _ in self.fields:
            src = to_torch(flat[k], dt == torch.bfloat16)
            if self.stage[k] is not None:
                st = self.stage[k][:rows]
                st.copy_(src)
                src = st
            self.dev.copy_in(self.slots[slot][k][:rows], src)
        return self.dev.record()

    def blob(self, ring_id):
        """The slots' storages shared: what device.msgpack holds."""
        slots = [[{"key": list(k), "share": self.dev.share(t)} for k, t in s.items()] for s in self.slots]
        return {"version": VERSION, "ring": ring_id, "kind": self.dev.kind, "device": self.dev.name,
                "identity": self.dev.identity(), "batch": self.batch, "slots": slots, "local": self.local}

    def write_blob(self, folder, ring_id):
        """Writes the blob into the ring's folder, atomically."""
        path = os.path.join(folder, BLOB)
        tmp = f"{path}.{os.getpid()}.tmp"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644)  # as the ring's files
        with os.fdopen(fd, "wb") as f:
            f.write(msgpack.packb(self.blob(ring_id), use_bin_type=True))
        os.replace(tmp, path)  # replaces a link of that name, never follows it
        return path


def read_blob(folder):
    """The blob of the ring at folder, or None when it has none (a producer
    without a device, or by bytes)."""
    try:
        fd = os.open(os.path.join(folder, BLOB), os.O_RDONLY | os.O_NOFOLLOW)
    except FileNotFoundError:
        return None
    with os.fdopen(fd, "rb") as f:
        return msgpack.unpackb(f.read(), raw=False)


def views(dev, blob, schema):
    """The device slots of blob as this process's tensors: [{key path:
    tensor [batch, *row shape]}], one dict per slot (rebuilt once). In
    the producer's own process they are the producer's slots themselves."""
    mine = _local.get(blob.get("local"))
    if mine is not None:
        return mine.slots
    of = {k: (dt, shape) for k, dt, shape in fields(schema, blob["batch"])}
    return [{tuple(e["key"]): dev.rebuild(e["share"], *of[tuple(e["key"])]) for e in s} for s in blob["slots"]]
