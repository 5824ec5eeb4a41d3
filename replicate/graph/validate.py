"""Check a graph's invariants: every value defined once before use, types agree with the rules."""

from __future__ import annotations

from ..errors import ReplicateError
from . import primitives


class InvalidGraphError(ReplicateError):
    pass


def validate(graph) -> None:
    """Raise ``InvalidGraphError`` if the graph is malformed."""
    defined = set()
    for x in graph.inputs:
        if x.id in defined:
            raise InvalidGraphError(f"input {x} listed twice")
        defined.add(x.id)
    for k, node in enumerate(graph.nodes):
        if node.prim not in primitives.REGISTRY:
            raise InvalidGraphError(f"node {k}: unknown primitive {node.prim!r}")
        for i in node.inputs:
            if i.id not in defined:
                raise InvalidGraphError(f"node {k} ({node.prim}) uses a value before it is defined")
        if node.out is None or node.out.node is not node:
            raise InvalidGraphError(f"node {k} ({node.prim}) has a broken output link")
        if node.out.id in defined:
            raise InvalidGraphError(f"node {k} ({node.prim}) redefines a value")
        expect = primitives.get(node.prim).shape_rule(*[i.aval for i in node.inputs], **node.attrs)
        if expect != node.out.aval:
            raise InvalidGraphError(f"node {k} ({node.prim}): output {node.out.aval} but the shape "
                                    f"rule gives {expect}")
        defined.add(node.out.id)
    for o in graph.outputs:
        if o.id not in defined:
            raise InvalidGraphError("an output is not defined by the graph")
