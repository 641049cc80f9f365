"""Trajectories and slices from Python against real Go nodes: actors
append steps of their episodes interleaved; sample_slices returns slices of
one episode's consecutive steps (strict, or padded and masked); n-step
returns at sample time equal a plain computation over the stored episodes;
the node killed (kill -9) mid-episode knows every committed step's episode
when it starts again; the IterableDataset; and replay.sample_slices's golden
bytes (replay/testdata/wire/controls.hex)."""

import os
import threading
import time
import unittest

import numpy as np

from tensorwire import _msgpack, errors, replay
from tensorwire.replay_seq import ReplayDataset, nstep_returns

from nodes import REPO, TOKEN, Node
from test_golden_services import parse
from test_replay import MODES, dial

try:
    import torch
except ImportError:
    torch = None


def reward_of(ep, t):
    return float((ep * 31 + t * 7) % 13) - 6.0


def steps(ep, start, stop, length):
    """Steps [start, stop) of episode ep of `length` steps: every field says
    which step it is; done on the last."""
    t = np.arange(start, stop, dtype=np.int64)
    n = len(t)
    return {
        "obs": np.broadcast_to(((ep * 7 + t) % 251).astype(np.uint8)[:, None], (n, 6)).copy(),
        "episode": np.full(n, ep, np.int64),
        "step": t,
        "next": {"reward": np.array([reward_of(ep, x) for x in t], np.float32), "done": t == length - 1},
    }


def check_slices(test, td, info, slice_len, strict=True):
    """Each slice: one episode, consecutive steps, no torn step; padding
    (mask False) zero, at the end."""
    eps, st = td["episode"], td["step"]
    for s in range(len(info.episodes)):
        rows = slice(s * slice_len, (s + 1) * slice_len)
        m = info.mask[rows]
        k = int(m.sum())
        test.assertTrue(m[:k].all() and not m[k:].any(), m)
        if strict:
            test.assertEqual(k, slice_len)
        test.assertTrue((eps[rows][:k] == info.episodes[s]).all())
        np.testing.assert_array_equal(np.diff(st[rows][:k]), np.ones(k - 1, np.int64))
        ok = td["obs"][rows][:k] == ((eps[rows][:k] * 7 + st[rows][:k]) % 251).astype(np.uint8)[:, None]
        test.assertTrue(ok.all())
        test.assertTrue((td["obs"][rows][k:] == 0).all() and (eps[rows][k:] == 0).all())


def plain_nstep(ep, t, length, gamma, n, slice_end):
    """The n-step return of step t of episode ep, by a plain loop over the
    episode as written, cut at its end and at slice_end (its slice's last
    step + 1)."""
    g, scale, m = 0.0, 1.0, 0
    for k in range(n):
        if t + k >= min(length, slice_end):
            break
        g += scale * reward_of(ep, t + k)
        scale *= gamma
        m += 1
    terminal = t + m - 1 == length - 1
    return g, (0.0 if terminal else gamma ** m), m


class TestSlices(unittest.TestCase):
    fills = 0

    @classmethod
    def setUpClass(cls):
        cls.node = Node(buffers=[f"seq-{m},capacity=400,traj-key=episode" for m in MODES] +
                        ["plain,capacity=10", "ds,capacity=200,traj-key=episode",
                         "pri,capacity=100,traj-key=episode,sampler=prioritized,alpha=1,beta=1",
                         "hot,capacity=48,traj-key=episode"]).start()

    @classmethod
    def tearDownClass(cls):
        cls.node.close()

    def fill(self, b, lengths):
        """Three actors append their episodes, 1 to 4 steps a call,
        interleaved; returns {episode: length}."""
        eps = {}
        TestSlices.fills += 1
        base = 100000 * TestSlices.fills  # episode keys unique per fill

        def actor(a):
            rng = np.random.default_rng(a)
            for i, length in enumerate(lengths[a::3]):
                ep = base + 1000 * (a + 1) + i
                eps[ep] = length
                t = 0
                while t < length:
                    k = min(int(rng.integers(1, 5)), length - t)
                    b.extend(steps(ep, t, t + k, length))
                    t += k

        ts = [threading.Thread(target=actor, args=(a,)) for a in range(3)]
        for t in ts:
            t.start()
        for t in ts:
            t.join(120)
        return eps

    def test_slices_and_nstep(self):
        for mode in MODES:
            with self.subTest(mode=mode), dial(self.node, f"seq-{mode}", mode) as b:
                lengths = [3, 9, 20, 30, 5, 12, 40, 8, 2, 25, 17, 33]  # 204 steps: no overwrite yet
                eps = self.fill(b, lengths)
                td, info = b.sample_slices(batch_size=256, slice_len=8)
                self.assertEqual(len(info.episodes), 32)
                check_slices(self, td, info, 8)
                self.assertTrue(all(eps[e] >= 8 for e in info.episodes))
                td, info = b.sample_slices(num_slices=64, slice_len=8, strict_length=False)
                check_slices(self, td, info, 8, strict=False)
                self.assertTrue(any(eps[e] < 8 for e in info.episodes))
                # n-step returns at sample time against a plain computation.
                gamma, n = 0.9, 3
                out = nstep_returns(td["next"]["reward"], td["next"]["done"], gamma, n, 8, mask=info.mask)
                for row in range(len(info.mask)):
                    if not info.mask[row]:
                        self.assertEqual((out["return"][row], out["steps"][row]), (0, 0))
                        continue
                    ep, t = int(td["episode"][row]), int(td["step"][row])
                    first = int(td["step"][row - row % 8])
                    g, disc, m = plain_nstep(ep, t, eps[ep], gamma, n, first + 8)
                    self.assertAlmostEqual(out["return"][row], g, places=5)
                    self.assertAlmostEqual(out["discount"][row], disc, places=12)
                    self.assertEqual(out["steps"][row], m)
                    self.assertEqual(td["step"][out["last"][row]], t + m - 1)
                # Wrap-around: 300 more steps overwrite the oldest.
                eps.update(self.fill(b, [50, 50, 50, 50, 50, 50]))
                for _ in range(5):
                    td, info = b.sample_slices(batch_size=256, num_slices=16)
                    check_slices(self, td, info, 16)
                with self.assertRaises(replay.ArgumentError):
                    b.sample_slices(batch_size=100, slice_len=8)
                with self.assertRaises(replay.ArgumentError):
                    b.sample_slices(slice_len=8)

    def test_slices_into(self):
        """sample_slices_into writes the slices into the caller's batch, filled
        with garbage first: whole slices, padding zeroed, in dst's own arrays
        (torch tensors too); a batch of another size is an ArgumentError, and
        a batch of another schema a SchemaError."""
        for mode in MODES:
            with self.subTest(mode=mode), dial(self.node, f"seq-{mode}", mode) as b:
                self.fill(b, [3, 9, 20, 30, 5, 12])
                dst, _ = b.sample_slices(num_slices=16, slice_len=4, strict_length=False)
                obs = dst["obs"]
                for strict in (True, False, False):
                    for path in (("obs",), ("episode",), ("step",), ("next", "reward")):
                        a = dst
                        for k in path:
                            a = a[k]
                        a[...] = 77
                    info = b.sample_slices_into(dst, slice_len=4, strict_length=strict)
                    self.assertIs(dst["obs"], obs)
                    self.assertEqual(len(info.episodes), 16)
                    check_slices(self, dst, info, 4, strict=strict)
                info = b.sample_slices_into(dst, num_slices=8)  # 8 slices of 8 steps
                check_slices(self, dst, info, 8)
                if torch is not None:
                    tdst = {k: torch.from_numpy(v) if not isinstance(v, dict) else
                            {kk: torch.from_numpy(vv) for kk, vv in v.items()} for k, v in dst.items()}
                    tdst["obs"].fill_(5)
                    info = b.sample_slices_into(tdst, slice_len=4, strict_length=False)
                    check_slices(self, dst, info, 4, strict=False)  # the tensors share dst's arrays
                with self.assertRaises(replay.ArgumentError):
                    b.sample_slices_into(dst, slice_len=5)
                with self.assertRaises(replay.ArgumentError):
                    b.sample_slices_into(dst, slice_len=4, num_slices=3)
                wrong = dict(dst, obs=dst["obs"].astype(np.int16))
                with self.assertRaises(replay.SchemaError):
                    b.sample_slices_into(wrong, slice_len=4)

    def test_prioritized(self):
        """Start steps by priority among those that can start a slice, rows
        weighted by their start (torchrl's PrioritizedSliceSampler)."""
        with dial(self.node, "pri", "ref") as b:
            idx = b.extend(steps(1, 0, 10, 10))
            b.extend(steps(2, 0, 10, 10))
            p = np.ones(10)
            p[3], p[8] = 100.0, 1000.0  # step 8 starts no slice of 4
            b.update_priority(replay.SampleInfo(idx, np.ones(10, np.uint64), np.ones(10)), p)
            td, info = b.sample_slices(num_slices=2000, slice_len=4, prioritized=True)
            check_slices(self, td, info, 4)
            starts = td["step"][::4]
            self.assertTrue((starts <= 6).all())
            hot = (starts == 3) & (info.episodes == 1)
            self.assertTrue(1620 < hot.sum() < 1920, hot.sum())  # 100/113 of 2000: 1770
            np.testing.assert_allclose(info.weights[::4][hot], 0.01)
            np.testing.assert_allclose(info.weights[::4][~hot], 1.0)
        with dial(self.node, "ds", "bytes") as b, self.assertRaises(replay.ArgumentError):
            b.sample_slices(num_slices=1, slice_len=1, prioritized=True)

    def test_without_replacement(self):
        """An epoch cuts every episode into slices and returns each once:
        no step twice."""
        with Node(buffers=["wr,capacity=100,traj-key=episode"]) as node, dial(node, "wr", "bytes") as b:
            for ep, n in ((1, 10), (2, 7), (3, 12)):
                b.extend(steps(ep, 0, n, n))
            for _ in range(2):  # two epochs of 3 + 2 + 4 slices of 3
                td, info = b.sample_slices(num_slices=9, slice_len=3, without_replacement=True)
                check_slices(self, td, info, 3)
                keys = set(zip(td["episode"].tolist(), td["step"].tolist()))
                self.assertEqual(len(keys), 27)

    def test_never_torn_by_reference(self):
        """Writers overwrite a 48-step buffer while this client gathers
        slices from its own mapping: every slice whole, one episode."""
        stop = threading.Event()
        errs = []

        def writer(a):
            try:
                with dial(self.node, "hot", "bytes") as w:
                    ep = a
                    while not stop.is_set():
                        for t in range(0, 12, 3):
                            w.extend(steps(ep, t, t + 3, 12), timeout=30)
                        ep += 3
            except Exception as e:  # reported below
                errs.append(e)

        ts = [threading.Thread(target=writer, args=(a,)) for a in range(1, 3)]
        for t in ts:
            t.start()
        try:
            with dial(self.node, "hot", "ref") as b:
                end = time.monotonic() + 2
                n = 0
                while time.monotonic() < end:
                    try:
                        td, info = b.sample_slices(num_slices=4, slice_len=6, timeout=30)
                    except replay.ContendedError:
                        continue  # overwritten again and again: nothing returned, as documented
                    check_slices(self, td, info, 6)
                    n += 1
                self.assertGreater(n, 0)
        finally:
            stop.set()
            for t in ts:
                t.join(60)
        self.assertEqual(errs, [])

    def test_slices_ahead(self):
        """slices_ahead=4 by reference: the first call asks the node for
        four samples' slices (the node counts them at once) and the next
        three are served from them; the fifth asks again; another spec asks
        the node; slices all overwritten before use are sampled again, from
        the new episodes only. As Go's TestClient_SlicesAhead*."""
        with Node(buffers=["ahead,capacity=4096,traj-key=episode", "ahead-hot,capacity=64,traj-key=episode"]) as node:
            with dial(node, "ahead", "ref", slices_ahead=4) as b:
                for ep in range(1, 21):
                    b.extend(steps(ep, 0, 40, 40))
                base = b.stats()["sampled"]
                per = 8 * 3
                for call in range(1, 6):
                    td, info = b.sample_slices(num_slices=3, slice_len=8)
                    check_slices(self, td, info, 8)
                    want = 8 * per if call == 5 else 4 * per
                    self.assertEqual(b.stats()["sampled"] - base, want, f"after call {call}")
                td, info = b.sample_slices(num_slices=2, slice_len=4)
                check_slices(self, td, info, 4)
                self.assertEqual(b.stats()["sampled"] - base, 8 * per + 4 * (4 * 2))
            with dial(node, "ahead-hot", "ref", slices_ahead=8) as b:
                for ep in range(1, 5):
                    b.extend(steps(ep, 0, 16, 16))
                b.sample_slices(num_slices=2, slice_len=8)  # seven samples' slices left
                for ep in range(11, 15):  # every slot rewritten
                    b.extend(steps(ep, 0, 16, 16))
                for _ in range(7):
                    td, info = b.sample_slices(num_slices=2, slice_len=8)
                    check_slices(self, td, info, 8)
                    self.assertTrue(all(11 <= e <= 14 for e in info.episodes), info.episodes)
                self.assertGreater(b.resampled, 0)
        with self.assertRaises(replay.ArgumentError):
            dial(self.node, "plain", "ref", slices_ahead=-1)

    def test_no_trajectory_key(self):
        with dial(self.node, "plain", "bytes") as b:
            with self.assertRaises(replay.ArgumentError):
                b.sample_slices(num_slices=1, slice_len=1)

    @unittest.skipIf(torch is None, "torch is not installed")
    def test_dataset(self):
        with dial(self.node, "ds", "ref") as b:
            self.fill(b, [20, 20, 20])
            ds = b.as_dataset(64, slice_len=4)
            self.assertIsInstance(ds, torch.utils.data.IterableDataset)
            for i, item in enumerate(ds):
                self.assertIsInstance(item["obs"], torch.Tensor)
                self.assertEqual(tuple(item["obs"].shape), (64, 6))
                check_slices(self, {k: v.numpy() for k, v in item.items() if k in ("obs", "episode", "step")},
                             item["info"], 4)
                if i == 4:
                    break
            rows = next(iter(ReplayDataset(b, 32, prefetch=1)))
            self.assertEqual(tuple(rows["step"].shape), (32,))


class TestKilledMidEpisode(unittest.TestCase):
    def test_restart_knows_episodes(self):
        """kill -9 of the node in the middle of episodes: started again, it
        knows every committed step's episode, and the steps written after
        the restart continue them: a slice spans both."""
        with Node(buffers=["seq,capacity=100,traj-key=episode"]) as node:
            with dial(node, "seq", "ref") as b:
                b.extend(steps(1, 0, 6, 12))
                b.extend(steps(2, 0, 3, 12))
                b.extend(steps(1, 6, 8, 12))
                node.kill()
                node.start()
                b.extend(steps(2, 3, 12, 12))
                b.extend(steps(1, 8, 12, 12))
                td, info = b.sample_slices(num_slices=40, slice_len=12)
                check_slices(self, td, info, 12)
                self.assertEqual(set(info.episodes.tolist()), {1, 2})
                for s in range(40):
                    np.testing.assert_array_equal(td["step"][s * 12:(s + 1) * 12], np.arange(12))


class TestSlicesGolden(unittest.TestCase):
    def test_bytes(self):
        with open(os.path.join(REPO, "replay", "testdata", "wire", "controls.hex")) as f:
            g = parse(f.read())[1]
        self.assertEqual(_msgpack.packb(replay._slices_request("buf", 2, 2, False, True)), g["replay.sample_slices request"])
        r = _msgpack.unpackb(g["replay.sample_slices response, rows left out"])
        info = replay.SliceInfo._from_wire(r, 2)
        np.testing.assert_array_equal(info.indices, [4, 5, 9, -1])
        np.testing.assert_array_equal(info.mask, [True, True, True, False])
        np.testing.assert_array_equal(info.episodes, [7, 8])
        self.assertEqual(_msgpack.packb(replay._slices_request("buf", 2, 2, False, True, by_bytes=False, packed=True)),
                         g["replay.sample_slices request, packed"])
        packed = replay.SliceInfo._from_wire(_msgpack.unpackb(g["replay.sample_slices response, packed picks"]), 2)
        np.testing.assert_array_equal(packed.indices, [4, 5, 9, -1])
        np.testing.assert_array_equal(packed.ids, [1, 1, 2, 0])
        np.testing.assert_array_equal(packed.weights, [1, 0.5, 1, 1])
        np.testing.assert_array_equal(packed.mask, [True, True, True, False])
        np.testing.assert_array_equal(packed.episodes, [7, 8])
        self.assertEqual(replay._slice_shape(256, 32, None), (32, 8))
        self.assertEqual(replay._slice_shape(256, None, 8), (32, 8))
        self.assertEqual(replay._slice_shape(None, 4, 2), (4, 2))


if __name__ == "__main__":
    unittest.main()
