"""Sharded optimiser state (``wrap_optimizer(shard=True)``): the Variables that hold only this
process's slice, cut here, cut again for the processes of a Replicator (``reshard``) and made
whole again for a checkpoint. The step's rewrite is ``graph/passes/shard_state.py``; its
reduce-scatters and all-gathers are bucketed by ``graph/passes/bucketing.py``; ``check_sync``
checks each slice on its own process (``runtime/checks/sync_check.py``).

The state is sharded over a *data-parallel group*: the processes that hold the same
parameters. ``wrap_optimizer`` cuts it over every process (``replicas()``); with model
parallelism (``Replicator(logical_devices=m)``) a parameter lives on one logical device and the
group is that device's processes, one per replica group (n/m of them, the device's
communicator), so the Replicator's construction (``runtime/loop/layout.py``) calls ``reshard``:
each process's slices gathered once and cut again, process p keeping slice p // m of its
devices' state. The step's rewrite then runs on the whole replica's graph (every device's
ops), each device's state on its own group, before ``split_devices`` keeps this device's part.

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

import weakref

import numpy as np

from .errors import ReplicateError
from .graph.passes.shard_state import ShardLayout
from .state import Variable

# every Variable wrap_optimizer(shard=True) cut (or would have, on one process), in the order
# cut — the same on every process running the same program: what ``reshard`` cuts again
_SHARDED: list = []


def shard_state(optimizer) -> None:
    """Cut ``optimizer``'s per-parameter state (its slots, float32 master weights: each a list
    of one Variable per parameter) into this process's slices (``Variable.shard``). One process:
    nothing to cut (a Replicator on several reshards it)."""
    # the process count and rank belong to the runtime, above: asked once, here (as
    # rp.function asks for its communicator)
    from .runtime.communication.comm import replicas

    comm = replicas()
    params = optimizer.params
    for value in vars(optimizer).values():
        if not isinstance(value, list) or value is params or len(value) != len(params):
            continue
        for var, p in zip(value, params):
            if isinstance(var, Variable) and var.shard is None and var.shape == p.shape:
                _SHARDED.append(weakref.ref(var))
                if comm.size > 1:
                    layout = ShardLayout(tuple(var.shape), comm.size, comm.rank)
                    var.value, var.shard = layout.part(var.value), layout


def _whole(lay: ShardLayout, rows: list):
    """The whole value from ``rows`` ((layout, slice) of every process of a group, in any
    order: with model parallelism each slice is held by every device of its replica group)."""
    parts = {}
    for other, value in rows:
        if other is not None and other.n == lay.n and other.shape == lay.shape:
            parts.setdefault(other.rank, value)
    if len(parts) != lay.n:
        raise ReplicateError(
            f"sharded optimiser state of shape {lay.shape} is cut over {lay.n} processes, but "
            f"only slices {sorted(parts)} are held by the processes gathering it: gather it on "
            "the processes it was cut for (every process of the job)")
    return lay.whole([parts[r] for r in range(lay.n)])


def whole_values(comm, variables: dict) -> dict:
    """{name: whole value} of the sharded ones among ``variables`` ({name: Variable}): every
    process's slices, gathered (collective: every process calls it with the same names)."""
    names = [name for name, var in variables.items() if var.shard is not None]
    if not names:
        return {}
    rows = comm.allgather_obj([(variables[n].shard, variables[n].value) for n in names])
    return {n: _whole(variables[n].shard, [row[i] for row in rows]) for i, n in enumerate(names)}


def reshard(comm, n: int, rank: int) -> None:
    """Cut every sharded Variable again for a data-parallel group of ``n`` processes, this one
    ``rank`` (a Replicator's construction: its device's group with model parallelism). Those
    cut for a group of another size whose processes are all in ``comm`` are gathered (one
    exchange, collective: every process of ``comm`` calls it) and cut again; the others (cut for
    other processes, or already for this group) are left as they are. ``n == 1``: made
    whole."""
    alive = [v for v in (ref() for ref in _SHARDED) if v is not None]
    _SHARDED[:] = [weakref.ref(v) for v in alive]
    todo = [v for v in alive if (1 if v.shard is None else v.shard.n) != n
            and v.released is None and comm.size % (1 if v.shard is None else v.shard.n) == 0]
    if any(v.shard is not None for v in todo) and comm.size > 1:
        rows = comm.allgather_obj([(v.name, v.shard, v.value) for v in todo])
        if any([name for name, _, _ in row] != [v.name for v in todo] for row in rows):
            raise ReplicateError(
                "the processes hold different sharded optimiser state (wrap_optimizer("
                "shard=True)) when the Replicator reshards it:\n" + "\n".join(
                    f"  process {r}: {[name for name, _, _ in row]}"
                    for r, row in enumerate(rows)))
        wholes = [v.value if v.shard is None else _whole(v.shard, [row[i][1:] for row in rows])
                  for i, v in enumerate(todo)]
    else:
        wholes = [v.value for v in todo]
    for var, whole in zip(todo, wholes):
        whole = np.asarray(whole)
        if n == 1:
            var.value, var.shard = whole, None
        else:
            layout = ShardLayout(tuple(whole.shape), n, rank)
            var.value, var.shard = layout.part(whole), layout


def load_whole(var: Variable, value) -> None:
    """Load a whole value into ``var``: a sharded one keeps its own slice (restoring a checkpoint
    into any number of processes)."""
    var.load(value if var.shard is None else var.shard.part(value))


__all__ = ["load_whole", "reshard", "shard_state", "whole_values"]
