"""A Python trainer publishes module.state_dict() to a node's store; Python
replicas following it (Replica(follow=(store, name))) switch between two
batches and every answer says its version; the node's Go MLP serving the
same parameter set computes the same outputs from the same files."""

import unittest

import numpy as np

from tensorwire import serve, store

from nodes import Node, wait_until

try:
    import torch
except ImportError:
    torch = None


def mlp(seed):
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(), torch.nn.Linear(256, 16))


def state(module):
    return {k: v.detach().numpy().copy() for k, v in module.state_dict().items()}


@unittest.skipIf(torch is None, "torch is not installed in this interpreter")
class TestReplicaWeights(unittest.TestCase):
    def test_follow(self):
        node = Node(extra=["--store", "main",
                           "--serve", "policy,replicas=0,input=obs:float32:64,output=logits:float32:16,max-batch=16",
                           "--serve", "gompl,store=main,param=policy,max-batch=16"])
        st = None
        try:
            # The Go model needs a first version before the node serves it.
            a, b = mlp(1), mlp(2)
            node.start()
            st = store.Store(node.addr, "main", token=node.token, root=node.root)
            self.assertEqual(st.publish("policy", state(a)), 1)
            served = mlp(9)  # the replica's own weights, replaced by version 1
            x = np.random.default_rng(0).normal(size=(4, 64)).astype(np.float32)
            with serve.Replica(node.addr, "policy", served, token=node.token, root=node.root,
                               follow=(st, "policy")) as r, \
                    serve.Client(node.addr, "policy", token=node.token, root=node.root) as c:
                r.start()
                out, v = c.predict({"obs": x}, timeout=60, return_version=True)
                self.assertEqual(v, 1)
                with torch.inference_mode():
                    np.testing.assert_array_equal(out["logits"], a(torch.from_numpy(x)).numpy())
                self.assertEqual(st.publish("policy", state(b)), 2)

                def at2():
                    out, v = c.predict({"obs": x}, timeout=60, return_version=True)
                    return (out, v) if v == 2 else None
                out, v = wait_until(at2, what="the replica at version 2")
                with torch.inference_mode():
                    want = b(torch.from_numpy(x)).numpy()
                np.testing.assert_array_equal(out["logits"], want)
                # The Go MLP, from the same store's files.
                with serve.Client(node.addr, "gompl", token=node.token, root=node.root) as g:
                    def go2():
                        out, v = g.predict({"obs": x}, timeout=60, return_version=True)
                        return (out, v) if v == 2 else None
                    gout, _ = wait_until(go2, what="the Go MLP at version 2")
                np.testing.assert_allclose(gout["logits"], want, rtol=1e-4, atol=1e-5)
        finally:
            if st is not None:
                st.close()
            node.close()

    def test_follow_bfloat16(self):
        """A bfloat16 module's state_dict, published as torch tensors
        (stored as torch.bfloat16), loads into a following replica as
        bfloat16 values, not as their bits cast: its answers are the
        module's."""
        node = Node(extra=["--store", "main",
                           "--serve", "policy,replicas=0,input=obs:float32:64,output=logits:float32:16,max-batch=16"])
        self.addCleanup(node.close)
        node.start()
        st = store.Store(node.addr, "main", token=node.token, root=node.root)
        self.addCleanup(st.close)
        class Cast(torch.nn.Module):
            def __init__(self, dtype):
                super().__init__()
                self.dtype = dtype

            def forward(self, x):
                return x.to(self.dtype)

        def bmlp(seed):  # float32 in and out, bfloat16 inside
            torch.manual_seed(seed)
            return torch.nn.Sequential(Cast(torch.bfloat16), torch.nn.Linear(64, 256), torch.nn.ReLU(),
                                       torch.nn.Linear(256, 16), Cast(torch.float32)).to(torch.bfloat16)

        a = bmlp(3)
        self.assertEqual(st.publish("policy", dict(a.state_dict())), 1)
        x = np.random.default_rng(1).normal(size=(4, 64)).astype(np.float32)
        with torch.inference_mode():
            want = a(torch.from_numpy(x)).numpy()
        with serve.Replica(node.addr, "policy", bmlp(8), token=node.token, root=node.root,
                           follow=(st, "policy")) as r, \
                serve.Client(node.addr, "policy", token=node.token, root=node.root) as c:
            r.start()
            out, v = c.predict({"obs": x}, timeout=60, return_version=True)
            self.assertEqual(v, 1)
            np.testing.assert_array_equal(out["logits"], want)


if __name__ == "__main__":
    unittest.main()
