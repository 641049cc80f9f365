"""Predictions per second from Python against the Go client's, on one node
serving the MLP of docs/serve.md (64 -> 256 -> 16, max batch 16): N
predictions of one row in flight from one client, by reference and by
bytes. A benchmark, not a test (unittest does not collect it):

    cd python && PYTHONPATH=.:tests python3 tests/bench_serve.py [--in-flight 1,16,64] [--seconds 3]

The Python figures are two: N asyncio tasks awaiting apredict and N
threads calling predict(), by reference on Linux x86-64 by bell (the ring
shared with the node and futexes, as the Go client; apredict's requests
watched by one collector thread with futex_waitv), else by call. The Go figures are
serve.Client's (tests/goclient: N goroutines predicting in a loop; by
reference by bell).
"""

import argparse
import asyncio
import os
import subprocess
import threading
import time

import numpy as np

import tensorwire
from nodes import Node, goclient, write_state_dict


def python_rate(node, mode, n, seconds, api):
    c = tensorwire.serve.Client(node.addr, "policy", token=node.token, root=node.root, bytes_mode=mode == "bytes")
    x = np.zeros((1, 64), np.float32)
    stop = time.monotonic() + seconds
    count = [0] * n

    async def loop(k):
        while time.monotonic() < stop:
            await c.apredict({"obs": x})
            count[k] += 1

    async def main():
        await asyncio.gather(*(loop(k) for k in range(n)))

    def thread(k):
        while time.monotonic() < stop:
            c.predict({"obs": x})
            count[k] += 1

    before = c.stats()
    t0 = time.monotonic()
    if api == "async":
        asyncio.run(main())
    else:
        ts = [threading.Thread(target=thread, args=(k,)) for k in range(n)]
        for t in ts:
            t.start()
        for t in ts:
            t.join()
    took = time.monotonic() - t0
    after = c.stats()
    c.close()
    rows, batches = after["rows"] - before["rows"], after["batches"] - before["batches"]
    return sum(count) / took, rows / max(batches, 1)


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
        print(f"{'mode':6} {'in flight':>9} {'py async/s':>11} {'py threads/s':>13} {'go pred/s':>10} "
              f"{'async/go':>8} {'threads/go':>10}")
        for mode in ("ref", "bytes"):
            for n in [int(v) for v in args.in_flight.split(",")]:
                pa, _ = python_rate(node, mode, n, args.seconds, "async")
                pt, _ = python_rate(node, mode, n, args.seconds, "threads")
                go = go_rate(node, mode, n, args.seconds)
                print(f"{mode:6} {n:9d} {pa:11,.0f} {pt:13,.0f} {go:10,.0f} {pa / go:8.2f} {pt / go:10.2f}",
                      flush=True)
    finally:
        node.close()


if __name__ == "__main__":
    main()
