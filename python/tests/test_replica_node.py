"""tensorwire.Node: the `tensorwire node` binary started from Python, serving
a model whose replica is a torch module in this process; the node stopped
on exit, and killed with a Python parent killed by SIGKILL; a clear error
without a binary or with a bad flag."""

import os
import signal
import subprocess
import sys
import time
import unittest

import numpy as np

import tensorwire
from tensorwire import serve
from tensorwire.node import BinaryNotFoundError, NodeStartError

from nodes import binary, python_env, wait_until

try:
    import torch
except ImportError:
    torch = None

SPEC = "policy,replicas=0,input=obs:float32:64,output=logits:float32:16,max-batch=16"


def alive(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie is dead too.
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(")")[-1].split()[0] != "Z"
    except OSError:
        return True


class TestNode(unittest.TestCase):
    @unittest.skipIf(torch is None, "torch is not installed in this interpreter")
    def test_serves_and_stops(self):
        torch.manual_seed(0)
        module = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(), torch.nn.Linear(256, 16))
        with tensorwire.Node(serve=[SPEC], token="secret", binary=binary()) as node:
            pid = node.proc.pid
            with serve.Replica(node, "policy", module) as r, \
                    serve.Client(node.address, "policy", token=node.token, root=node.root) as c:
                r.start()
                self.assertEqual(r.mode, "ref")
                x = np.ones((3, 64), np.float32)
                with torch.inference_mode():
                    want = module(torch.from_numpy(x)).numpy()
                np.testing.assert_array_equal(c.predict({"obs": x}, timeout=60)["logits"], want)
        self.assertFalse(alive(pid))

    def test_script_exits_with_a_replica_running(self):
        """A script that starts a Node, a Replica and a Client by reference
        and exits without closing any: the replica leaves first (it does
        not report itself detached and try to attach again), the replica's
        and the client's folders go from the root, the process exits
        cleanly. Before, the node stopped under the replica, the script
        aborted at shutdown (the Node's output thread), and the client's
        folder stayed for the next client to sweep."""
        import tempfile
        root = tempfile.mkdtemp(prefix="tw-replica-exit-")
        self.addCleanup(__import__("shutil").rmtree, root, True)
        code = ("import sys, torch, tensorwire\n"
                "node = tensorwire.Node(root=sys.argv[2], serve=[sys.argv[3]], binary=sys.argv[1]).start()\n"
                "r = tensorwire.serve.Replica(node, 'policy', torch.nn.Linear(64, 16)).start()\n"
                "c = tensorwire.serve.Client(node.address, 'policy', root=node.root)\n"
                "print(c.predict({'obs': torch.zeros(2, 64)}, timeout=60)['logits'].shape, flush=True)\n"
                "print(c.mode, c._dir, flush=True)\n"
                "print(r._dir, flush=True)\n")
        p = subprocess.run([sys.executable, "-c", code, binary(), root, SPEC], env=python_env(),
                           capture_output=True, timeout=120)
        err = p.stderr.decode(errors="replace")
        self.assertEqual(p.returncode, 0, err)
        self.assertIn(b"(2, 16)", p.stdout)
        self.assertNotIn("detached", err)
        words = p.stdout.decode().split()
        self.assertEqual(words[-3], "ref")
        for who, folder in (("client", words[-2]), ("replica", words[-1])):
            self.assertTrue(folder.startswith(os.path.join(root, serve.CLIENTS_DIR)), folder)
            self.assertFalse(os.path.exists(folder), f"the {who}'s folder stayed in the root")

    def test_dies_with_its_parent(self):
        """A Python process that started a node is killed (SIGKILL): the node
        stops too (it watches that process: --parent)."""
        code = ("import sys, time, tensorwire\n"
                "n = tensorwire.Node(binary=sys.argv[1]).start()\n"
                "print(n.proc.pid, flush=True)\n"
                "time.sleep(600)\n")
        p = subprocess.Popen([sys.executable, "-c", code, binary()], env=python_env(), stdout=subprocess.PIPE)
        try:
            pid = int(p.stdout.readline())
            self.assertTrue(alive(pid))
            p.send_signal(signal.SIGKILL)
            p.wait()
            wait_until(lambda: not alive(pid), limit=30, what="the node died with its parent")
        finally:
            p.kill()
            p.stdout.close()

    def test_errors(self):
        old = os.environ.pop("TENSORWIRE_BIN", None)
        path = os.environ.get("PATH", "")
        os.environ["PATH"] = "/nonexistent"
        try:
            with self.assertRaisesRegex(BinaryNotFoundError, "TENSORWIRE_BIN"):
                tensorwire.Node()
        finally:
            os.environ["PATH"] = path
            if old is not None:
                os.environ["TENSORWIRE_BIN"] = old
        with self.assertRaisesRegex(NodeStartError, "replicas=0"):
            tensorwire.Node(serve=["policy,input=obs:float32:4,output=a:float32:"], binary=binary()).start()


if __name__ == "__main__":
    unittest.main()
