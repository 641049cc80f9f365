"""The loader benchmark with a Python producer ("tensorwire bench loader
--producer python", docs/benchmarks.md): tensorsocket's workload (uint8
[3, 224, 224] samples made and transformed in a torch DataLoader, batch 64,
a 5 ms training step) served by one tensorwire.loader.Producer to N
Python consumer processes through a node's remote loader, beside N jobs
each running the same DataLoader alone, in the same run. For each: samples/s
per consumer, the CPU seconds of every process over the epoch, and whether
each consumer saw every sample exactly once, by content.

    python3 -m tensorwire._bench_loader --bin tensorwire [--samples 2000] [--consumers 4] [--json FILE]
        [--device cuda:0] [--plain]

--device D: GPU delivery (docs/loader.md, "GPU delivery"): the producer
puts each batch on D once and the shared consumers get views of it, while
each independent job copies its own batches there (pinned, non_blocking).
--plain: samples made without the transform (a fill), so that the figures
are the delivery's rather than the DataLoader's.

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
import resource
import shutil
import subprocess
import sys
import tempfile
import time

import numpy as np

H = W = 224


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
    sys.stdout.write("ready\n")
    sys.stdout.flush()
    sys.stdin.readline()
    cpu0, t0 = _cpu_self(), time.monotonic()
    count = 0
    for b in batches():
        ids = _ids(b)
        np.add.at(seen, ids, 1)
        count += len(ids)
        time.sleep(step)
    dt = time.monotonic() - t0
    if extra is not None:
        out.update(extra())
    out.update({"samples": count, "seconds": dt, "samples_per_s": count / dt, "cpu_s": _cpu_self() - cpu0,
                "exactly_once": bool((seen == 1).all())})
    sys.stdout.write(json.dumps(out) + "\n")
    sys.stdout.flush()


def role_consumer(a):
    import torch  # noqa: F401 (a training job has it; the batches come as tensors)
    from . import loader
    c = loader.Consumer(a.addr, "train", a.batch, token=open(a.token, "rb").read().strip(), root=a.root,
                        timeout=120, device=a.device or None)
    _consume(lambda: iter(c), a.samples, a.step, {"role": "consumer"}, lambda: {"delivery": c.delivery})
    c.close()


def role_independent(a):
    import torch
    import torch.utils.data as tud
    cuda = a.device.startswith("cuda")
    dl = tud.DataLoader(_dataset(a.samples, a.plain), batch_size=a.batch, shuffle=True, num_workers=a.workers,
                        pin_memory=cuda)
    if not a.device:
        _consume(lambda: iter(dl), a.samples, a.step, {"role": "independent"})
        return
    dev = torch.device(a.device if cuda else "cpu")
    _consume(lambda: (b.to(dev, non_blocking=True) for b in dl), a.samples, a.step, {"role": "independent"})


def role_producer(a):
    import torch.utils.data as tud
    from . import loader
    dl = tud.DataLoader(_dataset(a.samples, a.plain), batch_size=a.batch, shuffle=True, num_workers=a.workers)
    cpu0 = _cpu_self()
    with loader.Producer(a.addr, "train", dl, token=open(a.token, "rb").read().strip(), root=a.root,
                         epochs=1, device=a.device or None) as p:
        p.run()
        mode, delivery = p.mode, p.delivery
    sys.stdout.write(json.dumps({"role": "producer", "cpu_s": _cpu_self() - cpu0, "mode": mode,
                                 "delivery": delivery}) + "\n")
    sys.stdout.flush()


def _start(args, **kw):
    return subprocess.Popen(args, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, **kw)


def _run_side(a, shared, d):
    """One side: N consumers of a producer (shared) or N independent jobs."""
    me = [sys.executable, "-m", "tensorwire._bench_loader", "--samples", str(a.samples), "--batch", str(a.batch),
          "--step", str(a.step), "--workers", str(a.workers), "--threads", str(a.threads), "--device", a.device] + (["--plain"] if a.plain else [])
    node = prod = None
    procs = []
    try:
        if shared:
            root, token = os.path.join(d, "root"), os.path.join(d, "token")
            os.makedirs(root, exist_ok=True)
            fd = os.open(token, os.O_WRONLY | os.O_CREAT, 0o600)
            os.write(fd, b"bench-secret\n")
            os.close(fd)
            node = subprocess.Popen([a.bin, "node", "--listen", "127.0.0.1:0", "--root", root, "--token-file", token,
                                     "--loader", f"train,producer=remote,slots={a.slots},window={a.slots}"],
                                    stdout=subprocess.PIPE, stderr=open(os.path.join(d, "node.log"), "ab"), text=True)
            line = node.stdout.readline()
            if not line.startswith("listening on "):
                with open(os.path.join(d, "node.log")) as f:
                    raise RuntimeError(f"the node did not start: {f.read()}")
            addr = line.split()[-1]
            conn = ["--addr", addr, "--root", root, "--token", token]
            procs = [_start(me + ["--role", "consumer"] + conn) for _ in range(a.consumers)]
            prod = _start(me + ["--role", "producer"] + conn)
        else:
            procs = [_start(me + ["--role", "independent"]) for _ in range(a.consumers)]
        for p in procs:
            if p.stdout.readline().strip() != "ready":
                raise RuntimeError("a consumer did not start")
        node_cpu0 = _proc_cpu(node.pid) if node else 0.0
        t0 = time.monotonic()
        for p in procs:
            p.stdin.write("go\n")
            p.stdin.flush()
        res = [json.loads(p.stdout.readline()) for p in procs]
        wall = time.monotonic() - t0
        out = {"consumers": res, "wall_s": wall}
        cpu = sum(r["cpu_s"] for r in res)
        if shared:
            pr = json.loads(prod.stdout.readline())
            out["producer"] = pr
            out["node_cpu_s"] = _proc_cpu(node.pid) - node_cpu0
            cpu += pr["cpu_s"] + out["node_cpu_s"]
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
    p.add_argument("--plain", action="store_true", help="samples without the transform: the delivery's figures")
    p.add_argument("--threads", type=int, default=1, help="torch's intra-op threads in each process (0: torch's default)")
    p.add_argument("--role", default="parent")
    p.add_argument("--addr")
    p.add_argument("--root")
    p.add_argument("--token")
    a = p.parse_args(argv)
    if a.role != "parent" and a.threads > 0:
        import torch
        torch.set_num_threads(a.threads)
    if a.role == "consumer":
        return role_consumer(a)
    if a.role == "producer":
        return role_producer(a)
    if a.role == "independent":
        return role_independent(a)
    d = tempfile.mkdtemp(prefix="tensorwire-bench-loader-", dir="/dev/shm" if os.path.isdir("/dev/shm") else None)
    try:
        res = {"samples": a.samples, "batch": a.batch, "step_s": a.step, "workers": a.workers,
               "device": a.device, "plain": a.plain,
               "consumers": a.consumers, "date": time.strftime("%Y-%m-%d", time.gmtime())}
        res["independent"] = _run_side(a, False, d)
        res["shared"] = _run_side(a, True, d)
    finally:
        shutil.rmtree(d, ignore_errors=True)
    ind, sh = res["independent"], res["shared"]
    print(f"loader, Python producer: {a.samples} samples of uint8 [3, 224, 224], batch {a.batch}, "
          f"{a.step * 1000:g} ms step, {a.consumers} consumers, DataLoader num_workers={a.workers}"
          + (f", on {a.device}" if a.device else "") + (", no transform (--plain)" if a.plain else ""))
    print(f"{'':22} {'samples/s per consumer':>24} {'CPU s per epoch':>16} {'each sample once':>17}")
    shared_name = "shared (producer " + sh["producer"]["mode"] + \
        (", " + str(sh["producer"].get("delivery")) if a.device else "") + ")"
    for name, r in (("independent jobs", ind), (shared_name, sh)):
        rates = [c["samples_per_s"] for c in r["consumers"]]
        once = all(c["exactly_once"] and c["samples"] == a.samples for c in r["consumers"])
        print(f"{name:22} {min(rates):>11.0f} to {max(rates):<10.0f} {r['cpu_s']:>16.1f} {str(once):>17}")
    ratio = sh["cpu_s"] / ind["cpu_s"]
    slow = min(c["samples_per_s"] for c in sh["consumers"]) / min(c["samples_per_s"] for c in ind["consumers"])
    res["cpu_ratio"], res["speed_ratio"] = ratio, slow
    print(f"shared CPU / independent CPU: {ratio:.2f} (goal <= 0.4); slowest shared / slowest independent "
          f"consumer: {slow:.2f} (goal >= 1)")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(res, f, indent=1)
    ok = all(c["exactly_once"] for side in (ind, sh) for c in side["consumers"])
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
