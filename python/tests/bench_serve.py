"""Predictions per second from Python against the Go client's, on one node
serving the MLP of docs/serve.md (64 -> 256 -> 16, max batch 16): N
predictions of one row in flight from one client, by reference and by
bytes. A benchmark, not a test (unittest does not collect it):

    cd python && PYTHONPATH=.:tests python3 tests/bench_serve.py [--in-flight 1,16,64] [--seconds 3]

The Go figures are serve.Client's (tests/goclient: N goroutines predicting
in a loop; by reference it uses the bell, shared rings and futexes, which
the Python client does not).
"""

import argparse
import asyncio
import os
import subprocess
import time

import numpy as np

import tensorwire
from nodes import Node, goclient, write_state_dict


def python_rate(node, mode, n, seconds):
    c = tensorwire.serve.Client(node.addr, "policy", token=node.token, root=node.root, bytes_mode=mode == "bytes")
    x = np.zeros((1, 64), np.float32)
    stop = time.monotonic() + seconds
    count = [0]

    async def loop():
        while time.monotonic() < stop:
            await c.apredict({"obs": x})
            count[0] += 1

    async def main():
        await asyncio.gather(*(loop() for _ in range(n)))

    before = c.stats()
    t0 = time.monotonic()
    asyncio.run(main())
    took = time.monotonic() - t0
    after = c.stats()
    c.close()
    rows, batches = after["rows"] - before["rows"], after["batches"] - before["batches"]
    return count[0] / took, rows / max(batches, 1)


def go_rate(node, mode, n, seconds):
    args = [goclient(), "-addr", node.addr, "-name", "policy", "-token-file", node.token_file]
    if mode == "ref":
        args += ["-root", node.root]
    r = subprocess.run(args + ["bench", str(n), f"{seconds}s"], capture_output=True, text=True, check=True)
    return float(r.stdout.split()[-1])


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--in-flight", default="1,16,64")
    p.add_argument("--seconds", type=float, default=3)
    args = p.parse_args()
    rng = np.random.default_rng(0)
    node = Node(extra=["--serve", "policy,params=policy,max-batch=16"])
    try:
        write_state_dict(os.path.join(node.root, "policy"), {
            "0.weight": rng.normal(size=(256, 64)) / 8, "0.bias": rng.normal(size=256) / 10,
            "2.weight": rng.normal(size=(16, 256)) / 16, "2.bias": rng.normal(size=16) / 10})
        node.start()
        print(f"{'mode':6} {'in flight':>9} {'python pred/s':>14} {'mean batch':>10} {'go pred/s':>10} {'python/go':>9}")
        for mode in ("ref", "bytes"):
            for n in [int(v) for v in args.in_flight.split(",")]:
                py, batch = python_rate(node, mode, n, args.seconds)
                go = go_rate(node, mode, n, args.seconds)
                print(f"{mode:6} {n:9d} {py:14,.0f} {batch:10.1f} {go:10,.0f} {py / go:9.2f}", flush=True)
    finally:
        node.close()


if __name__ == "__main__":
    main()
