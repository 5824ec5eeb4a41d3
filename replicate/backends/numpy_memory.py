"""The NumPy backend's memory planning: which values can live in buffers allocated once and reused
every call.

A value gets a *planned* buffer when the backend writes it with ``out=`` (fused groups, ufunc
elementwise ops, reductions, matmul, concatenate). Views (reshape, transpose, broadcast_to,
indexing) and communication results alias their input, so a buffer stays busy until the last use of
every value that may alias it — for a bucket handed to the communication thread, until its
``comm_wait``. Buffers whose values reach a graph output are never planned: results handed to the
caller are fresh arrays every call. A linear scan in execution order gives a freed buffer of the
same shape and dtype to the next value that needs one; an elementwise op may write in place into an
input that dies at that op.

The plan lands in ``graph.meta.memory_plan``; the graph itself is unchanged.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ..graph.core import Graph
from ..graph.primitives import REGISTRY

NOTHING = frozenset()  # a backend that writes nothing with out=: no buffers are planned


@dataclass
class MemoryPlan:
    slot: dict = field(default_factory=dict)     # value id -> buffer index
    buffers: list = field(default_factory=list)  # (shape, dtype) per buffer
    in_place: int = 0                            # values written over a dying input
    # value id -> (buffer index, offset, shape): written straight into its part of a
    # concatenation's buffer (a gradient into its bucket); those concatenations copy nothing
    part: dict = field(default_factory=dict)
    done: set = field(default_factory=set)       # concatenations whose parts are all in place

    @property
    def nbytes(self) -> int:
        """The planned buffers' bytes: allocated once, what the plan holds at its peak."""
        return sum(_nbytes(s, d) for s, d in self.buffers)

    def __str__(self) -> str:
        return (f"memory plan: {len(self.slot)} values in {len(self.buffers)} buffers "
                f"({self.nbytes / 2**20:.1f} MiB), {self.in_place} in place, "
                f"{len(self.done)} concatenations written in place")


def _nbytes(shape, dtype):
    n = 1
    for d in shape:
        n *= d
    return n * dtype.itemsize


def aliases_input(node) -> bool:
    """Its result may share memory with its first input: a view, or what a host node hands back
    (communication results are not ours to reuse)."""
    spec = REGISTRY[node.prim]
    return spec.view or spec.host


def plan_memory(graph: Graph, writes_out) -> MemoryPlan:
    """Plan buffers for ``graph``'s values; ``writes_out``: the primitives the backend can run
    with ``out=`` (a set of names)."""
    nodes = graph.nodes
    root: dict[int, int] = {}
    for node in nodes:
        v = node.out.id
        root[v] = root.get(node.inputs[0].id, node.inputs[0].id) \
            if node.inputs and aliases_input(node) else v
    last_use: dict[int, int] = {}
    for i, node in enumerate(nodes):
        for x in node.inputs:
            last_use[root.get(x.id, x.id)] = i
    escaping = {root.get(o.id, o.id) for o in graph.outputs}
    plan = MemoryPlan()
    parts = _concatenations_in_place(graph, writes_out, root, last_use, escaping)
    first_part = {min(members): c for c, members in parts.items()}
    free: dict[tuple, list[int]] = {}
    dying_at: dict[int, list[int]] = {}
    for r, i in last_use.items():
        dying_at.setdefault(i, []).append(r)
    for i, node in enumerate(nodes):
        v = node.out.id
        key = (node.out.shape, node.out.dtype)
        if i in first_part:  # the concatenation's buffer, busy from its first part on
            c = first_part[i]
            plan.slot[c.out.id] = len(plan.buffers)
            plan.buffers.append((c.out.shape, c.out.dtype))
            plan.done.add(c.out.id)
            offset = 0
            for m in parts[c]:  # (the parts' writers, in the concatenation's order)
                src = nodes[m].out
                plan.part[src.id] = (plan.slot[c.out.id], offset, src.shape)
                offset += src.size
        planned = (root[v] == v and v not in escaping and v in last_use
                   and node.prim in writes_out and node.out.size > 0
                   and v not in plan.part and v not in plan.done)
        dying = [r for r in dying_at.get(i, ()) if r in plan.slot]
        if planned:
            buffer = None
            if REGISTRY[node.prim].elementwise:  # in place over an input dying here
                for r in dying:
                    b = plan.slot[r]
                    if plan.buffers[b] == key and any(x.id == r for x in node.inputs):
                        buffer, plan.in_place = b, plan.in_place + 1
                        dying.remove(r)
                        break
            if buffer is None and free.get(key):
                buffer = free[key].pop()
            if buffer is None:
                buffer = len(plan.buffers)
                plan.buffers.append(key)
            plan.slot[v] = buffer
        for r in dying:
            b = plan.slot[r]
            free.setdefault(plan.buffers[b], []).append(b)
    return plan


def _concatenations_in_place(graph, writes_out, root, last_use, escaping) -> dict:
    """1-D concatenations (a gradient bucket) whose every part is a fresh buffer written by the
    backend (``out=``), possibly reshaped flat, read by nothing after the concatenation: those
    parts can be written straight into the concatenation's buffer. ``{node: [indices of the
    nodes writing its parts]}``."""
    index = {n.out.id: i for i, n in enumerate(graph.nodes)}
    found = {}
    for c in graph.nodes:
        v = c.out.id
        if c.prim != "concatenate" or c.out.ndim != 1 or v in escaping or v not in last_use \
                or c.out.size == 0 or root[v] != v:
            continue
        members, seen = [], set()
        for x in c.inputs:
            r = root.get(x.id, x.id)
            src = graph.nodes[index[r]] if r in index else None
            if src is None or r in seen or r in escaping or last_use.get(r) != index[v] \
                    or src.prim not in writes_out or src.out.dtype != c.out.dtype \
                    or src.out.size != x.size or src.out.size == 0 \
                    or not all(REGISTRY[graph.nodes[index[y]].prim].alias
                               for y in _chain(x, index, graph, r)):
                break
            seen.add(r)
            members.append(index[r])
        else:
            found[c] = members
    return found


def _chain(x, index, graph, r):
    """The value ids from ``x`` back to (not including) its root ``r``."""
    out = []
    while x.id != r:
        out.append(x.id)
        x = graph.nodes[index[x.id]].inputs[0]
    return out


def memory(graph: Graph, writes_out) -> Graph:
    """The ``memory`` pass: the same graph, with its plan in ``graph.meta.memory_plan``."""
    return Graph(graph.inputs, graph.nodes, graph.outputs,
                 graph.meta.copy(memory_plan=plan_memory(graph, writes_out)))
