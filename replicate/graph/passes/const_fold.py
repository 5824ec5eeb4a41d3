"""Constant folding: a node whose inputs are all constants is computed at compile time.

Only ``foldable`` primitives (deterministic, no effect, not on the host) are folded, and only when
the result is small (``MAX_FOLDED`` elements): folding ``broadcast_to(0.0, (4096, 4096))``
would trade one cheap kernel for a 64 MB constant.
"""

from __future__ import annotations

import numpy as np

from ..core import Graph, Node
from ..primitives import REGISTRY
from ..rebuild import Rebuilder
from ..reference import reference_apply

MAX_FOLDED = 4096


def const_fold(graph: Graph) -> Graph:
    rb = Rebuilder(graph)
    known: dict[int, np.ndarray] = {}  # new value id -> constant value
    for node in graph.nodes:
        inputs = [rb.get(i) for i in node.inputs]
        foldable = (node.prim == "const" or
                    (REGISTRY[node.prim].foldable and inputs and
                     all(i.id in known for i in inputs) and node.out.size <= MAX_FOLDED))
        if not foldable:
            rb.copy(node, inputs)
            continue
        if node.prim == "const":
            value = node.attrs["value"]
        else:
            value = reference_apply(node, [known[i.id] for i in inputs])
            value = value.reshape(node.out.shape)
            node = _const_node(node, value)
        out = rb.copy(node, ())
        known[out.id] = value
    return rb.finish()


def _const_node(node, value):
    new = Node("const", (), {"value": value}, node.where)
    new.out = node.out  # rb.copy only reads .out.aval and .out.id from it
    return new
