"""What a child forked from a process (os.fork, multiprocessing's fork
start method, a pool's workers) may do with the clients its parent made,
each test in a fresh process that forks. The parent's objects stay the
parent's: a store or rpc client dials a connection of its own in the
child and writes under an identity of its own, a serve Client refuses
(its registration, slots and threads are the parent's) and its close
there leaves the parent's alone. Nodes and communicators: test_node,
test_collective."""

import json
import subprocess
import sys
import textwrap
import unittest

try:
    import torch  # noqa: F401
    HAVE_TORCH = True
except ImportError:
    HAVE_TORCH = False

# Shared by the scripts: wait for the child (20 s at most, then kill it
# and say it hung), and print the report.
WAIT = textwrap.dedent("""
    import json, os, threading, time
    def busy(call):
        \"\"\"A thread of the parent making call in a loop until stop() is
        called, which returns the errors it met.\"\"\"
        errs, done = [], threading.Event()
        def loop():
            while not done.is_set():
                try:
                    call()
                except Exception as e:
                    errs.append(repr(e))
        t = threading.Thread(target=loop)
        t.start()
        time.sleep(0.2)  # calling by the fork
        def stop():
            done.set()
            t.join()
            return errs[:3]
        return stop
    def wait_child(pid):
        for _ in range(400):
            done, status = os.waitpid(pid, os.WNOHANG)
            if done:
                return os.waitstatus_to_exitcode(status)
            time.sleep(0.05)
        os.kill(pid, 9)
        os.waitpid(pid, 0)
        return "hung"
""")


def run(tc, script):
    out = subprocess.run([sys.executable, "-c", WAIT + textwrap.dedent(script)], capture_output=True, timeout=180)
    tc.assertEqual(out.returncode, 0, out.stderr.decode(errors="replace")[-3000:])
    return json.loads(out.stdout.decode().splitlines()[-1])


class TestFork(unittest.TestCase):
    def test_store_appends_of_parent_and_child_both_land(self):
        """A child appends with the Store it inherited, then the parent does:
        both land, with revisions of their own. Before, the child went on
        with the parent's client id and sequence numbers, so the node,
        which applies a write once per (client, sequence number), answered
        the parent's append with the child's revision and dropped it."""
        rep = run(self, """
            import numpy as np, tensorwire
            node = tensorwire.Node(store=["main"]).start()
            st = tensorwire.store.Store(node.address, "main", root=node.root)
            st.append("b", {"x": np.zeros(2, np.float32)})
            r, w = os.pipe()
            pid = os.fork()
            if pid == 0:
                rev = st.append("b", {"x": np.ones(2, np.float32)})
                os.write(w, str(rev).encode())
                os._exit(0)
            os.close(w)
            code = wait_child(pid)
            child_rev = int(os.read(r, 64) or b"0")
            rev = st.append("b", {"x": np.full(2, 2, np.float32)})
            items = st.get("b")
            rep = {"child": code, "revs": sorted([child_rev, rev]),
                   "values": sorted(float(np.asarray(i["x"])[0]) for i in items)}
            st.close()
            node.stop()
            print(json.dumps(rep))
        """)
        self.assertEqual(rep["child"], 0)
        self.assertEqual(rep["values"], [0.0, 1.0, 2.0])
        self.assertEqual(len(set(rep["revs"])), 2, rep)

    def test_child_calls_while_a_parent_thread_does(self):
        """A child publishes 30 times with the inherited Store while a
        thread of the parent publishes in a loop, then closes it: no call
        fails on either side and the child exits. Before, the child took
        the parent's connection (its stream ids, its locks) and hung."""
        rep = run(self, """
            import numpy as np, tensorwire
            node = tensorwire.Node(store=["main"]).start()
            st = tensorwire.store.Store(node.address, "main", root=node.root)
            st.publish("w", {"a": np.ones(4, np.float32)})
            stop = busy(lambda: st.publish("p", {"a": np.full(4, 2, np.float32)}))
            pid = os.fork()
            if pid == 0:
                bad = 0
                for _ in range(30):
                    try:
                        st.publish("c", {"a": np.full(4, 3, np.float32)})
                    except Exception:
                        bad += 1
                st.close()
                os._exit(min(bad, 100))
            code = wait_child(pid)
            time.sleep(0.3)
            errs = stop()
            latest = st.latest("c").version
            rep = {"child": code, "parent_errors": errs, "child_versions": latest}
            st.close()
            node.stop()
            print(json.dumps(rep))
        """)
        self.assertEqual(rep, {"child": 0, "parent_errors": [], "child_versions": 30})

    def test_replay_buffer_in_a_child_while_a_parent_thread_samples(self):
        """A child forked while a thread of the parent samples from a
        replay Buffer with prefetch (a sample in flight, the lock taken and
        let go in a loop) extends and samples through the Buffer it
        inherited: every call answers, and the child exits."""
        rep = run(self, """
            import numpy as np, tensorwire
            node = tensorwire.Node(buffer=["rb,capacity=256"]).start()
            buf = tensorwire.replay.Buffer(node.address, "rb", root=node.root, prefetch=True)
            buf.extend({"obs": np.zeros((64, 4), np.float32)})
            stop = busy(lambda: buf.sample(8, timeout=30))
            pid = os.fork()
            if pid == 0:
                bad = 0
                for _ in range(20):
                    try:
                        buf.extend({"obs": np.ones((4, 4), np.float32)}, timeout=30)
                        batch, info = buf.sample(8, timeout=30)
                        if batch["obs"].shape != (8, 4):
                            bad += 1
                    except Exception:
                        bad += 1
                buf.close()
                os._exit(min(bad, 100))
            code = wait_child(pid)
            rep = {"child": code, "parent_errors": stop(), "size": buf.stats()["size"]}
            buf.close()
            node.stop()
            print(json.dumps(rep))
        """)
        self.assertEqual(rep, {"child": 0, "parent_errors": [], "size": 64 + 80})

    @unittest.skipUnless(HAVE_TORCH, "needs torch")
    def test_serve_client_refuses_in_a_child(self):
        """A child's predict with the serve Client it inherited (by
        reference: slots in files) raises ClosedError naming the fork,
        and its close there leaves the parent's registration and slots
        alone: the parent's next predictions are right."""
        rep = run(self, """
            import numpy as np, torch, tensorwire
            spec = "policy,replicas=0,input=obs:float32:4,output=logits:float32:2,max-batch=16"
            node = tensorwire.Node(serve=[spec]).start()
            torch.manual_seed(0)
            model = torch.nn.Linear(4, 2)
            replica = tensorwire.serve.Replica(node, "policy", model).start()
            client = tensorwire.serve.Client(node.address, "policy", root=node.root)
            obs = np.arange(8, dtype=np.float32).reshape(2, 4)
            client.predict({"obs": obs}, timeout=60)
            r, w = os.pipe()
            pid = os.fork()
            if pid == 0:
                try:
                    client.predict({"obs": obs}, timeout=10)
                    said = "no error"
                except tensorwire.serve.ClosedError as e:
                    said = "ClosedError" + (" naming the fork" if "forked" in str(e) else ": " + str(e))
                except Exception as e:
                    said = f"{type(e).__name__}: {e}"
                client.close()
                os.write(w, said.encode())
                os._exit(0)
            os.close(w)
            code = wait_child(pid)
            said = os.read(r, 4096).decode()
            out = client.predict({"obs": obs}, timeout=60)
            with torch.no_grad():
                want = model(torch.from_numpy(obs)).numpy()
            rep = {"child": code, "said": said, "mode": client.mode, "right": bool(np.allclose(out["logits"], want))}
            client.close()
            replica.close()
            node.stop()
            print(json.dumps(rep))
        """)
        self.assertEqual(rep, {"child": 0, "said": "ClosedError naming the fork", "mode": "ref", "right": True})


if __name__ == "__main__":
    unittest.main()
