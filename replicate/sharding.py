"""Sharded optimiser state (``wrap_optimizer(shard=True)``): the Variables that hold only this
process's slice, cut here and made whole again for a checkpoint. The step's rewrite is
``graph/passes/shard_state.py``; its reduce-scatters and all-gathers are bucketed by
``graph/passes/bucketing.py``; ``check_sync`` checks each slice on its own process
(``runtime/checks/sync_check.py``).

Stage 3 (parameters sharded between steps, gathered just before use) is not built. What it
would take, in this design:

1. Here: ``shard="params"`` cuts ``optimizer.params`` too, after making them equal (rank 0's
   whole value broadcast first: the Replicator's first-use broadcast skips sharded Variables).
   The step's rewrite needs no new rule for the simplest form: a sharded parameter comes in as
   its slice, its first non-elementwise reader (the forward's matmul) all-gathers it
   (``_Sharder.whole``, once per value), the update runs on the slice and the new value goes
   out as the slice — no all-gather at the end (checked on a graph by hand: two
   ``mpi_allgather`` at the forward's reads, two reduce-scatters, slices out). That saves
   memory only between steps: the gathered parameters live from the forward to their last
   use in the backward pass.
2. For the per-step peak: ``shard_state.py`` gathers a parameter twice, for its forward
   readers and again for its backward readers (the vjp's nodes: the trace would have to mark
   where the backward pass starts), so the forward's copy dies after its layer;
   ``bucketing.py`` buckets the gathers per layer and starts each a bounded number of buckets
   ahead of its first use (today a bucket starts as soon as its inputs exist — at the step's
   start for a graph input — which would gather every layer at once); and the NumPy backend's
   executor drops a value after its last use (``numpy_backend.run`` keeps every value until
   the step ends; communication results are not planned buffers, so ``numpy_memory.py`` does
   not free them). JAX frees inside its program.
3. Reads outside the step: ``Variable.numpy()`` of a sharded parameter is refused today (the
   eager read); it would gather (a collective: every process calls it), as checkpoints do
   (``whole_values``). ``check_sync`` would compare nothing of the parameters (no process
   holds another's slice), only their layouts and padding; ``rp.memory_report`` would count
   their slices.
"""

from __future__ import annotations

from .graph.passes.shard_state import ShardLayout
from .state import Variable


def shard_state(optimizer) -> None:
    """Cut ``optimizer``'s per-parameter state (its slots, float32 master weights: each a list
    of one Variable per parameter) into this process's slices (``Variable.shard``). One process:
    nothing to cut."""
    # the process count and rank belong to the runtime, above: asked once, here (as
    # rp.function asks for its communicator)
    from .runtime.communication.comm import replicas

    comm = replicas()
    if comm.size == 1:
        return
    params = optimizer.params
    for value in vars(optimizer).values():
        if not isinstance(value, list) or value is params or len(value) != len(params):
            continue
        for var, p in zip(value, params):
            if isinstance(var, Variable) and var.shard is None and var.shape == p.shape:
                layout = ShardLayout(tuple(var.shape), comm.size, comm.rank)
                var.value, var.shard = layout.part(var.value), layout


def whole_values(comm, variables: dict) -> dict:
    """{name: whole value} of the sharded ones among ``variables`` ({name: Variable}): every
    process's slices, gathered (collective: every process calls it with the same names)."""
    names = [name for name, var in variables.items() if var.shard is not None]
    if not names:
        return {}
    rows = comm.allgather_obj([variables[n].value for n in names])
    return {n: variables[n].shard.whole([row[i] for row in rows]) for i, n in enumerate(names)}


def load_whole(var: Variable, value) -> None:
    """Load a whole value into ``var``: a sharded one keeps its own slice (restoring a checkpoint
    into any number of processes)."""
    var.load(value if var.shard is None else var.shard.part(value))


__all__ = ["load_whole", "shard_state", "whole_values"]
