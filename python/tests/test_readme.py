"""The README's "From Python" block, run as written against a node started
as the walkthrough's (its own folder and a free port in place of /tmp/tw
and localhost:7070)."""

import os
import re
import subprocess
import sys
import unittest

from nodes import REPO, Node, python_env


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
        with open(os.path.join(REPO, "README.md")) as f:
            text = f.read()
        printed = text.split("<!-- end from-python -->", 1)[1].split("```\n", 2)[1]
        self.assertEqual(r.stdout, printed)


if __name__ == "__main__":
    unittest.main()
