"""The Python role of `tensorwire bench store --writers-lang python`: one of
the rollouts' workers, written with this client and numpy, run by the
benchmark's parent as

    python3 -m tensorwire._bench_store --role appender --addr HOST:PORT --root DIR \\
        --n N --inflight K --extend E --out FILE

It does what the Go appender does (internal/bench/store/roles.go): K
threads on one Store append 28 KB items to the bin "rollouts" (E at a
time with extend when E > 1) until its stdin closes, each item an "obs"
of uint8 [28672] whose first 8 bytes are its index, a "key" "N:G:I" and,
as numpy has no CRC-32C, a "crc32" (zlib's CRC-32 of obs) that the Go
drainer checks instead of the Go items' "crc". It prints "ready" once
connected and writes its result as the Go role's JSON to FILE, latencies
as an HdrHistogram V2 encoding.
"""

import argparse
import json
import sys
import threading
import time
import zlib

import numpy as np

from . import store
from ._bench_replay import hdr_encode
from ._td import NonTensorData

STORE = "bench"  # internal/bench/store: storeName, rolloutBin, rolloutBytes
BIN = "rollouts"
OBS_BYTES = 28 << 10


def item(pattern, w, g, i):
    obs = pattern[i % 256:i % 256 + OBS_BYTES].copy()
    obs[:8] = np.frombuffer(int(i).to_bytes(8, "little"), np.uint8)
    return {"obs": obs, "key": NonTensorData(f"{w}:{g}:{i}"), "crc32": NonTensorData(zlib.crc32(obs) & 0xFFFFFFFF)}


def appender(a):
    s = store.Store(a.addr, STORE, root=a.root)
    pattern = np.random.default_rng(28 + a.n).integers(0, 256, OBS_BYTES + 256, dtype=np.uint8)
    stop = threading.Event()
    acked = [0] * a.inflight
    lats = [[] for _ in range(a.inflight)]
    errors = []

    def loop(g):
        i = 0
        while not stop.is_set():
            tds = [item(pattern, a.n, g, i + k) for k in range(a.extend)]
            t0 = time.perf_counter_ns()
            try:
                if a.extend == 1:
                    s.append(BIN, tds[0])
                else:
                    s.extend(BIN, tds)
            except Exception as e:  # noqa: BLE001 (the run's error, reported)
                if not stop.is_set():
                    errors.append(e)
                    stop.set()
                return
            lats[g].append(time.perf_counter_ns() - t0)
            i += a.extend
            acked[g] = i

    print("ready", flush=True)
    first = time.time_ns()
    threads = [threading.Thread(target=loop, args=(g,), daemon=True) for g in range(a.inflight)]
    for t in threads:
        t.start()
    threading.Thread(target=lambda: (sys.stdin.read(), stop.set()), daemon=True).start()
    for t in threads:
        t.join()
    last = time.time_ns()
    s.close()
    if errors:
        raise errors[0]
    with open(a.out, "w") as f:
        json.dump({"acked": acked, "latency": hdr_encode([d for ls in lats for d in ls]),
                   "first_ns": first, "last_ns": last}, f)


def main():
    ap = argparse.ArgumentParser(prog="python3 -m tensorwire._bench_store")
    ap.add_argument("--role", choices=["appender"], required=True)
    ap.add_argument("--addr", required=True)
    ap.add_argument("--root", required=True)
    ap.add_argument("--n", type=int, required=True)
    ap.add_argument("--inflight", type=int, default=8)
    ap.add_argument("--extend", type=int, default=1)
    ap.add_argument("--out", required=True)
    appender(ap.parse_args())


if __name__ == "__main__":
    main()
