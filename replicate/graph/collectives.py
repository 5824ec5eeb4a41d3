"""Collective primitives: one per collective, and what the placeholder rewrite turns them into.

``all_reduce``, ``all_gather``, ``broadcast``, ``reduce_scatter`` and ``permute`` are
*placeholders*: while replica i's subgraph is traced its peers do not exist, so a call only
records a node with its arguments, the replica's id and a sequence number (``bind_collective``).
Each has its rows like any primitive: the shape rule here, the gradient in ``vjp_rules.py`` and
its meaning, once, as the rewrite's row in ``passes/replicate_collectives.py`` (``LOWER``) — eager
mode runs that same row at once, one replica per process (``runtime/communication/host_rows.py``
fills the reference table with it for every name in ``PLACEHOLDERS``).

The rewrite produces ``local_reduce`` (the in-process combine), ``mpi_*`` (one cross-process
collective) and, with gradient bucketing, ``comm_start``/``comm_wait`` (a flat buffer reduced on
the communication thread while the step computes on).
"""

from __future__ import annotations

from ..dtypes import is_float
from ..errors import DTypeError, ShapeError, source_line, user_frame
from .aval import AVal
from .core import bind, current_trace
from .primitives import COLLECTIVE, REGISTRY, declare

REDUCE_OPS = ("sum", "mean", "max", "min")


def _same(x, **_):
    return x


def _float_mean(prim, x, op):
    """The mean of integers is not an integer: one rule in both modes and on every backend —
    an error asking for a float cast (never a truncated or zero result)."""
    if op == "mean" and not is_float(x.dtype):
        raise DTypeError(
            f"{prim}({x}, op='mean') at {source_line(user_frame())}: the mean of {x.dtype} "
            f"values is not {'a bool' if x.dtype.kind == 'b' else 'an integer'}; cast first "
            "(rnp.cast(x, 'float32')), or reduce with "
            "'sum' and divide as you mean to (rnp.floor_divide for a floored mean)")


def _reduced_same(x, *, op, **_):
    _float_mean("all_reduce", x, op)
    return x


def _all_gather(x, *, num_replicas, axis, tiled, **_):
    shape = list(x.shape)
    if tiled:
        shape[axis] *= num_replicas
    else:
        shape.insert(axis, num_replicas)
    return AVal(tuple(shape), x.dtype)


def _reduce_scatter(x, *, num_replicas, axis, op, **_):
    _float_mean("reduce_scatter", x, op)
    shape = list(x.shape)
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


def _scattered(x, *, size, **_):
    if len(x.shape) != 1 or x.shape[0] % size:
        raise ShapeError(f"mpi_reduce_scatter takes a flat buffer of a multiple of {size} "
                         f"elements, got {x}")
    return AVal((x.shape[0] // size,), x.dtype)


# Communication must run on every rank even where its result is unused (say, the gradient of a
# broadcast on a rank without the root): ``effect`` keeps dead-code elimination and CSE off it.
_PLACEHOLDER = dict(effect=True, placeholder=True)
# (``across``: what the replicas receive — one value for all, each its own part, another's value)
declare("all_reduce", COLLECTIVE, _reduced_same, across="same", **_PLACEHOLDER)
declare("all_gather", COLLECTIVE, _all_gather, across="same", **_PLACEHOLDER)
declare("broadcast", COLLECTIVE, _same, across="same", **_PLACEHOLDER)
declare("reduce_scatter", COLLECTIVE, _reduce_scatter, across="own", **_PLACEHOLDER)
declare("permute", COLLECTIVE, _same, across="moved", **_PLACEHOLDER)
PLACEHOLDERS = tuple(n for n, p in REGISTRY.items() if p.placeholder)  # in declaration order
# what the rewrite produces: gradients are taken before it, on the placeholders
_EXCHANGE = dict(differentiable=False, effect=True, exchange=True)
# the in-process combine is a sum of k arrays on one device: no communication, so a backend runs
# it with the step's other ops (inside a JAX jit segment, on the GPU) rather than on the host
declare("local_reduce", COLLECTIVE, _same_all, differentiable=False, host=False)
declare("mpi_allreduce", COLLECTIVE, _same, **_EXCHANGE)
declare("mpi_allgather", COLLECTIVE, _gathered, **_EXCHANGE)
declare("mpi_broadcast", COLLECTIVE, _same, **_EXCHANGE)
# sharded optimiser state (``passes/shard_state.py``): this process's chunk of a flat buffer
# reduced over the processes
declare("mpi_reduce_scatter", COLLECTIVE, _scattered, **_EXCHANGE)


def _started(x, *, collective="allreduce", size=1, **_):
    """A started bucket's result: ``collective`` is ``allreduce`` (the default),
    ``reduce_scatter`` or ``allgather`` of the flat buffer over ``size`` processes."""
    return _scattered(x, size=size) if collective == "reduce_scatter" else \
        _gathered(x, size=size) if collective == "allgather" else x


# gradient bucketing with overlap: start a flat buffer's exchange (``collective``) on the
# communication thread (the value is a handle), and wait for it where the result is needed
declare("comm_start", COLLECTIVE, _started, **_EXCHANGE)
declare("comm_wait", COLLECTIVE, _same, **_EXCHANGE)

# What each exchange node asks of a transport (``backends.base.Transport``: the host's MPI, NCCL,
# a CUDA-aware MPI): ``EXCHANGES[prim](transport, *operands, **attrs)``. The reference table's
# rows (the runtime's ``host_rows.py``) and a device backend's communication nodes
# (``backends/cupy_comm.py``) both run through it. ``comm``: model parallelism's group label.
EXCHANGES = {
    "mpi_allreduce": lambda t, x, *, op, owned=False, comm=None, **_: t.allreduce(x, op, owned,
                                                                                  comm),
    "mpi_allgather": lambda t, x, *, comm=None, **_: t.allgather(x, comm),
    "mpi_broadcast": lambda t, x, *, root, comm=None, **_: t.broadcast(x, root, comm),
    "mpi_reduce_scatter": lambda t, x, *, op, comm=None, **_: t.reduce_scatter(x, op, comm),
    "comm_start": lambda t, x, *, op=None, owned=False, comm=None, collective="allreduce",
    _inline=False, **_: t.start(x, op, owned, comm, collective, _inline),
    "comm_wait": lambda t, handle, **_: t.wait(handle),
}


def bind_collective(prim: str, x, *, num_replicas: int, replica: int, **attrs):
    """Record (graph mode) or run (eager mode) collective ``prim`` of ``x`` for replica
    ``replica`` of ``num_replicas``; in a trace it gets the replica's next sequence number,
    by which the rewrite matches it with its peers' calls."""
    trace = current_trace()
    seq = trace.next_collective_seq() if trace is not None else 0
    return bind(prim, x, num_replicas=num_replicas, replica=replica, seq=seq, **attrs)


__all__ = ["EXCHANGES", "PLACEHOLDERS", "REDUCE_OPS", "bind_collective"]
