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

from .reference import reference_apply


def eval_nodes(nodes, env: dict, apply=reference_apply, after=None) -> dict:
    """Run ``nodes`` in order over ``env`` (value id -> value; the values they read from outside
    must be in it); ``apply(node, args)`` computes one node, ``after(node, value)`` (optional)
    sees each result. Returns ``env`` with every node's value added."""
    for node in nodes:
        value = apply(node, [env[i.id] for i in node.inputs])
        env[node.out.id] = value
        if after is not None:
            after(node, value)
    return env


def eval_graph(graph, inputs, apply=reference_apply, after=None) -> list:
    """``graph``'s outputs for ``inputs`` (one value per ``graph.inputs``)."""
    env = eval_nodes(graph.nodes, {x.id: v for x, v in zip(graph.inputs, inputs)}, apply, after)
    return [env[o.id] for o in graph.outputs]


__all__ = ["eval_graph", "eval_nodes"]
