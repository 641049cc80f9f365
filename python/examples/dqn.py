"""A DQN-style loop in PyTorch over a Go node's replay buffer.

Actor processes play a small environment with an epsilon-greedy copy of the
Q-network and extend the buffer with their transitions; the learner samples
batches from it (by reference when it shares the node's root: the rows come
out of the shared mapping, not over the network), takes a TD step against a
target network, and feeds the TD errors back as priorities. The actors pick
up the learner's weights from a file it publishes now and then.

Start a node with a prioritized buffer, then run this against it:

    mkdir -p /tmp/tw/root; (umask 077; head -c 32 /dev/urandom | base64 > /tmp/tw/token)
    go run ./cmd/tensorwire node --listen 127.0.0.1:7070 --root /tmp/tw/root --token-file /tmp/tw/token \\
        --buffer dqn,capacity=100000,sampler=prioritized,min-size=1000
    python3 python/examples/dqn.py --addr 127.0.0.1:7070 --token-file /tmp/tw/token --root /tmp/tw/root

The environment is a corridor of N cells: the agent starts in the middle,
moves left or right, and gets 1 for reaching the right end and 0 otherwise;
an episode ends at either end or after 4N steps. A learned policy walks
right; the script prints the return of the greedy policy as it learns.
"""

import argparse
import multiprocessing as mp
import os
import sys
import time

import numpy as np

try:
    import torch
    from torch import nn
except ImportError:  # pragma: no cover
    sys.exit("this example needs PyTorch (apt-get install python3-torch)")

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import tensorwire  # noqa: E402

N = 10  # corridor length
OBS = N  # one-hot position


class Corridor:
    def __init__(self, rng):
        self.rng = rng
        self.reset()

    def reset(self):
        self.pos, self.t = N // 2, 0
        return self.obs()

    def obs(self):
        o = np.zeros(OBS, np.float32)
        o[self.pos] = 1
        return o

    def step(self, a):
        self.pos += 1 if a == 1 else -1
        self.t += 1
        reward = 1.0 if self.pos == N - 1 else 0.0
        done = self.pos in (0, N - 1) or self.t >= 4 * N
        return self.obs(), reward, done


def qnet():
    return nn.Sequential(nn.Linear(OBS, 64), nn.ReLU(), nn.Linear(64, 2))


def load_weights(net, path):
    try:
        net.load_state_dict(torch.load(path))
    except (OSError, RuntimeError, EOFError):
        pass  # not published yet, or being replaced


def actor(i, args, stop):
    """Plays with an epsilon-greedy policy; extends the buffer with batches
    of transitions (obs, action, reward, next/obs, next/done)."""
    torch.set_num_threads(1)
    rng = np.random.default_rng(i)
    env, net = Corridor(rng), qnet()
    buf = tensorwire.replay.Buffer(args.addr, args.buffer, token=tensorwire.read_token(args.token_file),
                                   root=args.root or None)
    obs, eps, rows = env.reset(), 0.5, []
    while not stop.is_set():
        with torch.no_grad():
            a = int(net(torch.from_numpy(obs)).argmax()) if rng.random() > eps else int(rng.integers(2))
        nxt, r, done = env.step(a)
        rows.append((obs, a, r, nxt, done))
        obs = env.reset() if done else nxt
        if len(rows) == args.actor_batch:
            o, a, r, n, d = zip(*rows)
            buf.extend({"obs": np.stack(o), "action": np.array(a, np.int64), "reward": np.array(r, np.float32),
                        "next": {"obs": np.stack(n), "done": np.array(d)}})
            rows = []
            load_weights(net, args.weights)
            eps = max(0.05, eps * 0.98)
    buf.close()


def greedy_return(net):
    env = Corridor(np.random.default_rng(0))
    obs, total = env.reset(), 0.0
    for _ in range(4 * N):
        with torch.no_grad():
            obs, r, done = env.step(int(net(torch.from_numpy(obs)).argmax()))
        total += r
        if done:
            break
    return total


def learn(args):
    token = tensorwire.read_token(args.token_file)
    buf = tensorwire.replay.Buffer(args.addr, args.buffer, token=token, root=args.root or None, prefetch=True)
    print(f"buffer {args.buffer!r}: mode {buf.mode}", flush=True)
    net, target = qnet(), qnet()
    target.load_state_dict(net.state_dict())
    opt = torch.optim.Adam(net.parameters(), lr=1e-3)
    torch.save(net.state_dict(), args.weights)
    stop = mp.get_context("spawn").Event()
    actors = [mp.get_context("spawn").Process(target=actor, args=(i, args, stop)) for i in range(args.actors)]
    for p in actors:
        p.start()
    try:
        t0 = time.monotonic()
        for step in range(1, args.steps + 1):
            batch, info = buf.sample(args.batch, timeout=120, as_torch=True)
            q = net(batch["obs"]).gather(1, batch["action"].view(-1, 1)).squeeze(1)
            with torch.no_grad():
                nq = target(batch["next"]["obs"]).max(1).values
                y = batch["reward"] + args.gamma * nq * (~batch["next"]["done"]).float()
            td = y - q
            w = torch.from_numpy(info.weights).float()  # importance weights of prioritized sampling
            loss = (w * td.pow(2)).mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
            buf.update_priority(info, td.detach().abs().numpy().astype(np.float64) + 1e-3)
            if step % args.target_every == 0:
                target.load_state_dict(net.state_dict())
                tmp = args.weights + ".tmp"
                torch.save(net.state_dict(), tmp)
                os.replace(tmp, args.weights)
            if step % args.log_every == 0 or step == args.steps:
                st = buf.stats()
                print(f"step {step}: loss {loss.item():.4f}, greedy return {greedy_return(net):.0f}, "
                      f"buffer {st['size']} transitions, {step * args.batch / (time.monotonic() - t0):.0f} sampled/s",
                      flush=True)
    finally:
        stop.set()
        for p in actors:
            p.join(60)
        buf.close()
    return greedy_return(net)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--addr", default="127.0.0.1:7070")
    p.add_argument("--token-file", default="/tmp/tw/token")
    p.add_argument("--root", default="/tmp/tw/root", help='the node\'s root as this machine mounts it ("": by bytes)')
    p.add_argument("--buffer", default="dqn")
    p.add_argument("--actors", type=int, default=2)
    p.add_argument("--actor-batch", type=int, default=32)
    p.add_argument("--steps", type=int, default=2000)
    p.add_argument("--batch", type=int, default=128)
    p.add_argument("--gamma", type=float, default=0.9)
    p.add_argument("--target-every", type=int, default=100)
    p.add_argument("--log-every", type=int, default=500)
    p.add_argument("--weights", default="", help="where the learner publishes its weights for the actors")
    args = p.parse_args()
    if not args.weights:
        args.weights = os.path.join(args.root or "/tmp", f"{args.buffer}-weights.pt")
    ret = learn(args)
    print(f"final greedy return: {ret:.0f}")


if __name__ == "__main__":
    main()
