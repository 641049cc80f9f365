"""The torch.autograd.Functions of tensorwire.collective (imported when a
torch tensor first reaches a call, so that numpy users need no torch).

Each backward is the adjoint under the sum-of-losses convention, as
package collective's tape defines it (docs/collective.md, "Adjoints"):

    Allreduce(SUM)            -> Allreduce(SUM) of the gradient
    Bcast(root)               -> Reduce(SUM, root): the root the sum, the others zeros
    Reduce(SUM, root)         -> Bcast(root) of the root's gradient
    Gather(axis, root)        -> Scatter(axis, the forward's sizes, root)
    Scatter(axis, n, root)    -> Gather(axis, root): the root its input's gradient, the others zeros
    Allgather(axis)           -> ReduceScatter(SUM, axis, the forward's sizes)
    ReduceScatter(SUM, axis)  -> Allgather(axis)
    Alltoall(g, s, n)         -> Alltoall(s, g, the forward's sizes along g)
    Isend / Wait              -> Wait's backward starts receiving the gradient, Isend's waits for it
    Irecv / Wait              -> Wait's backward starts sending the gradient back, Irecv's waits

Any other reduction raises NoAdjointError in backward, on every rank.
"""

import torch

from . import collective as _c


def _no_adjoint(what, op):
    if op != _c.MPI_SUM:
        raise _c.NoAdjointError(f"{what}: no adjoint for reduction {op} (only MPI_SUM has one)")


class Allreduce(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, comm, op):
        ctx.comm, ctx.op = comm, op
        return comm._allreduce(x.detach(), op)

    @staticmethod
    def backward(ctx, g):
        _no_adjoint("Allreduce", ctx.op)
        return ctx.comm._allreduce(g, _c.MPI_SUM), None, None


class Bcast(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, comm, root):
        ctx.comm, ctx.root = comm, root
        return comm._bcast(x.detach(), root)

    @staticmethod
    def backward(ctx, g):
        return ctx.comm._reduce(g, _c.MPI_SUM, ctx.root), None, None


class Reduce(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, comm, op, root):
        ctx.comm, ctx.op, ctx.root = comm, op, root
        return comm._reduce(x.detach(), op, root)

    @staticmethod
    def backward(ctx, g):
        _no_adjoint("Reduce", ctx.op)
        return ctx.comm._bcast(g, ctx.root), None, None, None


class Gather(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, comm, axis, root):
        axis = _c._axis(axis, x)
        ctx.comm, ctx.axis, ctx.root = comm, axis, root
        y = comm._gather(x.detach(), axis, root)
        ctx.n = x.shape[axis]  # after the call: a bad axis is its error, on every rank
        return y

    @staticmethod
    def backward(ctx, g):
        return ctx.comm._scatter(g, ctx.axis, ctx.n, ctx.root), None, None, None


class Allgather(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, comm, axis):
        axis = _c._axis(axis, x)
        ctx.comm, ctx.axis = comm, axis
        y = comm._allgather(x.detach(), axis)
        ctx.n = x.shape[axis]  # after the call: a bad axis is its error, on every rank
        return y

    @staticmethod
    def backward(ctx, g):
        return ctx.comm._reducescatter(g, _c.MPI_SUM, ctx.axis, ctx.n), None, None


class Scatter(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, comm, axis, numelem, root):
        axis = _c._axis(axis, x)
        ctx.comm, ctx.axis, ctx.root = comm, axis, root
        ctx.meta = (x.shape, x.dtype, x.device)
        return comm._scatter(x.detach(), axis, numelem, root)

    @staticmethod
    def backward(ctx, g):
        gi = ctx.comm._gather(g, ctx.axis, ctx.root)
        if ctx.comm.rank != ctx.root:
            shape, dtype, device = ctx.meta
            gi = torch.zeros(shape, dtype=dtype, device=device)
        return gi, None, None, None, None


class Alltoall(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, comm, gatheraxis, scatteraxis, numelem):
        g, s = _c._axis(gatheraxis, x), _c._axis(scatteraxis, x)
        ctx.comm, ctx.g, ctx.s = comm, g, s
        y = comm._alltoall(x.detach(), g, s, numelem)
        ctx.n = x.shape[g]  # after the call: a bad axis is its error, on every rank
        return y

    @staticmethod
    def backward(ctx, g):
        return ctx.comm._alltoall(g, ctx.s, ctx.g, ctx.n), None, None, None, None


class ReduceScatter(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, comm, op, axis, numelem):
        axis = _c._axis(axis, x)
        ctx.comm, ctx.op, ctx.axis = comm, op, axis
        return comm._reducescatter(x.detach(), op, axis, numelem)

    @staticmethod
    def backward(ctx, g):
        _no_adjoint("ReduceScatter", ctx.op)
        return ctx.comm._allgather(g, ctx.axis), None, None, None, None


class Start(torch.autograd.Function):
    """Isend or Irecv: returns the handle's dummy. Its backward waits for
    the reverse transfer that Wait's backward started."""

    @staticmethod
    def forward(ctx, x, st):
        ctx.st = st
        ctx.meta = (x.shape, x.dtype, x.device)
        st.comm._start(st, x.detach())
        dt = x.dtype if x.dtype.is_floating_point else torch.float64
        return torch.zeros((), dtype=dt, device=x.device)

    @staticmethod
    def backward(ctx, g):
        st = ctx.st
        if st.back is None:
            raise RuntimeError("tensorwire.collective: the backward of an Isend or Irecv ran before its Wait's: "
                               "the Wait's result must reach the loss (JoinDummies)")
        shape, dtype, device = ctx.meta
        like = torch.zeros(shape, dtype=dtype, device=device)
        got = st.comm._wait(st.back, like, st.send)  # Wait's backward received for an Isend
        st.back = None
        if st.send:
            return got, None
        return like, None


class Wait(torch.autograd.Function):
    """Completes an Isend (its tensor) or an Irecv (what arrived). Its
    backward starts the reverse transfer: receiving the Isend's gradient
    from its destination, or sending the Irecv's gradient to its source."""

    @staticmethod
    def forward(ctx, dummy, st, like):
        ctx.st, ctx.ddt = st, dummy.dtype
        ctx.meta = (like.shape, like.dtype, like.device)
        out = st.comm._wait(st.id, like.detach(), not st.send)
        if st.send:
            return like.detach().clone()
        return out

    @staticmethod
    def backward(ctx, g):
        st = ctx.st
        shape, dtype, device = ctx.meta
        if st.send:
            back = _c._P2P(st.comm, False, st.peer, st.tag, None)
            st.back = st.comm._start(back, torch.zeros(shape, dtype=dtype, device=device))
        else:
            back = _c._P2P(st.comm, True, st.peer, st.tag, None)
            st.back = st.comm._start(back, g.detach())
        return torch.zeros((), dtype=ctx.ddt, device=device), None, None


class JoinDummies(torch.autograd.Function):
    @staticmethod
    def forward(ctx, loopthrough, *dummies):
        ctx.meta = [(d.shape, d.dtype, d.device) for d in dummies]
        return loopthrough.view_as(loopthrough)

    @staticmethod
    def backward(ctx, g):
        return (g,) + tuple(torch.zeros(s, dtype=dt, device=dev) for s, dt, dev in ctx.meta)


def functions():
    return {f.__name__: f for f in (Allreduce, Bcast, Reduce, Gather, Allgather, Scatter, Alltoall,
                                    ReduceScatter, Start, Wait, JoinDummies)}
