"""Collectives over all replicas, usable anywhere inside ``step_fn`` on nests of arrays.

Each call works on every leaf of the nest. In graph mode a call records a placeholder (rewritten
once all local replicas are traced); in eager mode it communicates at once. All are differentiable.

>>> import replicate as rp, replicate.numpy as rnp
>>> rp.all_reduce({"g": rnp.ones(2)}, "mean")["g"].tolist()   # one replica: the identity
[1.0, 1.0]
"""

from __future__ import annotations

from . import tree
from .context import current
from .errors import ReplicateError
from .graph import collectives as _prims
from .graph.core import bind, current_trace


def _apply(nest, kind, **attrs):
    from .numpy import as_array

    ctx = current()
    num, rid = (1, 0) if ctx is None else (ctx.num_replicas, ctx.replica_id)
    trace = current_trace()

    def one(leaf):
        x = as_array(leaf)
        seq = trace.next_collective_seq() if trace is not None else 0
        return bind("collective", x, kind=kind, num_replicas=num, replica=rid, seq=seq, **attrs)

    return tree.tree_map(one, nest)


def all_reduce(nest, op: str = "sum"):
    """Combine each leaf over all replicas with ``op`` (sum, mean, max, min); every replica gets
    the result."""
    if op not in _prims.REDUCE_OPS:
        raise ReplicateError(f"all_reduce: unknown op {op!r}; choose one of {_prims.REDUCE_OPS}")
    return _apply(nest, "all_reduce", op=op)


def all_gather(nest, axis: int = 0, tiled: bool = False):
    """Every replica's leaf, in replica order: stacked along a new ``axis``, or concatenated
    along ``axis`` when ``tiled``."""
    return _apply(nest, "all_gather", axis=int(axis), tiled=bool(tiled))


def broadcast(nest, root: int = 0):
    """Replica ``root``'s value, on every replica."""
    return _apply(nest, "broadcast", root=int(root))


def reduce_scatter(nest, op: str = "sum", axis: int = 0):
    """Reduce over replicas, then give replica i the i-th chunk along ``axis``."""
    if op not in _prims.REDUCE_OPS:
        raise ReplicateError(f"reduce_scatter: unknown op {op!r}")
    return _apply(nest, "reduce_scatter", op=op, axis=int(axis))


def permute(nest, shift: int = 1):
    """Replica i sends its value to replica (i + shift) mod R (and receives from i - shift)."""
    return _apply(nest, "permute", shift=int(shift))
