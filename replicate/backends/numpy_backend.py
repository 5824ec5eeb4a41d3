"""The NumPy backend: run a graph node by node with the reference implementations."""

from __future__ import annotations

import numpy as np

from .numpy_impl import IMPL

name = "numpy"
passes = ("dce", "cse")


def lower(graph):
    """Return ``run(inputs) -> outputs`` for ``graph`` (inputs/outputs are NumPy arrays)."""
    slot = {}
    for x in graph.inputs:
        slot[x.id] = len(slot)
    program = []
    for node in graph.nodes:
        fn = IMPL[node.prim]
        args = tuple(slot[i.id] for i in node.inputs)
        slot[node.out.id] = len(slot)
        program.append((fn, args, node.attrs, slot[node.out.id], node.out.aval.dtype))
    n_inputs, n_slots = len(graph.inputs), len(slot)
    outputs = [slot[o.id] for o in graph.outputs]

    def run(inputs):
        if len(inputs) != n_inputs:
            raise ValueError(f"expected {n_inputs} inputs, got {len(inputs)}")
        env = list(inputs) + [None] * (n_slots - n_inputs)
        for fn, args, attrs, out, dtype in program:
            value = fn(*[env[a] for a in args], **attrs)
            if value.dtype != dtype:
                value = value.astype(dtype)
            env[out] = value
        return [np.asarray(env[o]) for o in outputs]

    return run
