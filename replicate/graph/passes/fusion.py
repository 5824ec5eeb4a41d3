"""Elementwise fusion: maximal groups of elementwise ops become one ``fused`` node (one kernel).

Rules (a group has one output):

* members are the ops flagged ``fuse="map"`` (elementwise ops, and ``broadcast_to``) and at most
  one flagged ``fuse="reduce"`` (sum/max/min/prod over axes);
* a producer joins its consumer's group when every user of its value is in the group and the
  value is not a graph output (so nothing outside needs it materialised);
* with a reduction, the members upstream of it are its *prologue* (computed at the reduction's
  input shape) and those downstream its *epilogue* (at the output shape); the epilogue may only
  read scalars from outside the group, so a kernel is one reduction with a map before and after;
* matmul/einsum, other structural ops (reshape, transpose, indexing, concatenation, padding),
  random ops and communication are boundaries.

Groups of one op stay plain nodes (they already are one kernel). A backend that cannot run
every such group as one kernel says so with ``accept(members) -> bool`` (the CuPy backend's
generated reductions take only constants in their epilogue): a group it rejects is not formed,
so a fused node is always one kernel, never an op-by-op fallback.
"""

from __future__ import annotations

from ..core import Array, Graph, Node
from ..fused import FUSED, FusedBody
from ..primitives import REGISTRY
from ..rebuild import Rebuilder
from ..trace import Trace


def _fusible(node) -> str | None:
    """'map' for an elementwise member, 'reduce' for a reduction, None for a boundary."""
    return REGISTRY[node.prim].fuse


def _scalar(x: Array) -> bool:
    return x.size <= 1


def find_groups(graph: Graph, accept=None) -> list[list[int]]:
    """Indices (into graph.nodes, in order) of each fused group of two or more nodes that
    ``accept`` (if given) takes."""
    nodes = graph.nodes
    producer = {n.out.id: i for i, n in enumerate(nodes)}
    users: dict[int, list[int]] = {}
    for i, n in enumerate(nodes):
        for x in n.inputs:
            users.setdefault(x.id, []).append(i)
    outputs = {o.id for o in graph.outputs}
    assigned: set[int] = set()
    groups = []
    for root in range(len(nodes) - 1, -1, -1):
        if root in assigned or _fusible(nodes[root]) is None:
            continue
        # side: "pre" (prologue), "red" (the reduction), "post" (epilogue, or a map-only group)
        reduction = root if _fusible(nodes[root]) == "reduce" else None
        side = {root: "red" if reduction is not None else "post"}
        work = [root]
        while work:
            m = work.pop()
            for x in nodes[m].inputs:
                p = producer.get(x.id)
                if p is None or p in assigned or p in side or x.id in outputs:
                    continue
                kind = _fusible(nodes[p])
                if kind is None or any(u not in side for u in users[x.id]):
                    continue
                consumers = {side[u] for u in users[x.id]}
                if kind == "reduce":
                    if reduction is not None or consumers != {"post"} or \
                            not _epilogue_ok(nodes, side, x):
                        continue
                    reduction, side[p] = p, "red"
                elif reduction is None:
                    side[p] = "post"
                elif consumers <= {"pre", "red"}:
                    side[p] = "pre"
                elif consumers == {"post"} and _scalar(nodes[p].out):
                    side[p] = "post"  # the epilogue only ever sees scalars from outside
                else:
                    continue
                work.append(p)
        group = sorted(side)
        if len(group) > 1 and accept is not None and not accept([nodes[i] for i in group]):
            # the backend cannot run it as one kernel: the epilogue alone may still be one (the
            # reduction and its prologue are tried again from the reduction)
            group = sorted(i for i, where in side.items() if where == "post")
            if reduction is None or len(group) < 2 or not accept([nodes[i] for i in group]):
                continue
            side = dict.fromkeys(group)
        assigned.update(side)
        groups.append(group)
    return [g for g in groups if len(g) > 1]


def _epilogue_ok(nodes, members, reduced: Array) -> bool:
    """Every input the (current, all-epilogue) members read from outside is a scalar."""
    inside = {nodes[m].out.id for m in members} | {reduced.id}
    return all(_scalar(x) for m in members for x in nodes[m].inputs if x.id not in inside)


def fuse(graph: Graph, accept=None) -> Graph:
    groups = find_groups(graph, accept)
    if not groups:
        return graph
    nodes = graph.nodes
    root_of = {g[-1]: g for g in groups}
    members = {i for g in groups for i in g}
    rb = Rebuilder(graph)
    for i, node in enumerate(nodes):
        if i in root_of:  # the group runs where its result is made
            group = [nodes[j] for j in root_of[i]]
            body, externals = _body(group)
            fused = Node(FUSED, tuple(rb.get(x) for x in externals), {"body": body}, node.where)
            fused.out = Array(node.out.aval, node=fused, trace=rb.trace)
            rb.trace.record(fused)
            rb.subst[node.out.id] = fused.out
        elif i not in members:
            rb.copy(node)
    return rb.finish()


def _body(members: list[Node]) -> tuple[FusedBody, list[Array]]:
    """Copy ``members`` into a body graph whose inputs stand for the group's external values."""
    body_trace = Trace()
    subst: dict[int, Array] = {}
    externals: list[Array] = []
    body_nodes = []
    reduction = None
    for m in members:
        args = []
        for x in m.inputs:
            if x.id not in subst:
                subst[x.id] = body_trace.new_input(x.aval, f"in{len(externals)}")
                externals.append(x)
            args.append(subst[x.id])
        copy = Node(m.prim, tuple(args), m.attrs, m.where)
        copy.out = Array(m.out.aval, node=copy, trace=body_trace)
        subst[m.out.id] = copy.out
        body_nodes.append(copy)
        if REGISTRY[m.prim].fuse == "reduce":
            reduction = copy
    out = subst[members[-1].out.id]
    return FusedBody(Graph(list(body_trace.inputs), body_nodes, [out]), reduction), externals
