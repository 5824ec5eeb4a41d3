"""The placeholder rewrite: turn each replica's collective placeholders into real communication.

After ``step_fn`` has been traced once per local replica (k subgraphs in one graph), this pass

1. groups the placeholders by sequence number (the n-th collective each replica called),
2. checks that every replica called it, with the same kind, arguments, shape and dtype — a
   disagreement raises ``CollectiveMismatchError`` naming the source lines, before anything is
   communicated,
3. replaces each group by an in-process combine of the k local values (``local_reduce`` or a
   stack), one cross-process collective (``mpi_*``, omitted with one process), and the fan-out of
   the result to the k replicas (the same value for all, or each replica's slice) — one row of
   ``LOWER`` per collective.

Replica r on rank p has global id ``p * k + r``.
"""

from __future__ import annotations

import numpy as np

from ... import numpy as rnp
from ...dtypes import is_low_precision
from ...errors import CollectiveMismatchError, ReplicaContextError, source_line
from ..core import Graph, bind
from ..primitives import REGISTRY, RuleTable
from ..rebuild import Rebuilder

_IGNORED = ("seq", "replica")


def _signature(node):
    attrs = {k: v for k, v in node.attrs.items() if k not in _IGNORED}
    return (node.prim, tuple(sorted(attrs.items())), node.inputs[0].aval)


def _describe(node):
    attrs = {k: v for k, v in node.attrs.items() if k not in _IGNORED + ("num_replicas",)}
    args = ", ".join(f"{k}={v!r}" for k, v in sorted(attrs.items()))
    return f"{node.prim}({node.inputs[0].aval}{', ' if args else ''}{args})"


def _where(node):
    return source_line(node.where) if node.where else "<unknown line>"


def group_placeholders(graph: Graph, k: int) -> dict:
    """{seq: [node of replica 0, ..., node of replica k-1]}, checked for agreement."""
    groups: dict = {}
    for node in graph.nodes:
        if REGISTRY[node.prim].placeholder:
            groups.setdefault(node.attrs["seq"], {})[node.attrs["replica"] % k] = node
    out = {}
    for seq in sorted(groups):
        members = groups[seq]
        if len(members) != k:
            missing = sorted(set(range(k)) - set(members))
            called = "\n".join(f"  replica {r}: {_describe(n)} at {_where(n)}"
                               for r, n in sorted(members.items()))
            raise CollectiveMismatchError(
                f"collective #{seq} was called by only some replicas (not by local replica(s) "
                f"{missing}):\n{called}\nEvery replica must call the same collectives in the same "
                "order; make the call unconditional (select its result with rnp.where instead).")
        nodes = [members[r] for r in range(k)]
        sigs = [_signature(n) for n in nodes]
        if len(set(sigs)) != 1:
            lines = "\n".join(f"  replica {r}: {_describe(n)} at {_where(n)}"
                              for r, n in enumerate(nodes))
            raise CollectiveMismatchError(
                f"replicas disagree about collective #{seq}:\n{lines}\n"
                "Every replica must call the same collective with the same shapes and dtypes.")
        out[seq] = nodes
    return out


# -- the rewrite of each placeholder: a row per collective -----------------------------------------
# A row is ``lower(g, inputs, **attrs) -> the k per-replica results``; ``g`` says where this
# process stands (k replicas here, n processes, this one's rank, R replicas in all, ``first``:
# the global id of local replica 0).
class _Where:
    __slots__ = ("k", "n", "rank", "R", "first")

    def __init__(self, k, n, rank, R):
        self.k, self.n, self.rank, self.R, self.first = k, n, rank, R, rank * k


def _reduced(g, inputs, op):
    dtype = inputs[0].dtype
    if is_low_precision(dtype) and op in ("sum", "mean") and g.k * g.n > 1:
        # float16/bfloat16: summed in float32, rounded once at the end
        return rnp.cast(_reduced(g, [rnp.cast(x, np.float32) for x in inputs], op), dtype)
    base = "sum" if op == "mean" else op
    combined = inputs[0] if g.k == 1 else bind("local_reduce", *inputs, op=base)
    if g.n > 1:
        combined = bind("mpi_allreduce", combined, op=base, size=g.n)
    if op == "mean":
        combined = combined * np.asarray(1.0 / g.R, combined.dtype)
    return combined


def _everyone(g, inputs):  # (R, ...) in global replica order
    stacked = rnp.stack(inputs, 0)
    if g.n > 1:
        stacked = rnp.reshape(bind("mpi_allgather", stacked, size=g.n), (g.R,) + inputs[0].shape)
    return stacked


def _all_reduce(g, inputs, *, op, **_):
    return [_reduced(g, inputs, op)] * g.k


def _broadcast(g, inputs, *, root, **_):
    root_rank, root_local = divmod(root, g.k)
    value = inputs[root_local]
    if g.n > 1:
        value = bind("mpi_broadcast", value, root=root_rank, size=g.n)
    return [value] * g.k


def _all_gather(g, inputs, *, axis, tiled, **_):
    out = rnp.moveaxis(_everyone(g, inputs), 0, axis)
    if tiled:
        shape = list(inputs[0].shape)
        shape[axis] *= g.R
        out = rnp.reshape(out, shape)
    return [out] * g.k


def _reduce_scatter(g, inputs, *, op, axis, **_):
    total = _reduced(g, inputs, op)
    chunk = inputs[0].shape[axis] // g.R
    pre = (slice(None),) * axis
    return [total[pre + (slice((g.first + r) * chunk, (g.first + r + 1) * chunk),)]
            for r in range(g.k)]


def _permute(g, inputs, *, shift, **_):
    everyone = _everyone(g, inputs)
    return [everyone[(g.first + r - shift) % g.R] for r in range(g.k)]


LOWER = RuleTable("collective rewrite", {
    "all_reduce": _all_reduce, "broadcast": _broadcast, "all_gather": _all_gather,
    "reduce_scatter": _reduce_scatter, "permute": _permute,
})


def lower(prim, inputs, *, k, n, rank, num_replicas, **attrs) -> list:
    """Collective ``prim``'s row: the k per-replica results of the k local ``inputs`` on
    process ``rank`` of ``n``. The rewrite emits it into the graph; eager mode (k = 1, no
    trace) runs it at once, its ``mpi_*`` nodes through the reference table."""
    return LOWER[prim](_Where(k, n, rank, num_replicas), inputs, **attrs)


def _lower_group(nodes, inputs, k, n, rank):
    """Emit the communication for one placeholder group; return the k per-replica results."""
    node = nodes[0]
    attrs = {a: v for a, v in node.attrs.items() if a not in ("seq", "replica", "num_replicas")}
    R = node.attrs["num_replicas"]
    if k == 1 and R != n:  # a step outside a Replicator under mpiexec: as eager mode says
        raise ReplicaContextError(f"collectives need one replica per process: {R} replicas on {n} "
                         f"processes ({_describe(node)} at {_where(node)})")
    return lower(node.prim, inputs, k=k, n=n, rank=rank, num_replicas=R, **attrs)


def replicate_collectives(graph: Graph, k: int, n: int = 1, rank: int = 0,
                          comm: str | None = None) -> Graph:
    """Rewrite the placeholders of a k-replica graph for n processes (this one being ``rank``).
    ``comm``: the label of the communicator the exchanges go over (with model parallelism, the
    processes of this logical device, one per replica group; ``None``: every process)."""
    groups = group_placeholders(graph, k)
    after, ready = upstream_collectives(graph, groups)
    lowered: dict = {}
    order = _grouped_order(graph, groups)
    rb = Rebuilder(graph)
    with rb:
        for node in order:
            if not REGISTRY[node.prim].placeholder:
                rb.copy(node)
                continue
            seq = node.attrs["seq"]
            if seq not in lowered:
                members = groups[seq]
                start = len(rb.trace.nodes)
                lowered[seq] = _lower_group(members, [rb.get(m.inputs[0]) for m in members],
                                            k, n, rank)
                for new in rb.trace.nodes[start:]:  # errors must name the user's line, not ours
                    new.where, new.placed = members[0].where, members[0].placed
                    if comm is not None and REGISTRY[new.prim].exchange:
                        new.attrs = dict(new.attrs, comm=comm)
                    if members[0].attrs.get("shard") and new.prim == "mpi_allreduce":
                        new.attrs = dict(new.attrs, shard=True)  # (passes/shard_state.py)
                    if REGISTRY[new.prim].exchange:  # (what bucketing plans from)
                        new.attrs = dict(new.attrs, _exchange=seq, _after=after[seq],
                                         _ready=ready[seq])
                for m, value in zip(members, lowered[seq]):
                    rb.subst[m.out.id] = value
    return rb.finish()


def upstream_collectives(graph: Graph, groups: dict) -> tuple[dict, dict]:
    """``after, ready``, read from the traced step before the rewrite, so that every process
    finds the same (after it they need not: a broadcast's gradient is used on the root's
    process only), for bucketing to plan from (``passes/bucket_plan.py``):

    ``after[seq]``: bit ``s`` set when collective #s is upstream of an input of collective #seq
    in any replica; ``ready[seq]``: where local replica 0's input of collective #seq is made
    (its place in the trace: replica 0 is traced first, so this is the same on every process
    however many replicas each holds; -1: an input of the step)."""
    upstream: dict[int, int] = {}  # value id -> bits
    after: dict[int, int] = {}
    for node in graph.nodes:
        bits = 0
        for x in node.inputs:
            bits |= upstream.get(x.id, 0)
        if REGISTRY[node.prim].placeholder:
            seq = node.attrs["seq"]
            after[seq] = after.get(seq, 0) | bits
            bits |= 1 << seq
        if bits:
            upstream[node.out.id] = bits
    made = {n.out.id: i for i, n in enumerate(graph.nodes)}
    ready = {seq: made.get(members[0].inputs[0].id, -1) for seq, members in groups.items()}
    return after, ready


def _grouped_order(graph: Graph, groups: dict) -> list:
    """A topological order in which a placeholder group is emitted once all its members' inputs
    exist (the replicas' subgraphs are interleaved as needed)."""
    producer = {node.out.id: node for node in graph.nodes}
    group_of = {id(n): members for members in groups.values() for n in members}

    def deps(node):
        members = group_of.get(id(node), [node])
        return [producer[i.id] for m in members for i in m.inputs if i.id in producer]

    done, order = set(), []
    for root in graph.nodes:
        if id(root) in done:
            continue
        stack = [(root, False)]
        while stack:
            node, expanded = stack.pop()
            if id(node) in done:
                continue
            if expanded:
                for member in group_of.get(id(node), [node]):
                    if id(member) not in done:
                        done.add(id(member))
                        order.append(member)
                continue
            stack.append((node, True))
            for dep in reversed(deps(node)):
                if id(dep) not in done:
                    stack.append((dep, False))
    return order
