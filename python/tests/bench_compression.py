"""Rows by bytes with and without LZ4, from Python: a node with a replay
buffer of Atari-like observations (84x84 uint8, a constant background, a
block that moves, 3% of the pixels noise: lz4 takes them to about a
seventh), sampled in batches of 256 and extended in batches of 128, by
bytes, by clients made with compression=True and False, in turns, ROUNDS
rounds of SECONDS seconds each. Prints rows/s, the bytes a sampled batch
took on the wire and the client's CPU a batch. Run it inside a network namespace whose loopback is rate-limited
(tc) to see a link's figures (docs/benchmarks.md, "Python clients and
LZ4").

    TENSORWIRE_BIN=... python3 python/tests/bench_compression.py [ROUNDS [SECONDS]]
"""

import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import numpy as np  # noqa: E402

from tensorwire import replay, rpc  # noqa: E402

from nodes import TOKEN, CountingProxy, Node  # noqa: E402
from test_compression import frames  # noqa: E402


def noisy(ids, rng):
    f = frames(ids)
    m = rng.random(f["obs"].shape) < 0.03
    f["obs"][m] = rng.integers(0, 256, m.sum(), dtype=np.uint8)
    return f


def main():
    rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 3
    seconds = float(sys.argv[2]) if len(sys.argv) > 2 else 3.0
    rng = np.random.default_rng(1)
    node = Node(buffers=["atari,capacity=4096,min-size=1"]).start()
    proxy = CountingProxy(node.addr)
    try:
        with rpc.Client(node.addr, token=TOKEN, root=node.root) as c, replay.Buffer(c, "atari", bytes_mode=True) as b:
            for k in range(32):
                b.extend(noisy(np.arange(k * 128, (k + 1) * 128) + 1, rng))
        wire = {}
        for comp in (True, False):  # one batch through a counting proxy: its bytes on the wire
            with rpc.Client(proxy.addr, token=TOKEN, root=node.root, compression=comp) as c, \
                    replay.Buffer(c, "atari", bytes_mode=True) as b:
                b.sample(256)
                _, d0 = proxy.counts()
                b.sample(256)
                wire[comp] = proxy.counts()[1] - d0
        sends = [noisy(np.arange(k * 128, (k + 1) * 128) + 1, rng) for k in range(8)]
        for _ in range(rounds):
            for comp in (True, False):
                with rpc.Client(node.addr, token=TOKEN, root=node.root, compression=comp) as c, \
                        replay.Buffer(c, "atari", bytes_mode=True) as b:
                    b.sample(256)
                    t0, c0, n = time.perf_counter(), time.process_time(), 0
                    while time.perf_counter() - t0 < seconds:
                        b.sample(256)
                        n += 1
                    dt, cpu = time.perf_counter() - t0, time.process_time() - c0
                    print(f"sample  compression={comp!s:5}  {n * 256 / dt:8.0f} rows/s  {wire[comp] / 1e6:5.2f} MB a "
                          f"batch of 256 on the wire  client CPU {cpu / n * 1e3:5.2f} ms a batch", flush=True)
                    t0, c0, n = time.perf_counter(), time.process_time(), 0
                    while time.perf_counter() - t0 < seconds:
                        b.extend(sends[n % len(sends)])
                        n += 1
                    dt, cpu = time.perf_counter() - t0, time.process_time() - c0
                    print(f"extend  compression={comp!s:5}  {n * 128 / dt:8.0f} rows/s  client CPU "
                          f"{cpu / n * 1e3:5.2f} ms a batch of 128", flush=True)
    finally:
        proxy.close()
        node.close()


if __name__ == "__main__":
    main()
