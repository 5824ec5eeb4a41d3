"""The reference table's communication rows: what each collective primitive does on the host.

The graph layer declares the collectives (``graph/collectives.py``) and writes what they mean
once, as rows of the collective rewrite (``LOWER`` in ``graph/passes/replicate_collectives.py``),
but cannot talk to other processes; this module, which owns the communicator, fills their rows
of the reference table ``IMPL`` when the runtime is imported (``replicate`` imports it):

* the placeholders run at once in eager mode, one replica per process: the processes agree on
  the call, then the collective's ``LOWER`` row runs eagerly (k = 1 replica here, n processes);
* ``mpi_*`` and ``comm_start``/``comm_wait`` — what the rewrite and bucketing produce, and what
  an eager row runs — call the host's transport (``transport.HOST``) through
  ``graph.collectives.EXCHANGES``.
"""

from __future__ import annotations

from ...context import current as current_replica
from ...errors import ReplicaContextError, source_line, user_frame
from ...graph.aval import AVal
from ...graph.collectives import EXCHANGES, PLACEHOLDERS
from ...graph.core import concrete
from ...graph.passes.replicate_collectives import lower
from ...graph.reference import IMPL
from .agree import COLLECTIVE, agree, digest
from .comm import replicas
from .transport import HOST

_HOST = {"all_reduce": "all_reduce", "all_gather": "all_gather", "broadcast": "broadcast"}


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
        args = ", ".join(f"{k}={v!r}" for k, v in attrs.items())  # (as the wrapper passed them)
        mine = f"{kind}({AVal(tuple(x.shape), x.dtype)}, {args})"
        agree(comm, COLLECTIVE, digest(mine),
              describe=lambda: f"{mine} at {source_line(user_frame())}")
    return comm


def _eager_row(kind):
    """The eager row of placeholder ``kind``: agree, then run its ``LOWER`` row at once."""
    def run(x, *, num_replicas, replica, seq, **attrs):
        comm = _eager(kind, x, num_replicas, attrs)
        out, = lower(kind, [concrete(x)], k=1, n=comm.size, rank=replica,
                     num_replicas=num_replicas, **attrs)
        return out.value
    return run


def _on_host(call):
    return lambda *xs, **attrs: call(HOST, *xs, **attrs)


IMPL.update({kind: _eager_row(kind) for kind in PLACEHOLDERS})
IMPL.update({prim: _on_host(call) for prim, call in EXCHANGES.items()})
