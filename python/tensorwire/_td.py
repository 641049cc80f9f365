"""TensorDicts on the wire (docs/protocol.md, "TensorDicts") and dtypes.

In Python a TensorDict is a dict: keys are str, values numpy arrays (or
torch tensors, converted), nested dicts (nested TensorDicts) and
NonTensorData. Its batch size is given separately or inferred.
"""

import json
import math
import os

import numpy as np

from ._fields import is_int
from .errors import InternalError, InvalidArgumentError

# meta.json's and the wire's dtype names, and the numpy dtypes of their
# elements, little-endian. numpy has no bfloat16: its elements are raw bits.
DTYPES = {
    "torch.bool": np.dtype("|b1"), "torch.uint8": np.dtype("|u1"), "torch.int8": np.dtype("|i1"),
    "torch.int16": np.dtype("<i2"), "torch.int32": np.dtype("<i4"), "torch.int64": np.dtype("<i8"),
    "torch.uint16": np.dtype("<u2"), "torch.uint32": np.dtype("<u4"), "torch.uint64": np.dtype("<u8"),
    "torch.float16": np.dtype("<f2"), "torch.bfloat16": np.dtype("<u2"),
    "torch.float32": np.dtype("<f4"), "torch.float64": np.dtype("<f8"),
    "torch.complex64": np.dtype("<c8"), "torch.complex128": np.dtype("<c16"),
}

# numpy dtype strings ("<i8") to torch names, for arrays the caller gives
# (bfloat16 has no numpy dtype: torch bfloat16 tensors are kept apart).
_NAMES = {dt.str: name for name, dt in DTYPES.items() if name != "torch.bfloat16"}


class NonTensorData:
    """A non-tensor value of a TensorDict (tensordict's NonTensorData): any
    JSON value."""

    def __init__(self, data):
        self.data = data

    def __repr__(self):
        return f"NonTensorData({self.data!r})"

    def __eq__(self, other):
        return isinstance(other, NonTensorData) and other.data == self.data


def torch_name(dtype):
    """The torch name of a little-endian numpy dtype; InvalidArgumentError
    for dtypes tensordict has no name for (objects, strings)."""
    dt = np.dtype(dtype)
    name = _NAMES.get(dt.str)
    if name is None:
        raise InvalidArgumentError(f"dtype {dt} has no tensordict name")
    return name


def numpy_dtype(name):
    """The numpy dtype of a torch name; InvalidArgumentError for others
    (aliases such as torch.long included, as in the Go reader)."""
    try:
        return DTYPES[name]
    except (KeyError, TypeError):
        raise InvalidArgumentError(f"dtype {name!r} is not a tensordict dtype name") from None


def as_array(v, what="value"):
    """v as a numpy array, little-endian, without copying when it can: numpy
    arrays as they are, torch tensors through .numpy() (bfloat16 as raw
    bits), anything else through np.asarray."""
    if isinstance(v, np.ndarray):
        a = v
    elif type(v).__module__.startswith("torch"):
        t = v.detach()
        if t.device.type != "cpu":
            t = t.cpu()
        import torch
        if t.dtype == torch.bfloat16:
            a = t.view(torch.int16).numpy().view("<u2")
            return _BF16(a)
        a = t.numpy()
    else:
        a = np.asarray(v)
    if a.dtype.kind not in "biufc":
        raise InvalidArgumentError(f"{what}: dtype {a.dtype} is not a tensor dtype")
    if a.dtype.byteorder == ">":
        a = a.astype(a.dtype.newbyteorder("<"))
    return a


class _BF16(np.ndarray):
    """A uint16 array that holds bfloat16 bits (from a torch tensor)."""

    def __new__(cls, a):
        return a.view(cls)


class _BF16Memmap(np.memmap, _BF16):
    """A mapped file of bfloat16 bits (load_memmap): a memmap (its file
    name, for references) that to_torch and dtype_name know as bfloat16."""


def marked(a, name):
    """Array a holding elements of dtype name, marked as bfloat16's raw bits
    (_BF16) when name is torch.bfloat16, so that to_torch and dtype_name
    know them for what they are; other arrays as they are."""
    return _BF16(a) if name == "torch.bfloat16" and not isinstance(a, _BF16) else a


def to_torch(a, bfloat16=None):
    """Numpy array a as a torch tensor sharing its memory (torch.from_numpy);
    bfloat16: a holds bfloat16 elements as their raw bits (numpy has no
    bfloat16: DTYPES, as_array), read back as torch.bfloat16. None: when a
    is marked so (marked, as_array)."""
    import torch
    if bfloat16 is None:
        bfloat16 = isinstance(a, _BF16)
    if bfloat16:
        return torch.from_numpy(a.view("<i2")).view(torch.bfloat16)
    return torch.from_numpy(a)


def tree_to_torch(td):
    """Nested dicts of arrays as the same dicts of torch tensors sharing
    the arrays' memory (to_torch: bfloat16's marked bits as
    torch.bfloat16)."""
    return {k: tree_to_torch(v) if isinstance(v, dict) else to_torch(v) for k, v in td.items()}


def dtype_name(a):
    """The torch name of array a's elements."""
    if isinstance(a, _BF16):
        return "torch.bfloat16"
    return torch_name(a.dtype)


def flatten(td, prefix=()):
    """Yields (key path, value) of a nested dict, depth first, a nested dict
    before its contents, in insertion order. Keys must be str; a tuple key
    is a path (("a", "b") is td["a"]["b"])."""
    for k, v in td.items():
        path = prefix + (tuple(k) if isinstance(k, tuple) else (k,))
        for p in path[len(prefix):]:
            if not isinstance(p, str):
                raise InvalidArgumentError(f"TensorDict key {p!r}: keys are str")
        if isinstance(v, dict):
            yield path, v
            yield from flatten(v, path)
        else:
            yield path, v


def leaves(td):
    """(path, array) of every tensor of td, depth first."""
    return [(p, as_array(v, f"key {'.'.join(p)}")) for p, v in flatten(td)
            if not isinstance(v, (dict, NonTensorData))]


def batch_len(td):
    """The common first dimension of td's tensors: a batch of transitions
    needs one, and at least one tensor."""
    n = None
    for path, a in leaves(td):
        if a.ndim == 0:
            raise InvalidArgumentError(f"{'.'.join(path)} is a scalar; a batch needs a first dimension")
        if n is None:
            n = a.shape[0]
        elif a.shape[0] != n:
            raise InvalidArgumentError(f"{'.'.join(path)} has {a.shape[0]} rows, other tensors {n}")
    if n is None:
        raise InvalidArgumentError("a batch needs at least one tensor")
    return n


def set_path(td, path, value):
    d = td
    for k in path[:-1]:
        d = d.setdefault(k, {})
        if not isinstance(d, dict):
            raise InternalError(f"TD key {list(path)}: {k!r} is not a dict")
    d[path[-1]] = value


class TD:
    """A TensorDict argument of a call (Go's rpc.TD): data, a dict; batch,
    its batch size (inferred from the tensors' first dimension when None);
    rows, the rows (first batch dimension) the call works on, or None for
    all; out, the node's changes come back into data (bytes mode).

    By reference when every tensor is a np.memmap of a whole file under
    the client's root and the node shares it; otherwise by bytes."""

    def __init__(self, data, batch=None, rows=None, out=False):
        self.data = data
        self.batch = list(batch) if batch is not None else None
        self.rows = None if rows is None else [int(r) for r in rows]
        self.out = out
        self.wire = None
        self.parts = []  # the arrays of the body, bytes mode

    def prepare(self, root):
        """Builds the wire form (a dict for msgpack) and the body parts; by
        reference when root (this side's shared root, absolute, or None)
        allows."""
        batch = self.batch if self.batch is not None else [batch_len(self.data)]
        entries, arrays = [], []
        for path, v in flatten(self.data):
            e = {"key": list(path), "kind": "", "dtype": "", "shape": None, "ref": None, "data": None}
            if isinstance(v, dict):
                e["kind"], e["shape"] = "dict", list(batch)
            elif isinstance(v, NonTensorData):
                e["kind"], e["data"] = "data", json.dumps(v.data, separators=(",", ":")).encode()
            else:
                a = as_array(v, f"TD key {list(path)}")
                e["kind"], e["dtype"], e["shape"] = "tensor", dtype_name(a), list(a.shape)
                arrays.append((e, v, a))
            entries.append(e)
        if self.rows is not None:
            if not batch:
                raise InvalidArgumentError("TD rows of a TensorDict without batch dimensions")
            for r in self.rows:
                if not 0 <= r < batch[0]:
                    raise InvalidArgumentError(f"TD rows: row {r} of {batch[0]}")
        w = {"batch": list(batch), "rows": self.rows, "gathered": False, "out": bool(self.out), "entries": entries}
        self.wire, self.parts = w, []
        if root is not None and arrays and _set_refs(arrays, root):
            return
        idx = None if self.rows is None else np.asarray(self.rows, dtype=np.intp)
        for e, _, a in arrays:
            if idx is not None:
                a = a[idx]
            self.parts.append(np.ascontiguousarray(a))
        if self.rows is not None:
            w["gathered"], w["rows"] = True, None
            for e in entries:
                if e["kind"] != "data":
                    e["shape"][0] = len(self.rows)
            w["batch"][0] = len(self.rows)

    def comes_back(self):
        """Whether the node sends this TD's contents back (out, by bytes)."""
        w = self.wire
        if w is None or not w["out"]:
            return False
        for e in w["entries"]:
            if e["kind"] == "tensor":
                return e["ref"] is None
        return False

    def write_back(self, back):
        """Writes the node's copy (a dict) into data at rows."""
        for path, a in leaves(back):
            dst = self.data
            for k in path:
                dst = dst[k]
            if self.rows is not None:
                dst[np.asarray(self.rows, dtype=np.intp)] = a
            else:
                dst[...] = a


def _set_refs(arrays, root):
    """Makes the tensor entries references, if every array is a np.memmap of
    a whole file under root."""
    refs = []
    for e, v, a in arrays:
        if not isinstance(v, np.memmap) or v.filename is None or v.offset != 0:
            return False
        base = v
        while isinstance(base.base, np.memmap):
            base = base.base
        if base is not v or not v.flags.c_contiguous:
            return False  # a view of a mapping: its offset in the file is not tracked here
        try:
            size = os.path.getsize(v.filename)
        except OSError:
            return False
        if size < v.nbytes:
            return False
        rel = os.path.relpath(os.path.realpath(v.filename), root)
        if rel == ".." or rel.startswith(".." + os.sep) or os.path.isabs(rel):
            return False
        refs.append((e, {"path": rel.replace(os.sep, "/"), "file": list(v.shape), "offset": 0}))
    for e, r in refs:
        e["ref"] = r
    return True


# The most bytes an array may have (numpy's, and a Go int's, limit): no
# dimension of a received tensor is larger, nor are the bytes of its
# non-zero dimensions together (a tensor with a zero dimension takes no
# bytes, whatever its others: numpy still refuses them past this).
_MAX_BYTES = (1 << 63) - 1
# The most dimensions a numpy array has (NPY_MAXDIMS: 64 from numpy 2, 32
# before): a received tensor of more is refused with the shape checks.
_MAX_DIMS = 64 if int(np.__version__.split(".")[0]) >= 2 else 32


def _entries(w):
    """The entries of a wire TD received from a peer, each checked to be
    one this side can build (the entry, its key and kind; a tensor's dtype
    and shape, within _MAX_BYTES; data's bytes), as (key list, entry dict); InternalError
    naming what is wrong otherwise. A peer that sends anything else is not
    speaking the protocol: nothing it sent is used."""
    if not isinstance(w, dict):
        raise InternalError(f"TD: a {type(w).__name__}, not a map")
    entries = w.get("entries")
    if entries is None:
        return []
    if not isinstance(entries, list):
        raise InternalError(f"TD entries: a {type(entries).__name__}, not a list")
    out = []
    for e in entries:
        if not isinstance(e, dict):
            raise InternalError(f"TD entry: a {type(e).__name__}, not a map")
        key = e.get("key")
        if not isinstance(key, list) or not key or not all(isinstance(k, (str, bytes)) for k in key):
            raise InternalError(f"TD entry with key {key!r}: want a non-empty list of strings")
        try:
            key = [k if isinstance(k, str) else k.decode() for k in key]
        except UnicodeDecodeError:
            raise InternalError(f"TD entry with key {key!r}: not UTF-8") from None
        kind = e.get("kind")
        if kind == "tensor":
            dt = numpy_dtype_of(e.get("dtype"), key)
            shape = e.get("shape")
            if shape is None:
                shape = e["shape"] = []
            if (not isinstance(shape, list) or len(shape) > _MAX_DIMS
                    or not all(is_int(d) and 0 <= d <= _MAX_BYTES for d in shape)
                    or math.prod(d for d in shape if d) * dt.itemsize > _MAX_BYTES):
                raise InternalError(f"TD {key}: shape {shape!r}")
        elif kind == "data":
            if not isinstance(e.get("data"), (bytes, str, type(None))):
                raise InternalError(f"TD {key}: non-tensor data of type {type(e.get('data')).__name__}")
        elif kind != "dict":
            raise InternalError(f"TD {key}: unknown entry kind {kind!r}")
        out.append((key, e))
    return out


def numpy_dtype_of(name, key):
    """numpy_dtype for a received TD's entry at key: InternalError (the
    peer's fault) for a name that is not a dtype's."""
    try:
        return numpy_dtype(name)
    except InvalidArgumentError:
        raise InternalError(f"TD {key}: dtype {name!r} is not a tensordict dtype name") from None


def wire_entries(w):
    """A received wire TD's entries, each checked (_entries), and the body
    bytes its bytes-mode tensors take: (entries, nbytes). InternalError for
    a description no TensorDict can have. The entries go to build, which
    then does not check them again."""
    entries = _entries(w)
    n = 0
    for _, e in entries:
        if e.get("kind") != "tensor" or e.get("ref") is not None:
            continue
        n += math.prod(e["shape"]) * numpy_dtype(e["dtype"]).itemsize
    return entries, n


def wire_bytes(w):
    """The body bytes a received wire TD's bytes-mode tensors take
    (wire_entries)."""
    return wire_entries(w)[1]


def _at(d, key):
    for k in key:
        if not isinstance(d, dict) or k not in d:
            return None
        d = d[k]
    return d


def fits(entries, dst):
    """Whether a received wire TD (its checked entries) can be read into
    dst, a dict of numpy arrays (nested dicts for nested keys) that the
    caller holds: as many entries as dst has items, each naming one of them
    once, every tensor a C-contiguous, writeable array of its dtype and
    shape sent as bytes, every dict a dict, no non-tensor data. rpc.go's
    wireTD.fits, the same rule."""
    if not isinstance(dst, dict):
        return False
    try:
        items = sum(1 for _ in flatten(dst))
    except InvalidArgumentError:  # a key that is not a str: nothing fits it
        return False
    if len(entries) != items:
        return False
    seen = set()
    for key, e in entries:
        t = tuple(key)
        if t in seen:
            return False
        seen.add(t)
        v = _at(dst, key)
        kind = e["kind"]
        if kind == "dict":
            if not isinstance(v, dict):
                return False
        elif kind == "tensor":
            if (not isinstance(v, np.ndarray) or e.get("ref") is not None or not v.flags.c_contiguous
                    or not v.flags.writeable or v.dtype != numpy_dtype(e["dtype"])
                    or v.shape != tuple(e["shape"])):
                return False
        else:
            return False
    return True


def build_into(dst, read_into, entries):
    """Reads a received wire TD's tensors into dst, which fits(entries,
    dst), in entry order, and returns dst."""
    for key, e in entries:
        if e["kind"] == "tensor":
            a = _at(dst, key)
            if a.nbytes:
                read_into(memoryview(a.reshape(-1).view(np.uint8)))
    return dst


def build(w, read_into, entries=None):
    """The dict of a wire TD received by bytes: each tensor is allocated and
    filled by read_into(memoryview), in entry order. The caller has checked
    that the body holds wire_bytes(w) bytes; entries are wire_entries(w)'s
    when it has them (None: checked here)."""
    if w is None:
        return None
    td = {}
    for key, e in (_entries(w) if entries is None else entries):
        kind = e["kind"]
        if kind == "dict":
            set_path(td, key, {})
        elif kind == "tensor":
            if e.get("ref") is not None:
                raise InternalError(f"TD {key}: a reference in a response; results travel as bytes")
            a = np.empty(tuple(e["shape"]), dtype=numpy_dtype(e["dtype"]))
            if a.nbytes:
                read_into(memoryview(a.reshape(-1).view(np.uint8)))
            set_path(td, key, marked(a, e["dtype"]))
        else:
            try:
                set_path(td, key, NonTensorData(json.loads(e.get("data") or b"null")))
            except (ValueError, RecursionError) as err:
                raise InternalError(f"TD {key}: non-tensor data: {err}") from None
    return td
