"""Sequence helpers over a replay buffer: n-step returns computed at sample
time over slices (torchrl's MultiStepTransform, Acme's n-step adder), and a
torch IterableDataset over a buffer (torchrl's as_dataset, Reverb's
dataset). docs/replay.md, "Trajectories and slices".

numpy only; torch is imported when a dataset is iterated."""

import collections
import threading
import time

import numpy as np

from .errors import ClientClosedError, DeadlineExceededError, UnavailableError
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
    item's "mask" and "episodes" come with it).

    prefetch=N (torchrl's ReplayBuffer(prefetch=N)): while the consumer
    works on an item, one thread per iteration samples up to N items ahead;
    never more than N are taken from the buffer and not yet handed out
    (they count as sampled: the rate limiter, max_times_sampled and an
    epoch without replacement see them when they are taken). The thread
    blocks, never spins: on a condition while N items wait, and in the call
    while the node waits for data. When the iteration stops (the loop
    breaks, the iterator is closed or collected, an error is raised) the
    thread is told to stop and joined before the iterator's close returns;
    a call it is in then ends by itself within about a second (it waits for
    the node in calls of at most _WAIT seconds, asked again while the
    iteration lasts), or at once when the dataset made the buffer (the
    buffer is closed). A closed buffer ends the iteration; any other error
    of a sample is raised in the consumer, after the items fetched before
    it.

    source: a tensorwire.replay.Buffer, or a function returning a new one
    (for DataLoader workers, each of which opens its own connection; the
    dataset closes it when the iteration stops). timeout: seconds a sample
    may wait for the buffer (None: as long as it takes). The dataset is
    endless, as torchrl's and Reverb's are."""

    _WAIT = 1.0  # the longest the thread's calls wait, so that it sees a stop
    _JOIN = 60.0  # a hang guard on joining the thread

    def __init__(self, source, batch_size, slice_len=None, num_slices=None, strict_length=True, prefetch=2,
                 timeout=None):
        if prefetch < 1:
            raise ValueError(f"prefetch={prefetch}: want at least 1")
        self.source, self.batch_size, self.prefetch, self.timeout = source, batch_size, prefetch, timeout
        self.slices = None
        if slice_len is not None or num_slices is not None:
            self.slices = dict(slice_len=slice_len, num_slices=num_slices, strict_length=strict_length)

    def _sample(self, buf, timeout):
        if self.slices is None:
            batch, info = buf.sample(self.batch_size, timeout=timeout, as_torch=True)
            batch["info"] = info
            return batch
        batch, info = buf.sample_slices(self.batch_size, timeout=timeout, as_torch=True, **self.slices)
        import torch
        batch["mask"] = torch.from_numpy(info.mask)
        batch["info"] = info
        return batch

    def _sample_until(self, buf, ahead):
        """A sample, asked in calls of at most _WAIT seconds until one is
        served, the dataset's timeout passes, or the iteration stops
        (_Stopped)."""
        deadline = None if self.timeout is None else time.monotonic() + self.timeout
        while True:
            left = None if deadline is None else deadline - time.monotonic()
            try:
                return self._sample(buf, self._WAIT if left is None else max(min(left, self._WAIT), 0.0))
            except ClientClosedError:
                raise  # the connection was closed: at once, each time
            except (DeadlineExceededError, UnavailableError):
                if ahead.stopped:
                    raise _Stopped from None
                if left is not None and left <= self._WAIT:
                    raise

    def _fetch(self, buf, ahead):
        # Every way out but a stopped iteration (which reads no more) puts
        # an item, so the consumer's get never waits for a thread gone.
        while ahead.reserve():
            try:
                item = self._sample_until(buf, ahead)
            except _Stopped:
                return
            except (ClosedError, ClientClosedError):
                ahead.put(_END)
                return
            except BaseException as e:  # handed to the consumer
                ahead.put(e)
                return
            ahead.put(item)

    def __iter__(self):
        owned = callable(self.source)
        buf = self.source() if owned else self.source
        ahead = _Ahead(self.prefetch)
        t = threading.Thread(target=self._fetch, args=(buf, ahead), name="tensorwire-replay-prefetch", daemon=True)
        t.start()
        try:
            while True:
                item = ahead.get()
                if item is _END:
                    return
                if isinstance(item, BaseException):
                    raise item
                yield item
        finally:
            ahead.stop()
            if owned:
                buf.close()  # a call in flight ends at once
            t.join(self._JOIN)


class _Stopped(Exception):
    """The iteration stopped while the thread waited for a sample."""


_END = object()  # the buffer was closed: the iteration ends


class _Ahead:
    """The items fetched ahead: at most n taken and not handed out. The
    thread reserves a place before it samples, so the bound counts the
    sample in flight too."""

    def __init__(self, n):
        self._n = n
        self._items = collections.deque()
        self._taken = 0  # places reserved: items waiting, and the one being sampled
        self._cv = threading.Condition()
        self.stopped = False

    def reserve(self):
        """Waits for a place; False once the iteration has stopped."""
        with self._cv:
            while self._taken >= self._n and not self.stopped:
                self._cv.wait()
            if self.stopped:
                return False
            self._taken += 1
            return True

    def put(self, item):
        with self._cv:
            self._items.append(item)
            self._cv.notify_all()

    def get(self):
        with self._cv:
            while not self._items:
                self._cv.wait()
            self._taken -= 1
            self._cv.notify_all()
            return self._items.popleft()

    def stop(self):
        with self._cv:
            self.stopped = True
            self._cv.notify_all()


def _as_iterable_dataset():
    """Makes ReplayDataset a torch IterableDataset when torch is there."""
    global ReplayDataset
    try:
        from torch.utils.data import IterableDataset
    except ImportError:
        return
    ReplayDataset = type("ReplayDataset", (ReplayDataset, IterableDataset), {"__doc__": ReplayDataset.__doc__})


_as_iterable_dataset()
