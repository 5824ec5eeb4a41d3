"""Gradient bucketing: many small cross-process all-reduces become a few flat buffers.

The ``mpi_allreduce`` nodes that the collective rewrite produced are grouped by reduction op
and dtype. Within a group they are taken in the order their inputs become ready (the backward
pass makes the last layer's gradient first) and packed into buckets of at most ``bucket_bytes``;
a bucket closes where one of its results is needed before the next gradient is ready. That rule
also keeps dependent all-reduces apart — one whose input needs another's result (cross-replica
BatchNorm's variance after its mean) is ready only after that result's first use — without
splitting independent ones: gradients behind different numbers of BatchNorm all-reduces share a
bucket (grouping them by that number, as before, left a small conv GAN with 20 one-tensor
gradient all-reduces, each a cut in the JAX program).

Each bucket is emitted as soon as its last gradient exists: the in-process combine of its members
(``local_reduce``, hoisted from where the user called ``all_reduce``), a flat ``concatenate``, an
optional cast to float16/bfloat16 (``compress``), and with ``overlap`` a ``comm_start`` — the
communication thread reduces it while the step computes on — and a ``comm_wait`` placed just
before the first use of its result; without ``overlap``, one blocking ``mpi_allreduce``. A packed
bucket is marked ``owned``: nothing else reads it, so the reduction is written over it (no fresh
buffer per step; with memory planning the bucket itself is reused every step). Slices of the
reduced buffer replace the original results. Buckets start in the same order on every rank
and the thread runs them in that order, so results are bitwise those of the unbucketed graph
(without compression).
"""

from __future__ import annotations

from ... import numpy as rnp
from ...dtypes import is_float
from ..core import Graph, bind
from ..rebuild import Rebuilder


class _Member:
    __slots__ = ("node", "pre", "ready", "first_use", "nbytes")

    def __init__(self, node, pre, ready, first_use):
        self.node, self.pre, self.ready, self.first_use = node, pre, ready, first_use
        self.nbytes = node.out.size * node.out.dtype.itemsize


def plan_buckets(graph: Graph, bucket_bytes: int) -> list[list[_Member]]:
    """The buckets, each a list of members in packing order, in start order."""
    nodes = graph.nodes
    index = {n.out.id: i for i, n in enumerate(nodes)}
    users: dict[int, list[int]] = {}
    for i, n in enumerate(nodes):
        for x in n.inputs:
            users.setdefault(x.id, []).append(i)
    out_ids = {o.id for o in graph.outputs}
    groups: dict[tuple, list[_Member]] = {}
    for node in nodes:
        if node.prim != "mpi_allreduce":
            continue
        src = node.inputs[0]
        pre = None
        p = index.get(src.id)
        if p is not None and nodes[p].prim == "local_reduce" and len(users[src.id]) == 1:
            pre = nodes[p]  # moves with the bucket
            ready = max((index.get(x.id, -1) for x in pre.inputs), default=-1)
        else:
            ready = -1 if p is None else p
        first_use = min(users.get(node.out.id, [len(nodes)]))
        if node.out.id in out_ids:
            first_use = min(first_use, len(nodes))
        key = (node.attrs["op"], node.out.dtype.str)  # (dependent ones: see needed_by below)
        groups.setdefault(key, []).append(_Member(node, pre, ready, first_use))
    buckets = []
    for members in groups.values():
        members.sort(key=lambda m: m.ready)
        current, size, needed_by = [], 0, None
        for m in members:
            fits = size + m.nbytes <= bucket_bytes and m.ready < needed_by if current else True
            if not fits:
                buckets.append(current)
                current, size, needed_by = [], 0, None
            current.append(m)
            size += m.nbytes
            needed_by = m.first_use if needed_by is None else min(needed_by, m.first_use)
        if current:
            buckets.append(current)
    buckets.sort(key=lambda b: max(m.ready for m in b))
    return buckets


def bucketing(graph: Graph, bucket_bytes: int = 25 * 2**20, compress=None,
              overlap: bool = True) -> Graph:
    if bucket_bytes <= 0 or not any(n.prim == "mpi_allreduce" for n in graph.nodes):
        return graph
    graph = communication_first(graph)
    buckets = plan_buckets(graph, bucket_bytes)
    moved = {id(m.node) for b in buckets for m in b} | \
        {id(m.pre) for b in buckets for m in b if m.pre is not None}
    starts: dict[int, list[int]] = {}  # node index after which bucket b is ready
    for b, members in enumerate(buckets):
        starts.setdefault(max(m.ready for m in members), []).append(b)
    waiting: dict[int, int] = {}  # original member output id -> bucket
    for b, members in enumerate(buckets):
        for m in members:
            waiting[m.node.out.id] = b
    rb = Rebuilder(graph)
    handles: dict[int, object] = {}
    done: set[int] = set()

    def start(b):
        members = buckets[b]
        for m in members:  # an input made from another bucket's result needs that one first
            for x in (m.pre.inputs if m.pre is not None else m.node.inputs):
                if x.id in waiting and waiting[x.id] not in done:
                    finish(waiting[x.id])
        n_before = len(rb.trace.nodes)
        flats = []
        for m in members:
            x = rb.copy(m.pre) if m.pre is not None else rb.get(m.node.inputs[0])
            flats.append(rnp.reshape(x, (-1,)) if x.ndim != 1 else x)
        flat = flats[0] if len(flats) == 1 else rnp.concatenate(flats, 0)
        dtype = flat.dtype
        if compress is not None and is_float(dtype) and dtype.itemsize > 2:
            flat = rnp.cast(flat, compress)
        attrs = dict(members[0].node.attrs, bucket=b)
        if flat is not flats[0]:  # a fresh buffer nobody else reads: reduce over it in place
            attrs["owned"] = True
        if overlap:
            handles[b] = (bind("comm_start", flat, **attrs), dtype)
        else:
            handles[b] = (bind("mpi_allreduce", flat, **attrs), dtype)
        for new in rb.trace.nodes[n_before:]:
            new.where = members[0].node.where

    def finish(b):
        value, dtype = handles[b]
        if overlap:
            value = bind("comm_wait", value, bucket=b)
        if value.dtype != dtype:
            value = rnp.cast(value, dtype)
        offset = 0
        for m in buckets[b]:
            n = m.node.out.size
            part = value if len(buckets[b]) == 1 else value[offset:offset + n]
            if part.shape != m.node.out.shape:
                part = rnp.reshape(part, m.node.out.shape)
            rb.subst[m.node.out.id] = part
            offset += n
        done.add(b)

    with rb:
        for b in starts.get(-1, ()):
            start(b)
        for i, node in enumerate(graph.nodes):
            if id(node) not in moved:
                for x in node.inputs:
                    b = waiting.get(x.id)
                    if b is not None and b not in done:
                        finish(b)
                rb.copy(node)
            for b in starts.get(i, ()):
                start(b)
        for o in graph.outputs:
            b = waiting.get(o.id)
            if b is not None and b not in done:
                finish(b)
        for b in range(len(buckets)):  # a result nobody reads still completes its bucket
            if b not in done:
                finish(b)
    graph = rb.finish()
    return sink_waits(graph) if overlap else graph


def communication_first(graph: Graph) -> Graph:
    """Order the all-reduces and everything they need before everything else (the optimiser
    updates, the outputs), each part in its old order — still a valid order, since what an
    all-reduce needs needs only such nodes. Traced with several replicas per process, a
    gradient's update can sit between the next gradients' computations; a bucket must close
    before the first use of its results, so that order gave one bucket per gradient."""
    needed: set[int] = set()
    for node in reversed(graph.nodes):  # (a pipeline stage's sends must not wait for them)
        if node.prim in ("mpi_allreduce", "send") or node.out.id in needed:
            needed.update(x.id for x in node.inputs)
            needed.add(node.out.id)
    first = [n for n in graph.nodes if n.out.id in needed]
    if len(first) == len(graph.nodes):
        return graph
    rest = [n for n in graph.nodes if n.out.id not in needed]
    return Graph(graph.inputs, first + rest, graph.outputs, graph.meta.copy())


def sink_waits(graph: Graph) -> Graph:
    """Run everything that does not need a bucket's result before everything that does.

    A node is *waiting* if it is a ``comm_wait`` or reads a waiting value; nothing else can read
    a waiting value, so the not-waiting nodes (in order) followed by the waiting ones (in order)
    is still a valid order — and the rest of the backward pass computes while buckets travel.
    """
    tainted: set[int] = set()
    first, later = [], []
    for node in graph.nodes:
        if node.prim == "comm_wait" or any(x.id in tainted for x in node.inputs):
            tainted.add(node.out.id)
            later.append(node)
        else:
            first.append(node)
    return Graph(graph.inputs, first + later, graph.outputs, graph.meta.copy())
