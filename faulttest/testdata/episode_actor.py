"""The fault suite's Python actor (faulttest/episodes_test.go): appends
the steps of its episodes to a replay buffer through the Python client,
one to four steps a call, and logs each call as the Go actor does, one
os.write a line: "begin EPISODE T K" before, "ack EPISODE T K" after it
returned. Prints "ready MODE", then a "stat ok=N ep=E t=T" line per call.

    episode_actor.py ADDR TOKEN_FILE ACTOR INC LOG [ROOT]

Stopped by SIGTERM (exit 0) or killed."""

import os
import random
import signal
import sys

import numpy as np

from tensorwire import replay

OBS = 4  # epObsWidth


def steps(ep, t, k):
    st = np.arange(t, t + k, dtype=np.int64)
    obs = ep * 31 + st[:, None] * 7 + np.arange(OBS, dtype=np.int64)[None, :]
    return {"episode": np.full(k, ep, np.int64), "step": st, "obs": obs}


def main():
    addr, token_file, actor, inc, log = sys.argv[1:6]
    root = sys.argv[6] if len(sys.argv) > 6 else None
    actor, inc = int(actor), int(inc)
    stop = []
    signal.signal(signal.SIGTERM, lambda *_: stop.append(1))
    with open(token_file, "rb") as f:
        token = f.read().rstrip(b"\r\n")
    fd = os.open(log, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    b = replay.Buffer(addr, "rb", token=token, root=root, timeout=60)
    print("ready", b.mode, flush=True)
    rng = random.Random()
    ok, n = 0, 0
    while not stop:
        ep = (actor + 1) << 40 | inc << 20 | n
        n += 1
        length, t = rng.randint(20, 80), 0
        while t < length and not stop:
            k = min(rng.randint(1, 4), length - t)
            os.write(fd, f"begin {ep} {t} {k}\n".encode())
            b.extend(steps(ep, t, k))
            if stop:
                break  # this call's fate is the test's unknown, as if killed
            os.write(fd, f"ack {ep} {t} {k}\n".encode())
            ok += 1
            t += k
            print(f"stat ok={ok} ep={ep} t={t}", flush=True)
    b.close()


if __name__ == "__main__":
    main()
