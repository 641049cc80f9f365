"""Datasets in tensordict's on-disk format (docs/format.md), with numpy.

    td = tensorwire.load_memmap("/data/fmnist")
    images, labels = td["images"], td["labels"]   # np.memmap, nothing read yet

load_memmap makes the checks tensorwire's Go reader makes, before anything
is used, and names the file at fault: FormatError for what is broken,
UnsupportedError for what is refused on purpose.
"""

import json
import mmap
import os
import stat
import sys

import numpy as np

from ._td import DTYPES, NonTensorData, _BF16Memmap, marked

__all__ = ["load_memmap", "escape_key", "FormatError", "UnsupportedError", "NonTensorData"]

META = "meta.json"
LEAF_SUFFIX = ".memmap"
PICKLE = "other.pickle"
TYPE_TENSORDICT = "<class 'tensordict._td.TensorDict'>"
TYPE_TENSORDICT_OLD = "<class 'tensordict.tensordict.TensorDict'>"
TYPE_NONTENSOR = "<class 'tensordict.tensorclass.NonTensorData'>"
RESERVED = ("shape", "device", "_type")
MAX_DEPTH = 64
_ESCAPED = set('/<>:"|?*\\ %') | {chr(c) for c in range(0x20)} | {"\x7f"}


class _Obj(list):
    """A JSON object as its (key, value) pairs, in file order."""


class FormatError(ValueError):
    """A TensorDict on disk that is broken: meta.json missing or corrupt, a
    file missing or short, an unknown dtype, a shape that does not start
    with the batch size (Go's tensordict.ErrFormat)."""


class UnsupportedError(ValueError):
    """A TensorDict on disk that is refused on purpose: pickled non-tensor
    data (unpickling runs code), jagged tensors, other tensordict types (Go's
    tensordict.ErrUnsupported)."""


def escape_key(key):
    """The file or folder name of a key, as tensordict 0.14 writes it: "" is
    "%", "." is "%2E" and ".." is "%2E%2E"; in any other key each of
    / < > : " | ? * \\ space %, the control characters and DEL is %XX."""
    if key == "":
        return "%"
    if key in (".", ".."):
        return "%2E" * len(key)
    return "".join("%%%02X" % ord(c) if c in _ESCAPED else c for c in key)


def _legacy_name(key, suffix):
    """The name tensordict before 0.14 may have used: the raw key, when it
    stays in its folder."""
    if "/" in key or "\x00" in key:
        return None
    name = key + suffix
    if name in ("", ".", ".."):
        return None
    return name


def _find(d, key, suffix):
    p = os.path.join(d, escape_key(key) + suffix)
    if not os.path.lexists(p):
        legacy = _legacy_name(key, suffix)
        if legacy is not None and os.path.lexists(os.path.join(d, legacy)):
            return os.path.join(d, legacy)
    return p


def _prefault(arrays):
    """Maps every page of the files behind arrays (np.memmap leaves, as
    load_memmap returns) into this process's page tables now, by reading
    (madvise MADV_POPULATE_READ, Linux 5.14 and later; no byte changes), so
    that a loop's first touch of each page does not fault: the Go side's
    memmap.Tensor.Prefault. A hint: anything else, or any failure, does
    nothing."""
    if not sys.platform.startswith("linux"):
        return
    advice = getattr(mmap, "MADV_POPULATE_READ", 22)
    for a in arrays:
        mm = getattr(a, "_mmap", None)
        if mm is None:
            continue
        try:
            mm.madvise(advice)
        except (OSError, ValueError, AttributeError):
            return


def load_memmap(prefix, mode="r"):
    """Maps the TensorDict stored at prefix (by tensorwire or by tensordict's
    td.memmap) and returns it as a dict in meta.json's order: np.memmap
    for tensors (mode "r", read-only, or "r+", writes go to the files),
    dicts for nested TensorDicts, NonTensorData for non-tensors. A tensor
    with no elements has no file and is a plain empty array. The batch size
    is not returned: it is each tensor's leading dimensions.

    Raises FormatError or UnsupportedError (see their docs), naming the file
    at fault, before anything is returned."""
    if mode not in ("r", "r+"):
        raise ValueError(f"mode {mode!r}: want 'r' or 'r+'")
    try:
        return _load_dir(prefix, mode, 0, None)
    except (FormatError, UnsupportedError) as e:
        raise type(e)(f"load {prefix}: {e}") from None


def _read_meta(d):
    path = os.path.join(d, META)
    try:
        with open(path, "rb") as f:
            data = f.read()
    except FileNotFoundError:
        raise FormatError(f"{path} is missing (not a memory-mapped TensorDict, or one still being written)") from None
    except OSError as e:
        raise FormatError(f"{path}: {e}") from None
    try:
        members = json.loads(data, object_pairs_hook=_Obj)
    except (ValueError, UnicodeDecodeError) as e:
        raise FormatError(f"{path}: {e}") from None
    if not isinstance(members, _Obj):
        raise FormatError(f"{path}: not a JSON object")
    typ = None
    for k, v in members:
        if k == "_type":
            if not isinstance(v, str):
                raise FormatError(f"{path}: _type: {v!r} is not a string")
            typ = v
    return members, typ


def _load_dir(d, mode, depth, batch_of_parent):
    members, typ = _read_meta(d)
    return _dict_from(d, members, typ, mode, depth, batch_of_parent)


def _dict_from(d, members, typ, mode, depth, parent_batch):
    meta = os.path.join(d, META)
    if typ not in (TYPE_TENSORDICT, TYPE_TENSORDICT_OLD):
        raise UnsupportedError(f"{meta} holds a {typ}, not a TensorDict")
    batch = []
    for k, v in members:
        if k == "shape":
            batch = v
    if not isinstance(batch, list) or not all(_is_dim(x) for x in batch):
        raise FormatError(f"{meta}: batch size {batch!r}")
    _check_size(batch, 1, f"{meta}: batch size")
    if parent_batch is not None and batch[:len(parent_batch)] != parent_batch:
        raise FormatError(f"{meta}: batch size mismatch: TensorDict of batch size {batch} "
                          f"does not start with {parent_batch}")
    td = {}
    for key, e in members:
        if key in RESERVED or not isinstance(e, _Obj):
            continue  # the TensorDict's own fields, or other metadata tensordict also skips
        e = dict(e)
        if e.get("type") is not None:
            v = _load_collection(d, key, mode, depth, batch)
        elif e.get("dtype"):
            v = _load_leaf(d, key, e, mode, batch)
        else:
            raise FormatError(f"{meta}: entry {key!r} is neither a tensor nor a collection")
        td[key] = v
    return td


def _is_dim(x):
    return isinstance(x, int) and not isinstance(x, bool) and x >= 0


def _check_size(shape, itemsize, what):
    n = itemsize
    for x in shape:
        n *= x
        if n > (1 << 63) - 1:
            raise FormatError(f"{what}: shape {shape} overflows")
    return n


def _load_leaf(d, key, e, mode, batch):
    meta = os.path.join(d, META)
    if e.get("is_nested"):
        raise UnsupportedError(f"{meta}: {key!r} is a nested (jagged) tensor")
    name = e.get("dtype")
    dt = DTYPES.get(name) if isinstance(name, str) else None
    if dt is None:
        raise FormatError(f"{meta}: {key!r}: dtype {name!r} is not a name torch writes")
    shape = e.get("shape")
    if not isinstance(shape, list) or not all(_is_dim(x) for x in shape):
        raise FormatError(f"{meta}: {key!r}: shape {shape!r}")
    nbytes = _check_size(shape, dt.itemsize, f"{meta}: {key!r}")
    if shape[:len(batch)] != batch:
        raise FormatError(f"{meta}: batch size mismatch: tensor {key!r} of shape {shape} "
                          f"does not start with batch size {batch}")
    if nbytes == 0:
        return marked(np.zeros(shape, dt), name)  # tensordict writes no file for these
    path = _find(d, key, LEAF_SUFFIX)
    try:
        st = os.stat(path)
    except OSError as err:
        raise FormatError(f"leaf {key!r}: {err}") from None
    if not stat.S_ISREG(st.st_mode):
        raise FormatError(f"leaf {key!r}: {path} is not a regular file")
    if st.st_size < nbytes:
        raise FormatError(f"leaf {key!r}: {path}: file shorter than its shape: "
                          f"{st.st_size} bytes, {shape} {name} needs {nbytes}")
    # bfloat16's bits (numpy has no bfloat16) marked so, as the client's
    # other arrays of them are (_td.marked).
    cls = _BF16Memmap if name == "torch.bfloat16" else np.memmap
    return cls(path, dtype=dt, mode=mode, shape=tuple(shape))


def _load_collection(d, key, mode, depth, batch):
    depth += 1
    if depth > MAX_DEPTH:
        raise FormatError(f"{d}: TensorDicts nested more than {MAX_DEPTH} deep (a symlink loop?)")
    sub = _find(d, key, "")
    try:
        st = os.stat(sub)
    except OSError as err:
        raise FormatError(f"folder of {key!r}: {err}") from None
    if not stat.S_ISDIR(st.st_mode):
        raise FormatError(f"folder of {key!r}: {sub} is not a folder")
    members, typ = _read_meta(sub)
    if typ == TYPE_NONTENSOR:
        return _non_tensor(sub, members)
    return _dict_from(sub, members, typ, mode, depth, batch)


def _non_tensor(d, members):
    if os.path.lexists(os.path.join(d, PICKLE)):
        raise UnsupportedError(f"{os.path.join(d, PICKLE)}: pickled non-tensor data is never loaded "
                               "(it can run code); store JSON-able data instead")
    for k, v in members:
        if k == "data":
            return NonTensorData(_plain(v))
    raise FormatError(f"{os.path.join(d, META)} has no data")


def _plain(v):
    """JSON decoded with object_pairs_hook back into dicts."""
    if isinstance(v, _Obj):
        return {k: _plain(x) for k, x in v}
    if isinstance(v, list):
        return [_plain(x) for x in v]
    return v
