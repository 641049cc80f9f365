"""A full root gives the Python client an error it can act on, not a raw
OSError nor a SIGBUS later (issue 24): a serve client's slots are reserved
on disk as the Go side reserves them, and ENOSPC is ResourceExhaustedError."""

import os
import shutil
import subprocess
import tempfile
import unittest

import tensorwire
from tensorwire import serve


class TestFullRoot(unittest.TestCase):
    def setUp(self):
        if os.geteuid() != 0 or not shutil.which("mount"):
            raise unittest.SkipTest("a full tmpfs needs root and mount")
        self.dir = tempfile.mkdtemp(prefix="tensorwire-pytest-full-")
        r = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=256k", "tmpfs", self.dir], capture_output=True)
        if r.returncode != 0:
            shutil.rmtree(self.dir, ignore_errors=True)
            raise unittest.SkipTest(f"mount tmpfs: {r.stderr.decode(errors='replace')}")
        self.addCleanup(shutil.rmtree, self.dir, True)
        self.addCleanup(subprocess.run, ["umount", "-l", self.dir], capture_output=True)

    def test_slots_on_a_full_disk(self):
        # 1 MiB of slots on a 256 KiB tmpfs: a sparse file would be made,
        # and a store through its mapping would SIGBUS later.
        with self.assertRaises(tensorwire.ResourceExhaustedError) as cm:
            serve._create_td(os.path.join(self.dir, "in"), [(["obs"], "torch.float32", [1024])], 256)
        self.assertIn("no space left", str(cm.exception))

    def test_slots_that_fit(self):
        serve._create_td(os.path.join(self.dir, "in"), [(["obs"], "torch.float32", [16])], 8)
        self.assertEqual(os.path.getsize(os.path.join(self.dir, "in", "obs.memmap")), 8 * 16 * 4)


if __name__ == "__main__":
    unittest.main()
