"""The README's "From Python" blocks, run as written against a node started
as the walkthrough's (its own folder and a free port in place of /tmp/tw
and localhost:7070), and one serving a model as the serve block says."""

import os
import re
import subprocess
import sys
import unittest

import numpy as np

from nodes import REPO, Node, python_env, write_state_dict


def readme_block(name):
    with open(os.path.join(REPO, "README.md")) as f:
        text = f.read()
    m = re.search(r"<!-- begin %s -->\n```\w*\n(.*?)```\n<!-- end %s -->" % (name, name), text, re.S)
    if m is None:
        raise AssertionError(f"README.md has no fenced block between <!-- begin {name} --> and <!-- end {name} -->")
    return m.group(1)


class TestReadme(unittest.TestCase):
    def test_from_python(self):
        code = readme_block("from-python")
        shell = readme_block("walkthrough-shell")
        buffer = re.search(r"--buffer (\S+)", shell).group(1)
        for want in ('"/tmp/tw/token"', '"/tmp/tw/root"', '"localhost:7070"', '"buf"'):
            self.assertIn(want, code)
        with Node(buffers=[buffer]) as node:
            code = code.replace("/tmp/tw/token", node.token_file).replace("/tmp/tw/root", node.root)
            code = code.replace("localhost:7070", node.addr)
            r = subprocess.run([sys.executable, "-c", code], env=python_env(), capture_output=True, text=True,
                               timeout=120)
            self.assertEqual(r.returncode, 0, r.stderr)
        self.assertEqual(r.stdout, printed_after("from-python"))

    def test_from_python_producer(self):
        """The producer block: a DataLoader's producer and three training
        processes of batch 32, 64 and 128, against a node serving the
        remote loader the text names."""
        try:
            import torch  # noqa: F401
        except ImportError:
            self.skipTest("needs torch")
        code = readme_block("from-python-producer")
        with open(os.path.join(REPO, "README.md")) as f:
            self.assertIn("--loader train,producer=remote", f.read())
        with Node(extra=["--loader", "train,producer=remote"]) as node:
            code = code.replace("/tmp/tw/token", node.token_file).replace("/tmp/tw/root", node.root)
            code = code.replace("localhost:7070", node.addr)
            r = subprocess.run([sys.executable, "-c", code], env=python_env(), capture_output=True, text=True,
                               timeout=300)
            self.assertEqual(r.returncode, 0, r.stderr)
        self.assertEqual(r.stdout, printed_after("from-python-producer"))

    def test_from_python_serve(self):
        """The serve block, against a node serving, as "policy", an MLP of
        64 -> 256 -> 16 whose state_dict is at ROOT/policy, as the text says."""
        code = readme_block("from-python-serve")
        with open(os.path.join(REPO, "README.md")) as f:
            self.assertIn("--serve policy,params=policy", f.read())
        for want in ('"/tmp/tw/token"', '"/tmp/tw/root"', '"localhost:7070"', '"policy"'):
            self.assertIn(want, code)
        rng = np.random.default_rng(0)
        node = Node(extra=["--serve", "policy,params=policy"])
        try:
            write_state_dict(os.path.join(node.root, "policy"), {
                "0.weight": rng.normal(size=(256, 64)) / 8, "0.bias": rng.normal(size=256) / 10,
                "2.weight": rng.normal(size=(16, 256)) / 16, "2.bias": rng.normal(size=16) / 10})
            node.start()
            code = code.replace("/tmp/tw/token", node.token_file).replace("/tmp/tw/root", node.root)
            code = code.replace("localhost:7070", node.addr)
            r = subprocess.run([sys.executable, "-c", code], env=python_env(), capture_output=True, text=True,
                               timeout=120)
            self.assertEqual(r.returncode, 0, r.stderr)
        finally:
            node.close()
        self.assertEqual(r.stdout, printed_after("from-python-serve"))


def printed_after(name):
    """The output the README shows after the block name: the next fenced
    block."""
    with open(os.path.join(REPO, "README.md")) as f:
        text = f.read()
    return text.split(f"<!-- end {name} -->", 1)[1].split("```\n", 2)[1]


if __name__ == "__main__":
    unittest.main()
