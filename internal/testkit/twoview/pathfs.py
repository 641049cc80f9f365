#!/usr/bin/python3
"""pathfs SRC MNT: a FUSE view of SRC whose open files go stale when they
are unlinked, as NFS files do.

An NFS client reads a file by its handle on the server, page by page: a
rename on the server (by another client) leaves the handle valid, but once
another client unlinks the file, the server has it no more, and a page not
yet read cannot be read (ESTALE): a mapping faults there (SIGBUS). bindfs
keeps the file open for its reader, which keeps an unlinked file readable;
this view keeps it open too (so a rename does not matter) but fails every
read of a file whose link count dropped to zero (EIO), as a host whose NFS
server lost the file. Used by internal/testkit/twoview (Stateless); it needs
python3-fusepy (Debian).
"""
import errno
import os
import sys

from fusepy import FUSE, FuseOSError, Operations


class PathFS(Operations):
    def __init__(self, root):
        self.root = root

    def _p(self, path):
        return os.path.join(self.root, path.lstrip("/"))

    def _call(self, fn, *args):
        try:
            return fn(*args)
        except OSError as e:
            raise FuseOSError(e.errno or errno.EIO)

    def access(self, path, mode):
        if not os.access(self._p(path), mode):
            raise FuseOSError(errno.EACCES)

    def getattr(self, path, fh=None):
        st = self._call(os.lstat, self._p(path))
        return {k: getattr(st, k) for k in ("st_atime", "st_ctime", "st_gid", "st_mode", "st_mtime",
                                              "st_nlink", "st_size", "st_uid", "st_ino")}

    def readdir(self, path, fh):
        return [".", ".."] + self._call(os.listdir, self._p(path))

    def readlink(self, path):
        return self._call(os.readlink, self._p(path))

    def statfs(self, path):
        st = self._call(os.statvfs, self._p(path))
        return {k: getattr(st, k) for k in ("f_bavail", "f_bfree", "f_blocks", "f_bsize", "f_favail",
                                              "f_ffree", "f_files", "f_flag", "f_frsize", "f_namemax")}

    def chmod(self, path, mode):
        return self._call(os.chmod, self._p(path), mode)

    def chown(self, path, uid, gid):
        return self._call(os.chown, self._p(path), uid, gid)

    def mkdir(self, path, mode):
        return self._call(os.mkdir, self._p(path), mode)

    def rmdir(self, path):
        return self._call(os.rmdir, self._p(path))

    def unlink(self, path):
        return self._call(os.unlink, self._p(path))

    def symlink(self, name, target):
        return self._call(os.symlink, target, self._p(name))

    def rename(self, old, new):
        return self._call(os.rename, self._p(old), self._p(new))

    def link(self, target, name):
        return self._call(os.link, self._p(name), self._p(target))

    def utimens(self, path, times=None):
        return self._call(os.utime, self._p(path), times)

    def open(self, path, flags):
        return self._call(os.open, self._p(path), flags & ~(os.O_CREAT | os.O_EXCL | os.O_TRUNC))

    def create(self, path, mode, fi=None):
        return self._call(os.open, self._p(path), os.O_RDWR | os.O_CREAT | os.O_TRUNC, mode)

    def _live(self, fh):
        """Raises EIO when the open file fh was unlinked: stale, as NFS."""
        if self._call(os.fstat, fh).st_nlink == 0:
            raise FuseOSError(errno.EIO)

    def read(self, path, size, offset, fh):
        self._live(fh)
        return self._call(os.pread, fh, size, offset)

    def write(self, path, data, offset, fh):
        self._live(fh)
        return self._call(os.pwrite, fh, data, offset)

    def truncate(self, path, length, fh=None):
        return self._call(os.truncate, self._p(path), length)

    def flush(self, path, fh):
        return 0

    def release(self, path, fh):
        os.close(fh)
        return 0

    def fsync(self, path, datasync, fh):
        return self._call(os.fsync, fh)


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit("usage: pathfs.py SRC MNT")
    FUSE(PathFS(os.path.abspath(sys.argv[1])), sys.argv[2], foreground=False, nothreads=True, allow_other=True)
