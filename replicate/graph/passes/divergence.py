"""Which variable updates would leave the replicas holding different values.

Run on the traced step before the collective rewrite (placeholders still say what each
collective means). A value *varies* across replicas when it depends on a replica's batch or on
a value marked per replica (a replica-folded random key) through anything but a collective that
gives every replica the same result (``all_reduce``, ``all_gather``, ``broadcast``).
``reduce_scatter`` hands each replica its own chunk, so its result varies; ``permute`` varies
when its operand does. An updated variable whose new value varies is *divergent*: after the
step, replicas (and ranks) would hold different copies of what should be one value — the classic
is an optimiser update from local gradients that were never all-reduced.

This follows data only: a Python branch on ``rp.replica_id()`` bakes a different constant into
each replica's trace and is not seen here (the run-time comparison of variables across ranks,
``Replicator(check_sync=...)``, finds what this misses).
"""

from __future__ import annotations

from ..core import Graph
from ..primitives import REGISTRY


def varying_values(graph: Graph, sources: dict) -> dict:
    """``{value id: the source's name}`` for every value that varies across replicas;
    ``sources``: ``{value id: name}`` of the values that vary by construction."""
    varies = dict(sources)
    for node in graph.nodes:
        across = REGISTRY[node.prim].across
        if across == "same":
            continue
        if across == "own":
            varies[node.out.id] = f"the per-replica result of {node.prim}"
            continue
        for x in node.inputs:
            source = varies.get(x.id)
            if source is not None:
                varies[node.out.id] = source
                break
    return varies


def divergent_writes(graph: Graph, sources: dict, writes) -> list:
    """``writes``: ``(variable, replica, value, where)`` per replica's update; returns
    ``(variable, where, source)`` per variable written from a varying value (first replica's
    line), in order."""
    varies = varying_values(graph, sources)
    out, seen = [], set()
    for var, _replica, value, where in writes:
        source = varies.get(value.id)
        if source is not None and id(var) not in seen:
            seen.add(id(var))
            out.append((var, where, source))
    return out


__all__ = ["divergent_writes", "varying_values"]
