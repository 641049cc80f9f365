"""Actors asking a Go node's policy for actions: torch_spread's scenario from
Python. Each actor holds one environment state and needs the policy's
action for it; they all await the node at once (asyncio), so the node
batches their requests onto its model, where one actor asking alone would
run a forward of one row per step.

    python3 -c 'import torch; from torch import nn; from tensordict import TensorDict
    m = nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 16))
    TensorDict(m.state_dict(), batch_size=[]).memmap_("/tmp/tw/root/policy")'
    tensorwire node --listen 127.0.0.1:7070 --root /tmp/tw/root --token-file /tmp/tw/token --serve policy,params=policy
    python3 python/examples/serve_policy.py --addr 127.0.0.1:7070 --actors 64 --steps 200

It prints the steps taken per second and the node's mean batch size.
"""

import argparse
import asyncio
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import tensorwire  # noqa: E402


class ToyEnv:
    """An environment of one state: a random walk the action nudges."""

    def __init__(self, obs_size, seed):
        self.rng = np.random.default_rng(seed)
        self.obs = self.rng.normal(size=(1, obs_size)).astype(np.float32)

    def step(self, action):
        self.obs = (0.9 * self.obs + self.rng.normal(scale=0.1, size=self.obs.shape)).astype(np.float32)
        self.obs[0, action % self.obs.shape[1]] += 0.1
        return float(action % 2)  # a reward


async def actor(policy, env, steps, as_torch):
    total = 0.0
    for _ in range(steps):
        out = await policy.apredict({"obs": env.obs}, timeout=60, as_torch=as_torch)
        logits = out["logits"]
        action = int(logits.argmax()) if not as_torch else int(logits.argmax().item())
        total += env.step(action)
    return total


async def run(policy, actors, steps, as_torch):
    obs_size = policy.input_schema[0]["shape"][0]
    envs = [ToyEnv(obs_size, seed=i) for i in range(actors)]
    return await asyncio.gather(*(actor(policy, e, steps, as_torch) for e in envs))


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--addr", default="127.0.0.1:7070")
    p.add_argument("--token-file", default="/tmp/tw/token")
    p.add_argument("--root", default="/tmp/tw/root", help='the node\'s root as this machine mounts it ("": by bytes)')
    p.add_argument("--name", default="policy", help="the model's name on the node")
    p.add_argument("--actors", type=int, default=64)
    p.add_argument("--steps", type=int, default=200, help="steps per actor")
    p.add_argument("--torch", action="store_true", help="outputs as torch tensors")
    args = p.parse_args()

    token = tensorwire.read_token(args.token_file) if args.token_file else None
    with tensorwire.serve.Client(args.addr, args.name, token=token, root=args.root or None) as policy:
        if len(policy.input_schema) != 1 or policy.input_schema[0]["key"] != ["obs"] or \
                len(policy.input_schema[0]["shape"]) != 1:
            sys.exit(f"this example wants a model with one input, obs, of one dimension; "
                     f"the node's takes {policy.input_schema}")
        print(f"model {args.name!r}: mode {policy.mode}, max batch {policy.max_batch}, {args.actors} actors",
              flush=True)
        before = policy.stats()
        t0 = time.monotonic()
        returns = asyncio.run(run(policy, args.actors, args.steps, args.torch))
        took = time.monotonic() - t0
        after = policy.stats()
        batches = after["batches"] - before["batches"]
        rows = after["rows"] - before["rows"]
        print(f"{args.actors * args.steps} steps in {took:.2f}s: {args.actors * args.steps / took:,.0f} steps/s; "
              f"node: {batches} batches, mean batch {rows / max(batches, 1):.1f}; "
              f"mean return {np.mean(returns):.1f}")


if __name__ == "__main__":
    main()
