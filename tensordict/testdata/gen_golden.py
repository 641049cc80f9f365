#!/usr/bin/env python3
"""Generate the golden fixtures in ./golden/ (run from anywhere: python3 gen_golden.py).

These fixtures are AUTHORED FROM tensordict's SOURCE CODE, not produced by
running tensordict: PyTorch and tensordict cannot be installed on the machine
where tensorwire is developed.  Every byte written here mirrors what the
upstream code paths below write for ``td.memmap_(prefix)`` /
``td.memmap(prefix)``; re-running this script reproduces the files exactly
(stdlib only, no numpy, deterministic).

Upstream sources read (github.com/pytorch/tensordict, main branch around the
0.13/0.14 releases, commit 09aaa7217b5a unless noted; the 0.14 parts re-read
at tag v0.14.0, which includes commit e70b89164db1 "[BugFix] Harden memmap
path handling (#1762)"):

* tensordict/_td_memmap.py (commit 179bcc8457eb): ``_save_metadata`` (meta.json =
  entries in insertion order, then "shape", "device", "_type"; written with
  ``json_dumps`` in binary mode, no trailing newline), ``_update_metadata``
  (leaf entry = {"device", "shape", "dtype", "is_nested"}; collection entry =
  {"type": type(value).__name__}), ``_populate_memmap`` (file name
  ``f"{_encode_key_for_filesystem(key)}.memmap"``).
* tensordict/_utils_key_json.py (commits 0f020cace16b, 706f5d3590ff; v0.14.0):
  ``_encode_key_for_filesystem`` (robust escaping ``%XX`` of / < > : " | ? * \\
  space NUL % and chars 0-31, 127; since v0.14.0 the whole key "" is "%", "."
  is "%2E" and ".." is "%2E%2E", every other key as before), JSON backend
  (orjson if importable, else stdlib json; orjson output is compact, stdlib
  ``json.dumps`` uses ", "/": " and ensure_ascii=True).
* tensordict/_td.py: ``TensorDict._memmap_`` / ``TensorDict._load_memmap``
  (device forced to "cpu" before metadata is saved; nested directories named
  by the encoded key since PR #1762, v0.14.0: v0.13.0 wrote ``prefix / key``).
* tensordict/_base/serialization.py: ``memmap_`` / ``memmap`` / ``load_memmap``
  (robust_key default True since PR #1717, tensordict 0.13).
* tensordict/memmap.py: ``MemoryMappedTensor.from_tensor`` /
  ``_prepare_memmap_file`` (file reserved only when numel > 0, then
  ``torch.from_file(shared=True, size=numel)``; a zero-element tensor gets NO
  file; an existing longer file is not truncated).
* tensordict/tensorclass.py (v0.12.4, v0.13.0, v0.14.0): ``_memmap_`` /
  ``_load_memmap`` / ``NonTensorDataBase`` (meta.json = {"_type": str(cls)}
  followed by the instance's ``_non_tensordict`` in its order, JSON-able
  values only; non-JSON values pickled into "other.pickle"; no "_tensordict"
  sub-directory for NonTensorData). ``_non_tensordict`` of a NonTensorData is
  built by ``_init_wrapper``: "data" (passed), then the fields with a
  non-None default ("_is_non_tensor": True), then the remaining fields set to
  None ("_metadata"); so meta.json is {"_type", "data", "_is_non_tensor",
  "_metadata"}, the order the issue's run of 0.12.4/0.13.0/0.14.0 showed.
* tensordict/utils.py: ``_STR_DTYPE_TO_DTYPE`` (dtype names are ``str(dtype)``,
  e.g. "torch.float16", "torch.uint16").

Outputs: golden/<case>/ (the fixture tree) and golden/<case>.expected.json
(what a reader must decode from it).
"""

import json
import os
import pickle
import shutil
import struct
import textwrap

HERE = os.path.dirname(os.path.abspath(__file__))
GOLDEN = os.path.join(HERE, "golden")

TD_TYPE = "<class 'tensordict._td.TensorDict'>"
NTD_TYPE = "<class 'tensordict.tensorclass.NonTensorData'>"

# dtype name -> (struct format of one element, itemsize)
DTYPES = {
    "torch.bool": ("?", 1),
    "torch.uint8": ("B", 1),
    "torch.int8": ("b", 1),
    "torch.int16": ("<h", 2),
    "torch.uint16": ("<H", 2),
    "torch.int32": ("<i", 4),
    "torch.uint32": ("<I", 4),
    "torch.int64": ("<q", 8),
    "torch.uint64": ("<Q", 8),
    "torch.float16": ("<H", 2),  # values given as raw bits
    "torch.bfloat16": ("<H", 2),  # values given as raw bits
    "torch.float32": ("<f", 4),
    "torch.float64": ("<d", 8),
    "torch.complex64": ("<ff", 8),  # values given as [re, im]
    "torch.complex128": ("<dd", 16),  # values given as [re, im]
}


def f16_bits(x):
    return struct.unpack("<H", struct.pack("<e", x))[0]


def bf16_bits(x):
    # exact for values representable in bfloat16 (all values used here)
    bits = struct.unpack("<I", struct.pack("<f", x))[0]
    assert bits & 0xFFFF == 0, x
    return bits >> 16


def encode_key_013(key):
    """Mirror of v0.13.0's _encode_key_for_filesystem(key, robust=True)."""
    unsafe = set('/<>:"|?*\\ \0%') | {chr(i) for i in range(32)} | {chr(127)}
    return "".join("%%%02X" % ord(c) if c in unsafe else c for c in key)


def encode_key(key):
    """Mirror of v0.14.0's _encode_key_for_filesystem(key, robust=True)."""
    if not key:
        return "%"
    if key in (".", ".."):
        return "%2E" * len(key)
    return encode_key_013(key)


class Writer:
    """How file and folder names and NonTensorData meta.json are written."""

    def __init__(self, leaf_name, folder_name, nontensor_extra):
        self.leaf_name, self.folder_name, self.nontensor_extra = leaf_name, folder_name, nontensor_extra


# tensordict 0.14.0 (robust_key default): escaped names, the NonTensorData
# fields after "data".
TD014 = Writer(encode_key, encode_key, True)
# tensordict 0.13.0 leaves and folders; NonTensorData as tensorwire wrote it.
LEGACY = Writer(encode_key_013, lambda key: key, False)


def dumps(obj, style):
    if style == "orjson":
        return json.dumps(obj, separators=(",", ":"), ensure_ascii=False).encode("utf-8")
    if style == "json":
        return json.dumps(obj).encode("utf-8")
    raise ValueError(style)


def numel(shape):
    n = 1
    for s in shape:
        n *= s
    return n


def pack(dtype, values):
    fmt, _ = DTYPES[dtype]
    out = b""
    for v in values:
        if dtype.startswith("torch.complex"):
            out += struct.pack(fmt, *v)
        else:
            out += struct.pack(fmt, v)
    return out


# ---------------------------------------------------------------- model
class Leaf:
    def __init__(self, dtype, shape, values, extra=b""):
        assert len(values) == numel(shape)
        self.dtype, self.shape, self.values, self.extra = dtype, list(shape), values, extra


class TD:
    def __init__(self, batch, entries):
        self.batch = list(batch)
        self.entries = entries  # list of (key, Leaf | TD | NonTensor), insertion order


class NonTensor:
    def __init__(self, data, picklable_only=False):
        self.data = data
        self.pickled = picklable_only


def write(path, data):
    with open(path, "wb") as f:
        f.write(data)


def write_td(td, prefix, style, rel, expected, w, relnames):
    os.makedirs(prefix, exist_ok=True)
    meta = {}
    for key, val in td.entries:
        safe = w.folder_name(key)
        if isinstance(val, Leaf):
            fname = w.leaf_name(key) + ".memmap"
            raw = pack(val.dtype, val.values)
            n = numel(val.shape)
            if n:  # upstream creates no file for zero-element tensors
                write(os.path.join(prefix, fname), raw + val.extra)
            meta[key] = {
                "device": "cpu",
                "shape": val.shape,
                "dtype": val.dtype,
                "is_nested": False,
            }
            expected["leaves"].append(
                {
                    "path": rel + [key],
                    "dtype": val.dtype,
                    "shape": val.shape,
                    "file": "/".join(relnames + [fname]),
                    "file_exists": bool(n),
                    "file_size": len(raw + val.extra) if n else 0,
                    "values": val.values,
                }
            )
        elif isinstance(val, TD):
            write_td(val, os.path.join(prefix, safe), style, rel + [key], expected, w, relnames + [safe])
            meta[key] = {"type": "TensorDict"}
        elif isinstance(val, NonTensor):
            sub = os.path.join(prefix, safe)
            os.makedirs(sub, exist_ok=True)
            nmeta = {"_type": NTD_TYPE}
            rec = {"path": rel + [key], "type": NTD_TYPE, "pickled": val.pickled}
            if val.pickled:
                blob = pickle.dumps({"data": val.data}, protocol=4)
                write(os.path.join(sub, "other.pickle"), blob)
                rec["pickle_file"] = "/".join(relnames + [safe, "other.pickle"])
                rec["data_hex"] = val.data.hex()
            else:
                nmeta["data"] = val.data
                rec["data"] = val.data
            if w.nontensor_extra:
                nmeta["_is_non_tensor"] = True
                nmeta["_metadata"] = None
            write(os.path.join(sub, "meta.json"), dumps(nmeta, style))
            expected["non_tensors"].append(rec)
            meta[key] = {"type": "NonTensorData"}
        else:
            raise TypeError(val)
    meta.update({"shape": td.batch, "device": "cpu", "_type": TD_TYPE})
    write(os.path.join(prefix, "meta.json"), dumps(meta, style))
    expected["tensordicts"].append(
        {"path": rel, "batch_size": td.batch, "device": "cpu", "type": TD_TYPE}
    )


# ------------------------------------------------- repr (TensorDict.__repr__)
def _size(shape):
    return "torch.Size([%s])" % ", ".join(str(s) for s in shape)


def td_repr(td, device="None"):
    """Mirror of TensorDict.__repr__ / utils._td_fields for an in-memory TD
    (device=None, plain CPU tensors, not shared)."""
    strs = []
    for key, val in td.entries:
        if isinstance(val, Leaf):
            strs.append(
                "%s: Tensor(shape=%s, device=cpu, dtype=%s, is_shared=False)"
                % (key, _size(val.shape), val.dtype)
            )
        else:
            strs.append("%s: %s" % (key, td_repr(val, device)))
    fields = textwrap.indent("\n" + ",\n".join(sorted(strs)), "    ")
    parts = [
        textwrap.indent("fields={%s}" % fields, "    "),
        textwrap.indent("batch_size=%s" % _size(td.batch), "    "),
        textwrap.indent("device=%s" % device, "    "),
        textwrap.indent("is_shared=False", "    "),
    ]
    return "TensorDict(\n%s)" % ",\n".join(parts)


def make_case(name, td, style, notes, extra_expected=None, w=TD014):
    prefix = os.path.join(GOLDEN, name)
    expected = {
        "case": name,
        "meta_json_style": style,
        "notes": notes,
        "tensordicts": [],
        "leaves": [],
        "non_tensors": [],
    }
    write_td(td, prefix, style, [], expected, w, [])
    expected["tensordicts"].sort(key=lambda d: d["path"])
    if extra_expected:
        expected.update(extra_expected)
    with open(os.path.join(GOLDEN, name + ".expected.json"), "w", encoding="utf-8") as f:
        json.dump(expected, f, indent=2, ensure_ascii=True)
        f.write("\n")


def basic():
    return TD(
        [4],
        [
            ("obs", Leaf("torch.float32", [4, 3], [float(i) for i in range(12)])),
            ("action", Leaf("torch.int64", [4], [0, 1, 2, 3])),
            ("done", Leaf("torch.bool", [4], [False, True, False, True])),
            ("next", TD([4], [("reward", Leaf("torch.float64", [4], [0.5, 1.5, 2.5, 3.5]))])),
        ],
    )


def main():
    if os.path.isdir(GOLDEN):
        shutil.rmtree(GOLDEN)
    os.makedirs(GOLDEN)

    repr_note = {
        "repr_in_memory": td_repr(basic()),
        "repr_note": (
            "repr of the same data as an in-memory TensorDict(device=None) before "
            "memmap; after load_memmap leaves print as MemoryMappedTensor(...) and "
            "device=cpu (is_shared of loaded leaves not verified)."
        ),
    }
    make_case(
        "basic_orjson", basic(), "orjson",
        "meta.json as written with the orjson backend (default when orjson is installed, Python < 3.13).",
        repr_note,
    )
    make_case(
        "basic_json", basic(), "json",
        "meta.json as written with the stdlib json backend (no orjson, e.g. Python >= 3.13).",
        repr_note,
    )

    dt = [
        ("bool", Leaf("torch.bool", [2], [True, False])),
        ("uint8", Leaf("torch.uint8", [2], [1, 255])),
        ("int8", Leaf("torch.int8", [2], [-1, 127])),
        ("int16", Leaf("torch.int16", [2], [-2, 32767])),
        ("int32", Leaf("torch.int32", [2], [-3, 2147483647])),
        ("int64", Leaf("torch.int64", [2], [-4, 9223372036854775807])),
        ("float16", Leaf("torch.float16", [2], [f16_bits(1.0), f16_bits(-2.0)])),
        ("bfloat16", Leaf("torch.bfloat16", [2], [bf16_bits(1.0), bf16_bits(-2.0)])),
        ("float32", Leaf("torch.float32", [2], [1.5, -0.25])),
        ("float64", Leaf("torch.float64", [2], [2.5, -0.125])),
        ("complex64", Leaf("torch.complex64", [2], [[1.0, 2.0], [-3.0, 0.5]])),
        ("complex128", Leaf("torch.complex128", [2], [[1.25, -2.5], [0.0, 1.0]])),
        ("uint16", Leaf("torch.uint16", [2], [1, 65535])),
        ("uint32", Leaf("torch.uint32", [2], [2, 4294967295])),
        ("uint64", Leaf("torch.uint64", [2], [3, 18446744073709551615])),
    ]
    assert dt[6][1].values == [0x3C00, 0xC000] and dt[7][1].values == [0x3F80, 0xC000]
    make_case(
        "dtypes", TD([2], dt), "orjson",
        "One leaf per dtype. float16/bfloat16 values are raw uint16 bits; complex values "
        "are [re, im]; bool is 1 byte (0/1). uint16/32/64 need torch >= 2.3. Decode big "
        "integers with json.Number (uint64 max does not fit a float64).",
    )

    make_case(
        "escaped_keys",
        TD(
            [2],
            [
                ("normal", Leaf("torch.int32", [2], [1, 2])),
                ("a/b", Leaf("torch.int32", [2], [10, 20])),
                ("x y", Leaf("torch.int32", [2], [30, 40])),
                ("100%", Leaf("torch.int32", [2], [50, 60])),
                ("q?", Leaf("torch.int32", [2], [70, 80])),
                ("a.b", Leaf("torch.int32", [2], [110, 120])),
                ("caf\u00e9", Leaf("torch.int32", [2], [90, 100])),
                ("sub dir", TD([2], [("v", Leaf("torch.int16", [2], [5, 6]))])),
            ],
        ),
        "orjson",
        "robust_key=True layout (default since tensordict 0.13, PR #1717; nested directory "
        "names encoded since PR #1762). meta.json keys are the RAW keys; only file and "
        "directory names are %XX-escaped (uppercase hex). '.' and non-ASCII are not "
        "escaped; orjson writes non-ASCII keys as raw UTF-8. Legacy writers "
        "(robust_key=False / <0.13 default) use the raw key as file name ('a/b' fails to "
        "save there) and pre-#1762 writers name nested dirs with the raw key ('sub dir').",
    )

    make_case(
        "nontensor",
        TD(
            [2],
            [
                ("x", Leaf("torch.float32", [2], [1.0, 2.0])),
                ("text", NonTensor("hello")),
                ("cfg", NonTensor({"lr": 0.001})),
                ("blob", NonTensor(b"\x00\x01\x02", picklable_only=True)),
            ],
        ),
        "orjson",
        "NonTensorData entries: parent records {'type': 'NonTensorData'}; the sub-directory "
        "holds meta.json {'_type': \"<class 'tensordict.tensorclass.NonTensorData'>\", 'data': ..., "
        "'_is_non_tensor': true, '_metadata': null} in that order (v0.12.4 to v0.14.0) and no "
        "_tensordict/ directory (newer versions). A value that is not JSON-serializable (here "
        "bytes) is moved to other.pickle = pickle.dumps({'data': value}) and absent from "
        "meta.json, which keeps _is_non_tensor and _metadata: a safe reader must refuse it. "
        "The NonTensorData batch size is not stored (it follows the parent).",
    )

    make_case(
        "special_keys",
        TD(
            [2],
            [
                ("", Leaf("torch.int32", [2], [1, 2])),
                (".", Leaf("torch.int32", [2], [3, 4])),
                ("..", Leaf("torch.int32", [2], [5, 6])),
                ("...", Leaf("torch.int32", [2], [7, 8])),
                (".x", Leaf("torch.int32", [2], [9, 10])),
                ("%", Leaf("torch.int32", [2], [11, 12])),
                ("%2E", Leaf("torch.int32", [2], [13, 14])),
                (
                    "nested",
                    TD(
                        [2],
                        [
                            ("", TD([2], [("", Leaf("torch.int16", [2], [21, 22])), ("v", Leaf("torch.int16", [2], [23, 24]))])),
                            (".", TD([2], [(".", Leaf("torch.int16", [2], [25, 26]))])),
                            ("..", TD([2], [("..", Leaf("torch.int16", [2], [27, 28])), ("", NonTensor("up"))])),
                            (".x", TD([2], [("w", Leaf("torch.int16", [2], [29, 30]))])),
                        ],
                    ),
                ),
            ],
        ),
        "orjson",
        "tensordict 0.14.0 layout for keys that are not a name of their own (commit e70b89164db1, "
        "'[BugFix] Harden memmap path handling (#1762)'): the whole key '' is written '%', '.' is "
        "'%2E' and '..' is '%2E%2E', for leaves (%.memmap, %2E.memmap, %2E%2E.memmap) and for "
        "nested TensorDicts and NonTensorData folders alike. Any other key is escaped as before: "
        "'...' and '.x' keep their dots, '%' is '%25' and '%2E' is '%252E', so no two keys share "
        "a name. v0.13.0 wrote the leaves .memmap, ..memmap and ...memmap (see legacy_names) and "
        "nested folders under the raw key, which for these keys is the folder itself or its parent.",
    )

    make_case(
        "legacy_names",
        TD(
            [2],
            [
                ("", Leaf("torch.int32", [2], [1, 2])),
                (".", Leaf("torch.int32", [2], [3, 4])),
                ("..", Leaf("torch.int32", [2], [5, 6])),
                ("a b", Leaf("torch.int32", [2], [7, 8])),
                ("sub dir", TD([2], [("v", Leaf("torch.int16", [2], [9, 10]))])),
                ("cfg", NonTensor({"lr": 0.001})),
            ],
        ),
        "orjson",
        "Names as older writers wrote them, for readers: leaves by v0.13.0's encoder ('' is "
        ".memmap, '.' is ..memmap, '..' is ...memmap; 'a b' is a%20b.memmap), the nested folder "
        "under its raw key ('sub dir', as v0.13.0 named nested folders), and a NonTensorData "
        "meta.json with only _type and data (as tensorwire wrote it before matching tensordict's "
        "four members). tensordict 0.14.0 reads all of it: it tries the escaped name first, then "
        "the raw one (never for collection keys '', '.', '..').",
        w=LEGACY,
    )

    make_case(
        "empty_leaf",
        TD(
            [2],
            [
                ("e", Leaf("torch.float32", [2, 0], [])),
                ("f", Leaf("torch.float32", [2], [0.5, -0.5])),
            ],
        ),
        "orjson",
        "Zero-element leaf 'e' (shape [2, 0]): meta.json has its entry but NO e.memmap file "
        "exists (torch.from_file creates no file for size 0). Readers must synthesize an "
        "empty tensor.",
    )

    make_case(
        "longer_file",
        TD([3], [("a", Leaf("torch.int32", [3], [7, 8, 9], extra=b"\xef\xbe\xad\xde"))]),
        "orjson",
        "a.memmap is 16 bytes for a 12-byte tensor (as left when an existing larger file is "
        "overwritten: torch.from_file never shrinks). Readers read the first numel*itemsize "
        "bytes and ignore the tail.",
    )


if __name__ == "__main__":
    main()
