"""Sequence helpers over a replay buffer: n-step returns computed at sample
time over slices (torchrl's MultiStepTransform, Acme's n-step adder), and a
torch IterableDataset over a buffer (torchrl's as_dataset, Reverb's
dataset). docs/replay.md, "Trajectories and slices".

numpy only; torch is imported when a dataset is iterated."""

import queue
import threading

import numpy as np

from .replay import ClosedError

__all__ = ["nstep_returns", "ReplayDataset"]


def nstep_returns(reward, done, gamma, n, slice_len, mask=None):
    """n-step returns over a sample of slices (Buffer.sample_slices), so that
    writers store single steps. reward, done: arrays of num_slices*slice_len
    rows (done: the step ended its episode, terminated or truncated), mask:
    SliceInfo.mask (None: every row a step). For each step t:

        return[t]   = sum_{k<m} gamma^k reward[t+k]
        discount[t] = gamma^m, or 0 when the m steps end in a terminal step
        steps[t]    = m = min(n, steps to the end of its episode (done
                      included), steps to the end of its slice)
        last[t]     = t+m-1, the row whose next observation bootstraps

    m is cut at the end of the slice as well as at the episode's end, as
    torchrl's MultiStepTransform cuts at the end of its batch: a slice of L
    steps gives full n-step returns for its first L-n+1 steps. Padding rows
    (mask False) get 0, 0, 0 and their own row. Returns a dict of arrays
    "return" (float64), "discount" (float64), "steps" (int64), "last"
    (int64)."""
    r = np.asarray(reward, dtype=np.float64).reshape(-1)
    d = np.asarray(done).reshape(-1).astype(bool)
    if r.shape != d.shape or len(r) % slice_len:
        raise ValueError(f"reward {r.shape} and done {d.shape}: want the same, a multiple of slice_len {slice_len}")
    if n < 1:
        raise ValueError(f"n={n}: want at least 1")
    m = np.ones(len(r), bool) if mask is None else np.asarray(mask, bool).reshape(-1)
    ret = np.zeros(len(r))
    disc = np.zeros(len(r))
    steps = np.zeros(len(r), np.int64)
    last = np.arange(len(r), dtype=np.int64)
    # Vectorised over the rows: add step k of each window while it lasts.
    alive = m.copy()  # the window of row t still grows
    scale = np.ones(len(r))
    pos = np.arange(len(r))
    end = (pos // slice_len + 1) * slice_len  # one past the slice's last row
    for k in range(n):
        j = pos + k
        ok = alive & (j < end)
        ok[ok] &= m[j[ok]]
        ret[ok] += scale[ok] * r[j[ok]]
        steps[ok] += 1
        last[ok] = j[ok]
        scale[ok] *= gamma
        ended = np.zeros(len(r), bool)
        ended[ok] = d[j[ok]]
        alive = ok & ~ended
    disc[m] = scale[m]
    terminal = m & d[last]
    disc[terminal] = 0.0
    return {"return": ret, "discount": disc, "steps": steps, "last": last}


class ReplayDataset:
    """A torch IterableDataset over a replay buffer: each item is a sample,
    a dict of torch tensors, of batch_size transitions (Buffer.sample) or,
    with slice_len or num_slices, of slices (Buffer.sample_slices; the
    item's "mask" and "episodes" come with it). One thread fetches up to
    `prefetch` samples ahead into a queue; it blocks, never spins, and
    stops when the iteration stops or the buffer is closed.

    source: a tensorwire.replay.Buffer, or a function returning a new one
    (for DataLoader workers, each of which opens its own connection). The
    dataset is endless, as torchrl's and Reverb's are."""

    def __init__(self, source, batch_size, slice_len=None, num_slices=None, strict_length=True, prefetch=2,
                 timeout=None):
        if prefetch < 1:
            raise ValueError(f"prefetch={prefetch}: want at least 1")
        self.source, self.batch_size, self.prefetch, self.timeout = source, batch_size, prefetch, timeout
        self.slices = None
        if slice_len is not None or num_slices is not None:
            self.slices = dict(slice_len=slice_len, num_slices=num_slices, strict_length=strict_length)

    def _sample(self, buf):
        if self.slices is None:
            batch, info = buf.sample(self.batch_size, timeout=self.timeout, as_torch=True)
            batch["info"] = info
            return batch
        batch, info = buf.sample_slices(self.batch_size, timeout=self.timeout, as_torch=True, **self.slices)
        import torch
        batch["mask"] = torch.from_numpy(info.mask)
        batch["info"] = info
        return batch

    def __iter__(self):
        owned = callable(self.source)
        buf = self.source() if owned else self.source
        q = queue.Queue(maxsize=self.prefetch)
        stop = threading.Event()

        def fetch():
            while not stop.is_set():
                try:
                    item = self._sample(buf)
                except ClosedError:
                    return
                except BaseException as e:  # handed to the consumer
                    item = e
                while not stop.is_set():
                    try:
                        q.put(item, timeout=0.5)
                        break
                    except queue.Full:
                        continue
                if isinstance(item, BaseException):
                    return

        t = threading.Thread(target=fetch, name="tensorwire-replay-prefetch", daemon=True)
        t.start()
        try:
            while True:
                item = q.get()
                if isinstance(item, BaseException):
                    raise item
                yield item
        finally:
            stop.set()
            if owned:
                buf.close()
            t.join(timeout=1.0 if owned else 0.0)


def _as_iterable_dataset():
    """Makes ReplayDataset a torch IterableDataset when torch is there."""
    global ReplayDataset
    try:
        from torch.utils.data import IterableDataset
    except ImportError:
        return
    ReplayDataset = type("ReplayDataset", (ReplayDataset, IterableDataset), {"__doc__": ReplayDataset.__doc__})


_as_iterable_dataset()
