"""Which replica the code is running as: set by the Replicator while it traces or runs a step."""

from __future__ import annotations

import contextlib
import threading
from dataclasses import dataclass

from .graph.core import current_trace
from .numpy.random import fold_in

_local = threading.local()


@dataclass(frozen=True)
class ReplicaContext:
    """What ``input_fn`` receives and what ``replica_id()`` / ``num_replicas()`` read.

    ``replica_id`` is global (``rank * replicas_per_rank + local_id``).
    """

    replica_id: int
    num_replicas: int
    rank: int = 0
    num_ranks: int = 1
    local_id: int = 0
    replicas_per_rank: int = 1
    start_step: int = 0  # batches to skip: set when a run resumes from a checkpoint


def current() -> ReplicaContext | None:
    return getattr(_local, "ctx", None)


@contextlib.contextmanager
def replica_scope(ctx: ReplicaContext | None):
    previous = current()
    _local.ctx = ctx
    try:
        yield ctx
    finally:
        _local.ctx = previous


def replica_id() -> int:
    """This replica's global index (0 outside a Replicator)."""
    ctx = current()
    return 0 if ctx is None else ctx.replica_id


def num_replicas() -> int:
    """The total number of replicas (1 outside a Replicator)."""
    ctx = current()
    return 1 if ctx is None else ctx.num_replicas


def replica_key_fold(k):
    """Make a random key replica-specific, so replicas draw different numbers."""
    ctx = current()
    if ctx is None or ctx.num_replicas == 1:
        return k
    folded = fold_in(k, ctx.replica_id)
    trace = current_trace()
    if trace is not None:  # per replica by construction (the divergence check follows it)
        trace.mark_varying(folded)
    return folded
