"""Rank processes forked from a process that imported torch once.

A process of the suite that imports PyTorch spends most of its CPU
there: 1.4 s of a core with Debian's torch 1.13 and 2.2 s with PyPI's
current one (2026-12-02, CI's 2-core machine), against well under a
second for the rest of a collective test's rank. test_collective starts
42 such ranks (44 with CUDA), and CI runs the suite twice (Debian's
torch, then PyPI's). Measured alone on that machine, the module used 96
s of CPU with Debian's torch and 142 s with PyPI's when each rank was
exec'd, 43 s and 68 s forked from here.

Zygote is a helper process, started once per test module with the
module's interpreter and environment, that imports the modules it is
given (torch, numpy), starts no thread, and then forks a child for each
popen(): the child takes pipes for its stdout and stderr from the caller
(passed over a Unix socket; stdin is /dev/null), the caller's environment,
argv and working folder for it, and runs
the script as __main__, as `python SCRIPT ARGS` would. The children are
real processes with their own pids, signals and exit statuses, and
import tensorwire themselves (it is not preloaded: the code under test
starts in the child, with the child's environment). What they do not do
afresh is import torch and numpy: that was done before the fork, with the
zygote's environment (the module's; the tests set no variable torch reads
at import).

Forked is the child's handle, with what the tests use of subprocess.Popen:
pid, returncode, communicate(timeout), wait(timeout), poll(), kill(). Set
TENSORWIRE_TEST_EXEC=1 to start every rank as an exec of the interpreter
instead (available(): False).

The wire between test and zygote (one SOCK_SEQPACKET socket, a JSON
message each): the test sends {"argv", "env", "cwd"} with three file
descriptors and is answered {"pid"}; whenever a child exits, the zygote
sends {"exit": pid, "code": returncode} (negative: the signal's number).
The zygote exits when the test's end of the socket closes; children still
running are left to run, as Popen's are."""

import importlib
import json
import os
import selectors
import signal
import socket
import subprocess
import sys
import time


def available():
    """Whether rank processes may be forked from a zygote (not when
    TENSORWIRE_TEST_EXEC is set)."""
    return os.environ.get("TENSORWIRE_TEST_EXEC", "") in ("", "0")


class Zygote:
    """A zygote process of this interpreter with environment `env` that
    imports the modules named in `preload`. Not thread-safe: one test thread uses it."""

    def __init__(self, preload, env=None):
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        self._proc = subprocess.Popen(
            [sys.executable, os.path.abspath(__file__), str(theirs.fileno()), *preload],
            env=env, pass_fds=(theirs.fileno(),), stdin=subprocess.DEVNULL)
        theirs.close()
        self._sock = ours
        self._exits = {}
        msg = self._recv(timeout=300)
        if msg.get("ready") is not True:
            raise RuntimeError(f"zygote: unexpected first message {msg}")

    def _recv(self, timeout=None):
        """The next message; exits are kept in _exits and returned too."""
        self._sock.settimeout(timeout)
        try:
            data = self._sock.recv(1 << 16)
        except socket.timeout:
            raise subprocess.TimeoutExpired("zygote", timeout) from None
        if not data:
            raise RuntimeError(f"zygote: gone (exit {self._proc.poll()})")
        msg = json.loads(data)
        if "exit" in msg:
            self._exits[msg["exit"]] = msg["code"]
        return msg

    def popen(self, argv, env, cwd=None):
        """Starts `python argv[0] argv[1:]` as a child of the zygote, with
        stdin /dev/null and its stdout and stderr pipes that communicate()
        reads, as Popen(stdout=PIPE, stderr=PIPE, text=True) would."""
        fds, ours = [], []
        try:
            fds.append(os.open(os.devnull, os.O_RDONLY))
            for _ in range(2):
                r, w = os.pipe()
                ours.append(r)
                fds.append(w)
            req = json.dumps({"argv": list(argv), "env": dict(env), "cwd": cwd or os.getcwd()}).encode()
            self._sock.settimeout(60)  # a poll() may have left it non-blocking
            socket.send_fds(self._sock, [req], fds)
        except BaseException:
            for fd in ours:
                os.close(fd)
            raise
        finally:
            for fd in fds:
                os.close(fd)
        while True:
            msg = self._recv(timeout=60)
            if "pid" in msg:
                return Forked(self, msg["pid"], ours[0], ours[1])

    def close(self):
        """Ends the zygote (its running children are left alone)."""
        self._sock.close()
        try:
            self._proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self._proc.kill()
            self._proc.wait()


class Forked:
    """A child of a Zygote: the subset of subprocess.Popen the tests use."""

    def __init__(self, zygote, pid, out_fd, err_fd):
        self._z = zygote
        self.pid = pid
        self.returncode = None
        self._fds = {out_fd: 0, err_fd: 1}
        self._bufs = [[], []]
        self.args = [f"<zygote child {pid}>"]

    def poll(self):
        if self.returncode is None:
            if self.pid not in self._z._exits:
                # Take what the zygote has sent, without waiting.
                try:
                    while self.pid not in self._z._exits:
                        self._z._recv(timeout=0)
                except (subprocess.TimeoutExpired, BlockingIOError):
                    pass
            self.returncode = self._z._exits.pop(self.pid, None)
        return self.returncode

    def wait(self, timeout=None):
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.poll() is None:
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                raise subprocess.TimeoutExpired(self.args, timeout)
            try:
                self._z._recv(timeout=left)
            except subprocess.TimeoutExpired:
                raise subprocess.TimeoutExpired(self.args, timeout) from None
        return self.returncode

    def communicate(self, timeout=None):
        """Reads stdout and stderr to their ends and waits for the exit, as
        Popen.communicate(timeout) with text=True; on TimeoutExpired what
        was read is kept for the next call."""
        deadline = None if timeout is None else time.monotonic() + timeout
        sel = selectors.DefaultSelector()
        for fd in self._fds:
            sel.register(fd, selectors.EVENT_READ)
        try:
            while self._fds:
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    raise subprocess.TimeoutExpired(self.args, timeout)
                for key, _ in sel.select(left):
                    chunk = os.read(key.fd, 1 << 16)
                    if chunk:
                        self._bufs[self._fds[key.fd]].append(chunk)
                    else:
                        sel.unregister(key.fd)
                        os.close(key.fd)
                        del self._fds[key.fd]
        finally:
            sel.close()
        self.wait(None if deadline is None else max(0.0, deadline - time.monotonic()))
        return tuple(b"".join(b).decode(errors="replace") for b in self._bufs)

    def kill(self):
        if self.poll() is None:
            try:
                os.kill(self.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


def _child(req, fds):
    """In the forked child: become `python argv...`; never returns."""
    code = 1
    try:
        for i, fd in enumerate(fds):
            os.dup2(fd, i)
        for fd in fds:
            if fd > 2:
                os.close(fd)
        os.environ.clear()
        os.environ.update(req["env"])
        os.chdir(req["cwd"])
        script = req["argv"][0]
        sys.argv = list(req["argv"])
        sys.path[0] = os.path.dirname(os.path.abspath(script))
        import runpy
        try:
            runpy.run_path(script, run_name="__main__")
            code = 0
        except SystemExit as e:
            if e.code is None:
                code = 0
            elif isinstance(e.code, int):
                code = e.code
            else:
                print(e.code, file=sys.stderr)
                code = 1
        except KeyboardInterrupt:
            import traceback
            traceback.print_exc()
            code = -signal.SIGINT
        # What the interpreter does on its way out: wait for the threads
        # that are not daemons, then run the atexit functions.
        import atexit
        import threading
        threading._shutdown()
        atexit._run_exitfuncs()
    except BaseException:
        import traceback
        traceback.print_exc()
        code = 1
    finally:
        try:
            sys.stdout.flush()
            sys.stderr.flush()
        finally:
            if code < 0:  # died of SIGINT, as an interpreter that lets KeyboardInterrupt out does
                signal.signal(-code, signal.SIG_DFL)
                os.kill(os.getpid(), -code)
            os._exit(code & 0xFF)


def _serve(sock_fd, preload):
    for m in preload:
        importlib.import_module(m)
    sock = socket.socket(fileno=sock_fd)
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_w, False)
    signal.signal(signal.SIGCHLD, lambda *_: None)
    signal.set_wakeup_fd(wake_w)
    sock.send(json.dumps({"ready": True}).encode())
    live = set()
    sel = selectors.DefaultSelector()
    sel.register(sock, selectors.EVENT_READ)
    sel.register(wake_r, selectors.EVENT_READ)
    while True:
        ready = [k.fileobj for k, _ in sel.select()]
        if wake_r in ready:
            os.read(wake_r, 4096)
        while live:
            pid, status = os.waitpid(-1, os.WNOHANG)
            if pid == 0:
                break
            live.discard(pid)
            sock.send(json.dumps({"exit": pid, "code": os.waitstatus_to_exitcode(status)}).encode())
        if sock in ready:
            msg, fds, _, _ = socket.recv_fds(sock, 1 << 20, 3)
            if not msg:
                return
            pid = os.fork()
            if pid == 0:
                signal.set_wakeup_fd(-1)
                signal.signal(signal.SIGCHLD, signal.SIG_DFL)
                sel.close()
                sock.close()
                os.close(wake_r)
                os.close(wake_w)
                _child(json.loads(msg), fds)
            for fd in fds:
                os.close(fd)
            live.add(pid)
            sock.send(json.dumps({"pid": pid}).encode())


if __name__ == "__main__":
    _serve(int(sys.argv[1]), sys.argv[2:])
