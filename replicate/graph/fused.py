"""The ``fused`` primitive: one kernel made of a group of elementwise ops, with at most one
reduction and its elementwise prologue and epilogue.

A fused node's ``body`` is a small graph of its own whose inputs stand for the node's inputs and
whose one output is the node's output. The elementwise fusion pass (``passes/fusion.py``) builds
them from the primitives flagged ``fuse="map"``/``"reduce"``; backends run a body as one kernel
(CuPy: generated CUDA; NumPy: ufuncs writing into preallocated buffers; reference: the
interpreter).
"""

from __future__ import annotations

from ..errors import ShapeError
from .core import Graph
from .interpret import eval_graph
from .primitives import ELEMENTWISE, FUSED, REGISTRY, declare, prims_where
from .reference import IMPL

# the non-elementwise ops a fused group may contain (from the primitives' ``fuse`` flags)
FUSIBLE_STRUCTURAL = tuple(sorted(n for n in prims_where(fuse="map")
                                  if REGISTRY[n].kind != ELEMENTWISE))
FUSIBLE_REDUCTIONS = tuple(sorted(prims_where(fuse="reduce")))


class FusedBody:
    """A fused group: ``graph`` (inputs = the node's inputs, one output), and the reduction node
    in it (or None). Compared by identity: two groups are never merged by CSE."""

    __slots__ = ("graph", "reduction")

    def __init__(self, graph: Graph, reduction=None):
        self.graph = graph
        self.reduction = reduction

    @property
    def prims(self) -> list[str]:
        return [n.prim for n in self.graph.nodes if n.prim != "const"]

    def __repr__(self) -> str:
        return f"FusedBody({','.join(self.prims)})"


def _fused_shape(*avals, body: FusedBody):
    expect = [x.aval for x in body.graph.inputs]
    if list(avals) != expect:
        raise ShapeError(f"fused group expects {[str(a) for a in expect]}, got "
                         f"{[str(a) for a in avals]}")
    return body.graph.outputs[0].aval


def run_body(body: FusedBody, *values):
    """Reference semantics: interpret the body with the NumPy table, node by node."""
    return eval_graph(body.graph, values)[0]


declare(FUSED, FUSED, _fused_shape, differentiable=False)  # built after autodiff
IMPL[FUSED] = lambda *xs, body: run_body(body, *xs)
