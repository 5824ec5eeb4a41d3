"""Sharded optimiser state (``wrap_optimizer(shard=True)``): the Variables that hold only this
process's slice, cut here and made whole again for a checkpoint. The step's rewrite is
``graph/passes/shard_state.py``."""

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
