"""Gradient buckets planned: which exchanges share a flat buffer, and in which order they start.

Every process must plan the same buckets — a plan that differed would mix the processes'
buffers — and the processes' graphs differ (a broadcast's gradient is used on the root's process
only, a sharded step's slice that holds padding on one is cut differently). So the plan is made
from what they agree on: the exchanges' order (which the ranks compare) and, for a step the
collective rewrite tagged, where each exchange's input is made in the traced step and which
other collectives it depends on there (``replicate_collectives.upstream_collectives``). The
buckets themselves are added to the schedule the ranks compare (``bucketing._scheduled``), so a
step traced differently on some replicas stops with an error that says so, never a mixed sum.
``bucketing.py`` builds what this plans.
"""

from __future__ import annotations

import heapq

from ...errors import CollectiveMismatchError
from ..core import Graph
from ..primitives import REGISTRY

# what to do when the replicas traced different steps (also ``schedule.py``'s hint)
TRACED_DIFFERENTLY = (
    "\nThe gradient buckets are planned from each process's traced step; here the replicas "
    "traced different steps (a Python branch on the replica's id, a loop over a set, whose "
    "order differs between processes?). Write such a branch as rnp.where(...) and loop in a "
    "fixed order, so that every replica traces the same step, or turn bucketing off: "
    "options={'bucket_bytes': 0}.")

# the exchanges packed: gradient all-reduces, and a sharded step's reduce-scatters of gradients
# and all-gathers of new parameters (``shard_state.py`` marks those ``shard``); started on the
# communication thread as ``comm_start[collective=...]``
COLLECTIVE = {"mpi_allreduce": "allreduce", "mpi_reduce_scatter": "reduce_scatter",
              "mpi_allgather": "allgather"}


def sharded_exchange(node) -> bool:
    """Made by ``shard_state``: a reduce-scatter, a parameter's all-gather, a norm's partial."""
    return node.prim in COLLECTIVE and (node.prim == "mpi_reduce_scatter" or bool(
        node.attrs.get("shard") or node.attrs.get("exact")))


def bucketable(node) -> bool:
    return node.prim in COLLECTIVE and (node.prim != "mpi_allgather" or
                                        bool(node.attrs.get("shard")))


class _Member:
    __slots__ = ("node", "pre", "ready", "first_use", "nbytes", "size", "order")

    def __init__(self, node, pre, ready, first_use, order):
        self.node, self.pre, self.ready, self.first_use = node, pre, ready, first_use
        self.order = order  # (``ready``, or the exchange's place: a sharded or tagged step)
        # (elements in the bucket's result per process: the slice; bytes: what the whole
        # exchange carries, the gradient or the gathered parameter)
        self.size = node.inputs[0].size if node.prim == "mpi_allgather" else node.out.size
        self.nbytes = max(node.inputs[0].size, node.out.size) * node.out.dtype.itemsize


def plan_buckets(graph: Graph, bucket_bytes: int) -> list[list[_Member]]:
    """The buckets, each a list of members in packing order, in start order.

    Every process must plan the same buckets, and the graphs differ between them: a broadcast's
    gradient is used on the root's process only; a sharded step's slice that holds padding on
    one is cut differently, constants merge differently. So the plan is made from what they
    agree on. Where the collective rewrite tagged every exchange (``_exchange``, ``_after``,
    ``_ready``: ``replicate_collectives.upstream_collectives``), members are packed, and
    buckets started, in ``exchange_order``, and a bucket closes at the first
    exchange that depends on one of its members in the traced step — so a bucket never holds
    two exchanges one of which needs the other, on any process — or when it is full. A
    sharded step's are packed in the exchanges' order (which the ranks compare), a pipeline's
    in the order they become ready; both close where one of their results is needed before the
    next member is ready. Every plan is compared between the processes
    (``bucketing._scheduled``)."""
    members = members_of(graph)
    if is_tagged(graph):
        return _by_dependence(graph, members, bucket_bytes)
    groups: dict[tuple, list[_Member]] = {}
    for key, m in members.values():
        groups.setdefault(key, []).append(m)
    buckets = []
    for group in groups.values():
        group.sort(key=lambda m: m.order)
        current, size, needed_by = [], 0, None
        for m in group:
            fits = size + m.nbytes <= bucket_bytes and m.ready < needed_by if current else True
            if not fits:
                buckets.append(current)
                current, size, needed_by = [], 0, None
            current.append(m)
            size += m.nbytes
            needed_by = m.first_use if needed_by is None else min(needed_by, m.first_use)
        if current:
            buckets.append(current)
    buckets.sort(key=lambda b: max(m.order for m in b))
    return buckets


def members_of(graph: Graph) -> dict[int, tuple]:
    """``{id(node): (group key, _Member)}`` of each bucketable exchange, in graph order."""
    nodes = graph.nodes
    in_place = any(sharded_exchange(n) for n in nodes) or is_tagged(graph)
    index = {n.out.id: i for i, n in enumerate(nodes)}
    users: dict[int, list[int]] = {}
    for i, n in enumerate(nodes):
        for x in n.inputs:
            users.setdefault(x.id, []).append(i)
    out_ids = {o.id for o in graph.outputs}
    members = {}
    for node in nodes:
        if not bucketable(node):
            continue
        src = node.inputs[0]
        pre = None
        p = index.get(src.id)
        if p is not None and nodes[p].prim == "local_reduce" and len(users[src.id]) == 1 \
                and node.prim == "mpi_allreduce":
            pre = nodes[p]  # moves with the bucket
            ready = max((index.get(x.id, -1) for x in pre.inputs), default=-1)
        else:
            ready = -1 if p is None else p
        first_use = min(users.get(node.out.id, [len(nodes)]))
        if node.out.id in out_ids:
            first_use = min(first_use, len(nodes))
        # (``exact``: never compressed)
        key = (node.prim, node.attrs.get("op"), node.out.dtype.str, node.attrs.get("exact"),
               node.attrs.get("comm"))
        order = index[node.out.id] if in_place else ready
        members[id(node)] = (key, _Member(node, pre, ready, first_use, order))
    return members


def is_tagged(graph: Graph) -> bool:
    """Every exchange of ``graph`` tagged by the collective rewrite (not a sharded step's, not
    a pipeline's sends): its buckets are planned from the tags alone (``_by_dependence``)."""
    return all("_after" in n.attrs and not sharded_exchange(n)
               for n in graph.nodes if REGISTRY[n.prim].exchange)


def _tag_order(node) -> tuple:
    """Where a tagged exchange's input is made in the traced step, then its number: the order
    the processes agree on, close to the order the values become ready (the backward pass makes
    the last layer's gradient first)."""
    return node.attrs["_ready"], node.attrs["_exchange"]


def exchange_order(graph: Graph) -> list:
    """The tagged exchanges in ``_tag_order``, each after every collective it depends on in the
    traced step (where a replica's data flow differs from replica 0's, the two orders can
    disagree). The order the processes agree on: their buckets start in it."""
    pending = sorted((n for n in graph.nodes if REGISTRY[n.prim].exchange), key=_tag_order)
    present = 0
    for n in pending:
        present |= 1 << n.attrs["_exchange"]
    done, order = 0, []
    while pending:
        i = next((i for i, n in enumerate(pending)
                  if not n.attrs["_after"] & present & ~done), 0)
        node = pending.pop(i)
        order.append(node)
        done |= 1 << node.attrs["_exchange"]
    return order


def _by_dependence(graph: Graph, members: dict, bucket_bytes: int) -> list[list[_Member]]:
    """Tagged exchanges packed in ``exchange_order`` (see ``plan_buckets``): an open bucket
    closes at the first exchange that needs one of its members, or when the next member does
    not fit. The buckets are in the order of their last members."""
    open_: dict[tuple, list] = {}  # group key -> [members, their bits, bytes]
    buckets = []

    def close(key):
        buckets.append(open_.pop(key)[0])

    exchanges = exchange_order(graph)
    rank = {id(n): i for i, n in enumerate(exchanges)}
    feeding = 0  # what another exchange needs (BatchNorm's statistics): never with gradients
    for node in exchanges:
        feeding |= node.attrs["_after"]
    for node in exchanges:
        after = node.attrs["_after"]
        for key in [k for k, (_, bits, _) in open_.items() if bits & after]:
            close(key)
        if id(node) not in members:
            continue
        key, m = members[id(node)]
        key += (feeding >> node.attrs["_exchange"] & 1,)
        if key in open_ and open_[key][2] + m.nbytes > bucket_bytes:
            close(key)
        entry = open_.setdefault(key, [[], 0, 0])
        entry[0].append(m)
        entry[1] |= 1 << node.attrs["_exchange"]
        entry[2] += m.nbytes
    for key in list(open_):
        close(key)
    buckets.sort(key=lambda b: rank[id(b[-1].node)])
    # each packed in the collectives' order, not the walk's: a loop whose order differs between
    # processes (over a set) makes the same gradients ready in another order
    return [sorted(b, key=lambda m: m.node.attrs["_exchange"]) for b in buckets]


def glue(graph: Graph, buckets: list[list[_Member]]) -> Graph:
    """``graph`` reordered so that each bucket's members (and their in-process combines) sit
    together and the buckets and other exchanges keep their order: a node that reads an early
    member's result moves after the bucket's last member is ready (cross-replica BatchNorm's
    1/R scaling of the mean, which the rewrite emits before the last replica's mean of
    squares). Each bucket goes right after its members' inputs are made, unless an exchange
    planned before it is not there yet. Members never need one another (``_by_dependence``),
    so this order exists — unless this process's replicas traced steps whose collectives
    depend on each other differently."""
    nodes = graph.nodes
    pos = {id(n): i for i, n in enumerate(nodes)}
    units: list[list] = [[m.pre for m in b if m.pre is not None] + [m.node for m in b]
                         for b in buckets]
    unit_of = {id(n): u for u, unit in enumerate(units) for n in unit}
    for n in nodes:
        if id(n) not in unit_of:
            unit_of[id(n)] = len(units)
            units.append([n])
    made_by = {n.out.id: unit_of[id(n)] for n in nodes}
    priority = [max(m.ready for m in b) + 0.5 for b in buckets] + \
        [pos[id(unit[0])] for unit in units[len(buckets):]]
    needs: list[set] = [set() for _ in units]
    for u, unit in enumerate(units):
        for n in unit:
            needs[u].update(made_by[x.id] for x in n.inputs if x.id in made_by)
        needs[u].discard(u)
    rank = {id(n): i for i, n in enumerate(exchange_order(graph))}
    chain = sorted((u for u, unit in enumerate(units)
                    if any(REGISTRY[n.prim].exchange for n in unit)),
                   key=lambda u: max(rank[id(n)] for n in units[u] if id(n) in rank))
    for a, b in zip(chain, chain[1:]):
        needs[b].add(a)
    users: list[list] = [[] for _ in units]
    for u, deps in enumerate(needs):
        for d in deps:
            users[d].append(u)
    waiting = [len(deps) for deps in needs]
    heap = [(priority[u], u) for u in range(len(units)) if not waiting[u]]
    heapq.heapify(heap)
    order = []
    while heap:
        _, u = heapq.heappop(heap)
        order.extend(units[u])
        for v in users[u]:
            waiting[v] -= 1
            if not waiting[v]:
                heapq.heappush(heap, (priority[v], v))
    if len(order) != len(nodes):
        raise CollectiveMismatchError(
            "the gradient buckets cannot be placed: this process's replicas traced steps whose "
            f"collectives depend on each other differently.{TRACED_DIFFERENTLY}")
    return Graph(graph.inputs, order, graph.outputs, graph.meta.copy())
