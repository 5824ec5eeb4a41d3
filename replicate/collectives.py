"""Collectives over all replicas, usable anywhere inside ``step_fn`` on nests of arrays.

Each call works on every leaf of the nest. In graph mode a call records a placeholder (rewritten
once all local replicas are traced); in eager mode it communicates at once. All are differentiable.

>>> import replicate as rp, replicate.numpy as rnp
>>> rp.all_reduce({"g": rnp.ones(2)}, "mean")["g"].tolist()   # one replica: the identity
[1.0, 1.0]
"""

from __future__ import annotations

import numpy as np

from . import tree
from .context import current
from .errors import ReplicateError
from .graph.collectives import REDUCE_OPS, bind_collective
from .numpy import as_array, cast


def _apply(nest, kind, **attrs):
    ctx = current()
    num, rid = (1, 0) if ctx is None else (ctx.num_replicas, ctx.replica_id)
    return tree.tree_map(
        lambda leaf: bind_collective(kind, _counted(as_array(leaf), attrs.get("op")),
                                     num_replicas=num, replica=rid, **attrs), nest)


def _counted(x, op):
    """A sum of bools counts them, in int64 (NumPy's ``sum``), rather than or-ing them."""
    return cast(x, np.int64) if op == "sum" and x.dtype == np.bool_ else x


def all_reduce(nest, op: str = "sum"):
    """Combine each leaf over all replicas with ``op`` (sum, mean, max, min); every replica gets
    the result. A ``"sum"`` of bools counts them (int64, as NumPy's ``sum``); integers keep
    their dtype (an elementwise sum, as ``torch.distributed``'s); ``"mean"`` needs floats."""
    if op not in REDUCE_OPS:
        raise ReplicateError(f"all_reduce: unknown op {op!r}; choose one of {REDUCE_OPS}")
    return _apply(nest, "all_reduce", op=op)


def gradient_mean(nest, shard: bool = False):
    """``all_reduce(nest, "mean")`` of gradients (``wrap_optimizer``); ``shard``: marked for
    the sharded-state rewrite (``graph/passes/shard_state.py``: a reduce-scatter)."""
    return _apply(nest, "all_reduce", op="mean", **({"shard": True} if shard else {}))


def all_gather(nest, axis: int = 0, tiled: bool = False):
    """Every replica's leaf, in replica order: stacked along a new ``axis``, or concatenated
    along ``axis`` when ``tiled``."""
    return _apply(nest, "all_gather", axis=int(axis), tiled=bool(tiled))


def broadcast(nest, root: int = 0):
    """Replica ``root``'s value, on every replica."""
    return _apply(nest, "broadcast", root=int(root))


def reduce_scatter(nest, op: str = "sum", axis: int = 0):
    """Reduce over replicas, then give replica i the i-th chunk along ``axis``."""
    if op not in REDUCE_OPS:
        raise ReplicateError(f"reduce_scatter: unknown op {op!r}")
    return _apply(nest, "reduce_scatter", op=op, axis=int(axis))


def permute(nest, shift: int = 1):
    """Replica i sends its value to replica (i + shift) mod R (and receives from i - shift)."""
    return _apply(nest, "permute", shift=int(shift))


__all__ = ["all_gather", "all_reduce", "broadcast", "permute", "reduce_scatter"]  # (rp.*)
