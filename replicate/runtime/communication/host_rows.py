"""The reference table's communication rows: what each collective primitive does on the host.

The graph layer declares the collectives (``graph/collectives.py``) but cannot talk to other
processes; this module, which owns the communicator, fills their rows of the reference table
``IMPL`` when the runtime is imported (``replicate`` imports it):

* the placeholders run at once in eager mode, one replica per process;
* ``mpi_*`` and ``comm_start``/``comm_wait`` are what the compiled step's rewrite and bucketing
  produced.
"""

from __future__ import annotations

import numpy as np

from ...context import current as current_replica
from ...dtypes import LOW_PRECISION
from ...errors import ReplicaContextError, source_line, user_frame
from ...graph.aval import AVal
from ...graph.reference import IMPL
from .agree import COLLECTIVE, agree, digest
from .comm import group, replicas
from .overlap import reduce_parts, start_allreduce

_HOST = {"all_reduce": "all_reduce", "all_gather": "all_gather", "broadcast": "broadcast"}
_ARGS = {"all_reduce": ("op",), "all_gather": ("axis", "tiled"), "broadcast": ("root",),
         "reduce_scatter": ("op", "axis"), "permute": ("shift",)}


def _eager(kind, x, num_replicas, attrs):
    """The communicator, once the processes agree that they all call this collective now.

    Eager mode has no schedule to compare ahead of time: before each collective the processes
    compare what they are about to call (a tagged fixed-size header, ``agree.py``), so a
    disagreement — another collective, other shapes, or a collective that only some processes
    call, which meets the others' next exchange — is an error named on every rank with every
    rank's call and line, never a hang, a misread message or a silently wrong result."""
    comm = replicas()
    if num_replicas != comm.size:
        if current_replica() is None:  # not in a step at all
            raise ReplicaContextError(
                f"rp.{kind} outside a step on {comm.size} processes at "
                f"{source_line(user_frame())}: the replica collectives combine the replicas of "
                f"a Replicator step; to combine the processes' values outside a step use "
                f"rp.host.{_HOST.get(kind, 'all_reduce')}(x, ...) (NumPy values)")
        raise ReplicaContextError(f"eager collectives need one replica per process: {num_replicas} "
                         f"replicas on {comm.size} processes")
    if comm.size > 1:
        args = ", ".join(f"{k}={attrs[k]!r}" for k in _ARGS[kind])
        mine = f"{kind}({AVal(tuple(x.shape), x.dtype)}, {args})"
        agree(comm, COLLECTIVE, digest(mine),
              describe=lambda: f"{mine} at {source_line(user_frame())}")
    return comm


def _all_reduce(x, *, num_replicas, replica, seq, op):
    comm = _eager("all_reduce", x, num_replicas, dict(op=op))
    out = comm.allreduce(wide_for_sum(x, op), "sum" if op == "mean" else op)
    out = out / num_replicas if op == "mean" else out
    return out.astype(x.dtype) if out.dtype != x.dtype else out


def wide_for_sum(x, op):
    """A float16/bfloat16 sum is taken in float32 and rounded once (as in graph mode)."""
    return x.astype(np.float32) if x.dtype in LOW_PRECISION and op in ("sum", "mean") else x


def _broadcast(x, *, num_replicas, replica, seq, root):
    return _eager("broadcast", x, num_replicas, dict(root=root)).bcast(x, root)


def _all_gather(x, *, num_replicas, replica, seq, axis, tiled):
    gathered = _eager("all_gather", x, num_replicas, dict(axis=axis, tiled=tiled)).allgather(x)
    out = np.moveaxis(gathered, 0, axis)  # (R, ...) -> the replicas' axis where asked
    if tiled:
        shape = list(x.shape)
        shape[axis] *= num_replicas
        out = out.reshape(shape)
    return out


def _reduce_scatter(x, *, num_replicas, replica, seq, op, axis):
    gathered = _eager("reduce_scatter", x, num_replicas, dict(op=op, axis=axis)).allgather(x)
    gathered = wide_for_sum(gathered, op)
    total = gathered.sum(0) if op in ("sum", "mean") else getattr(gathered, op)(0)
    if op == "mean":
        total = total / num_replicas
    total = total.astype(x.dtype)
    chunk = x.shape[axis] // num_replicas
    return np.take(total, np.arange(replica * chunk, (replica + 1) * chunk), axis=axis)


def _permute(x, *, num_replicas, replica, seq, shift):
    gathered = _eager("permute", x, num_replicas, dict(shift=shift)).allgather(x)
    return gathered[(replica - shift) % num_replicas]


IMPL.update({
    "all_reduce": _all_reduce, "all_gather": _all_gather, "broadcast": _broadcast,
    "reduce_scatter": _reduce_scatter, "permute": _permute,
    # (comm: the communicator of a device's processes, with model parallelism; else the world)
    # (a list: an unpacked bucket's parts, reduced over themselves; see overlap.reduce_parts)
    "mpi_allreduce": lambda x, op, owned=False, comm=None, **_: (
        reduce_parts(group(comm), x, op) if isinstance(x, list)
        else group(comm).allreduce(x, op, owned)),
    "mpi_allgather": lambda x, size, comm=None, **_: group(comm).allgather(x),
    "mpi_broadcast": lambda x, root, comm=None, **_: group(comm).bcast(x, root),
    "comm_start": lambda x, *, op, owned=False, comm=None, **_: start_allreduce(x, op, owned,
                                                                                 comm),
    "comm_wait": lambda handle, **_: handle.result(),
})
