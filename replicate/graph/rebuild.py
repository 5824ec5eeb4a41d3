"""Rebuild a graph node by node into a fresh trace, substituting values on the way.

Passes use this: they walk the old graph in a topological order, decide for each node whether to
copy it (with substituted inputs) or to emit something else (with ``replicate.numpy`` ops, which
record into the new trace while it is active).
"""

from __future__ import annotations

from .core import Array, Graph, Node
from .trace import Trace, active


class Rebuilder:
    def __init__(self, graph: Graph):
        self.old = graph
        self.trace = Trace()
        self.subst: dict[int, Array] = {}
        for x, name in zip(graph.inputs, graph.meta.input_names or
                           [f"in{i}" for i in range(len(graph.inputs))]):
            self.subst[x.id] = self.trace.new_input(x.aval, name)

    def __enter__(self):
        self._ctx = active(self.trace)
        self._ctx.__enter__()
        return self

    def __exit__(self, *exc):
        return self._ctx.__exit__(*exc)

    def get(self, x: Array) -> Array:
        return self.subst[x.id]

    def copy(self, node: Node, inputs=None) -> Array:
        """Copy ``node`` with (substituted) inputs; reuse it when nothing changed is not
        possible across traces, so a new node is always made."""
        inputs = tuple(self.subst[i.id] for i in node.inputs) if inputs is None else tuple(inputs)
        new = Node(node.prim, inputs, node.attrs, node.where, node.placed)
        out = Array(node.out.aval, node=new, trace=self.trace)
        new.out = out
        self.trace.record(new)
        self.subst[node.out.id] = out
        return out

    def finish(self, outputs=None, meta=None) -> Graph:
        outs = [self.subst[o.id] for o in self.old.outputs] if outputs is None else outputs
        return Graph(list(self.trace.inputs), list(self.trace.nodes), outs,
                     (self.old.meta if meta is None else meta).copy())
