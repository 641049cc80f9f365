#!/usr/bin/env python3
"""Write a PyTorch MLP's state_dict, inputs and torch's outputs as memory-mapped TensorDicts.

    python3 scripts/torch_mlp.py PREFIX [--sizes 64,256,16] [--rows 32] [--seed 0]

It builds nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 16)) (any
widths: a ReLU between each two Linear layers) with torch.manual_seed(seed),
and writes, in the layout tensordict 0.14's memmap_ writes (docs/format.md:
meta.json with the keys in order, then "shape", "device", "_type"; one
"<key>.memmap" file of raw little-endian elements per tensor):

    PREFIX/params   TensorDict(model.state_dict(), batch_size=[]).memmap_(PREFIX/params):
                    "0.weight" [256, 64], "0.bias" [256], "2.weight" [16, 256], "2.bias" [16]
    PREFIX/io       batch size [rows]: "obs" float32 [rows, 64] drawn from a normal
                    distribution, "logits" float32 [rows, 16], model(obs) computed by torch

tensordict itself is not installed where tensorwire's tests run (no PyPI), so
this script writes the format with torch alone, as scripts/torch_load.py reads
it. Keys such as "0.weight" need no escaping.
"""
import argparse
import json
import os

import torch
from torch import nn


def write(prefix, tensors, batch):
    os.makedirs(prefix, exist_ok=True)
    meta = {}
    for key, t in tensors.items():
        t = t.detach().contiguous().cpu()
        with open(os.path.join(prefix, key + ".memmap"), "wb") as f:
            f.write(t.numpy().tobytes())  # C order, little-endian on every machine torch runs on here
        meta[key] = {"device": "cpu", "shape": list(t.shape), "dtype": str(t.dtype), "is_nested": False}
    meta["shape"] = list(batch)
    meta["device"] = "cpu"
    meta["_type"] = "<class 'tensordict._td.TensorDict'>"
    with open(os.path.join(prefix, "meta.json"), "w") as f:
        f.write(json.dumps(meta, separators=(",", ":")))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("prefix")
    ap.add_argument("--sizes", default="64,256,16")
    ap.add_argument("--rows", type=int, default=32)
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args()
    sizes = [int(s) for s in a.sizes.split(",")]
    torch.manual_seed(a.seed)
    layers = []
    for i in range(len(sizes) - 1):
        if i:
            layers.append(nn.ReLU())
        layers.append(nn.Linear(sizes[i], sizes[i + 1]))
    model = nn.Sequential(*layers)
    obs = torch.randn(a.rows, sizes[0])
    with torch.no_grad():
        logits = model(obs)
    write(os.path.join(a.prefix, "params"), model.state_dict(), [])
    write(os.path.join(a.prefix, "io"), {"obs": obs, "logits": logits}, [a.rows])


if __name__ == "__main__":
    main()
