"""Merge the replicas' variable updates: every variable gets one value from all k replicas.

After the collective rewrite and CSE, the k replicas' updates of a variable that follow an
all-reduce are one node; then the graph's outputs keep one value per updated variable. Replicas
that would write different values (an update from replica-dependent data that was never
reduced) are an error naming each replica's line, never k silently different copies.
"""

from __future__ import annotations

from ...errors import ReplicateError, source_line
from ..core import Graph


def merge_updates(graph: Graph) -> Graph:
    meta = graph.meta
    k = meta.replicas
    n_res = meta.num_results * k
    merged = []
    for v, var in enumerate(meta.updated):
        values = graph.outputs[n_res + v * k: n_res + (v + 1) * k]
        if len({x.id for x in values}) != 1:
            lines = "\n".join(
                f"  replica {r}: {source_line(x.node.where) if x.node and x.node.where else '?'}"
                for r, x in enumerate(values))
            raise ReplicateError(
                f"replicas would write different values into variable {var.name!r}:\n{lines}\n"
                "Reduce what they write across replicas first (e.g. rp.all_reduce(grads, 'mean') "
                "or rp.optim.wrap_optimizer).")
        merged.append(values[0])
    return Graph(graph.inputs, graph.nodes, graph.outputs[:n_res] + merged, meta.copy())
