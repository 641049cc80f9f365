"""The loader benchmark with a Python producer ("tensorwire bench loader
--producer python", docs/benchmarks.md): tensorsocket's workload (uint8
[3, 224, 224] samples made and transformed in a torch DataLoader, batch 64,
a 5 ms training step) served by one tensorwire.loader.Producer to N
Python consumer processes through a node's remote loader, beside N jobs
each running the same DataLoader alone, in the same run. For each: samples/s
per consumer, the CPU seconds of every process over the epoch, and whether
each consumer saw every sample exactly once, by content.

    python3 -m tensorwire._bench_loader --bin tensorwire [--samples 2000] [--consumers 4] [--json FILE]
        [--device cuda:0] [--source transform|plain|premade] [--tensorsocket auto|on|off]

--device D: GPU delivery (docs/loader.md, "GPU delivery"): the producer
puts each batch on D once and the shared consumers get views of it, while
each independent job copies its own batches there (pinned, non_blocking).
--source: what makes the batches. transform (the default): the DataLoader
above. plain (--plain): the DataLoader without the transform (a fill per
sample), so that the figures are less the transform's. premade: batches
made once and handed out again with each sample's id written in, no
DataLoader: the figures are the delivery's alone (what bounds a consumer
is how fast batches reach it, not how fast they are made).

--tensorsocket: a third side, tensorsocket's own TensorProducer and
TensorConsumer (the PyPI package, when importable; auto runs it then, on
requires it) over the same source: a CUDA tensor per batch through
torch.multiprocessing's handles where CUDA is available, else the batch's
bytes pickled through zmq (each consumer receives every consumer's
batches: slow beyond 2 consumers on a small machine). Each side also
reports a steady rate, the samples after each consumer's first batch over
the time from it to its last, which leaves start-up out; the comparison
with tensorsocket uses the epoch's rate all the same, since tensorsocket
sends 8 loader batches a message and its steady rate is a burst's. It
drops an epoch's last messages (a quarter of 2,048 samples here); its
"each sample once" says so. A tensorsocket side that gets stuck is
reported, and the other sides' figures stand.

Each process runs torch with one intra-op thread (--threads), as torch sets
it in a DataLoader's worker processes: with torch's default (a thread per
core) N processes each transforming small tensors spin N x cores threads
on the cores, and torch 2.11 on 16 cores ran the independent jobs 6-7x
slower than with one (the device run of 2026-11-30; the same here, 24-32
samples/s against 184-212, torch 2.15 on 2 cores).
"""

import argparse
import json
import os
import queue
import resource
import shutil
import subprocess
import sys
import tempfile
import threading
import time

import numpy as np

H = W = 224

# A role's lines to the run ("ready", its JSON result), on the stdout it
# was started with; main points fd 1 and sys.stdout at stderr, so that
# whatever a library prints (tensorsocket's consumer logs to stdout) is
# not taken for one.
_out = sys.stdout


def _dataset(n, plain=False):
    import torch
    import torch.utils.data as tud

    class Plain(tud.Dataset):
        """Sample i without a transform: every byte (7i + 3) mod 256, with
        the id in channel 0's rows 0 and 1, as Synthetic's."""

        def __len__(self):
            return n

        def __getitem__(self, i):
            out = torch.full((3, H, W), (7 * i + 3) % 256, dtype=torch.uint8)
            out[0, 0], out[0, 1] = i % 256, i // 256 % 256
            return out

    class Synthetic(tud.Dataset):
        """Sample i, as a torchvision pipeline makes it: a "decoded" uint8
        [3, 256, 256] image (every byte (7i + 3) mod 256 with a little
        noise), RandomResizedCrop to 224 (bilinear), RandomHorizontalFlip and
        ColorJitter's brightness, back to uint8 [3, 224, 224]; then channel 0's
        rows 0 and 1 are set to i % 256 and i // 256 % 256, which the
        consumers read back (all the transform's random draws are seeded by i)."""

        def __len__(self):
            return n

        def __getitem__(self, i):
            import torch.nn.functional as F
            g = torch.Generator().manual_seed(i)
            img = torch.full((3, 256, 256), (7 * i + 3) % 256, dtype=torch.uint8)
            img ^= torch.randint(0, 8, (3, 256, 256), dtype=torch.uint8, generator=g)
            s = int(torch.randint(160, 257, (1,), generator=g))
            y, x = (int(v) for v in torch.randint(0, 257 - s, (2,), generator=g))
            crop = img[:, y:y + s, x:x + s].float().unsqueeze(0)
            out = F.interpolate(crop, size=(H, W), mode="bilinear", align_corners=False)[0]
            if torch.rand(1, generator=g).item() < 0.5:
                out = out.flip(-1)
            out = (out * (0.8 + 0.4 * torch.rand(1, generator=g))).clamp(0, 255).to(torch.uint8)
            out[0, 0], out[0, 1] = i % 256, i // 256 % 256
            return out

    return Plain() if plain else Synthetic()


class _Premade:
    """--source premade: an iterable of an epoch's batches (len: how many)
    that makes its batches once and hands them out again, each sample's id
    written into channel 0's rows 0 and 1 as _dataset's (the ids a fresh
    permutation each epoch). It cycles through `bufs` tensors, so a batch
    stays as it was handed out until bufs - 1 more have been: more than a
    tensorsocket producer's rubber band holds."""

    def __init__(self, n, batch, pin=False, bufs=32):
        import torch
        self.n, self.batch, self.epoch = n, batch, 0
        k = max(1, min(bufs, len(self)))
        self.bufs = [torch.full((batch, 3, H, W), (7 * j + 3) % 256, dtype=torch.uint8) for j in range(k)]
        if pin:
            self.bufs = [b.pin_memory() for b in self.bufs]

    def __len__(self):
        return (self.n + self.batch - 1) // self.batch

    def __iter__(self):
        import torch
        perm = torch.randperm(self.n, generator=torch.Generator().manual_seed(self.epoch))
        self.epoch += 1
        for j, s in enumerate(range(0, self.n, self.batch)):
            ids = perm[s:s + self.batch]
            b = self.bufs[j % len(self.bufs)][:len(ids)]
            b[:, 0, 0, 0] = (ids % 256).to(torch.uint8)
            b[:, 0, 1, 0] = (ids // 256 % 256).to(torch.uint8)
            yield b


def _source(a, pin=False):
    """The batches of --source: a DataLoader, or a _Premade."""
    if a.source == "premade":
        return _Premade(a.samples, a.batch, pin=pin)
    import torch.utils.data as tud
    return tud.DataLoader(_dataset(a.samples, a.source == "plain"), batch_size=a.batch, shuffle=True,
                          num_workers=a.workers, pin_memory=pin)


class _Gated:
    """The producer's source: its first batch at once (the producer learns
    the schema from it and publishes it once attached), then "ready" and
    the rest after "go". So the consumers join the epoch while the producer
    is attached (they cannot before), and the ring is not filled ahead
    before their epochs are timed."""

    def __init__(self, src):
        self.src, self.opened = src, False

    def __len__(self):
        return len(self.src)

    def __iter__(self):
        for i, b in enumerate(self.src):
            if i == 1 and not self.opened:
                self.opened = True
                _out.write("ready\n")
                _out.flush()
                sys.stdin.readline()
            yield b


class _Tuples:
    """An iterable of batches as 1-tuples, as tensorsocket's producer takes
    them (it measures a loader batch by its first tensor)."""

    def __init__(self, src):
        self.src = src

    def __len__(self):
        return len(self.src)

    def __iter__(self):
        return ((b,) for b in self.src)


def _ids(batch):
    if hasattr(batch, "device") and batch.device.type != "cpu":
        batch = batch[:, :1, :2, :1].cpu()  # the ids' bytes only; waits for the batch's copy
    b = batch.numpy() if hasattr(batch, "numpy") else batch
    return (b[:, 0, 0, 0].astype(np.int64) + 256 * b[:, 0, 1, 0].astype(np.int64)).tolist()


def _cpu_self():
    r, c = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime + c.ru_utime + c.ru_stime


def _proc_cpu(pid):
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _consume(batches, n, step, out, extra=None):
    """Iterates one epoch of batches (after "go" on stdin), a step per batch;
    prints a JSON line: samples/s, CPU seconds, exactly once."""
    seen = np.zeros(n, np.int64)
    _out.write("ready\n")
    _out.flush()
    sys.stdin.readline()
    cpu0, t0 = _cpu_self(), time.monotonic()
    count, first, t_first, t_last = 0, 0, None, None
    for b in batches():
        ids = _ids(b)
        t_last = time.monotonic()
        if t_first is None:
            t_first, first = t_last, len(ids)
        np.add.at(seen, ids, 1)
        count += len(ids)
        time.sleep(step)
    dt = time.monotonic() - t0
    steady = (count - first) / (t_last - t_first) if t_last is not None and t_last > t_first else 0.0
    if extra is not None:
        out.update(extra())
    out.update({"samples": count, "seconds": dt, "samples_per_s": count / dt, "steady_samples_per_s": steady,
                "cpu_s": _cpu_self() - cpu0, "exactly_once": bool((seen == 1).all())})
    _out.write(json.dumps(out) + "\n")
    _out.flush()


def role_consumer(a):
    import torch  # noqa: F401 (a training job has it; the batches come as tensors)
    from . import loader
    c = loader.Consumer(a.addr, "train", a.batch, token=open(a.token, "rb").read().strip(), root=a.root,
                        timeout=120, device=a.device or None)
    it = iter(c)  # joins the node's loader now, so that it is in the epoch the producer starts at "go"
    _consume(lambda: it, a.samples, a.step, {"role": "consumer"}, lambda: {"delivery": c.delivery})
    c.close()


def role_independent(a):
    import torch
    cuda = a.device.startswith("cuda")
    dl = _source(a, pin=cuda)
    if not a.device:
        _consume(lambda: iter(dl), a.samples, a.step, {"role": "independent"})
        return
    dev = torch.device(a.device if cuda else "cpu")
    _consume(lambda: (b.to(dev, non_blocking=True) for b in dl), a.samples, a.step, {"role": "independent"})


def role_producer(a):
    from . import loader
    dl = _source(a)
    cpu0 = _cpu_self()
    with loader.Producer(a.addr, "train", _Gated(dl), token=open(a.token, "rb").read().strip(), root=a.root,
                         epochs=1, samples=a.samples, device=a.device or None) as p:
        p.run()
        mode, delivery = p.mode, p.delivery
    _out.write(json.dumps({"role": "producer", "cpu_s": _cpu_self() - cpu0, "mode": mode,
                           "delivery": delivery}) + "\n")
    _out.flush()


def _ts_ports(a):
    p = [int(x) for x in a.ts_ports.split(",")]
    return {"port": p[0], "ack_port": p[1], "heart_ports": (p[2], p[3])}


def role_ts_consumer(a):
    """A tensorsocket consumer: joins its producer after "go" (a consumer
    blocks in its constructor until the producer serves), so its start-up
    is in its epoch's time but not in its steady rate."""
    import torch  # noqa: F401

    def batches():
        from tensorsocket.consumer import TensorConsumer
        return (b[0] for b in TensorConsumer(batch_size=a.batch, **_ts_ports(a)))
    _consume(batches, a.samples, a.step, {"role": "tensorsocket consumer"})


def role_ts_producer(a):
    """A tensorsocket producer over --source: after "go", waits until every
    consumer's heartbeat has come (tensorsocket serves the first one that
    joins at once), then serves one epoch."""
    from tensorsocket.producer import TensorProducer
    dl = _Tuples(_source(a))
    p = TensorProducer(dl, rubber_band_pct=0.02, **_ts_ports(a))
    _out.write("ready\n")
    _out.flush()
    sys.stdin.readline()
    while len(p.hb.consumers) < a.consumers:
        time.sleep(0.01)
    cpu0 = _cpu_self()
    for _ in p:
        pass
    cpu = _cpu_self() - cpu0
    import torch
    _out.write(json.dumps({"role": "tensorsocket producer", "cpu_s": cpu, "cuda": torch.cuda.is_available()}) + "\n")
    _out.flush()
    time.sleep(1)  # the consumers take the epoch's end before the sockets go
    p.join()


def _free_ports(n):
    import socket
    socks = [socket.socket() for _ in range(n)]
    try:
        for s in socks:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def _start(args, **kw):
    return subprocess.Popen(args, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, **kw)


class _Lines:
    """A process's stdout lines, read on a thread of their own so that the
    run can wait for one with a deadline."""

    def __init__(self, p):
        self.q = queue.Queue()
        threading.Thread(target=self._read, args=(p.stdout,), daemon=True).start()

    def _read(self, f):
        for line in f:
            self.q.put(line)
        self.q.put("")

    def get(self, timeout, what):
        try:
            line = self.q.get(timeout=timeout)
        except queue.Empty:
            raise RuntimeError(f"{what}: nothing within {timeout:g} s") from None
        if not line:
            raise RuntimeError(f"{what}: the process ended")
        return line


def _ready(lines, a, kind):
    line = lines.get(a.timeout, f"a {kind} process did not start")
    if line.strip() != "ready":
        raise RuntimeError(f"a {kind} process did not start: it said {line.strip()!r}")


def _run_side(a, kind, d):
    """One side: N consumers of a tensorwire producer ("shared"), N
    independent jobs, or N tensorsocket consumers of its producer."""
    me = [sys.executable, "-m", "tensorwire._bench_loader", "--samples", str(a.samples), "--batch", str(a.batch),
          "--step", str(a.step), "--workers", str(a.workers), "--threads", str(a.threads), "--device", a.device,
          "--source", a.source, "--consumers", str(a.consumers)]
    node = prod = None
    procs = []
    try:
        if kind == "shared":
            root, token = os.path.join(d, "root"), os.path.join(d, "token")
            os.makedirs(root, exist_ok=True)
            fd = os.open(token, os.O_WRONLY | os.O_CREAT, 0o600)
            os.write(fd, b"bench-secret\n")
            os.close(fd)
            # --parent: a run killed (a step's timeout) takes its node with it.
            node = subprocess.Popen([a.bin, "node", "--listen", "127.0.0.1:0", "--root", root, "--token-file", token,
                                     "--loader", f"train,producer=remote,slots={a.slots},window={a.slots}",
                                     "--parent", str(os.getpid())],
                                    stdout=subprocess.PIPE, stderr=open(os.path.join(d, "node.log"), "ab"), text=True)
            line = node.stdout.readline()
            if not line.startswith("listening on "):
                with open(os.path.join(d, "node.log")) as f:
                    raise RuntimeError(f"the node did not start: {f.read()}")
            addr = line.split()[-1]
            conn = ["--addr", addr, "--root", root, "--token", token]
            prod = _start(me + ["--role", "producer"] + conn)
            procs = [_start(me + ["--role", "consumer"] + conn) for _ in range(a.consumers)]
        elif kind == "tensorsocket":
            ports = ["--ts-ports", ",".join(str(p) for p in _free_ports(4))]
            prod = _start(me + ["--role", "ts-producer"] + ports)
            procs = [_start(me + ["--role", "ts-consumer"] + ports) for _ in range(a.consumers)]
        else:
            procs = [_start(me + ["--role", "independent"]) for _ in range(a.consumers)]
        lines = [_Lines(p) for p in procs]
        plines = _Lines(prod) if prod is not None else None
        for ln in ([plines] if kind == "shared" else []) + lines + ([plines] if kind == "tensorsocket" else []):
            _ready(ln, a, kind)  # a shared side's producer first: then its consumers can join
        node_cpu0 = _proc_cpu(node.pid) if node else 0.0
        t0 = time.monotonic()
        for p in procs + ([prod] if prod is not None else []):
            p.stdin.write("go\n")
            p.stdin.flush()
        if kind == "tensorsocket":
            # Its consumers are tensorsocket's: one that never hears of the
            # epoch's end (seen with 4 consumers) is reported as unfinished,
            # with its CPU time so far, once the producer has ended and a
            # grace period passed; it does not stop the run.
            pr = json.loads(plines.get(a.timeout, f"the {kind} producer's epoch"))
            res = []
            for p, ln in zip(procs, lines):
                try:
                    res.append(json.loads(ln.get(max(15.0, t0 + a.timeout - time.monotonic()) if not res else 15.0,
                                                 "a tensorsocket consumer's epoch")))
                except RuntimeError:
                    res.append({"role": "tensorsocket consumer", "finished": False, "samples": 0, "seconds": None,
                                "samples_per_s": 0.0, "steady_samples_per_s": 0.0, "cpu_s": _proc_cpu(p.pid),
                                "exactly_once": False})
        else:
            res = [json.loads(ln.get(a.timeout, f"a {kind} consumer's epoch")) for ln in lines]
            pr = json.loads(plines.get(a.timeout, f"the {kind} producer's epoch")) if prod is not None else None
        wall = time.monotonic() - t0
        out = {"consumers": res, "wall_s": wall}
        cpu = sum(r["cpu_s"] for r in res)
        if pr is not None:
            out["producer"] = pr
            cpu += pr["cpu_s"]
        if node is not None:
            out["node_cpu_s"] = _proc_cpu(node.pid) - node_cpu0
            cpu += out["node_cpu_s"]
        out["cpu_s"] = cpu
        return out
    finally:
        for p in procs + [prod]:
            if p is not None:
                p.kill()
                p.wait()
        if node is not None:
            node.terminate()
            node.wait()


def _have_tensorsocket():
    import importlib.util
    return importlib.util.find_spec("tensorsocket") is not None and importlib.util.find_spec("zmq") is not None


def main(argv=None):
    p = argparse.ArgumentParser(prog="python3 -m tensorwire._bench_loader", allow_abbrev=False)
    p.add_argument("--bin", default="tensorwire", help="the tensorwire command, for the node")
    p.add_argument("--samples", type=int, default=2000)
    p.add_argument("--consumers", type=int, default=4)
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--step", type=float, default=0.005, help="seconds of simulated training a batch")
    p.add_argument("--workers", type=int, default=0, help="each DataLoader's num_workers")
    p.add_argument("--slots", type=int, default=16)
    p.add_argument("--json", default="")
    p.add_argument("--device", default="", help="GPU delivery on this device (cuda:N; shm:N, the CPU stand-in)")
    p.add_argument("--source", default="transform", choices=("transform", "plain", "premade"),
                   help="what makes the batches: the DataLoader with the transform, without it, or batches made once")
    p.add_argument("--plain", action="store_true", help="the same as --source plain")
    p.add_argument("--tensorsocket", default="auto", choices=("auto", "on", "off"),
                   help="run tensorsocket's producer and consumers as a third side (auto: when importable)")
    p.add_argument("--sides", default="independent,shared,tensorsocket",
                   help="the sides to run, of independent, shared and tensorsocket (that one as --tensorsocket says)")
    p.add_argument("--timeout", type=float, default=600, help="seconds any process of a side may take to answer")
    p.add_argument("--threads", type=int, default=1, help="torch's intra-op threads in each process (0: torch's default)")
    p.add_argument("--role", default="parent")
    p.add_argument("--addr")
    p.add_argument("--root")
    p.add_argument("--token")
    p.add_argument("--ts-ports")
    a = p.parse_args(argv)
    if a.plain:
        a.source = "plain"
    if a.role != "parent":
        global _out
        _out = os.fdopen(os.dup(1), "w")
        os.dup2(2, 1)
        sys.stdout = sys.stderr
    if a.role != "parent" and a.threads > 0:
        import torch
        torch.set_num_threads(a.threads)
    roles = {"consumer": role_consumer, "producer": role_producer, "independent": role_independent,
             "ts-consumer": role_ts_consumer, "ts-producer": role_ts_producer}
    if a.role in roles:
        return roles[a.role](a)
    sides = a.sides.split(",")
    if not sides or any(x not in ("independent", "shared", "tensorsocket") for x in sides):
        print(f"--sides {a.sides!r}: want some of independent, shared and tensorsocket", file=sys.stderr)
        return 2
    ts = "tensorsocket" in sides and (a.tensorsocket == "on" or (a.tensorsocket == "auto" and _have_tensorsocket()))
    if a.tensorsocket == "on" and not _have_tensorsocket():
        print("--tensorsocket on: tensorsocket (and pyzmq) are not importable here (pip install tensorsocket)",
              file=sys.stderr)
        return 2
    d = tempfile.mkdtemp(prefix="tensorwire-bench-loader-", dir="/dev/shm" if os.path.isdir("/dev/shm") else None)
    try:
        res = {"samples": a.samples, "batch": a.batch, "step_s": a.step, "workers": a.workers,
               "device": a.device, "source": a.source, "plain": a.source == "plain",
               "consumers": a.consumers, "date": time.strftime("%Y-%m-%d", time.gmtime())}
        for side in ("independent", "shared"):
            if side in sides:
                res[side] = _run_side(a, side, d)
        if ts:
            try:
                res["tensorsocket"] = _run_side(a, "tensorsocket", d)
            except RuntimeError as e:  # its producer stuck, say: the other sides' figures stand
                res["tensorsocket_error"] = str(e)
    finally:
        shutil.rmtree(d, ignore_errors=True)
    ind, sh, tsr = res.get("independent"), res.get("shared"), res.get("tensorsocket")
    src = {"transform": "", "plain": ", no transform (--source plain)",
           "premade": ", batches made once (--source premade)"}[a.source]
    print(f"loader, Python producer: {a.samples} samples of uint8 [3, 224, 224], batch {a.batch}, "
          f"{a.step * 1000:g} ms step, {a.consumers} consumers, DataLoader num_workers={a.workers}"
          + (f", on {a.device}" if a.device else "") + src)
    print(f"{'':32} {'samples/s per consumer':>24} {'steady':>18} {'CPU s per epoch':>16} {'each sample once':>17}")
    rows = []
    if ind:
        rows.append(("independent jobs", ind))
    if sh:
        rows.append(("shared (producer " + sh["producer"]["mode"] +
                     (", " + str(sh["producer"].get("delivery")) if a.device else "") + ")", sh))
    if tsr:
        rows.append(("tensorsocket (" + ("cuda" if tsr["producer"].get("cuda") else "cpu, pickled") + ")", tsr))
    for name, r in rows:
        rates = [c["samples_per_s"] for c in r["consumers"]]
        steady = [c["steady_samples_per_s"] for c in r["consumers"]]
        once = all(c["exactly_once"] and c["samples"] == a.samples for c in r["consumers"])
        print(f"{name:32} {min(rates):>11.0f} to {max(rates):<10.0f} {min(steady):>8.0f} to {max(steady):<7.0f} "
              f"{r['cpu_s']:>16.1f} {str(once):>17}")
    if ind and sh:
        ratio = sh["cpu_s"] / ind["cpu_s"]
        slow = min(c["samples_per_s"] for c in sh["consumers"]) / min(c["samples_per_s"] for c in ind["consumers"])
        res["cpu_ratio"], res["speed_ratio"] = ratio, slow
        print(f"shared CPU / independent CPU: {ratio:.2f} (goal <= 0.4); slowest shared / slowest independent "
              f"consumer: {slow:.2f} (goal >= 1)")
    if "tensorsocket_error" in res:
        print(f"tensorsocket: no figures ({res['tensorsocket_error']})")
    if tsr:
        done = [c for c in tsr["consumers"] if c.get("finished", True)]
        if len(done) < len(tsr["consumers"]):
            print(f"tensorsocket: {len(tsr['consumers']) - len(done)} of {len(tsr['consumers'])} consumers never "
                  f"heard of the epoch's end (counted as delivering nothing)")
        # Over the whole epoch: tensorsocket hands its consumers 8 loader
        # batches a message, so its steady rate is a burst's.
        t_slow = min(c["samples_per_s"] for c in tsr["consumers"])
        res["vs_tensorsocket"] = None
        if sh and t_slow > 0:
            res["vs_tensorsocket"] = min(c["samples_per_s"] for c in sh["consumers"]) / t_slow
            print(f"slowest shared / slowest tensorsocket consumer, samples/s over the epoch: "
                  f"{res['vs_tensorsocket']:.1f}x (goal >= 10x)")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(res, f, indent=1)
    ok = all(c["exactly_once"] for side in (ind, sh) if side for c in side["consumers"])
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
