"""The bell from Python (serve/bell.go): a client's requests by reference
appended to a ring file it shares with the node, the node's bell rung with
a futex, and each request's record waited on with a futex, where a call
would cross the loopback TCP connection both ways.

Only on Linux on x86-64. The ring's words are written with plain stores
(Python has no atomics), in an order the node must see: an entry before the
tail that publishes it, a record's outputs before its sequence number. x86's
stores are seen in the order they are made (TSO); elsewhere they need
barriers that Python cannot make, so other machines use calls. Where a
plain store could lose to another writer's, the protocol does not depend on
it: the bell's word only has to change (a waking client writes a random
value into it, where a Go client adds one) and the client wakes the
node's poller with a futex after every request, so a wake-up is never left
to a word another client may have overwritten; a record's waiters count has
one writer, the request waiting on it. The futex calls order what the
kernel reads after the stores before them (futex_wait's and futex_wake's
full barriers), which is what makes a sleeper and its waker agree.

A client's collector thread waits for many requests at once (predict_async
and apredict) with futex_waitv (Linux 5.16 and later): on each request's
record and on a word of its own that a new request changes (Watch). Where
the kernel has no futex_waitv (or a seccomp filter refuses it), those
requests go by call.

Ring file layout (little-endian), as bell.go has it: 0 tail (u64, the
client's), 64 head (u64, the node's), 128 entries (slots x u64: start << 43
| n << 22 | seq), then, at the next multiple of 64, slots records of 32
bytes: done (u32, the last sequence number done), status (u32, 0 ok, 1
failed), waiters (u32), 16 version (u64). The node's bell file: 0 ring
(u32), 64 sleeping (u32); 4096 bytes.
"""

import ctypes
import mmap
import os
import platform
import random
import sys
import threading

SUPPORTED = sys.platform.startswith("linux") and platform.machine() in ("x86_64", "AMD64")

_SYS_FUTEX = 202  # x86-64
_SYS_FUTEX_WAITV = 449  # x86-64, Linux 5.16
_FUTEX2_SIZE_U32 = 0x02
_CLOCK_MONOTONIC = 1  # time.monotonic's clock on Linux
WAITV_MAX = 128  # the kernel's FUTEX_WAITV_MAX
_FUTEX_WAIT = 0  # shared futexes (not FUTEX_PRIVATE): the waiter and the waker are other processes
_FUTEX_WAKE = 1

_RING_TAIL = 0
_RING_HEAD = 64
_RING_ENTRIES = 128
_RECORD_SIZE = 32
BELL_SIZE = 4096
_BELL_RING = 0
_SEQ_BITS = 22
_ROW_BITS = 21
SEQ_MASK = (1 << _SEQ_BITS) - 1
FULL = -1  # Ring.push: the ring is full
REPUSH = -2  # Ring.push: the client registered again; read the registration and push again

_libc = None


class _Timespec(ctypes.Structure):
    _fields_ = [("tv_sec", ctypes.c_long), ("tv_nsec", ctypes.c_long)]


def _syscall():
    global _libc
    if _libc is None:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.syscall.restype = ctypes.c_long
        _libc = libc
    return _libc.syscall


class _Waitv(ctypes.Structure):
    _fields_ = [("val", ctypes.c_uint64), ("uaddr", ctypes.c_uint64), ("flags", ctypes.c_uint32),
                ("reserved", ctypes.c_uint32)]


_waitv_ok = None


def waitv_supported():
    """Whether this kernel lets the process call futex_waitv (asked once:
    a call with no futexes answers EINVAL where it exists, ENOSYS or EPERM
    where it does not)."""
    global _waitv_ok
    if _waitv_ok is None:
        ok = False
        if SUPPORTED:
            r = _syscall()(_SYS_FUTEX_WAITV, None, 0, 0, None, _CLOCK_MONOTONIC)
            ok = r == -1 and ctypes.get_errno() == 22  # EINVAL
        _waitv_ok = ok
    return _waitv_ok


def wait_any(words, until, arr):
    """Sleeps while every u32 at addr in words [(addr, old), ...] (at most
    WAITV_MAX) holds its old, until the time.monotonic() until, the GIL
    released; returns early when one is woken or changed, or on a signal.
    arr: the caller's waitv array (Watch.waitv), filled here, so that a
    collector sleeping once a batch allocates nothing for it."""
    for i, (addr, old) in enumerate(words):
        arr[i].val, arr[i].uaddr, arr[i].flags = old, addr, _FUTEX2_SIZE_U32
    ts = _Timespec(int(until), int((until - int(until)) * 1e9))
    _syscall()(_SYS_FUTEX_WAITV, arr, len(words), 0, ctypes.byref(ts), _CLOCK_MONOTONIC)


class Watch:
    """A word of the process's own that a collector sleeping in wait_any
    also waits on: changed (under the caller's lock) by each new request,
    woken when the collector sleeps."""

    def __init__(self):
        self.mm = mmap.mmap(-1, 4096)
        self.w = memoryview(self.mm).cast("I")
        self.addr = _address(self.mm)
        self.waitv = (_Waitv * WAITV_MAX)()  # wait_any's array, the collector's alone

    def word(self):
        return self.w[0]

    def change(self):
        self.w[0] = (self.w[0] + 1) & 0xFFFFFFFF

    def wake(self):
        wake(self.addr)


def ring_size(slots):
    """The ring file's size for slots, and the offset of its records."""
    records = (_RING_ENTRIES + 8 * slots + 63) & ~63
    size = (records + _RECORD_SIZE * slots + 4095) & ~4095
    return size, records


def entry(start, n, seq):
    return start << (_ROW_BITS + _SEQ_BITS) | n << _SEQ_BITS | (seq & SEQ_MASK)


def _address(mm):
    """The address of an mmap's first byte."""
    c = ctypes.c_char.from_buffer(mm)
    try:
        return ctypes.addressof(c)
    finally:
        del c  # the buffer export ends: the mmap can be closed


def wait(addr, old, timeout):
    """Sleeps while the u32 at addr holds old, at most timeout seconds (the
    GIL released); returns early when woken, interrupted or changed."""
    ts = _Timespec(int(timeout), int((timeout - int(timeout)) * 1e9))
    _syscall()(_SYS_FUTEX, ctypes.c_void_p(addr), _FUTEX_WAIT, ctypes.c_uint32(old), ctypes.byref(ts), None,
               0)


def wake(addr):
    """Wakes every sleeper on the u32 at addr."""
    _syscall()(_SYS_FUTEX, ctypes.c_void_p(addr), _FUTEX_WAKE, 1 << 30, None, None, 0)


class Ring:
    """A client's ring file (made by make), and the node's bell it rings
    (use_bell). push appends a request under a lock; a request's record is
    read with done, status and version, and waited on with sleep. Never
    unmapped by the client: a predict still waiting when the client closes
    reads its record after close; the mappings go with the Ring."""

    def __init__(self, path, slots):
        size, self.records = ring_size(slots)
        self.slots = slots
        fd = os.open(path, os.O_RDWR)
        try:
            self.mm = mmap.mmap(fd, size)
        finally:
            os.close(fd)
        self.q = memoryview(self.mm).cast("Q")
        self.w = memoryview(self.mm).cast("I")
        self.addr = _address(self.mm)
        self.seq = [0] * slots
        self.mu = threading.Lock()
        self.bell = None  # (mmap, u32 view, address) of the node's bell; None: none (requests go by call)
        self.bell_dir = ""

    @staticmethod
    def make(path, slots, reserve):
        """Makes the ring file, zero-filled, its blocks reserved
        (reserve(f, size, path), as the slots' are)."""
        size, _ = ring_size(slots)
        with open(path, "wb") as f:
            f.truncate(size)
            reserve(f, size, path)

    def use_bell(self, path, rel):
        """Maps the node's bell file at path (rel: its folder under the
        root, as the node named it), replacing the one before; path None:
        none."""
        b = None
        if path is not None:
            fd = os.open(path, os.O_RDWR)
            try:
                if os.fstat(fd).st_size < BELL_SIZE:
                    raise OSError(f"the node's bell {path} holds {os.fstat(fd).st_size} bytes; want {BELL_SIZE}")
                mm = mmap.mmap(fd, BELL_SIZE)
            finally:
                os.close(fd)
            b = (mm, memoryview(mm).cast("I"), _address(mm))
        with self.mu:
            old, self.bell, self.bell_dir = self.bell, b, rel if b is not None else ""
        if old is not None:
            old[1].release()
            old[0].close()

    def push(self, start, n, held):
        """Appends a request for rows [start, start+n) and rings the bell: its
        sequence number; None when there is no bell (go by call), FULL when
        the ring is full (the node has not taken the requests before),
        REPUSH without appending when held() (called under the ring's
        lock) is false: the client registered again since the caller read
        the registration it will wait under, and the entry would be read
        under the new one while the caller, seeing the registration
        changed, sends it again (twice)."""
        with self.mu:
            b = self.bell
            if b is None:
                return None
            if not held():
                return REPUSH
            q = self.q
            t = q[_RING_TAIL // 8]
            if t - q[_RING_HEAD // 8] >= self.slots:
                return FULL
            seq = (self.seq[start] + 1) & SEQ_MASK or 1
            self.seq[start] = seq
            q[_RING_ENTRIES // 8 + t % self.slots] = entry(start, n, seq)
            q[_RING_TAIL // 8] = t + 1  # after the entry: x86 keeps the order
            w = b[1]
            old = w[_BELL_RING // 4]
            new = random.getrandbits(32)
            w[_BELL_RING // 4] = new if new != old else old ^ 1
            wake(b[2] + _BELL_RING)  # always: see the module's doc
            return seq

    def done(self, start):
        return self.w[(self.records + _RECORD_SIZE * start) // 4]

    def status(self, start):
        return self.w[(self.records + _RECORD_SIZE * start) // 4 + 1]

    def version(self, start):
        return self.q[(self.records + _RECORD_SIZE * start + 16) // 8]

    def sleep(self, start, seen, timeout):
        """Sleeps on start's record while its done word holds seen, at most
        timeout seconds, counted as a waiter so that the node wakes it."""
        i = (self.records + _RECORD_SIZE * start) // 4
        w = self.w
        w[i + 2] += 1  # waiters: this request's alone (one request per first row at a time)
        try:
            if w[i] == seen:
                wait(self.addr + 4 * i, seen, timeout)
        finally:
            w[i + 2] -= 1

    def record_word(self, start):
        """The address of start's record's done word."""
        return self.addr + self.records + _RECORD_SIZE * start

    def add_waiter(self, start, k):
        """Counts k more (or, negative, fewer) waiters on start's record: the
        node wakes a record's done word only when someone waits on it."""
        i = (self.records + _RECORD_SIZE * start) // 4 + 2
        self.w[i] = (self.w[i] + k) & 0xFFFFFFFF

    def wake_all(self):
        """Wakes every request sleeping on a record (close)."""
        for s in range(self.slots):
            i = (self.records + _RECORD_SIZE * s) // 4
            if self.w[i + 2]:
                wake(self.addr + 4 * i)
