"""Common-subexpression elimination.

Two nodes with the same primitive, the same (already merged) inputs and equal attributes compute
the same value; the later one is dropped. Small constants are compared by value, so the k copies of
an optimiser update that the replicas trace after an all-reduce collapse into one. Nodes placed
on different logical devices are different nodes (each device computes its own).

Communication (the primitives flagged ``effect``: collectives and cross-process exchanges)
is never merged: two equal all-reduces are two exchanges with the other processes, which must see
the same calls on every rank (and the ranks compare the schedule as written, before this pass).
"""

from __future__ import annotations

import numpy as np

from ..core import Graph
from ..primitives import REGISTRY
from ..rebuild import Rebuilder

_SMALL_CONST = 64  # elements; larger constants are compared by identity


def _attr_key(value):
    if isinstance(value, np.ndarray):
        if value.size <= _SMALL_CONST:
            return ("nd", value.dtype.str, value.shape, value.tobytes())
        return ("nd-id", id(value))
    if isinstance(value, (list, tuple)):
        return tuple(_attr_key(v) for v in value)
    if isinstance(value, dict):
        return tuple(sorted((k, _attr_key(v)) for k, v in value.items()))
    if isinstance(value, np.dtype):
        return ("dtype", value.str)
    if isinstance(value, (float, complex, np.generic)):  # by its bits: -0.0 is not 0.0
        return ("scalar", type(value).__name__, np.asarray(value).tobytes())
    if isinstance(value, int):  # True == 1, but a flag is not a count
        return ("int", type(value).__name__, value)
    return value


def node_key(node, inputs):
    device = None if node.placed is None else node.placed.device  # (model parallelism)
    return (node.prim, tuple(i.id for i in inputs), _attr_key(node.attrs), device)


def cse(graph: Graph) -> Graph:
    rb = Rebuilder(graph)
    seen = {}
    for node in graph.nodes:
        inputs = tuple(rb.get(i) for i in node.inputs)
        if REGISTRY[node.prim].effect:
            rb.copy(node, inputs)
            continue
        key = node_key(node, inputs)
        hit = seen.get(key)
        if hit is not None:
            rb.subst[node.out.id] = hit
        else:
            seen[key] = rb.copy(node, inputs)
    return rb.finish()
