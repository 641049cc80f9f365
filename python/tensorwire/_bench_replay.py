"""The Python roles of `tensorwire bench replay` (--trainer python,
--writers-lang python): a writer or the trainer of the replay benchmark,
written with this client and numpy, run by the benchmark's parent as

    python3 -m tensorwire._bench_replay --role trainer|writer --addr HOST:PORT --root DIR \\
        --name NAME --mode ref|bytes --token-file F [--sample-batch N] [--batch N] ...

It does what the Go roles do (internal/bench/replay/roles.go): it joins the
run at the buffer node's barrier, stamps (writers) or verifies (trainer)
every transition as transition.go does, and prints its result as one line
of JSON starting with {"role": on stdout, latencies as HdrHistogram V2
encodings, so the parent reads it as a Go role's.
"""

import argparse
import base64
import json
import os
import re
import struct
import sys
import threading
import time
import zlib

import numpy as np

from . import replay
from .dataset import load_memmap
from .rpc import Client, read_token

OBS_SHAPE = (84, 84, 4)
OBS_BYTES = 84 * 84 * 4
ID_WRITER_SHIFT = 40
OBS_STRIDE = 256
WARM_LAPS = 4
HEAP_INTERVAL = 0.5
DIAL_TIMEOUT = 30.0
GOLDEN = np.uint64(0x9E3779B97F4A7C15)

# The checked words of an obs row (transition.go's obsChecks): both ends and
# every 256 bytes between, as word indices.
_offs = list(range(0, OBS_BYTES - 7, OBS_STRIDE))
if _offs[-1] != OBS_BYTES - 8:
    _offs.append(OBS_BYTES - 8)
WORDS = np.array(_offs) // 8
with np.errstate(over="ignore"):
    OFFSET_MUL = np.array(_offs, dtype=np.uint64) * GOLDEN  # obsWord(id, off) = id + off*golden, mod 2^64


# HdrHistogram V2 compressed encoding of durations in ns, as report.Latency
# (hdrhistogram-go) writes it: lowest 1, highest an hour, 3 digits.
HDR_HIGHEST = 3600 * 10**9


def _counts_index(v):
    bucket = (v | 2047).bit_length() - 11  # unit magnitude 0, 2048 sub-buckets
    return ((bucket + 1) << 10) + (v >> bucket) - 1024


def _zigzag(v):
    u = (v << 1) ^ (v >> 63)
    u &= (1 << 64) - 1
    out = bytearray()
    while True:
        if u < 0x80:
            out.append(u)
            return bytes(out)
        out.append((u & 0x7F) | 0x80)
        u >>= 7
        if len(out) == 8:
            out.append(u)
            return bytes(out)


def hdr_encode(durations_ns):
    """The base64 HdrHistogram V2 compressed encoding of the durations, or
    "" for none (an empty report.Latency)."""
    if not durations_ns:
        return ""
    counts = {}
    for v in durations_ns:
        i = _counts_index(min(max(int(v), 1), HDR_HIGHEST))
        counts[i] = counts.get(i, 0) + 1
    top = max(counts)
    payload = bytearray()
    i = 0
    while i <= top:
        c = counts.get(i, 0)
        if c:
            payload += _zigzag(c)
            i += 1
            continue
        j = i
        while j <= top and not counts.get(j, 0):
            j += 1
        payload += _zigzag(-(j - i)) if j - i > 1 else _zigzag(0)
        i = j
    inner = struct.pack(">iiiiqqd", 0x1C849313, len(payload), 0, 3, 1, HDR_HIGHEST, 1.0) + bytes(payload)
    z = zlib.compress(inner, 9)
    return base64.b64encode(struct.pack(">ii", 0x1C849314, len(z)) + z).decode()


# Transitions (transition.go).

def stamp(writer, first, n):
    """A batch of writer's transitions first..first+n-1, each id in every field."""
    ids = (np.uint64(writer + 1) << np.uint64(ID_WRITER_SHIFT)) + np.arange(first, first + n, dtype=np.uint64)
    obs = np.zeros((n, OBS_BYTES), np.uint8)
    with np.errstate(over="ignore"):
        obs.view("<u8")[:, WORDS] = ids[:, None] + OFFSET_MUL[None, :]
    return {
        "obs": obs.reshape((n,) + OBS_SHAPE),
        "action": ids.view(np.int64),
        "reward": (ids & np.uint64((1 << 24) - 1)).astype(np.float32),
        "done": (ids & np.uint64(1)).astype(bool),
    }


class Verifier:
    def __init__(self, log):
        self.log = log
        self.rows = self.torn = 0
        self.first = ""

    def check(self, td):
        ids = td["action"].view(np.uint64)
        n = len(ids)
        with np.errstate(over="ignore"):
            words = td["obs"].reshape(n, -1).view("<u8")[:, WORDS]
            ok = (ids >> np.uint64(ID_WRITER_SHIFT)) != 0
            ok &= td["reward"] == (ids & np.uint64((1 << 24) - 1)).astype(np.float32)
            ok &= td["done"].view(np.uint8) == (ids & np.uint64(1)).astype(np.uint8)
            ok &= (words == ids[:, None] + OFFSET_MUL[None, :]).all(axis=1)
        self.rows += n
        bad = np.nonzero(~ok)[0]
        for i in bad:
            self.torn += 1
            msg = f"torn row: row {i}: action {int(ids[i]):#x} disagrees with its other fields"
            if not self.first:
                self.first = msg
            if self.torn <= 5:
                self.log.error("a sample returned a torn row", err=msg)


# The run.

def go_duration(s):
    """Seconds of a Go duration string ("1.5s", "200ms", "1m30s")."""
    units = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}
    parts = re.findall(r"([0-9.]+)(ns|us|µs|ms|s|m|h)", s)
    if not parts or "".join(a + b for a, b in parts) != s.lstrip("+"):
        if s == "0":
            return 0.0
        raise argparse.ArgumentTypeError(f"invalid duration {s!r}")
    return sum(float(a) * units[b] for a, b in parts)


def go_bool(s):
    if s.lower() in ("1", "t", "true"):
        return True
    if s.lower() in ("0", "f", "false"):
        return False
    raise argparse.ArgumentTypeError(f"invalid boolean {s!r}")


class Log:
    """slog's text format, to --log-file (appended, a write a line) or stderr;
    warnings and errors to stderr as well."""

    def __init__(self, path, **attrs):
        self.f = open(path, "ab", buffering=0) if path else None
        self.attrs = attrs

    def _line(self, level, msg, kv):
        t = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime()) + ".%03dZ" % (time.time() % 1 * 1000)
        fields = [f"time={t}", f"level={level}", "msg=" + _q(msg)]
        fields += [f"{k}={_q(str(v))}" for k, v in {**self.attrs, **kv}.items()]
        return (" ".join(fields) + "\n").encode()

    def _log(self, level, msg, kv):
        line = self._line(level, msg, kv)
        if self.f is not None:
            self.f.write(line)
        if self.f is None or level in ("WARN", "ERROR"):
            sys.stderr.buffer.write(line)
            sys.stderr.flush()

    def info(self, msg, **kv):
        self._log("INFO", msg, kv)

    def error(self, msg, **kv):
        self._log("ERROR", msg, kv)


def _q(s):
    return json.dumps(s) if (not s or re.search(r'[\s"=]', s)) else s


def barrier(rc, phase, role="", mode=""):
    return rc.call("replaybench.barrier", {"phase": phase, "role": role, "mode": mode})


def dial(o):
    token = read_token(o.token_file) if o.token_file else None
    b = replay.Buffer(o.addr, o.name, token=token, root=o.root or None, bytes_mode=o.mode == "bytes",
                      prefetch=o.role == "trainer" and o.prefetch, timeout=DIAL_TIMEOUT)
    if b.mode != o.mode:
        b.close()
        raise SystemExit(f"the client works in mode {b.mode!r} (sharing {b.sharing}), not {o.mode!r}: ref needs "
                         f"--root {o.root!r} to be the node's own root on its kernel and mount (not a copy)")
    return b, Client(o.addr, token=token, timeout=DIAL_TIMEOUT)


def run_writer(o, log):
    b, rc = dial(o)
    run = barrier(rc, "start", "writer", b.mode)
    index, writers, capacity, duration = run["index"], run["writers"], run["capacity"], run["duration_ns"] / 1e9
    log.attrs["writer"] = index
    res = {"role": "writer", "mode": b.mode, "sharing": b.sharing, "index": index, "fill_ns": 0, "warmup_ns": 0, "warmup_transitions": 0,
           "elapsed_ns": 0, "transitions": 0, "extend_latency": ""}
    seq = 0
    share = (capacity + writers - 1) // writers
    start = time.perf_counter_ns()
    while res["warmup_transitions"] < WARM_LAPS * share:
        b.extend(stamp(index, seq, o.batch))
        seq += o.batch
        res["warmup_transitions"] += o.batch
        if res["fill_ns"] == 0 and res["warmup_transitions"] >= share:
            res["fill_ns"] = time.perf_counter_ns() - start
    res["warmup_ns"] = time.perf_counter_ns() - start
    log.info("warm-up written", transitions=res["warmup_transitions"], seconds=res["warmup_ns"] / 1e9)
    barrier(rc, "filled")
    barrier(rc, "timed")
    every = o.batch * writers / o.insert_rate if o.insert_rate > 0 else 0
    lat = []
    start = time.perf_counter()
    k = 0
    while time.perf_counter() - start < duration:
        if every:
            wait = start + k * every - time.perf_counter()
            if wait > 0:
                time.sleep(wait)
        batch = stamp(index, seq, o.batch)
        seq += o.batch
        t0 = time.perf_counter_ns()
        b.extend(batch)
        lat.append(time.perf_counter_ns() - t0)
        res["transitions"] += o.batch
        k += 1
    res["elapsed_ns"] = int((time.perf_counter() - start) * 1e9)
    res["extend_latency"] = hdr_encode(lat)
    barrier(rc, "done")
    b.close()
    rc.close()
    return res


def memcpy_gather(storage, batch, d):
    """numpy's gather limit on this mapping: np.take of batches of random rows
    of every leaf into reused buffers, warm, after reading every page once."""
    leaves = [a for a in storage.values() if isinstance(a, np.ndarray)]
    page = os.sysconf("SC_PAGE_SIZE")
    for a in leaves:
        int(a.reshape(-1)[::page].sum())
    rows = leaves[0].shape[0]
    dst = [np.empty((batch,) + a.shape[1:], a.dtype) for a in leaves]
    rng = np.random.default_rng(1)

    def round_():
        idx = rng.integers(0, rows, batch)
        for a, out in zip(leaves, dst):
            np.take(a, idx, axis=0, out=out, mode="clip")

    t = time.perf_counter()
    while time.perf_counter() - t < d / 8:
        round_()
    n = 0
    t = time.perf_counter()
    while time.perf_counter() - t < d:
        round_()
        n += 1
    return n * batch / (time.perf_counter() - t)


def run_trainer(o, log):
    b, rc = dial(o)
    run = barrier(rc, "start", "trainer", b.mode)
    duration = run["duration_ns"] / 1e9
    n = o.sample_batch
    dst = {"obs": np.zeros((n,) + OBS_SHAPE, np.uint8), "action": np.zeros(n, np.int64),
           "reward": np.zeros(n, np.float32), "done": np.zeros(n, bool)}
    res = {"role": "trainer", "mode": b.mode, "sharing": b.sharing, "memcpy_gather_transitions_per_s": 0.0, "warmup_transitions": 0,
           "elapsed_ns": 0, "transitions": 0, "rows_verified": 0, "torn_rows": 0, "resampled": 0,
           "node_resampled": 0, "heap_max_bytes": 0, "heap_polls": 0, "sample_latency": ""}
    v = Verifier(log)

    # The warm-up: sample, untimed, until the writers have filled the buffer.
    filled = threading.Event()
    errs = []

    def wait_filled():
        try:
            barrier(rc, "filled")
        except Exception as e:  # noqa: BLE001
            errs.append(e)
        filled.set()

    threading.Thread(target=wait_filled, daemon=True).start()
    while not filled.is_set():
        try:
            b.sample_into(dst, timeout=0.5)
        except TimeoutError:  # fewer than the min size so far
            continue
        v.check(dst)
        res["warmup_transitions"] += n
    if errs:
        raise errs[0]
    if o.root:
        storage = load_memmap(os.path.join(o.root, o.name, replay.STORAGE_DIR))
        res["memcpy_gather_transitions_per_s"] = memcpy_gather(storage, n, o.memcpy_duration)
        del storage
        log.info("memcpy gather limit (numpy's np.take)", transitions_per_s=int(res["memcpy_gather_transitions_per_s"]))
    before = b.stats()
    barrier(rc, "timed")

    stop = threading.Event()
    heap = {"max": 0, "polls": 0, "err": None}

    def poll():
        while True:
            try:
                st = b.stats(timeout=10)
                heap["max"] = max(heap["max"], st.get("node_heap", 0))
                heap["polls"] += 1
            except Exception as e:  # noqa: BLE001
                if heap["err"] is None and not stop.is_set():
                    heap["err"] = e
            if stop.wait(HEAP_INTERVAL):
                return

    poller = threading.Thread(target=poll, daemon=True)
    poller.start()
    lat = []
    start = time.perf_counter()
    while time.perf_counter() - start < duration:
        t0 = time.perf_counter_ns()
        b.sample_into(dst)
        lat.append(time.perf_counter_ns() - t0)
        res["transitions"] += n
        v.check(dst)
    res["elapsed_ns"] = int((time.perf_counter() - start) * 1e9)
    stop.set()
    poller.join()
    if heap["err"] is not None:
        raise heap["err"]
    res["heap_max_bytes"], res["heap_polls"] = heap["max"], heap["polls"]
    after = b.stats()
    res["resampled"] = after["sampled"] - before["sampled"] - res["transitions"]
    res["node_resampled"] = after["resampled"] - before["resampled"]
    res["sample_latency"] = hdr_encode(lat)
    barrier(rc, "done")
    res["rows_verified"], res["torn_rows"] = v.rows, v.torn
    if v.first:
        res["first_torn"] = v.first
    b.close()
    rc.close()
    return res


def main(argv=None):
    p = argparse.ArgumentParser(prog="python3 -m tensorwire._bench_replay", allow_abbrev=False)
    p.add_argument("--role", required=True, choices=("writer", "trainer"))
    p.add_argument("--addr", required=True)
    p.add_argument("--root", default="")
    p.add_argument("--name", default="replaybench")
    p.add_argument("--mode", default="ref", choices=("ref", "bytes"))
    p.add_argument("--token-file", default="")
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--sample-batch", type=int, default=256)
    p.add_argument("--insert-rate", type=float, default=0.0)
    p.add_argument("--prefetch", type=go_bool, default=True)
    p.add_argument("--memcpy-duration", type=go_duration, default=1.5)
    p.add_argument("--log-file", default="")
    p.add_argument("--child", action="store_true")
    o = p.parse_args(argv)
    log = Log(o.log_file, role=o.role, pid=os.getpid(), lang="python")
    if o.child:
        # Stop when the parent goes: it holds our stdin open while it lives.
        def watch():
            while os.read(0, 4096):  # the raw fd: a daemon thread must not hold stdin's buffer lock at exit
                pass
            os._exit(1)
        threading.Thread(target=watch, daemon=True).start()
    try:
        res = run_writer(o, log) if o.role == "writer" else run_trainer(o, log)
    except Exception as e:  # noqa: BLE001
        log.error("failed", err=f"{type(e).__name__}: {e}")
        print(f"{o.role}: {type(e).__name__}: {e}", file=sys.stderr)
        return 1
    sys.stdout.write(json.dumps(res) + "\n")
    sys.stdout.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())

