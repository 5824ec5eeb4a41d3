"""The ``fused`` primitive: one kernel made of a group of elementwise ops, with at most one
reduction and its elementwise prologue and epilogue.

A fused node's ``body`` is a small graph of its own whose inputs stand for the node's inputs and
whose one output is the node's output. The elementwise fusion pass
(``passes/fusion.py``) builds them; backends run a body as one kernel (CuPy: generated CUDA; NumPy:
ufuncs writing into preallocated buffers).
"""

from __future__ import annotations

from .core import Graph
from .primitives import FUSED, declare

# elementwise-like structural ops a fused group may contain: in a kernel they are only a way of
# indexing an input (broadcasting), never a copy
FUSIBLE_STRUCTURAL = ("broadcast_to",)
FUSIBLE_REDUCTIONS = ("reduce_sum", "reduce_max", "reduce_min", "reduce_prod")


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
        from ..errors import ShapeError

        raise ShapeError(f"fused group expects {[str(a) for a in expect]}, got "
                         f"{[str(a) for a in avals]}")
    return body.graph.outputs[0].aval


def run_body(body: FusedBody, *values):
    """Reference semantics: interpret the body with the NumPy table, node by node."""
    from ..backends.numpy_impl import IMPL

    env = {x.id: v for x, v in zip(body.graph.inputs, values)}
    for node in body.graph.nodes:
        value = IMPL[node.prim](*[env[i.id] for i in node.inputs], **node.attrs)
        env[node.out.id] = value.astype(node.out.aval.dtype, copy=False) \
            if hasattr(value, "astype") else value
    return env[body.graph.outputs[0].id]


declare(FUSED, FUSED, _fused_shape, differentiable=False)  # built after autodiff


def _register():
    from ..backends.numpy_impl import IMPL

    IMPL[FUSED] = lambda *xs, body: run_body(body, *xs)


_register()
