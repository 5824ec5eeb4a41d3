"""Dead-code elimination: keep only nodes that an output (or a side-effecting node) needs."""

from __future__ import annotations

from ..core import Graph

# primitives that must run even when nothing reads their result
SIDE_EFFECTS: set[str] = set()


def dce(graph: Graph) -> Graph:
    live = {o.id for o in graph.outputs}
    kept = []
    for node in reversed(graph.nodes):
        if node.out.id in live or node.prim in SIDE_EFFECTS:
            kept.append(node)
            live.update(i.id for i in node.inputs)
    kept.reverse()
    return Graph(graph.inputs, kept, graph.outputs, dict(graph.meta))
