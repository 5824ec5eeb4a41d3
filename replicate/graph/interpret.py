"""One interpreter: walk a graph value by value, one rule per node (autodidax's ``eval_jaxpr``).

Every place that runs a graph node by node calls this: a fused group's reference semantics, the
JAX backend's jitted segments and fused groups, the CuPy backend's unfused ops, the search for
the first non-finite value, constant folding.

>>> import numpy as np, replicate as rp, replicate.numpy as rnp
>>> g = rp.function(lambda x: rnp.exp(x) + 1.0, options={"disable": ["const_fold"]}).graph(
...     np.zeros(2))
>>> eval_graph(g, [np.zeros(2)])[0].tolist()
[2.0, 2.0]
"""

from __future__ import annotations

from ..errors import add_note, source_line
from .reference import reference_apply


def eval_nodes(nodes, env: dict, apply=reference_apply, after=None) -> dict:
    """Run ``nodes`` in order over ``env`` (value id -> value; the values they read from outside
    must be in it); ``apply(node, args)`` computes one node, ``after(node, value)`` (optional)
    sees each result. Returns ``env`` with every node's value added. An exception names the
    node that raised it and the user's line that made it (``note_failure``)."""
    for node in nodes:
        try:
            value = apply(node, [env[i.id] for i in node.inputs])
        except Exception as e:
            note_failure(e, node)
            raise
        env[node.out.id] = value
        if after is not None:
            after(node, value)
    return env


def describe_node(node) -> str:
    """``take(f32[10,4], i64[8]) -> f32[8,4] at file:line: code`` (a fused group: its ops)."""
    operands = ", ".join(str(i.aval) for i in node.inputs)
    where = source_line(node.where) if node.where else "?"
    name = node.prim
    if node.prim == "fused":
        name = "fused[" + ",".join(node.attrs["body"].prims) + "]"
    return f"{name}({operands}) -> {node.out.aval} at {where}"


def note_failure(error: BaseException, node, inputs=None) -> None:
    """Say in ``error`` which node of a compiled step raised it and the user's line that made the
    node (once: the innermost node wins). A fused group is run again op by op on ``inputs`` (its
    operands) with the reference rules to find the op that fails."""
    if getattr(error, "_replicate_node", None) is not None:
        return
    if node.prim == "fused" and inputs is not None:
        body = node.attrs["body"].graph
        try:
            eval_nodes(body.nodes, {x.id: v for x, v in zip(body.inputs, inputs)})
        except Exception as again:  # noqa: BLE001 - only its location is wanted
            member = getattr(again, "_replicate_node", None)
            if member is not None:
                node = member
    error._replicate_node = node
    add_note(error, f"  raised by {describe_node(node)} (in the compiled step)")


def eval_graph(graph, inputs, apply=reference_apply, after=None) -> list:
    """``graph``'s outputs for ``inputs`` (one value per ``graph.inputs``)."""
    env = eval_nodes(graph.nodes, {x.id: v for x, v in zip(graph.inputs, inputs)}, apply, after)
    return [env[o.id] for o in graph.outputs]


__all__ = ["describe_node", "eval_graph", "eval_nodes", "note_failure"]
