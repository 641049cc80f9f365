"""zygote.py, the suite's helper that forks rank processes from one that
imported torch once: a child must look to its script and to the test as
`python SCRIPT ARGS` started by subprocess.Popen would (argv, environment,
folder, output, exit status, death by a signal, the interpreter's exit
steps), or the tests that use it would test something else."""

import os
import signal
import subprocess
import sys
import tempfile
import textwrap
import unittest

import zygote

SCRIPT = textwrap.dedent(r"""
    import atexit, json, os, sys, threading, time
    mode = sys.argv[1]
    print(json.dumps({"argv": sys.argv, "env": os.environ.get("ZYGOTE_TEST"), "cwd": os.getcwd(),
                      "name": __name__, "numpy": "numpy" in sys.modules, "path0": sys.path[0]}))
    sys.stdout.flush()
    print("to stderr", file=sys.stderr)
    if mode == "exit3":
        sys.exit(3)
    if mode == "message":
        sys.exit("a message")
    if mode == "raise":
        raise ValueError("boom")
    if mode == "interrupt":
        raise KeyboardInterrupt
    if mode == "sleep":
        time.sleep(60)
    if mode == "exitsteps":
        # A thread that is not a daemon finishes before the atexit functions run.
        threading.Thread(target=lambda: (time.sleep(0.2), print("thread done", flush=True))).start()
        atexit.register(lambda: print("atexit ran", flush=True))
    print("end", end="")
""")


class TestZygote(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.dir = tempfile.mkdtemp()
        cls.script = os.path.join(cls.dir, "script.py")
        with open(cls.script, "w") as f:
            f.write(SCRIPT)
        cls.z = zygote.Zygote(["numpy"])

    @classmethod
    def tearDownClass(cls):
        cls.z.close()

    def run_both(self, mode, timeout=60):
        """(returncode, stdout, stderr) of the script run by the zygote and by Popen."""
        env = dict(os.environ, ZYGOTE_TEST="yes")
        got = []
        for start in (lambda: self.z.popen([self.script, mode], env, cwd=self.dir),
                      lambda: subprocess.Popen([sys.executable, self.script, mode], env=env, cwd=self.dir,
                                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)):
            p = start()
            out, err = p.communicate(timeout=timeout)
            got.append((p.returncode, out, err))
        return got

    def test_like_an_exec(self):
        for mode, code in (("ok", 0), ("exit3", 3), ("message", 1), ("raise", 1), ("interrupt", -signal.SIGINT),
                           ("exitsteps", 0)):
            with self.subTest(mode=mode):
                (zc, zout, zerr), (pc, pout, perr) = self.run_both(mode)
                self.assertEqual((zc, pc), (code, code))
                zlines, plines = zout.splitlines(), pout.splitlines()
                # The first line differs only in whether numpy was imported before the script.
                self.assertEqual(zlines[0].replace('"numpy": true', '"numpy": false'), plines[0])
                self.assertEqual(zlines[1:], plines[1:])
                self.assertIn("to stderr", zerr)
                if mode == "message":
                    self.assertIn("a message", zerr)
                if mode == "raise":
                    self.assertIn("ValueError: boom", zerr)
                if mode == "exitsteps":
                    self.assertEqual(zlines[1:], ["endthread done", "atexit ran"])

    def test_killed(self):
        p = self.z.popen([self.script, "sleep"], dict(os.environ))
        with self.assertRaises(subprocess.TimeoutExpired):
            p.communicate(timeout=0.5)
        self.assertIsNone(p.poll())
        p.kill()
        out, _ = p.communicate(timeout=30)
        self.assertEqual(p.returncode, -signal.SIGKILL)
        self.assertIn('"argv"', out)  # what was read before the timeout is kept


if __name__ == "__main__":
    unittest.main()
