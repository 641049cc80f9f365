"""tensorwire.Node's temporary folders (its root when none is given, and
each run's log and token) go with it: at stop(), when a Node never
stopped is collected, and when the Python process that made it exits
without stopping it. Before, a Node never started, or one alive at exit,
left them in the temporary folder, one or two per Node, and a process
that exited with a Node running aborted ("Fatal Python error:
_enter_buffered_busy": the node's output thread at finalization)."""

import gc
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
import unittest

import tensorwire

import test_fork


class TestNodeTempFolders(unittest.TestCase):
    def test_never_started_and_dropped(self):
        node = tensorwire.Node()
        tmp = os.path.dirname(node.root)
        self.assertTrue(os.path.isdir(node.root))
        del node
        gc.collect()
        self.assertFalse(os.path.exists(tmp), "a Node never started and dropped left its temporary root")

    def test_stopped(self):
        with tensorwire.Node() as node:
            self.assertTrue(node.address)
            folders = [os.path.dirname(node.root), os.path.dirname(node.log_path)]
            self.assertTrue(all(os.path.isdir(f) for f in folders), folders)
        self.assertEqual([f for f in folders if os.path.exists(f)], [])

    def test_process_exits_without_stopping_it(self):
        """A script that starts a Node and exits: it exits cleanly, and
        nothing of the Node is left, its process included."""
        tmp = tempfile.mkdtemp(prefix="tw-node-test-")
        self.addCleanup(shutil.rmtree, tmp, ignore_errors=True)
        script = textwrap.dedent("""
            import tensorwire
            node = tensorwire.Node(store=["st"]).start()
            print(node.proc.pid, flush=True)
        """)
        env = dict(os.environ, TMPDIR=tmp)
        out = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, timeout=120)
        self.assertEqual(out.returncode, 0, out.stderr.decode(errors="replace"))
        self.assertEqual(os.listdir(tmp), [], "the Node's temporary folders outlived its process")
        pid = int(out.stdout.split()[0])
        for _ in range(200):
            try:
                os.kill(pid, 0)
            except ProcessLookupError:
                break
            time.sleep(0.05)
        else:
            self.fail(f"the node (pid {pid}) outlived the process that started it")


class TestNodeLifetime(unittest.TestCase):
    def test_started_from_a_thread_that_ends(self):
        """A Node started from a thread that then finishes keeps running
        and serving (before 2026-12-01 the kernel killed it as the thread
        ended: PR_SET_PDEATHSIG is per thread)."""
        nodes = []
        t = threading.Thread(target=lambda: nodes.append(tensorwire.Node().start()))
        t.start()
        t.join()
        node = nodes[0]
        self.addCleanup(node.stop)
        time.sleep(1)
        self.assertIsNone(node.proc.poll(), f"the node exited ({node.proc.poll()}) when its starting thread ended")
        host, port = node.address.rsplit(":", 1)
        socket.create_connection((host, int(port)), timeout=10).close()

    def test_forked_child_exits(self):
        """A child forked after the Node started (os.fork, then a normal
        exit, atexit hooks and all) leaves the parent's node running, its
        temporary root in place and its clients working. Before, the
        child's exit hook ran the parent's Node's stop() and hung in it,
        so the child never exited (child_exited False)."""
        rep = test_fork.run(self, """
            import sys
            import numpy as np
            import tensorwire
            node = tensorwire.Node(store=["main"]).start()
            store = tensorwire.store.Store(node.address, "main", root=node.root)
            store.publish("w", {"a": np.ones(4, np.float32)})
            pid = os.fork()
            if pid == 0:
                sys.exit(0)
            exited = wait_child(pid) == 0
            time.sleep(0.3)
            rep = {"child_exited": exited, "node_alive": node.proc.poll() is None,
                   "root": os.path.isdir(node.root)}
            try:
                store.publish("w", {"a": np.full(4, 2, np.float32)})
                rep["publish"] = "ok"
            except Exception as e:
                rep["publish"] = repr(e)
            store.close()
            node.stop()
            print(json.dumps(rep), flush=True)
        """)
        self.assertEqual(rep, {"child_exited": True, "node_alive": True, "root": True, "publish": "ok"})


if __name__ == "__main__":
    unittest.main()
