"""Collective primitives: the placeholder recorded by a replica, and what the rewrite turns it into.

``collective`` is the placeholder. While replica i's subgraph is traced its peers do not exist, so
``all_reduce`` & co. only record a node with the kind, its arguments and a sequence number. The pass
``passes/replicate_collectives.py`` matches the n-th placeholder of every local replica and replaces
them with ``local_reduce`` (in-process combine), ``mpi_*`` (one cross-process collective) and
ordinary ops for the fan-out.

Rows for the shared tables (shape rule, NumPy implementation, VJP) are registered here.
"""

from __future__ import annotations

import numpy as np

from ..errors import ShapeError
from .core import AVal
from .passes.dce import SIDE_EFFECTS
from .primitives import COLLECTIVE, declare

KINDS = ("all_reduce", "all_gather", "broadcast", "reduce_scatter", "permute")
REDUCE_OPS = ("sum", "mean", "max", "min")


def _collective_shape(x, *, kind, num_replicas, axis=0, tiled=False, **_):
    shape = list(x.shape)
    if kind == "all_gather":
        if tiled:
            shape[axis] *= num_replicas
        else:
            shape.insert(axis, num_replicas)
    elif kind == "reduce_scatter":
        if shape[axis] % num_replicas:
            raise ShapeError(f"reduce_scatter: axis {axis} of size {shape[axis]} is not divisible "
                             f"by {num_replicas} replicas")
        shape[axis] //= num_replicas
    return AVal(tuple(shape), x.dtype)


def _same_all(*xs, **_):
    if len({(x.shape, x.dtype) for x in xs}) != 1:
        raise ShapeError("local_reduce operands differ")
    return xs[0]


def _gathered(x, *, size, **_):
    return AVal((size,) + x.shape, x.dtype)


declare("collective", COLLECTIVE, _collective_shape)
# what the rewrite produces: gradients are taken before it, on the placeholder
declare("local_reduce", COLLECTIVE, _same_all, differentiable=False)
declare("mpi_allreduce", COLLECTIVE, lambda x, **_: x, differentiable=False)
declare("mpi_allgather", COLLECTIVE, _gathered, differentiable=False)
declare("mpi_broadcast", COLLECTIVE, lambda x, **_: x, differentiable=False)
# what gradient bucketing produces with overlap: start a flat buffer's all-reduce on the
# communication thread (the value is a handle), and wait for it where the result is needed
declare("comm_start", COLLECTIVE, lambda x, **_: x, differentiable=False)
declare("comm_wait", COLLECTIVE, lambda h, **_: h, differentiable=False)

# Communication must run on every rank even where its result is unused (say, the gradient of a
# broadcast on a rank without the root): dead-code elimination must not drop one rank's side.
SIDE_EFFECTS.update({"collective", "mpi_allreduce", "mpi_allgather", "mpi_broadcast",
                     "comm_start", "comm_wait"})


# -- NumPy implementations -------------------------------------------------------------------------
def _comm():
    from ..runtime.comm import world

    return world()


def eager_collective(x, *, kind, num_replicas, replica, op="sum", axis=0, tiled=False, root=0,
                     shift=0, seq=0):
    """A collective run at once: one replica per process (eager mode, or an unreplicated graph)."""
    comm = _comm()
    if num_replicas != comm.size:
        raise ShapeError(f"eager collectives need one replica per process: {num_replicas} "
                         f"replicas on {comm.size} processes")
    if comm.size > 1:
        _check_agreement(comm, x, kind, dict(op=op, axis=axis, tiled=tiled, root=root, shift=shift))
    if kind == "all_reduce":
        out = comm.allreduce(x, "sum" if op == "mean" else op)
        return out / num_replicas if op == "mean" else out
    if kind == "broadcast":
        return comm.bcast(x, root)
    gathered = comm.allgather(x)  # (R, ...)
    if kind == "all_gather":
        out = np.moveaxis(gathered, 0, axis)
        return out.reshape(_collective_shape(AVal(x.shape, x.dtype), kind=kind, axis=axis,
                                             tiled=tiled, num_replicas=num_replicas).shape)
    if kind == "permute":
        return gathered[(replica - shift) % num_replicas]
    # reduce_scatter
    total = gathered.sum(0) if op in ("sum", "mean") else getattr(gathered, op)(0)
    if op == "mean":
        total = total / num_replicas
    chunk = x.shape[axis] // num_replicas
    return np.take(total, np.arange(replica * chunk, (replica + 1) * chunk), axis=axis)


_ARGS = {"all_reduce": ("op",), "all_gather": ("axis", "tiled"), "broadcast": ("root",),
         "reduce_scatter": ("op", "axis"), "permute": ("shift",)}


def _check_agreement(comm, x, kind, attrs):
    """Eager mode has no schedule to compare ahead of time: before each collective the processes
    compare what they are about to call (a tagged fixed-size header, ``runtime/agree.py``), so a
    disagreement — another collective, other shapes, or a collective that only some processes
    call, which meets the others' next exchange — is an error named on every rank with every
    rank's call and line, never a hang, a misread message or a silently wrong result."""
    from ..errors import source_line, user_frame
    from ..runtime.agree import COLLECTIVE, agree, digest

    args = ", ".join(f"{k}={attrs[k]!r}" for k in _ARGS[kind])
    mine = f"{kind}({AVal(tuple(x.shape), x.dtype)}, {args})"
    agree(comm, COLLECTIVE, digest(mine),
          describe=lambda: f"{mine} at {source_line(user_frame())}")


def _local_reduce(*xs, op):
    out = xs[0]
    fn = {"sum": np.add, "max": np.maximum, "min": np.minimum}[op]
    for x in xs[1:]:
        out = fn(out, x)
    return out


def _register_impls():
    from ..backends.numpy_impl import IMPL

    IMPL["collective"] = eager_collective
    IMPL["local_reduce"] = _local_reduce
    IMPL["mpi_allreduce"] = lambda x, op, owned=False, **_: _comm().allreduce(x, op, owned)
    IMPL["mpi_allgather"] = lambda x, size, **_: _comm().allgather(x)
    IMPL["mpi_broadcast"] = lambda x, root, **_: _comm().bcast(x, root)
    IMPL["comm_start"] = _comm_start
    IMPL["comm_wait"] = lambda handle, **_: handle.result()


def _comm_start(x, *, op, owned=False, **_):
    from ..runtime.overlap import start_allreduce

    return start_allreduce(x, op, owned)


# -- VJP of the placeholder: expressed with collectives again -------------------------------------
def _collective_vjp(g, out, needs, x, *, kind, num_replicas, replica, op="sum", axis=0,
                    tiled=False, root=0, shift=0, seq=0):
    from .. import collectives as C
    from .. import numpy as rnp

    if kind == "all_reduce":
        if op in ("sum", "mean"):
            return (C.all_reduce(g, op),)
        mask = rnp.cast(rnp.equal(x, out), g.dtype)
        return (C.all_reduce(g, "sum") * mask,)
    if kind == "all_gather":
        total = C.all_reduce(g, "sum")
        if tiled:
            n = x.shape[axis]
            index = (slice(None),) * axis + (slice(replica * n, (replica + 1) * n),)
        else:
            index = (slice(None),) * axis + (replica,)
        return (total[index],)
    if kind == "broadcast":
        total = C.all_reduce(g, "sum")
        return (total if replica == root else rnp.zeros_like(total),)
    if kind == "reduce_scatter":
        if op not in ("sum", "mean"):
            raise NotImplementedError(f"gradient of reduce_scatter({op!r})")
        full = C.all_gather(g, axis=axis, tiled=True)
        return (full / num_replicas if op == "mean" else full,)
    if kind == "permute":
        return (C.permute(g, -shift),)
    raise AssertionError(kind)


def _register_vjps():
    from .vjp_rules import VJP

    VJP["collective"] = _collective_vjp


_register_impls()
_register_vjps()
