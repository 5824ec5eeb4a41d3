"""Dead-code elimination: keep only nodes that an output (or a node with an effect) needs."""

from __future__ import annotations

from ..core import Graph
from ..primitives import REGISTRY


def dce(graph: Graph) -> Graph:
    live = {o.id for o in graph.outputs}
    kept = []
    for node in reversed(graph.nodes):
        if node.out.id in live or REGISTRY[node.prim].effect:
            kept.append(node)
            live.update(i.id for i in node.inputs)
    kept.reverse()
    return Graph(graph.inputs, kept, graph.outputs, graph.meta.copy())
