#!/usr/bin/env python3
"""Load a memory-mapped TensorDict folder with PyTorch alone and print it as JSON.

    python3 scripts/torch_load.py PREFIX... [--values]

It follows tensordict's TensorDict.load_memmap (tensordict/_td.py, 0.14):
meta.json keys in order, each leaf file found under its %XX-escaped name or,
failing that, its raw name (0.13's), and mapped with torch.from_file(path,
shared=False, dtype=..., size=numel).view(shape), where the dtype comes from
the string in meta.json through {str(d): d} over torch's dtypes, as
tensordict's _STR_DTYPE_TO_DTYPE does. tensordict itself cannot be installed
where tensorwire's CI runs (no PyPI); this script checks the part that
matters for compatibility, the bytes and dtype names, with real torch.

Output, one line per PREFIX in order (torch is imported once for all of
them): {"batch_size": [...], "fields": {"a/b": {"dtype", "shape", "sum",
"values"?}}, "nontensor": {"k": data}, "skipped": {"k": "reason"}}. sum is
float64 (complex: [re, im]); --values adds the flat element list (float16
and bfloat16 as raw uint16 bits, complex as [re, im] pairs). Leaves whose
dtype this torch lacks (uint16/32/64 before torch 2.3) are listed in skipped.
"""
import json
import os
import sys

import torch

DTYPES = {str(d): d for d in vars(torch).values() if isinstance(d, torch.dtype)}
UNSAFE = set('/<>:"|?*\\ \0%') | {chr(i) for i in range(32)} | {chr(127)}


def escape(key):
    # tensordict 0.14's _encode_key_for_filesystem: "", "." and ".." name no
    # file of their own and are written "%", "%2E" and "%2E%2E".
    if key in ("", ".", ".."):
        return "%2E" * len(key) or "%"
    return "".join("%%%02X" % ord(c) if c in UNSAFE else c for c in key)


def find(prefix, key, suffix):
    p = os.path.join(prefix, escape(key) + suffix)
    raw = key + suffix  # what tensordict 0.13 wrote; never a folder "", "." or ".."
    if not os.path.exists(p) and "/" not in key and raw not in ("", ".", ".."):
        if os.path.exists(os.path.join(prefix, raw)):
            return os.path.join(prefix, raw)
    return p


def flat_values(t):
    if t.dtype in (torch.float16, torch.bfloat16):
        return t.reshape(-1).view(torch.int16).to(torch.int32).bitwise_and(0xFFFF).tolist()
    if t.is_complex():
        return [[z.real, z.imag] for z in t.reshape(-1).tolist()]
    return t.reshape(-1).tolist()


def load(prefix, path, out, values):
    with open(os.path.join(prefix, "meta.json"), "rb") as f:
        meta = json.loads(f.read())
    if meta.get("_type") == "<class 'tensordict.tensorclass.NonTensorData'>":
        out["nontensor"]["/".join(path)] = meta.get("data")
        return
    if not path:
        out["batch_size"] = meta.get("shape", [])
    for key, entry in meta.items():
        if not isinstance(entry, dict):
            continue
        name = "/".join(path + [key])
        if "type" in entry:
            load(find(prefix, key, ""), path + [key], out, values)
            continue
        if entry["dtype"] not in DTYPES:
            out["skipped"][name] = "torch %s has no %s" % (torch.__version__, entry["dtype"])
            continue
        dtype, shape = DTYPES[entry["dtype"]], entry["shape"]
        numel = 1
        for d in shape:
            numel *= d
        if numel == 0:
            t = torch.empty(shape, dtype=dtype)
        else:
            t = torch.from_file(find(prefix, key, ".memmap"), shared=False, dtype=dtype, size=numel).view(shape)
        s = t.to(torch.complex128).sum() if t.is_complex() else t.to(torch.float64).sum()
        field = {"dtype": str(t.dtype), "shape": list(t.shape),
                 "sum": [s.real.item(), s.imag.item()] if t.is_complex() else s.item()}
        if values:
            field["values"] = flat_values(t)
        out["fields"][name] = field


def main():
    args = [a for a in sys.argv[1:] if not a.startswith("--")]
    if not args:
        sys.exit(__doc__)
    for prefix in args:
        out = {"batch_size": [], "fields": {}, "nontensor": {}, "skipped": {}}
        load(prefix, [], out, "--values" in sys.argv)
        json.dump(out, sys.stdout)
        sys.stdout.write("\n")


if __name__ == "__main__":
    main()
