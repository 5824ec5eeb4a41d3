"""Sharded optimiser state (ZeRO-1/2): the step's update, computed on this process's slice.

``rp.wrap_optimizer(opt, shard=True)`` traces the same step as without it; its gradient
all-reduces carry ``shard=True``, and its optimiser state (and float32 master weights) are
Variables holding only this process's slice (``Variable.shard``, a :class:`ShardLayout`). After
the collective rewrite this pass turns

  "all-reduce each gradient, every process applies the same update"

into

  "reduce-scatter each gradient (``mpi_reduce_scatter``: this process's 1/n of the flattened,
  zero-padded gradient), update the slice with the slice of the state, all-gather the new
  parameters".

It walks the graph once, carrying a *slice* (a flat ``(chunk,)`` value) for every value that
is the reduced gradient, a read of sharded state, or an elementwise op of those with scalars and
other whole values of the same shape (which are sliced: the same on every process, so the slice
is this process's part of it). A reduction of a slice over all its elements (a global norm, the
finite check of dynamic loss scaling) becomes the reduction of this process's valid elements and
an ``mpi_allreduce`` of the partial results. A slice that anything else reads — a parameter's
new value, a step output, an op that is not elementwise — is all-gathered back into the whole
value (``mpi_allgather``, once per value). A sharded variable's new value is its slice, the
padding set to zero. Elementwise ops compute on a slice exactly what they compute on the whole
array, and the reduce-scatter combines in the all-reduce's rank order, so the updates are
bitwise those of the unsharded step except where a reduction is split (the global norm: its
partial sums are added in another order).

With model parallelism the pass runs on the whole replica's graph (every device's ops, placed),
before ``split_devices``: the exchanges go over this process's device group (``comm``: the
processes holding the same logical device; ``n``/``rank`` its size and this process's place),
every node it makes is placed where the value it reads is made (a slice gathered on the device
that computed it, even when a transfer reads it), and the norm's partial sums of each device
are all-reduced over that device's group before the step adds the devices' sums as before.

The gradients' reduce-scatters and the parameters' all-gathers (marked ``shard``) are packed
into buckets by the bucketing pass, like all-reduces; a norm's partial sums are marked ``exact``
(never compressed). Stage 3 is not built: ``replicate/sharding.py`` says what it would take.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ... import numpy as rnp
from ...errors import ReplicateError
from ..core import Array, Graph, bind
from ..primitives import ELEMENTWISE, REGISTRY
from ..rebuild import Rebuilder

_SPLIT_REDUCTIONS = {"reduce_sum": "sum", "reduce_max": "max", "reduce_min": "min"}


@dataclass(frozen=True)
class ShardLayout:
    """How an array of ``shape`` is cut over ``n`` processes: flattened, zero-padded to
    ``n * chunk`` elements, process ``rank`` holding elements ``[rank * chunk, (rank + 1) *
    chunk)``, of which the first ``valid`` are the array's (the rest padding)."""

    shape: tuple
    n: int
    rank: int

    @property
    def size(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64))

    @property
    def chunk(self) -> int:
        return -(-self.size // self.n)

    @property
    def valid(self) -> int:
        return max(0, min(self.chunk, self.size - self.rank * self.chunk))

    def part(self, whole) -> np.ndarray:
        """This process's slice of the whole array (a new array, padding zero)."""
        flat = np.asarray(whole).reshape(-1)
        out = np.zeros(self.chunk, flat.dtype)
        out[:self.valid] = flat[self.rank * self.chunk:self.rank * self.chunk + self.valid]
        return out

    def whole(self, parts) -> np.ndarray:
        """The whole array from every process's slice, in rank order."""
        return np.concatenate([np.asarray(p).reshape(-1) for p in parts])[:self.size] \
            .reshape(self.shape)


def _identity(op: str, dtype) -> np.ndarray:
    if dtype == np.bool_:
        return np.asarray(op == "min")
    if op == "sum":
        return np.zeros((), dtype)
    big = np.inf if np.issubdtype(dtype, np.floating) else np.iinfo(dtype).max
    return np.asarray(big if op == "min" else -big).astype(dtype)


class _Sharder:
    def __init__(self, graph: Graph, n: int, rank: int, comm):
        self.graph, self.n, self.rank, self.comm = graph, n, rank, comm
        self.rb = Rebuilder(graph)
        self.sliced: dict = {}  # old value id -> (slice, layout)
        self.parts: dict = {}  # old value id -> this process's slice of a whole value

    def exchange(self, prim, x, **attrs):
        if self.comm is not None:
            attrs["comm"] = self.comm
        return bind(prim, x, size=self.n, **attrs)

    def whole(self, x: Array) -> Array:
        """The new graph's whole value of old value ``x`` (all-gathered once if sliced, on the
        logical device that made the slice: its reader may be a transfer to another)."""
        if x.id not in self.rb.subst:
            part, lay = self.sliced[x.id]
            start = len(self.rb.trace.nodes)
            gathered = rnp.reshape(self.exchange("mpi_allgather", part, shard=True),
                                   (self.n * lay.chunk,))
            if lay.n * lay.chunk != lay.size:
                gathered = gathered[:lay.size]
            self.rb.subst[x.id] = rnp.reshape(gathered, lay.shape)
            if part.node is not None:
                for new in self.rb.trace.nodes[start:]:
                    new.placed = part.node.placed
        return self.rb.get(x)

    def part(self, x: Array, lay: ShardLayout, depth: int = 0) -> Array:
        """This process's slice of old value ``x``: sliced already, an elementwise op's computed
        on its operands' slices (a few ops deep: ``lr * wd * p``), else cut from the whole."""
        if x.id in self.sliced:
            return self.sliced[x.id][0]
        value = self.rb.get(x)
        if value.ndim == 0:
            return value
        if (x.id, lay) not in self.parts:
            node = x.node
            if node is not None and depth < 4 and REGISTRY[node.prim].kind == ELEMENTWISE \
                    and node.out.shape == lay.shape:
                args = [self.part(i, lay, depth + 1) for i in node.inputs]
                self.parts[x.id, lay] = bind(node.prim, *args, **node.attrs)
                return self.parts[x.id, lay]
            if value.shape != lay.shape:
                value = rnp.broadcast_to(value, lay.shape)
            # (every process's cut reads ``flat``, even one of padding only: the graphs of the
            # processes differ in constants, never in what waits for what, so the optimisation
            # passes — bucketing — order their exchanges alike)
            flat, lo = rnp.reshape(value, (lay.size,)), min(lay.rank * lay.chunk, lay.size)
            cut = flat[lo:lo + lay.valid]
            if lay.valid < lay.chunk:
                cut = rnp.concatenate([cut, rnp.zeros((lay.chunk - lay.valid,), value.dtype)])
            self.parts[x.id, lay] = cut
        return self.parts[x.id, lay]

    def padded(self, part: Array, lay: ShardLayout) -> Array:
        """``part`` with its padding set to zero (what a sharded variable keeps)."""
        if lay.valid == lay.chunk:
            return part
        return rnp.concatenate([part[:lay.valid],
                                rnp.zeros((lay.chunk - lay.valid,), part.dtype)])

    # -- the rules, one node at a time ------------------------------------------------------
    def node(self, node) -> None:
        sliced = [x for x in node.inputs if x.id in self.sliced]
        if node.prim == "mpi_allreduce" and node.attrs.get("shard"):
            self.reduce_scatter(node)
        elif not sliced:
            self.rb.copy(node, [self.whole(x) for x in node.inputs])
        elif self.elementwise(node, self.sliced[sliced[0].id][1]):
            pass
        elif node.prim in _SPLIT_REDUCTIONS and node.out.ndim == 0 and len(node.inputs) == 1:
            self.split_reduction(node)
        else:
            self.rb.copy(node, [self.whole(x) for x in node.inputs])

    def reduce_scatter(self, node) -> None:
        x = self.rb.get(node.inputs[0])
        lay = ShardLayout(tuple(x.shape), self.n, self.rank)
        flat = rnp.reshape(x, (lay.size,))
        if lay.n * lay.chunk != lay.size:
            flat = rnp.concatenate([flat, rnp.zeros((lay.n * lay.chunk - lay.size,), x.dtype)])
        part = self.exchange("mpi_reduce_scatter", flat, op=node.attrs["op"])
        self.sliced[node.out.id] = (part, lay)

    def elementwise(self, node, lay: ShardLayout) -> bool:
        if REGISTRY[node.prim].kind != ELEMENTWISE or node.out.shape != lay.shape or any(
                x.id in self.sliced and self.sliced[x.id][1] != lay for x in node.inputs):
            return False
        args = [self.part(x, lay) for x in node.inputs]
        self.sliced[node.out.id] = (bind(node.prim, *args, **node.attrs), lay)
        return True

    def split_reduction(self, node) -> None:
        part, lay = self.sliced[node.inputs[0].id]
        op = _SPLIT_REDUCTIONS[node.prim]
        if lay.valid < lay.chunk:  # the padding counts as the reduction's identity
            mask = rnp.asarray(np.arange(lay.chunk) < lay.valid)
            part = rnp.where(mask, part, rnp.asarray(_identity(op, part.dtype)))
        local = bind(node.prim, part, **dict(node.attrs, axes=(0,)))
        # (``exact``: bucketing never compresses it — a norm's partial sums in float16 could
        # overflow, and the unsharded step computes the norm from the whole gradient)
        self.rb.subst[node.out.id] = self.exchange("mpi_allreduce", local, op=op, exact=True)

    def run(self, layouts: dict) -> Graph:
        rb, graph = self.rb, self.graph
        for i, x in enumerate(graph.inputs):  # sharded state comes in as this process's slice
            lay = layouts.get(x.id)
            if lay is not None:
                new = Array(type(x.aval)((lay.chunk,), x.dtype), trace=rb.trace)
                rb.trace.inputs[i] = new
                del rb.subst[x.id]
                self.sliced[x.id] = (new, lay)
        meta = graph.meta
        n_res = meta.num_results * meta.replicas
        with rb:
            for node in graph.nodes:
                start = len(rb.trace.nodes)
                self.node(node)
                for new in rb.trace.nodes[start:]:  # errors name the user's line
                    new.where = node.where
                    if new.placed is None:  # (``whole`` placed its gathers already)
                        new.placed = node.placed
            outputs, kept = [], {}  # (the k replicas' one update: one value, as before)
            for j, x in enumerate(graph.outputs):
                var = meta.updated[(j - n_res) // meta.replicas] if j >= n_res else None
                lay = getattr(var, "shard", None)
                if lay is None:
                    outputs.append(self.whole(x))
                    continue
                if (x.id, lay) not in kept:
                    start = len(rb.trace.nodes)
                    kept[x.id, lay] = self.padded(self.part(x, lay), lay)
                    for new in rb.trace.nodes[start:]:  # (where the update is made)
                        new.where, new.placed = x.node and x.node.where, x.node and x.node.placed
                outputs.append(kept[x.id, lay])
        return rb.finish(outputs)


def sharded_layouts(graph: Graph) -> dict:
    """{graph input id: layout} of the sharded Variables the step reads."""
    variables = graph.meta.variables
    first = len(graph.inputs) - len(variables)
    return {graph.inputs[first + i].id: var.shard for i, var in enumerate(variables)
            if getattr(var, "shard", None) is not None}


def shard_state(graph: Graph, n: int, rank: int, device: int = 0, devices: int = 1,
                comm=None) -> Graph:
    """The sharded step of ``graph`` on process ``rank`` of ``n`` (see the module docstring);
    ``graph`` itself when it neither reads sharded state nor reduces sharded gradients. With
    model parallelism (``devices`` > 1) ``graph`` is the whole replica's step, every node
    placed, and ``n``/``rank``/``comm`` are this process's device group: each logical device's
    state is sharded over the processes that hold that device (``split_devices`` keeps this
    device's part afterwards)."""
    layouts = sharded_layouts(graph)
    marked = any(node.prim == "mpi_allreduce" and node.attrs.get("shard")
                 for node in graph.nodes)
    if not layouts and not marked:
        return graph
    variables = [v for v in graph.meta.variables if getattr(v, "shard", None) is not None]
    group = f" of logical device {device}'s data-parallel group" if devices > 1 else ""
    for var in variables:
        if (var.shard.n, var.shard.rank) != (n, rank):
            raise ReplicateError(
                f"Variable {var.name!r} holds process {var.shard.rank}'s slice of {var.shard.n} "
                f"(wrap_optimizer(shard=True) cut it for the processes running then); this step "
                f"runs as process {rank} of {n}{group}. A Replicator reshards the optimiser "
                "state for its processes when it is constructed: construct it after "
                "wrap_optimizer, on the processes the state was cut for (a checkpoint restores "
                "into any number: it holds the whole state)")
    return _Sharder(graph, n, rank, comm).run(layouts)


__all__ = ["ShardLayout", "shard_state", "sharded_layouts"]
