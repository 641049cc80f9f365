"""Requests by bell for tensorwire.serve's Client (serve/bellclient.go's
side in Python; the ring and the futexes are _bell.py's): predict() pushes
its request to the client's ring, rings the node's bell and sleeps on its
record; predict_async and apredict push theirs and one collector thread
sleeps in futex_waitv on all their records. BellRequests holds those
methods of Client (the state they use is Client's: its lock, its ring, its
requests' admission), as bellclient.go holds serve.Client's in Go."""

import os
import re
import threading
import time

from . import _bell, errors as _errors
from .errors import DeadlineExceededError, InternalError

# The bell's timing, as serve/bellclient.go's: a waiter reads its record
# _BELL_SPINS times before it sleeps on it, _BELL_NAP at most at a time;
# asks the node every _BELL_PROBE whether it holds the registration
# (waiting for its record or for room in a full ring); a request abandoned
# keeps its slots until the node is done with it, at most _BELL_QUIET.
_BELL_SPINS = 50
_BELL_NAP = 0.1
_BELL_PROBE = 0.5
_BELL_QUIET = 30.0
_BELL_ROOM_NAP = 0.01  # the longest sleep waiting for room in a full ring
_BELL_DIR_RE = re.compile(r"^\.tensorwire-serve/nodes/[0-9a-f]{16}$")


class BellRequests:
    """The bell's half of serve.Client (a mixin: Client alone makes it)."""

    def _run_bell(self, req):
        """Runs req by bell: pushes it to the ring, rings the node's bell and
        waits on its record, pushing it again after the node registered the
        client anew (it restarted) and after an Unavailable failure (the
        node going down), as a call is sent again. None when the node gave
        no bell after all (the caller calls).

        A full ring is waited on as a record is: until the client closes or
        the deadline passes, asking the node every _BELL_PROBE whether it
        holds the registration. A ring stays full when the node is gone
        with requests in it; registering again (with the node restarted)
        empties it. The wait sleeps, 100 us at first, twice as long each
        time up to _BELL_ROOM_NAP."""
        ring = self._ring
        probe, nap = None, 0.0001
        while True:
            gen = self.registrations
            seq = ring.push(req.start, req.n, lambda: self.registrations == gen)
            if seq is None:
                return None
            if seq == _bell.REPUSH:
                continue  # registered again since gen was read: under the new registration
            if seq == _bell.FULL:  # the node has not taken the requests before
                self._bell_check(req)
                now = time.monotonic()
                if probe is None:
                    probe = now + _BELL_PROBE
                elif now >= probe:
                    self._probe()
                    probe = time.monotonic() + _BELL_PROBE
                    continue
                left = _s._left(req.deadline)
                time.sleep(max(min(nap, probe - now, left if left is not None else nap), 0))
                nap = min(2 * nap, _BELL_ROOM_NAP)
                continue
            probe, nap = None, 0.0001
            req.rung = seq
            if not self._wait_bell(req, seq, gen):
                continue  # registered again meanwhile: push it again
            req.rung = 0
            out = self._bell_result(req, seq)
            if out is not None:
                return out

    def _bell_result(self, req, seq):
        """The outputs of req, whose record says seq is done; None after a
        failure it may be rung again for (the node unreachable, the
        registration lost and made anew), the backoff waited out."""
        ring = self._ring
        if ring.status(req.start) == 0:
            return self._slot_outputs(req, ring.version(req.start))
        cid = self._id
        try:
            self._client.call("serve.failure", {"name": self.name, "client": cid, "start": req.start,
                                                "seq": seq}, timeout=_s._left(req.deadline))
        except BaseException as e:  # noqa: BLE001 (the request's own error, or the call's)
            err = self._retryable(req, e)
            if err is not None:
                raise err from None
            if isinstance(e, _s.NotRegisteredError):
                self._register(cid, req.deadline)  # the node lost the registration: make it anew
            self._backoff(req)
            return None
        raise InternalError(f"serve: the node said request {seq} failed, then that it did not")

    def _bell_check(self, req):
        """Raises what ends a request waiting by bell: the client closed, its
        deadline passed."""
        if self._closed:
            raise _s.ClosedError("serve: closed")
        left = _s._left(req.deadline)
        if left is not None and left <= 0:
            raise DeadlineExceededError("serve: predict: deadline exceeded")

    def _wait_bell(self, req, seq, gen):
        """Waits until req's record says seq is done (True), or the client
        registered again (False: push it again); a short spin first. Asks
        the node every _BELL_PROBE seconds whether it still holds the
        registration, registering again when it does not."""
        ring, start = self._ring, req.start
        for _ in range(_BELL_SPINS):
            if ring.done(start) == seq:
                return True
        probe = time.monotonic() + _BELL_PROBE
        while True:
            d = ring.done(start)
            if d == seq:
                return True
            self._bell_check(req)
            if self.registrations != gen:
                return False
            now = time.monotonic()
            if now >= probe:
                self._probe()
                probe = time.monotonic() + _BELL_PROBE
                continue
            nap = min(_BELL_NAP, probe - now)
            left = _s._left(req.deadline)
            if left is not None:
                nap = min(nap, left)
            ring.sleep(start, d, max(nap, 0))

    def _probe(self, timeout=None):
        """Renews the registration (the call's timeout: _BELL_PROBE by
        default), registering again if the node lost it; an unreachable
        node is not an error here (the next renewal, or a request, tries
        again)."""
        timeout = timeout or _BELL_PROBE
        cid = self._id
        try:
            self._client.call("serve.renew", {"name": self.name, "client": cid}, timeout=timeout)
        except _s.NotRegisteredError:
            try:
                self._register(cid, _s._deadline(timeout))
            except _errors.TensorwireError:
                pass
        except _errors.TensorwireError:
            pass

    def _quiet(self, start, n, seq, until):
        """Gives slots [start, start+n) back once the node is done with the
        request seq rung on them (its record says so), the client closed,
        or until passed (the node is gone, or stuck): a request abandoned
        mid-way (its deadline) may still be in the node's queue, which
        would write its outputs there."""
        if self._closed:
            return
        if self._ring.done(start) == seq or time.monotonic() >= until:
            self._put_slots(start, n)
            return
        t = threading.Timer(_BELL_NAP, self._quiet, args=(start, n, seq, until))
        t.daemon = True
        t.start()

    def _bell_after(self, req):
        """A retry pool thread: req's record said its request failed: asks
        the node why, and runs it again when it may."""
        try:
            out = self._bell_result(req, req.rung)
            req.rung = 0
            if out is None:
                out = self._run(req)
        except BaseException as e:  # noqa: BLE001 (delivered through the future)
            req.rung = 0
            self._finish(req, err=e)
            return
        self._finish(req, value=out)

    def _ring_async(self, req):
        """Rings req's request and hands it to the bell collector; False when
        the node gave no bell after all (the caller calls)."""
        while True:
            gen = self.registrations
            seq = self._ring.push(req.start, req.n, lambda: self.registrations == gen)
            if seq != _bell.REPUSH:  # else registered again since gen was read: under the new registration
                break
        if seq is None:
            return False
        if seq == _bell.FULL:  # the ring is full: a pool thread pushes it as predict does
            self._submit(self._run_async, req)
            return True
        req.rung, req.gen, req.probe = seq, gen, time.monotonic() + _BELL_PROBE
        with self._mu:
            if self._closed:
                _s._fail(req, _s.ClosedError("serve: closed"))
                return True
            self._bell_flight[req] = None
            if self._bell_collector is None:
                if self._watch is None:
                    self._watch = _bell.Watch()
                self._bell_collector = threading.Thread(target=self._collect_bells,
                                                        name="tensorwire-serve-bells", daemon=True)
                self._bell_collector.start()
            self._watch.change()
            sleeping = self._bell_sleeping
        if sleeping:
            self._watch.wake()
        return True

    def _collect_bells(self):
        """The bell collector: finishes each request whose record says done,
        hands the failed and those to ring again to the retry pool, fails
        those past their deadline, and sleeps on the records of the first
        _bell.WAITV_MAX - 1 still waiting and on its own word. Those after
        them (rung later, so mostly done later) are looked at whenever it
        wakes, and at least every nap: 1 ms after a request ended, twice
        as long each time nothing did, up to _BELL_NAP."""
        ring, watch = self._ring, self._watch
        watched = set()  # the requests counted as waiters on their records
        nap = 0.001  # while requests go unwatched
        try:
            while True:
                with self._mu:
                    if self._closed:
                        return
                    flight = list(self._bell_flight)
                now = time.monotonic()
                ended = []
                for r in flight:
                    if ring.done(r.start) == r.rung:
                        ended.append((r, "done"))
                    elif r.deadline is not None and now >= r.deadline:
                        ended.append((r, "late"))
                    elif self.registrations != r.gen:
                        ended.append((r, "again"))
                if ended:
                    nap = 0.001
                    with self._mu:
                        for r, _ in ended:
                            self._bell_flight.pop(r, None)
                    for r, how in ended:
                        if r in watched:
                            watched.discard(r)
                            ring.add_waiter(r.start, -1)
                        try:
                            self._bell_end(r, how)
                        except BaseException as e:  # noqa: BLE001 (taken from the flight: it must end here)
                            self._finish(r, err=InternalError(f"serve: ending a prediction by bell failed: {e!r}"))
                    continue
                if any(now >= r.probe for r in flight):
                    for r in flight:
                        r.probe = now + _BELL_PROBE
                    self._probe_later()
                watch_now = set(flight[:_bell.WAITV_MAX - 1])
                for r in watched - watch_now:
                    ring.add_waiter(r.start, -1)
                for r in watch_now - watched:
                    ring.add_waiter(r.start, 1)
                watched = watch_now
                until = now + _BELL_NAP
                if len(flight) >= _bell.WAITV_MAX:
                    until, nap = now + nap, min(2 * nap, _BELL_NAP)
                for r in flight:
                    until = min(until, r.probe if r.deadline is None else min(r.probe, r.deadline))
                with self._mu:
                    if self._closed or len(self._bell_flight) != len(flight):
                        continue
                    self._bell_sleeping = True
                    words = [(watch.addr, watch.word())]
                # Each record's done word read after its waiter was counted:
                # the node, having stored done, wakes it or we see it here.
                words += [(ring.record_word(r.start), ring.done(r.start)) for r in flight[:_bell.WAITV_MAX - 1]]
                if all(d != r.rung for (_, d), r in zip(words[1:], flight)):
                    _bell.wait_any(words, until, watch.waitv)
                self._bell_sleeping = False
        except BaseException as e:  # noqa: BLE001 (a bug, or no memory: no request may hang on it)
            self._collector_failed(e)
        finally:
            for r in watched:
                ring.add_waiter(r.start, -1)

    def _collector_failed(self, e):
        """The bell collector stopped on e: its requests fail with
        InternalError (their slots kept until the node is done with them,
        as after a deadline), and the next request starts a collector
        anew."""
        with self._mu:
            flight = list(self._bell_flight)
            self._bell_flight.clear()
            self._bell_collector = None
            self._bell_sleeping = False
        _s._log.error("serve: the collector of predictions by bell failed (%r); %d of them fail with it", e,
                      len(flight), exc_info=e)
        for r in flight:
            self._finish(r, err=InternalError(f"serve: the collector of predictions by bell failed: {e!r}"))

    def _bell_end(self, req, how):
        """Ends (or hands on) req, taken from the bell collector's requests:
        its record said done, its deadline passed, or the client registered
        again (ring it again)."""
        if how == "late":
            self._finish(req, err=DeadlineExceededError("serve: predict: deadline exceeded"))
        elif how == "again":
            self._submit(self._run_async, req)
        elif self._ring.status(req.start) != 0:
            self._submit(self._bell_after, req)
        else:
            try:
                req.rung = 0
                out = self._slot_outputs(req, self._ring.version(req.start))
            except BaseException as e:  # noqa: BLE001 (delivered through the future)
                self._finish(req, err=e)
                return
            self._finish(req, value=out)

    def _probe_later(self):
        """Probes on a thread of its own, one at a time: the bell collector
        does not wait on a call."""
        with self._mu:
            if self._probing or self._closed:
                return
            self._probing = True

        def run():
            try:
                self._probe()
            finally:
                self._probing = False

        threading.Thread(target=run, name="tensorwire-serve-probe", daemon=True).start()

    def _use_bell(self, rel):
        """Maps the bell the node named at registration ("" for none: the
        requests go by call). One that cannot be mapped is logged and left:
        calls work without it."""
        path = None
        if rel:
            if not isinstance(rel, str) or not _BELL_DIR_RE.match(rel):
                raise InternalError(f"serve: the node named the bell {rel!r}")
            path = os.path.join(self._client.root, *rel.split("/"), "bell")
        try:
            self._ring.use_bell(path, rel)
        except OSError as e:
            _s._log.warning("serve: the node's bell %s cannot be mapped (%s); requests go by call", rel, e)
            self._ring.use_bell(None, "")


# serve's errors and helpers, imported last: serve imports this module for
# BellRequests, and whichever of the two is imported first, the other then
# finds what it needs already defined.
from . import serve as _s  # noqa: E402
