"""What the package closes when the interpreter exits, in order: replicas
started on their own thread first, then serve clients by reference, then
Nodes, so that a replica leaves before its node stops (else it saw the node
go, said it was detached and tried to attach again, and left its folder in
the root), and a client unregisters and removes its slots' folder while its
node still answers (else the folder stayed for the next client to sweep).
Closing them in an atexit hook, before finalization, also keeps a Node's
output thread (a daemon reading its stdout) from aborting the interpreter
there ("Fatal Python error: _enter_buffered_busy") and removes its
temporary folders.

A child forked from the process (os.fork, multiprocessing's fork) inherits
these objects but owns none of them: it forgets them as it starts, so its
exit closes nothing of its parent's, and the clients that asked
(reset_at_fork) let go of the parent's state there (before, a child that
exited the normal way ran its parent's Nodes' stop() and hung in it)."""

import atexit
import os
import weakref

REPLICAS, CLIENTS, NODES = 0, 1, 2

_open = (weakref.WeakSet(), weakref.WeakSet(), weakref.WeakSet())


def close_at_exit(obj, stage):
    """Has obj.close() called at exit, in stage's turn, unless obj was
    collected first. Closing twice must do nothing."""
    _open[stage].add(obj)


@atexit.register
def _close_all():
    for objs in _open:
        for obj in list(objs):
            try:
                obj.close()
            except Exception:
                pass


_at_fork = weakref.WeakSet()


def reset_at_fork(obj):
    """Has obj._forked() called in a child forked from this process, as
    the child starts, unless obj was collected first: what a client must
    do so that the child's calls are its own (a connection, an identity)."""
    _at_fork.add(obj)


def _forget():
    for objs in _open:
        objs.clear()
    for obj in list(_at_fork):
        obj._forked()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget)
