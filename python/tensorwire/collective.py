"""Collectives from PyTorch, with mpi4torch's names and correct gradients
(docs/collective.md, "From Python").

    import tensorwire.collective as mpi4torch      # the one line that changes
    comm = mpi4torch.COMM_WORLD                     # from RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT
    y = comm.Allreduce(x, mpi4torch.MPI_SUM)        # a torch.autograd.Function: y.backward() works

or ``comm = tensorwire.collective.join("10.0.0.1:29500", rank, size)``.

Each rank is a Python process with a sidecar: ``tensorwire collective rank``,
a real Go rank of package collective started by ``join``, that the process
talks to over its pipes (small msgpack frames) while the tensors' bytes go
through a file both map (docs/protocol.md, "Collective sidecar pipe"). Go
ranks and Python ranks therefore form one communicator; the sidecar ends
when its Python process does, which the other ranks see as a lost rank.
A large output (64 KiB or more) is returned without a copy, as a tensor
over that file, which no later call writes while anything refers to it;
so it is shared memory: a process forked while it lives shares its pages.
The sidecar offers the file to its communicator as a shared buffer, so an
Allreduce, Reduce or ReduceScatter of ranks that share a host is reduced
where the inputs are in the ranks' files, and the other collectives read
them there (docs/collective.md, "Shared buffers").

Every differentiable call is a ``torch.autograd.Function`` whose backward is
the adjoint under the sum-of-losses convention, as package collective's
tape defines it (Allgather's is a ReduceScatter, not mpi4torch's scatter
from rank 1); the backward of a reduction other than MPI_SUM raises
NoAdjointError on every rank. numpy arrays work too (without autograd).
As in mpi4torch, the backward of a collective runs only where its output
reaches the loss: join an unused output in with JoinDummies, so that every
rank runs every backward collective.

Errors are the Go ranks' (same codes, reasons and messages): arguments that
do not fit together on every rank (MismatchError), a root out of range
(ArgumentError), a rank killed or stopped (PeerLostError, RankAbortedError),
each on every rank, never a hang; after a lost rank the communicator is
broken (BrokenError): close it and join again.
"""

import itertools
import math
import mmap
import os
import struct
import subprocess
import tempfile
import threading
import time

import numpy as np

from . import _exit, _msgpack
from ._binary import find_binary
from ._outpool import OutputPool
from ._regions import Regions, address, align
from ._td import as_array, dtype_name, numpy_dtype, to_torch
from .errors import (AbortedError, FailedPreconditionError, InvalidArgumentError, ResourceExhaustedError,
                     TensorwireError, UnauthenticatedError, UnavailableError, from_wire, register_reason)

__all__ = [
    "MPI_MAX", "MPI_MIN", "MPI_SUM", "MPI_PROD", "MPI_LAND", "MPI_BAND", "MPI_LOR", "MPI_BOR", "MPI_LXOR",
    "MPI_BXOR", "MPI_MINLOC", "MPI_MAXLOC", "WaitHandle", "JoinDummies", "JoinDummiesHandle",
    "MPI_Communicator", "COMM_WORLD", "join", "deactivate_cuda_aware_mpi_support",
    "MismatchError", "ArgumentError", "NoSpaceError", "PeerLostError", "RankAbortedError", "BrokenError",
    "ClosedError", "WaitedError", "NoAdjointError", "ConfigError", "JoinError", "JoinRefusedError",
    "SidecarError",
]

# The reductions: package collective's Op values (the pipe carries them).
MPI_SUM, MPI_PROD, MPI_MIN, MPI_MAX = 1, 2, 3, 4
MPI_LAND, MPI_LOR, MPI_LXOR, MPI_BAND, MPI_BOR, MPI_BXOR = 5, 6, 7, 8, 9, 10
# mpi4torch has these; package collective has no MINLOC/MAXLOC: ArgumentError.
MPI_MINLOC, MPI_MAXLOC = 11, 12


# One exception class per reason of package collective (docs/collective.md).

@register_reason
class MismatchError(InvalidArgumentError):
    """The ranks called with arguments that do not fit together (dtypes,
    shapes, roots, collectives); the communicator goes on."""
    reason = "collective.mismatch"


@register_reason
class ArgumentError(InvalidArgumentError):
    """A bad argument on some rank (a root out of range, an axis the tensor
    lacks, counts that do not add up); the communicator goes on."""
    reason = "collective.argument"


@register_reason
class NoSpaceError(ResourceExhaustedError):
    """The shared folder is full."""
    reason = "collective.no_space"


@register_reason
class PeerLostError(UnavailableError):
    """A rank died, closed, stopped or became unreachable (or this rank's
    sidecar exited)."""
    reason = "collective.peer_lost"


@register_reason
class RankAbortedError(AbortedError):
    """A rank broke off a collective part-way."""
    reason = "collective.aborted"


@register_reason
class BrokenError(FailedPreconditionError):
    """A call after a lost or aborted rank: close and join again."""
    reason = "collective.broken"


@register_reason
class ClosedError(FailedPreconditionError):
    """A call after close."""
    reason = "collective.closed"


@register_reason
class WaitedError(FailedPreconditionError):
    """A second Wait on a handle."""
    reason = "collective.waited"


@register_reason
class NoAdjointError(FailedPreconditionError):
    """The backward of a reduction other than MPI_SUM."""
    reason = "collective.no_adjoint"


@register_reason
class ConfigError(InvalidArgumentError):
    """Settings that cannot form a communicator."""
    reason = "collective.config"


@register_reason
class JoinError(UnavailableError):
    """The ranks could not form a communicator."""
    reason = "collective.join"


@register_reason
class JoinRefusedError(UnauthenticatedError):
    """A rank's token was refused (every rank's join fails at once)."""
    reason = "collective.unauthenticated"


@register_reason
class SidecarError(InvalidArgumentError):
    """The sidecar refused a frame (a bug on this side of the pipe)."""
    reason = "collective.sidecar"


_HDR = struct.Struct(">I")
_MAX_FRAME = 1 << 20
# The calls whose output may go elsewhere than over an input kept in the
# data file (pipe 3's out_at).
_OUT_AT_OPS = ("allreduce", "reduce", "bcast")


def _keep(k, v):
    """Whether a request's key k with value v goes on the wire: zero values
    are left out, numelem and out_at are kept at 0."""
    return v is not None and (k in ("numelem", "out_at") or (v != 0 and v != [] and v != ""))


def encode_frame(req):
    """One frame of the pipe: a 4-byte big-endian length and the msgpack map
    of req, keys sorted, zero values left out (numelem and out_at are kept
    at 0)."""
    body = _msgpack.packb({k: v for k, v in req.items() if _keep(k, v)})
    return _HDR.pack(len(body)) + body


class _Template:
    """A request's frame with its id and size still to fill in: a loop's
    calls differ only there, so each call encodes two integers and joins
    three byte strings. Its frames are encode_frame's bytes for the request
    with that id and size (docs/protocol.md), but for a size of 0, which a
    template writes where encode_frame leaves it out."""

    __slots__ = ("parts",)

    def __init__(self, req):
        m = {k: v for k, v in req.items() if k not in ("id", "size") and _keep(k, v)}
        parts, cur = [], [_msgpack._map_header(len(m) + 2)]
        for k in sorted(list(m) + ["id", "size"]):
            cur.append(_msgpack.pack_str(k))
            if k in m:
                _msgpack._pack_into(m[k], cur)
            else:  # a hole: the parts before and after it are joined around its value
                parts.append(b"".join(cur))
                cur = []
        parts.append(b"".join(cur))
        self.parts = parts

    def frame(self, rid, size):
        p = self.parts
        body = b"".join((p[0], _msgpack.pack_int(rid), p[1], _msgpack.pack_int(size), p[2]))
        return _HDR.pack(len(body)) + body


def decode_frame(body):
    return _msgpack.unpackb(body)


def _binary(binary):
    return find_binary(binary, "tensorwire.collective.join", ConfigError)  # node.py's order (_binary.py)


def _shm_dir(shm_dir):
    if shm_dir:
        return shm_dir
    return "/dev/shm" if os.path.isdir("/dev/shm") else tempfile.gettempdir()


# The bell file (docs/protocol.md, "Collective sidecar pipe"): the words
# saying which request this side and which reply the sidecar wrote last,
# as 32-bit word indexes of its mapping.
_BELL_SIZE = 4096
_BELL_REQ = 0
_BELL_RESP = 64 // 4


def _spin_seconds(spin):
    if spin is None:
        v = os.environ.get("TENSORWIRE_COLLECTIVE_SPIN_US")
        spin = float(v) * 1e-6 if v else 0.0
    spin = float(spin)
    if not 0 <= spin <= 1:
        raise ConfigError(f"spin {spin!r}: want 0 to 1 second")
    return spin


class _Sidecar:
    """The sidecar process, its pipes, the shared data file and the bell."""

    def __init__(self, binary, addr, rank, size, token, token_file, transport, shm_dir, timeout, frozen_after,
                 spin):
        fd, path = tempfile.mkstemp(prefix="tensorwire-pyrank-", dir=_shm_dir(shm_dir))
        self._fd = fd
        self._size = 0
        self._mm = None
        self._u8 = None
        self._ptr = 0
        self._pipe = 1  # the sidecar's pipe protocol (its hello's "pipe")
        self._regions = Regions()
        self._held = {}  # request id -> the Region an Isend's or Irecv's tensor is in until its Wait (pipe 4)
        self._orphans = []  # the Regions of requests whose Wait failed: they may still be in use
        self._quiet = set()  # ids of quiet requests (pipe 5) not waited for yet
        self._quiet_err = {}  # id -> the error of a quiet request whose start failed, for its Wait
        self._lock = threading.Lock()
        self._inherited = False  # a forked child's copy (_forked): the sidecar is the parent's
        _exit.reset_at_fork(self)
        self._ids = itertools.count(1)
        self._rbuf = b""
        self._templates = {}
        self._pool = OutputPool()
        self._spin_ns = int(spin * 1e9)
        self._bell = None
        self._bell_mm = None
        self.closed = False
        self._p = None
        bell_path = None
        try:
            if self._spin_ns:
                bfd, bell_path = tempfile.mkstemp(prefix="tensorwire-pyrank-bell-", dir=_shm_dir(shm_dir))
                try:
                    os.ftruncate(bfd, _BELL_SIZE)
                    self._bell_mm = mmap.mmap(bfd, _BELL_SIZE)
                finally:
                    os.close(bfd)
                self._bell = memoryview(self._bell_mm).cast("I")
            self._start(binary, path, bell_path, addr, rank, size, token, token_file, transport, shm_dir, timeout,
                        frozen_after, spin)
        except BaseException:
            if self._p is not None:
                if self._p.poll() is None:
                    self._p.kill()
                    self._p.wait()
                self._release()
            else:
                os.close(self._fd)
                self._close_bell()
            raise
        finally:
            if bell_path:
                os.unlink(bell_path)

    def _close_bell(self):
        if self._bell is not None:
            self._bell.release()
            self._bell = None
            self._bell_mm.close()

    def _start(self, binary, path, bell_path, addr, rank, size, token, token_file, transport, shm_dir, timeout,
               frozen_after, spin):
        try:
            self._grow(1 << 20)
            env = dict(os.environ)
            env.pop("TENSORWIRE_TOKEN", None)
            args = [binary, "collective", "rank", "--addr", addr, "--rank", str(rank), "--size", str(size),
                    "--data", path, "--transport", transport or "auto", "--join-timeout", _go_seconds(timeout),
                    "--frozen-after", _go_seconds(frozen_after)]
            if bell_path:
                args += ["--bell", bell_path, "--spin", f"{round(spin * 1e6)}us"]
            if shm_dir:
                args += ["--shm-dir", shm_dir]
            if token_file:
                args += ["--token-file", token_file]
            elif token:
                env["TENSORWIRE_TOKEN"] = token.decode() if isinstance(token, bytes) else str(token)
            # A session of its own: the terminal's Ctrl-C goes to this
            # process, which decides; the sidecar still ends with it (EOF).
            self._p = subprocess.Popen(args, stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env,
                                       close_fds=True, start_new_session=True)
            self._in = self._p.stdin.fileno()
            self._out = self._p.stdout.fileno()
            hello = self._read()
        finally:
            os.unlink(path)  # both have it open (the sidecar's link in the session folder goes with it)
        if hello.get("code"):
            self._p.wait()
            raise from_wire(hello["code"], hello.get("msg", ""), hello.get("reason", ""))
        self.rank, self.size, self.transport = hello.get("rank", 0), hello["world"], hello["transport"]
        self._pipe = hello.get("pipe", 1)

    def _grow(self, n):
        """Grows the data file to at least n bytes (whole MiB) and maps it.
        Its blocks are reserved, as the sidecar reserves those it adds, so
        a full /dev/shm is NoSpaceError here and not a SIGBUS at the first
        write into the mapping."""
        n = max(n, 1 << 20)
        n = (n + (1 << 20) - 1) & ~((1 << 20) - 1)
        if os.fstat(self._fd).st_size < n:
            try:
                if hasattr(os, "posix_fallocate"):
                    os.posix_fallocate(self._fd, 0, n)
                else:
                    os.ftruncate(self._fd, n)
            except OSError as e:
                raise NoSpaceError(f"the collective's data file cannot grow to {n} bytes: {e.strerror} "
                                   "(its folder is join's shm_dir, /dev/shm by default)") from e
        self._remap(n)

    def _kept(self, req, a, inplace):
        """For an Allreduce, Reduce or Bcast of a large input that lies in
        the data file already (a tensor of alloc, or an output kept there),
        (its offset, a hole for the output); else None."""
        if (not inplace or a is None or self._pipe < 3 or req["op"] not in _OUT_AT_OPS
                or a.nbytes < self._regions.min_bytes):
            return None
        off = self._in_file(a)
        if off is None:
            return None
        hole = self._hole(a.nbytes)  # clear of the input's region, which a keeps live
        if hole is None:
            return None
        return off, hole

    def _in_file(self, a):
        """The offset of array a's bytes in the data file when they lie in
        a live region there, contiguous from a multiple of 64; else None."""
        if not a.flags.c_contiguous:
            return None
        off = self._regions.find(a.ctypes.data, a.nbytes)
        if off is None or off % 64:
            return None
        return off

    def _hole(self, nbytes):
        """The offset of a hole for a region of nbytes (_regions.place), the
        file grown to hold it; None where there is none (too small, the
        bounds reached, no room in the folder)."""
        hole = self._regions.place(nbytes)
        if hole is None:
            return None
        try:
            if hole + nbytes > self._size:
                self._grow(hole + nbytes)
        except NoSpaceError:
            return None
        return hole

    def _hold(self, nbytes):
        """A live region of nbytes for an Isend's or Irecv's tensor (pipe
        4), or None (small, an old sidecar, the bounds reached, no room)."""
        hole = self._hole(nbytes) if self._pipe >= 4 else None
        if hole is None:
            return None
        return self._regions.claim(self._mm, self._ptr, hole, nbytes)

    def _forked(self):
        """In a child just forked (_exit.reset_at_fork): the sidecar, its
        pipe and the lock (held by a thread of the parent's at the fork,
        maybe) are the parent's."""
        self._inherited = True

    def _own(self):
        """Raises ClosedError in a child forked from the process that
        joined: a frame written there would put the parent's calls out of
        step. Checked before the lock."""
        if self._inherited:
            raise ClosedError("the communicator belongs to the process this one was forked from: join a "
                              "communicator of its own")

    def alloc(self, nbytes):
        """A zeroed uint8 array of nbytes over a region of the data file,
        live while it (or a view of it) is; None where there is none
        (too small, an old sidecar, the regions' bounds reached, no room)."""
        self._own()
        with self._lock:
            if self.closed:
                raise ClosedError("the communicator is closed")
            hole = self._hole(nbytes) if self._pipe >= 3 else None
            if hole is None:
                return None
            b = np.asarray(self._regions.claim(self._mm, self._ptr, hole, nbytes))
            b[:] = 0
            return b

    def _place(self, nbytes, room):
        """Where a call's input of nbytes goes, and whether it goes to a
        hole of room bytes (_regions.py) whose output may then stay there
        (room 0: the scratch); the file grown to hold them. Where the file
        cannot grow for a hole (room guesses an output after the input,
        which may be smaller), the scratch, grown for the input alone as
        before the regions (the sidecar grows it for an output); where it
        cannot for that either, NoSpaceError."""
        at = 0  # an old sidecar's (pipe 1): every input at offset 0
        if self._pipe >= 2:
            hole = self._regions.place(room) if room else None
            if hole is not None:
                try:
                    if hole + room > self._size:
                        self._grow(hole + room)
                    return hole, True
                except NoSpaceError:
                    pass
            at = self._regions.scratch()
        if at + nbytes > self._size:
            self._grow(at + nbytes)
        return at, False

    def _remap(self, n):
        if n <= self._size:
            return
        self._mm = mmap.mmap(self._fd, n)  # views and regions of the old mapping keep it alive
        self._u8 = np.frombuffer(self._mm, dtype=np.uint8)
        self._ptr = address(self._mm)
        self._size = n

    def _read(self):
        """The sidecar's next reply, a map. Anything else (too long, not
        msgpack, not a map: another program as TENSORWIRE_BIN, say) leaves
        the pipe out of step: the sidecar is stopped, this communicator
        closed, and the call raises PeerLostError saying what came."""
        n = _HDR.unpack(self._read_exactly(4))[0]
        if n > _MAX_FRAME:
            why = f"a reply of {n} bytes"
        else:
            try:
                m = decode_frame(self._read_exactly(n))
            except _msgpack.DecodeError as e:
                why = f"a reply that is not msgpack ({e})"
            else:
                if isinstance(m, dict):
                    return m
                why = f"a reply that is not a map ({m!r:.100})"
        self._abandon()
        raise PeerLostError(f"this rank's sidecar ({self._p.args[0]}, pid {self._p.pid}) sent {why}; it is "
                            "stopped and this communicator closed")

    def _reply(self, rid):
        """The reply to request rid: the next one but the error replies of
        quiet requests before it (pipe 5: an Isend or Irecv whose start
        failed), which are kept for their Wait to raise."""
        while True:
            resp = self._read()
            got = resp.get("id", 0)
            if got == rid or got not in self._quiet:
                return resp
            self._quiet.discard(got)
            if resp.get("code"):
                self._quiet_err[got] = from_wire(resp["code"], resp.get("msg", ""), resp.get("reason", ""))

    def _read_exactly(self, n):
        # One read takes a whole reply (header and body) when it has come.
        buf = self._rbuf
        while len(buf) < n:
            b = os.read(self._out, max(n - len(buf), 1 << 16))
            if not b:
                self._dead()
            buf += b
        self._rbuf = buf[n:]
        return buf[:n]

    def _abandon(self):
        self.closed = True
        if self._p.poll() is None:
            self._p.kill()
        self._p.wait()
        self._release()

    def _release(self):
        """Closes the pipes, the data file and the bell (once). The
        mappings stay while outputs in them live (_regions.py)."""
        if self._fd is None:
            return
        for f in (self._p.stdin, self._p.stdout):
            try:
                f.close()
            except OSError:
                pass
        os.close(self._fd)
        self._fd = None
        self._mm = self._u8 = None
        self._close_bell()

    def _dead(self):
        rc = self._p.wait()
        self.closed = True
        self._release()
        raise PeerLostError(f"this rank's sidecar (tensorwire collective rank, pid {self._p.pid}) exited "
                            f"with status {rc}; its messages are on stderr")

    def _template(self, req, a):
        """The frame template of req (without id and size) with input a."""
        key = (tuple((k, tuple(v) if isinstance(v, list) else v) for k, v in req.items() if k != "id"),
               None if a is None else (a.dtype, type(a), a.shape))
        t = self._templates.get(key)
        if t is None:
            m = {k: v for k, v in req.items() if k != "id"}
            if a is not None:
                m["has"] = True
                m["dtype"] = dtype_name(a)[len("torch."):]
                m["shape"] = list(a.shape)
            t = _Template(m)
            if len(self._templates) >= 256:
                self._templates.clear()
            self._templates[key] = t
        return t

    def _await(self, rid):
        """Watches the bell for reply rid for the bounded spin (yielding the
        processor between looks), so that the read after it finds the
        reply there instead of sleeping until the sidecar writes it."""
        bell = self._bell
        want = rid & 0xFFFFFFFF
        if bell is None or self._rbuf or bell[_BELL_RESP] == want:
            return
        now = time.perf_counter_ns
        end = now() + self._spin_ns
        yield_ = os.sched_yield
        while bell[_BELL_RESP] != want:
            if now() > end:
                return
            yield_()

    def call(self, req, a=None, write=True, stay=0, inplace=True, hold=None, into=None):
        """Runs req (its id set) with input a (a contiguous numpy array,
        written into the data file unless write is False: only its shape
        counts) and returns the reply (raising its error) and its output
        (a numpy array, or None) with its dtype's name. stay: the bytes of
        an output that may then stay in the file as a region (_regions.py)
        instead of being copied out (0: copied): with inplace, the output a
        call done in place leaves where its input was (or an Irecv's Wait
        puts there); without, at most that many bytes after the input, the
        room the request then gives it (a larger output comes at the
        file's end, and is copied). hold, a list, for an Isend or Irecv:
        its tensor goes to a region of its own, appended to hold, which the
        sidecar uses where it is until the Wait (pipe 4's keep); where none
        is free, the scratch as before. into: the region a held Irecv's
        Wait finds its tensor in."""
        self._own()
        with self._lock:
            if self.closed:
                raise ClosedError("the communicator is closed")
            nbytes = 0 if a is None else a.nbytes
            lead = 0 if inplace or a is None else align(nbytes, 64)  # where the output starts, from the input
            room = 0
            if stay >= self._regions.min_bytes:
                room = max(stay, nbytes) if inplace else lead + stay
            kept = self._kept(req, a, inplace)
            if kept is not None:
                # The input is where the caller keeps it (a tensor of
                # alloc, an earlier output): no copy in, and the output
                # to a hole of its own (pipe 3).
                at, out_at = kept
                req["out_at"] = out_at
                region, write, lead = True, False, out_at - at
            # A blocking send of a tensor already in the file (alloc's, an
            # output kept there) reads it where it is.
            sent_from = None
            if kept is None and req["op"] == "send" and self._pipe >= 2 and a is not None:
                sent_from = self._in_file(a)
                if sent_from is not None:
                    at, region, write = sent_from, False, False
            held = None
            if kept is None and sent_from is None and hold is not None:
                held = self._hold(nbytes)
                if held is not None:
                    at, region = held.off, False
                    req["keep"] = True
            # An Irecv, or an Isend of a tensor held in the file, needs no
            # reply to go on (pipe 5's quiet): its Wait says how it went. An
            # Isend of the scratch waits for its reply, which comes once
            # the sidecar has copied it out of the way of the next call.
            quiet = self._pipe >= 5 and (req["op"] == "irecv" or (req["op"] == "isend" and held is not None))
            if quiet:
                req["quiet"] = True
            try:
                if kept is None and sent_from is None and held is None:
                    at, region = self._place(nbytes, room)
            except NoSpaceError as e:
                # This rank cannot take part: its sidecar goes, so that the
                # other ranks get a lost rank instead of waiting for it.
                self._abandon()
                raise NoSpaceError(f"{e}; this rank left the communicator (the others see it lost)") from e
            if self._pipe >= 2:
                req["at"] = at
                req["room"] = room if region else 0
            if a is not None and write and a.nbytes:
                self._u8[at:at + a.nbytes] = a.reshape(-1).view(np.uint8)
            rid = req["id"]
            frame = self._template(req, a).frame(rid, self._size)
            try:
                try:
                    n = os.write(self._in, frame)
                    if n < len(frame):
                        view = memoryview(frame)[n:]
                        while view:
                            view = view[os.write(self._in, view):]
                except OSError:
                    self._dead()
                if self._bell is not None:
                    self._bell[_BELL_REQ] = rid & 0xFFFFFFFF
                if quiet:
                    self._quiet.add(rid)
                    if held is not None:
                        hold.append(held)
                    return {}, None, None
                if self._bell is not None:
                    self._await(rid)
                resp = self._reply(rid)
            except TensorwireError:
                raise
            except BaseException:
                # Interrupted (KeyboardInterrupt) between the request and
                # its reply: the pipe is out of step. The sidecar goes (the
                # other ranks see a lost rank) and so does this communicator.
                self._abandon()
                raise
            if resp.get("code"):
                raise from_wire(resp["code"], resp.get("msg", ""), resp.get("reason", ""))
            if resp.get("size", 0) > self._size:
                self._remap(resp["size"])
            if held is not None:
                hold.append(held)  # the request started: its bytes stay until its Wait
            if not resp.get("out"):
                return resp, None, None
            if into is not None and resp.get("off", 0) == into.off:
                name = "torch." + resp["dtype"]
                dt = numpy_dtype(name)
                shape = tuple(resp.get("shape") or ())
                return resp, np.asarray(into)[:math.prod(shape) * dt.itemsize].view(dt).reshape(shape), name
            return (resp,) + self._output(resp, at + lead if region else None, stay)

    def _output(self, resp, region, stay):
        """The reply's output tensor as a numpy array (bfloat16 as raw
        uint16 bits), with its dtype name: over its region when it is at
        region (where a hole place gave wants it) and fits in stay bytes,
        else copied out of the data file. Either way the array is the caller's alone:
        a large copy is a buffer of the pool that nothing refers to any
        more (_outpool.py), a region is written again only once nothing
        refers to it (_regions.py)."""
        name = "torch." + resp["dtype"]
        dt = numpy_dtype(name)
        shape = tuple(resp.get("shape") or ())
        nb = math.prod(shape) * dt.itemsize
        off = resp.get("off", 0)
        if off == region and nb <= stay:
            r = self._regions.claim(self._mm, self._ptr, off, nb)
            return np.asarray(r).view(dt).reshape(shape), name
        if nb < self._pool.min_bytes:  # a plain copy: the 1 KB path as it was
            return self._u8[off:off + nb].view(dt).reshape(shape).copy(), name
        b = self._pool.take(nb)
        b[:] = self._u8[off:off + nb]
        return b.view(dt).reshape(shape), name

    def close(self):
        if self._inherited:
            # A forked child's copy: nothing to say to the parent's sidecar.
            self.closed = True
            return
        with self._lock:
            if self.closed:
                return
            self.closed = True
            try:
                rid = next(self._ids)
                os.write(self._in, encode_frame({"id": rid, "op": "close"}))
                if self._bell is not None:
                    self._bell[_BELL_REQ] = rid & 0xFFFFFFFF
                self._read()
            except (OSError, TensorwireError):
                pass
            try:
                self._p.stdin.close()
                self._p.stdout.close()
            except OSError:
                pass
            try:
                self._p.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self._p.kill()
                self._p.wait()
            self._release()


# Tensors in and out: numpy arrays stay numpy; torch tensors come back as
# torch tensors on their device and dtype.

def _is_torch(x):
    return type(x).__module__.startswith("torch")


def _np(x):
    """x as a contiguous little-endian numpy array (bfloat16 as bits, its
    _BF16 type kept). A torch tensor's conjugate or negative view is
    resolved first: numpy cannot view it."""
    if _is_torch(x) and hasattr(x, "resolve_conj"):
        x = x.resolve_conj().resolve_neg()
    a = as_array(x)
    if not a.flags.c_contiguous:
        a = type(a)(np.ascontiguousarray(a)) if type(a) is not np.ndarray else np.ascontiguousarray(a)
    return a


_DTYPES_OK = set()  # (array type, dtype) pairs dtype_name takes


def _check_dtype(a):
    """InvalidArgumentError unless array a's elements have a tensordict
    dtype (checked once per array type and dtype)."""
    k = (type(a), a.dtype)
    if k not in _DTYPES_OK:
        dtype_name(a)
        _DTYPES_OK.add(k)


def _needs_grad(x):
    """Whether a call on x must go through autograd: a torch tensor that
    requires a gradient, with gradients on."""
    if not _is_torch(x) or not x.requires_grad:
        return False
    import torch
    return torch.is_grad_enabled()


def _nbytes(x):
    """The bytes of tensor or array x's elements (a torch tensor's, on any
    device, without a copy)."""
    if _is_torch(x):
        return x.numel() * x.element_size()
    return np.asarray(x).nbytes


def _like(a, name, like):
    """Array a (of dtype name) as like's kind: torch for torch."""
    if not _is_torch(like):
        return a
    t = to_torch(a, name == "torch.bfloat16")
    if like.device.type != "cpu":
        t = t.to(like.device)
    return t


def _axis(axis, x):
    nd = len(x.shape) if x is not None else None
    if axis < 0 and nd is not None:
        return axis + nd
    return axis


def _counts(req, numelem):
    """mpi4torch's numelem (this rank's count) or every rank's counts."""
    if numelem is None:
        return
    if isinstance(numelem, (list, tuple)):
        req["counts"] = [int(c) for c in numelem]
    else:
        req["numelem"] = int(numelem)


class WaitHandle:
    """What Isend and Irecv return, for Wait. ``dummy`` is a tensor to pass
    to JoinDummies (as in mpi4torch)."""

    def __init__(self, dummy, state):
        self._dummy = dummy
        self._state = state

    @property
    def dummy(self):
        return self._dummy


class _P2P:
    """An Isend or Irecv: its forward request and its backward one."""

    def __init__(self, comm, send, peer, tag, like):
        self.comm, self.send, self.peer, self.tag, self.like = comm, send, peer, tag, like
        self.id = None
        self.back = None  # the backward's request
        self.waited = False


class MPI_Communicator:
    """A communicator: every rank of it calls the same collectives in the
    same order. Methods with a trailing underscore are mpi4torch's
    in-place-named ones (they return a new tensor all the same)."""

    def __init__(self, sidecar):
        self._s = sidecar

    @property
    def rank(self):
        return self._s.rank

    @property
    def size(self):
        return self._s.size

    @property
    def transport(self):
        """"shm" (shared mappings), "tcp" or "hier" (shared mappings within each host, TCP between hosts)."""
        return self._s.transport

    def close(self):
        """Leaves the communicator (the sidecar exits)."""
        self._s.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def alloc(self, *shape, dtype=None):
        """A zeroed tensor of shape (ints, or one tuple) and dtype (a torch
        dtype, default torch.float32; a numpy dtype gives a numpy array)
        whose memory is this rank's data file, which its sidecar and, by
        shared mappings, the other ranks read where it is: an Allreduce,
        Reduce or Bcast of it (or of a contiguous view starting at a
        multiple of 64 bytes) copies nothing in, and its output comes back
        in the file too (package collective's Comm.Alloc, from Python).
        Fill it in place (``buf.copy_(grads)``, ``torch.cat(..., out=buf)``).
        The memory is the tensor's while it or any view of it lives, like
        the outputs of the calls (docs/collective.md, "Outputs in the data
        file"); there is no free. Below 64 KiB, past the 8 tensors the file
        keeps at once (these and the calls' outputs together) or 1 GiB, or
        with an older sidecar, it is a plain zeroed tensor, which works the
        same with one copy in per call."""
        if len(shape) == 1 and isinstance(shape[0], (tuple, list)):
            shape = tuple(shape[0])
        shape = tuple(int(d) for d in shape)
        if any(d < 0 for d in shape):
            raise ArgumentError(f"alloc: negative dimension in {shape}")
        as_numpy = dtype is not None and not type(dtype).__module__.startswith("torch")
        if as_numpy:
            dt = np.dtype(dtype)
            name = dtype_name(np.empty(0, dtype=dt))
        else:
            import torch
            name = str(dtype if dtype is not None else torch.float32)
            dt = numpy_dtype(name)
        n = math.prod(shape) * dt.itemsize
        b = self._s.alloc(n)
        a = np.zeros(shape, dtype=dt) if b is None else b.view(dt).reshape(shape)
        if as_numpy:
            return a
        return to_torch(a, name == "torch.bfloat16")

    # The raw calls on numpy arrays; timeout in seconds (None: none).

    def _run(self, op, x, write=True, timeout=None, like=None, stay=0, inplace=False, **kw):
        """Runs op on x (None: no input) and returns its output as like's
        kind (x's by default), or None. inplace: the output is where the
        input was (Allreduce, Reduce, Bcast), and may stay there; stay: the
        bytes an output after the input may take and stay (the others)."""
        req = {"id": next(self._s._ids), "op": op, "timeout": int(timeout * 1000) if timeout else 0}
        for k, v in kw.items():
            if k == "numelem":
                _counts(req, v)
            else:
                req[k] = v
        a = None
        if x is not None:
            try:
                a = _np(x)
                _check_dtype(a)
            except (InvalidArgumentError, TypeError, ValueError, RuntimeError) as e:
                # (RuntimeError: a torch tensor without data, on the meta
                # device, say.) Raised here alone, it would leave the other ranks waiting
                # for this one. The call goes on without a tensor, which
                # fails on every rank with the same ArgumentError (this
                # rank's tensor missing); here it is raised from e.
                try:
                    self._s.call(req)
                except TensorwireError as err:
                    raise err from e
                raise ArgumentError(f"{op}: this rank's tensor: {e}") from e
        if inplace and a is not None:
            stay = a.nbytes
        _, out, name = self._s.call(req, a, write, stay, inplace)
        if out is None:
            return None
        like = x if like is None else like
        return _like(out, name, like) if like is not None else out

    def _allreduce(self, x, op):
        return self._run("allreduce", x, inplace=True, red=op)

    def _bcast(self, x, root):
        return self._run("bcast", x, write=self.rank == root, inplace=True, root=root)

    def _reduce(self, x, op, root):
        return self._run("reduce", x, inplace=True, red=op, root=root)

    # The outputs of the others stay where they fit in the room their
    # sizes with equal pieces give (or an upper bound of them).

    def _gather(self, x, axis, root):
        stay = self.size * _nbytes(x) if self.rank == root else 0
        out = self._run("gather", x, stay=stay, axis=_axis(axis, x), root=root)
        if out is None:  # off the root: an empty tensor (nothing along the axis)
            shape = list(x.shape)
            shape[_axis(axis, x)] = 0
            out = x.new_zeros(shape) if _is_torch(x) else np.zeros(shape, dtype=_np(x).dtype)
        return out

    def _allgather(self, x, axis):
        return self._run("allgather", x, stay=self.size * _nbytes(x), axis=_axis(axis, x))

    def _scatter(self, x, axis, numelem, root):
        like = x
        if self.rank != root:
            x = None
        return self._run("scatter", x, like=like, stay=_nbytes(like), axis=_axis(axis, like), root=root,
                         numelem=numelem)

    def _alltoall(self, x, gatheraxis, scatteraxis, numelem):
        g, s = _axis(gatheraxis, x), _axis(scatteraxis, x)
        if g == s and 0 <= g < len(x.shape):
            return self._redistribute(x, g, numelem)
        return self._run("alltoall", x, stay=_nbytes(x), axis=g, axis2=s, numelem=numelem)

    def _redistribute(self, x, axis, numelem):
        """mpi4torch's Alltoall with gatheraxis == scatteraxis: the ranks'
        tensors joined along axis (rank order) are cut again, rank r
        getting the r-th piece of numelem elements (this rank's count, as
        mpi4torch; a list of every rank's; None: equal pieces). Done as an
        Allgather of the counts and one of the tensors, each rank keeping
        its piece: every rank receives the whole, so this is for the small
        and medium tensors such a redistribution is used on."""
        n = self.size
        # Every rank's row, [0, its count (-1: None)], [1, every rank's
        # counts] or [2, the length of a list that has not n], goes to
        # every rank, which so decides alike: lists that differ (or a
        # list on some ranks only) are a MismatchError on every rank.
        row = np.zeros(n + 1, dtype=np.int64)
        if isinstance(numelem, (list, tuple)):
            given = [int(c) for c in numelem]
            if len(given) == n:
                row[0], row[1:] = 1, given
            else:
                row[0], row[1] = 2, len(given)
        else:
            row[1] = -1 if numelem is None else int(numelem)
        rows = [[int(c) for c in q] for q in np.asarray(self._allgather(row, 0)).reshape(n, n + 1)]
        for q, rq in enumerate(rows):
            if rq[0] == 2:
                raise ArgumentError(f"Alltoall: rank {q} gave {rq[1]} counts for {n} ranks")
        lists = [q for q, rq in enumerate(rows) if rq[0] == 1]
        if lists:
            p = lists[0]
            for q, rq in enumerate(rows):
                if rq != rows[p]:
                    what = f"counts {rq[1:]}" if rq[0] == 1 else "its own count" if rq[1] >= 0 else "no counts"
                    raise MismatchError(f"Alltoall: rank {q} gave {what}, rank {p} counts {rows[p][1:]}")
            counts = rows[p][1:]
        else:
            counts = [rq[1] for rq in rows]
        whole = self._allgather(x, axis)
        total = whole.shape[axis]
        if all(c == -1 for c in counts):
            if total % n:
                raise ArgumentError(f"Alltoall: {total} elements along axis {axis} do not split in {n} equal pieces")
            counts = [total // n] * n
        if any(c < 0 for c in counts) or sum(counts) != total:
            raise ArgumentError(f"Alltoall: the ranks' counts {counts} do not add up to the {total} elements "
                                f"along axis {axis} of their tensors")
        lo = sum(counts[:self.rank])
        piece = whole[(slice(None),) * axis + (slice(lo, lo + counts[self.rank]),)]
        return piece.contiguous() if _is_torch(piece) else np.ascontiguousarray(piece)

    def _reducescatter(self, x, op, axis, numelem):
        return self._run("reducescatter", x, stay=_nbytes(x), red=op, axis=_axis(axis, x), numelem=numelem)

    def _start(self, st, x):
        st.id = next(self._s._ids)
        req = {"id": st.id, "op": "isend" if st.send else "irecv", "peer": st.peer, "tag": st.tag}
        held = []
        self._s.call(req, _np(x), st.send, hold=held)
        if held:
            self._s._held[st.id] = held[0]  # the tensor's bytes in the file, until the Wait
        return st.id

    def _wait(self, rid, like, recv):
        """Completes request rid; recv: an Irecv, whose tensor (of like's
        dtype and shape) may stay where the sidecar puts it (or put it:
        the region its start held)."""
        req = {"id": next(self._s._ids), "op": "wait", "req": rid}
        held = self._s._held.pop(rid, None)
        s = self._s
        try:
            _, out, name = s.call(req, stay=_nbytes(like) if recv and held is None else 0, inplace=True,
                                  into=held)
        except BaseException:
            s._quiet.discard(rid)
            failed = s._quiet_err.pop(rid, None)
            if failed is not None:
                # Its start failed (a quiet request's error reply): the
                # sidecar never used its region, and this is its error.
                raise failed from None
            if held is not None:
                # The request may still read or write its region (a Wait
                # that timed out leaves it running): never reused.
                s._orphans.append(held)
            raise
        s._quiet.discard(rid)
        if out is None:
            return None
        return _like(out, name, like)

    # mpi4torch's calls.

    def Allreduce(self, tensor, op):
        """Every rank gets the reduction with op of every rank's tensor."""
        if _is_torch(tensor):
            return _fn("Allreduce").apply(tensor, self, op)
        return self._allreduce(tensor, op)

    def Bcast_(self, tensor, root):
        """Every rank gets root's tensor (the others' give only the shape)."""
        if _is_torch(tensor):
            return _fn("Bcast").apply(tensor, self, root)
        return self._bcast(tensor, root)

    def Reduce_(self, tensor, op, root):
        """The root gets the reduction; the other ranks zeros."""
        if _is_torch(tensor):
            return _fn("Reduce").apply(tensor, self, op, root)
        return self._reduce(tensor, op, root)

    def Gather(self, tensor, gatheraxis, root):
        """The root gets every rank's tensor joined along gatheraxis (sizes
        along it may differ); the others an empty tensor."""
        if _is_torch(tensor):
            return _fn("Gather").apply(tensor, self, gatheraxis, root)
        return self._gather(tensor, gatheraxis, root)

    def Allgather(self, tensor, gatheraxis):
        """Every rank gets every rank's tensor joined along gatheraxis."""
        if _is_torch(tensor):
            return _fn("Allgather").apply(tensor, self, gatheraxis)
        return self._allgather(tensor, gatheraxis)

    def Scatter(self, tensor, scatteraxis, numelem, root):
        """Rank r gets piece r of root's tensor cut along scatteraxis, of
        numelem elements there (this rank's count, as mpi4torch; or a list
        of every rank's; or None: equal pieces). Off the root the tensor
        only says the dtype (and, in backward, the gradient's shape)."""
        if _is_torch(tensor):
            return _fn("Scatter").apply(tensor, self, scatteraxis, numelem, root)
        return self._scatter(tensor, scatteraxis, numelem, root)

    def Alltoall(self, tensor, gatheraxis, scatteraxis, numelem):
        """Rank r gets piece r (along scatteraxis, numelem elements there
        on this rank) of every rank's tensor, joined along gatheraxis. With
        gatheraxis == scatteraxis (mpi4torch's redistribution): the ranks'
        tensors joined along the axis, cut again in pieces of every rank's
        numelem, rank r getting piece r (its backward the redistribution
        back)."""
        if _is_torch(tensor):
            return _fn("Alltoall").apply(tensor, self, gatheraxis, scatteraxis, numelem)
        return self._alltoall(tensor, gatheraxis, scatteraxis, numelem)

    def ReduceScatter(self, tensor, op, scatteraxis, numelem=None):
        """Rank r gets piece r (numelem elements along scatteraxis; None:
        equal pieces) of the reduction of every rank's tensor."""
        if _is_torch(tensor):
            return _fn("ReduceScatter").apply(tensor, self, op, scatteraxis, numelem)
        return self._reducescatter(tensor, op, scatteraxis, numelem)

    def Barrier(self):
        """Returns once every rank has called it."""
        self._run("barrier", None)

    def Isend(self, tensor, dest, tag):
        """Starts sending tensor to dest; Wait on the handle."""
        st = _P2P(self, True, dest, tag, tensor)
        if _is_torch(tensor):
            return WaitHandle(_fn("Start").apply(tensor, st), st)
        self._start(st, tensor)
        return WaitHandle(None, st)

    def Irecv(self, tensor, source, tag):
        """Starts receiving a tensor of tensor's dtype and shape from source."""
        st = _P2P(self, False, source, tag, tensor)
        if _is_torch(tensor):
            return WaitHandle(_fn("Start").apply(tensor, st), st)
        self._start(st, tensor)
        return WaitHandle(None, st)

    def Wait(self, waithandle):
        """Completes an Isend (returns its tensor) or an Irecv (returns what
        arrived)."""
        st = waithandle._state
        if st.waited:
            raise WaitedError("Wait: this handle was waited for already")
        st.waited = True
        if waithandle.dummy is not None:
            return _fn("Wait").apply(waithandle.dummy, st, st.like)
        out = self._wait(st.id, st.like, not st.send)
        return st.like if st.send else out

    def Send(self, tensor, dest, tag):
        """Sends tensor to dest and returns it once dest has it. Without a
        gradient to carry (numpy, or no autograd), one call of the sidecar
        (its blocking send, from where the call put the tensor), else
        Wait(Isend(...)), whose backward receives the gradient."""
        if not _needs_grad(tensor):
            self._run("send", tensor, peer=dest, tag=tag)
            return tensor
        return self.Wait(self.Isend(tensor, dest, tag))

    def Recv(self, tensor, source, tag):
        """Receives a tensor of tensor's dtype and shape from source. Without
        a gradient to carry, one call of the sidecar (its blocking receive,
        into where the output stays), else Wait(Irecv(...))."""
        if not _needs_grad(tensor):
            return self._run("recv", tensor, write=False, inplace=True, peer=source, tag=tag)
        return self.Wait(self.Irecv(tensor, source, tag))


def JoinDummies(loopthrough, dummies):
    """loopthrough, on which autograd now also sees dummies depend: the
    backward of each dummy runs when loopthrough's does (mpi4torch's)."""
    if not _is_torch(loopthrough):
        return loopthrough
    ds = [d for d in dummies if d is not None]
    return _fn("JoinDummies").apply(loopthrough, *ds)


def JoinDummiesHandle(handle, dummies):
    """JoinDummies on a WaitHandle's dummy."""
    if handle.dummy is None:
        return handle
    return WaitHandle(JoinDummies(handle.dummy, dummies), handle._state)


def deactivate_cuda_aware_mpi_support():
    """mpi4torch's switch; a no-op here (tensors on a GPU go through host
    memory)."""


_FNS = {}


def _fn(name):
    if not _FNS:
        from . import _collective_autograd
        _FNS.update(_collective_autograd.functions())
    return _FNS[name]


# The longest time a sidecar's flag takes: Go's Duration holds 292 years;
# a longer timeout, or float("inf"), is as good as forever.
_GO_SECONDS_MAX = 100 * 365 * 86400


def _go_seconds(x):
    """x seconds as a Go duration flag ("12.5s"), capped at 100 years: "1e+10s"
    or "10000000000.0s" are no Duration Go parses, and the sidecar would
    exit with a usage error."""
    return f"{min(float(x), _GO_SECONDS_MAX):.6f}s"


def join(addr=None, rank=None, size=None, *, token=None, token_file=None, transport="auto", shm_dir=None,
         timeout=60, frozen_after=5, binary=None, spin=None):
    """Joins a communicator: rank of size, rank 0 listening at addr
    ("host:port"), the others reaching it there (they may start in any
    order within timeout seconds). Without arguments, torchrun's variables:
    RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT (under torchrun, whose agent
    listens on MASTER_PORT, rank 0 listens on MASTER_PORT+1;
    $TENSORWIRE_COLLECTIVE_PORT, when set, is the port). token (or token_file's) is
    the secret every rank shares (default $TENSORWIRE_TOKEN); transport
    "auto" (shared mappings when every rank is on this host; a hierarchy
    when the ranks are on several hosts, some with two or more), "shm",
    "tcp" or "hier" (shared mappings within each host, TCP between hosts;
    a host is a kernel and a shm_dir). The sidecar is the tensorwire binary: binary, $TENSORWIRE_BIN, the
    one bundled by a wheel built with Go, or PATH's. A rank stopped (SIGSTOP) frozen_after seconds is lost to the
    others. spin is how long (seconds, at most 1; default
    $TENSORWIRE_COLLECTIVE_SPIN_US microseconds, else 0) this process and
    its sidecar each watch for the other's next frame before sleeping in
    read, yielding the processor between looks: it saves the wake-ups of a
    call where every rank's two processes have a core of their own, and
    costs more than it saves where they do not (docs/collective.md, "Why a
    sidecar"); 0 sleeps at once (the pipe alone)."""
    env = os.environ
    if addr is None:
        if "MASTER_ADDR" not in env or "MASTER_PORT" not in env:
            raise ConfigError("join: no addr, and MASTER_ADDR and MASTER_PORT are not set")
        port = int(env["MASTER_PORT"])
        if env.get("TENSORWIRE_COLLECTIVE_PORT"):
            port = int(env["TENSORWIRE_COLLECTIVE_PORT"])
        elif env.get("TORCHELASTIC_RUN_ID"):
            port += 1  # under torchrun, its agent's store holds MASTER_PORT
        addr = f"{env['MASTER_ADDR']}:{port}"
    if rank is None:
        rank = int(env.get("RANK", "0"))
    if size is None:
        size = int(env.get("WORLD_SIZE", "1"))
    if token is None and token_file is None:
        token = env.get("TENSORWIRE_TOKEN") or None
    s = _Sidecar(_binary(binary), addr, rank, size, token, token_file, transport, shm_dir, timeout,
                 frozen_after, _spin_seconds(spin))
    return MPI_Communicator(s)


_world = None
_world_lock = threading.Lock()


def __getattr__(name):
    # COMM_WORLD is joined on first use, from torchrun's variables.
    global _world
    if name == "COMM_WORLD":
        with _world_lock:
            if _world is None:
                _world = join()
            return _world
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
