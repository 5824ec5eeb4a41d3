"""Gradient bucketing: many small cross-process all-reduces become a few flat buffers.

The ``mpi_allreduce`` nodes that the collective rewrite produced are grouped by reduction op
and dtype and packed into buckets of at most ``bucket_bytes`` (``bucket_plan.py``): in the
order their inputs become ready in the traced step (the backward pass makes the last layer's
gradient first), a bucket closing at the first exchange that depends on one of its members.
Independent ones share a bucket: gradients behind different numbers of BatchNorm all-reduces
(grouping them by that number, as before, left a small conv GAN with 20 one-tensor gradient
all-reduces, each a cut in the JAX program), and BatchNorm's statistics (mean, variance,
squared mean; each step of the GAN example, with cross-replica BatchNorm, had 25 exchanges, now
10). What another exchange needs never shares a bucket with gradients, which would then wait
for the step's middle. Each bucket's members are brought together (``bucket_plan.glue``):
what reads an early member's result waits for the bucket.

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

A sharded step (``shard_state.py``) has two more kinds, packed the same way, each kind and dtype
its own buckets: the gradients' ``mpi_reduce_scatter`` — the members' padded buffers side by side
as rows of ``processes`` (each process's slices), so process r receives its slices of every
member one after another — and the parameters' ``mpi_allgather`` of those slices. With
``overlap`` they go to the communication thread as ``comm_start[collective=...]``; ``compress``
casts the reduce-scatter (every element combined as the all-reduce combines it: bitwise the
compressed unsharded step) but never a parameter or a norm's partial sums (``exact``).
"""

from __future__ import annotations

from ... import numpy as rnp
from ...dtypes import is_float
from ...errors import source_line
from ..core import Graph, bind
from ..primitives import ELEMENTWISE, REDUCTION, REGISTRY, SOURCE
from ..rebuild import Rebuilder
from .bucket_plan import (
    COLLECTIVE,
    bucketable,
    glue,
    is_tagged,
    members_of,
    plan_buckets,
    sharded_exchange,
)


def bucketing(graph: Graph, bucket_bytes: int = 25 * 2**20, compress=None,
              overlap: bool = True) -> Graph:
    if bucket_bytes <= 0 or not any(bucketable(n) for n in graph.nodes):
        return graph
    graph = gathers_last(communication_first(graph))
    buckets = plan_buckets(graph, bucket_bytes)
    tagged = is_tagged(graph)
    if tagged:  # each bucket's members together, the exchanges in the planned order
        graph = glue(graph, buckets)
        placed = members_of(graph)  # the same members, where they now are
        buckets = [[placed[id(m.node)][1] for m in b] for b in buckets]
    moved = {id(m.node) for b in buckets for m in b} | \
        {id(m.pre) for b in buckets for m in b if m.pre is not None}
    starts: dict[int, list[int]] = {}  # node index after which bucket b is ready
    sharded = any(sharded_exchange(m.node) for b in buckets for m in b)
    at = -1  # (a sharded step: no bucket starts before the one planned before it)
    for b, members in enumerate(buckets):
        ready = max(m.order for m in members) if tagged else max(m.ready for m in members)
        if sharded and at < min(m.first_use for m in members):
            ready = max(ready, at)  # (buckets start in the planned order on every process)
            at = ready
        starts.setdefault(ready, []).append(b)
    started: list[int] = []  # in the order they start
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
        started.append(b)
        prim, attrs = members[0].node.prim, dict(members[0].node.attrs, bucket=b)
        # a reduce-scatter's members side by side as (processes, chunk) rows: process r's
        # chunk of the bucket is its slices of the members, one after another
        rows = prim == "mpi_reduce_scatter" and len(members) > 1
        flats = []
        for m in members:
            x = rb.copy(m.pre) if m.pre is not None else rb.get(m.node.inputs[0])
            flats.append(rnp.reshape(x, (attrs["size"], -1)) if rows else
                         rnp.reshape(x, (-1,)) if x.ndim != 1 else x)
        flat = flats[0] if len(flats) == 1 else \
            rnp.reshape(rnp.concatenate(flats, 1), (-1,)) if rows else rnp.concatenate(flats, 0)
        dtype = flat.dtype
        if compress is not None and is_float(dtype) and dtype.itemsize > 2 \
                and prim != "mpi_allgather" and not attrs.get("exact"):
            flat = rnp.cast(flat, compress)
        if flat is not flats[0] and prim == "mpi_allreduce":  # a fresh buffer nobody else
            attrs["owned"] = True  # reads: reduce over it in place
        if overlap:
            if prim != "mpi_allreduce":
                attrs["collective"] = COLLECTIVE[prim]
            handles[b] = (bind("comm_start", flat, **attrs), dtype)
        else:
            handles[b] = (bind(prim, flat, **attrs), dtype)
        for new in rb.trace.nodes[n_before:]:
            new.where = members[0].node.where

    def finish(b):
        value, dtype = handles[b]
        if overlap:
            value = bind("comm_wait", value, bucket=b)
        if value.dtype != dtype:
            value = rnp.cast(value, dtype)
        offset, gathered = 0, buckets[b][0].node.prim == "mpi_allgather"
        for m in buckets[b]:
            n = m.size
            part = value if len(buckets[b]) == 1 else value[:, offset:offset + n] \
                if gathered else value[offset:offset + n]
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
    graph = _scheduled(graph, [buckets[b] for b in started])
    return mark_inline(sink_waits(graph)) if overlap else graph


def _scheduled(graph: Graph, buckets) -> Graph:
    """``graph`` with its buckets, in start order, added to the schedule the ranks compare
    before they exchange anything (the processes' graphs differ: a plan that differed would mix
    their buffers). A tagged bucket names its collectives, in packing order."""
    rows = [(_within(b.node.attrs.get("comm"),
                     f"bucket {b.node.prim}[{b.node.attrs.get('op')}] {b.node.out.dtype} of "
                     f"{[m.node.inputs[0].shape for m in members]}{_numbers(members)}"),
             source_line(b.node.where) if b.node.where else "?")
            for members in buckets for b in members[:1]]
    schedule = list(graph.meta.collective_schedule or [])
    return Graph(graph.inputs, graph.nodes, graph.outputs,
                 graph.meta.copy(collective_schedule=schedule + rows))


def _numbers(members) -> str:
    if not all("_exchange" in m.node.attrs for m in members):
        return ""
    return " (collectives " + ", ".join(f"#{m.node.attrs['_exchange']}" for m in members) + ")"


# a schedule row that only the processes of one communicator compare (model parallelism: each
# logical device's group exchanges its own buckets): "within LABEL: text"
WITHIN = "within "


def _within(comm, text: str) -> str:
    return text if comm is None else f"{WITHIN}{comm}: {text}"


def communication_first(graph: Graph) -> Graph:
    """Order the all-reduces (and a sharded step's reduce-scatters) and everything they need
    before everything else (the optimiser updates, the outputs), each part in its old order —
    still a valid order, since what an all-reduce needs needs only such nodes. Traced with
    several replicas per process, a gradient's update can sit between the next gradients'
    computations; a bucket must close before the first use of its results, so that order gave
    one bucket per gradient. What only a sharded step's split reductions need (``exact``
    all-reduces of a global norm's partial sums, which read the reduce-scattered slices) comes
    second, so that the reduce-scatters are not held apart by them — and so do the sends of
    what such an all-reduce made, and the sends chained after those (model parallelism: a
    device's share of the norm sent on, the step's results sent at its end)."""
    exact: set[int] = set()  # made from an exact all-reduce's result (or chained after one)
    for node in graph.nodes:
        if node.prim == "mpi_allreduce" and node.attrs.get("exact") or any(
                x.id in exact for x in node.inputs):
            exact.add(node.out.id)
    needed: set[int] = set()
    later: set[int] = set()  # needed by the exact all-reduces only
    for node in reversed(graph.nodes):  # (a pipeline stage's sends must not wait for them)
        exchanged = node.prim == "mpi_allreduce" or node.prim == "mpi_reduce_scatter"
        if (exchanged or node.prim == "send" and node.out.id not in exact) \
                and not node.attrs.get("exact") or node.out.id in needed:
            needed.update(x.id for x in node.inputs)
            needed.add(node.out.id)
        elif node.prim == "mpi_allreduce" or node.out.id in later:
            later.update(x.id for x in node.inputs)
            later.add(node.out.id)
    first = [n for n in graph.nodes if n.out.id in needed]
    second = [n for n in graph.nodes if n.out.id in later and n.out.id not in needed]
    order = first + second + [n for n in graph.nodes
                              if n.out.id not in needed and n.out.id not in later]
    if all(a is b for a, b in zip(order, graph.nodes)):
        return graph
    return Graph(graph.inputs, order, graph.outputs, graph.meta.copy())


def gathers_last(graph: Graph) -> Graph:
    """Everything that reads a sharded step's gathered parameters (``mpi_allgather`` marked
    ``shard``) after everything else, each part in its old order (valid: nothing else reads
    such a value). Each parameter's gather is read just after it, before the next
    parameter's update; in that order a bucket of gathers would close at each."""
    tainted: set[int] = set()
    first, later = [], []
    for node in graph.nodes:
        if any(x.id in tainted for x in node.inputs):
            tainted.add(node.out.id)
            later.append(node)
        else:
            if node.prim == "mpi_allgather" and node.attrs.get("shard"):
                tainted.add(node.out.id)
            first.append(node)
    if not later:
        return graph
    return Graph(graph.inputs, first + later, graph.outputs, graph.meta.copy())


def sink_waits(graph: Graph) -> Graph:
    """Run everything that does not need a bucket's result before everything that does.

    A node is *waiting* if it is a ``comm_wait`` or reads a waiting value, and so is every
    exchange after a waiting one (the exchanges keep the order the processes agree on, though
    what one needs differs between them); nothing else can read a waiting value, so the
    not-waiting nodes (in order) followed by the waiting ones (in order) is still a valid order —
    and the rest of the backward pass computes while buckets travel.
    """
    tainted: set[int] = set()
    first, later = [], []
    exchanges_wait = False  # (the exchanges keep their order, the one the processes agree on)
    for node in graph.nodes:
        exchange = REGISTRY[node.prim].exchange and node.prim != "comm_wait"
        if node.prim == "comm_wait" or exchange and exchanges_wait or any(
                x.id in tainted for x in node.inputs):
            exchanges_wait = exchanges_wait or exchange
            tainted.add(node.out.id)
            later.append(node)
        else:
            first.append(node)
    return Graph(graph.inputs, first + later, graph.outputs, graph.meta.copy())


def mark_inline(graph: Graph) -> Graph:
    """Mark ``_inline`` each ``comm_start`` before whose ``comm_wait`` nothing worth overlapping
    computes (views, constants, other exchanges, and elementwise ops and reductions of fewer than
    ``OVERLAP_WORTH`` elements in all — a loss's sum): handing it to the communication thread
    would cost more than it hides, so the transport may run it on the step's thread
    (``overlap.CommThread.submit``). A private attribute: the processes need not agree on it
    (the exchanges' order is the same either way), and the schedule they compare leaves it out."""
    waits = {n.inputs[0].id: i for i, n in enumerate(graph.nodes) if n.prim == "comm_wait"}
    done = [0]  # the work of the nodes before each position (one pass, not one per bucket)
    for n in graph.nodes:
        done.append(done[-1] + _work(n))
    for i, node in enumerate(graph.nodes):
        j = waits.get(node.out.id) if node.prim == "comm_start" else None
        if j is not None and done[j] - done[i + 1] < OVERLAP_WORTH:
            node.attrs = dict(node.attrs, _inline=True)
    return graph


OVERLAP_WORTH = 1 << 16  # elements read by elementwise ops and reductions


def _work(node) -> int:
    """How much ``node`` computes, in elements read; a contraction (matmul, convolution) or
    anything else not elementwise counts as worth overlapping (``OVERLAP_WORTH`` on its own)."""
    spec = REGISTRY[node.prim]
    if spec.kind == SOURCE or spec.alias or spec.host:
        return 0
    if spec.kind in (ELEMENTWISE, REDUCTION):
        return sum(x.size for x in node.inputs)
    return OVERLAP_WORTH
