"""Nests of arrays: flatten to a list of leaves and a hashable structure, and back.

A nest is a dict (keys sorted), list, tuple or named tuple of nests (a named tuple comes back as
its own type: ``rnp.linalg.qr``'s ``QRResult``), or a leaf (anything else).

>>> leaves, treedef = flatten({"b": [1, 2], "a": 3})
>>> leaves
[3, 1, 2]
>>> unflatten(treedef, [30, 10, 20])
{'a': 30, 'b': [10, 20]}
"""

from __future__ import annotations

from typing import Any, Callable

from .errors import ReplicateError

LEAF = "*"


# (module-level recursion: a nested recursive function refers to itself through its closure, a
# reference cycle that would keep every leaf, and an eager step's arrays, alive until the garbage
# collector runs)
def _walk(x, leaves: list):
    if not isinstance(x, (dict, list, tuple)):  # (a leaf, most often)
        if x is None:
            return ("none",)
        leaves.append(x)
        return LEAF
    if isinstance(x, dict):
        keys = sorted(x)
        return ("dict", tuple(keys), tuple(_walk(x[k], leaves) for k in keys))
    if isinstance(x, tuple) and hasattr(x, "_fields"):  # a named tuple: rebuilt as its type
        return ("namedtuple", type(x), tuple(_walk(v, leaves) for v in x))
    return (type(x).__name__, len(x), tuple(_walk(v, leaves) for v in x))


def flatten(nest: Any) -> tuple[list, Any]:
    """Return (leaves, treedef); treedef is hashable and usable as a cache key."""
    leaves: list = []
    return leaves, _walk(nest, leaves)


def _build(t, it):
    if t == LEAF:
        return next(it)
    kind = t[0]
    if kind == "dict":
        return {k: _build(s, it) for k, s in zip(t[1], t[2])}
    if kind == "none":
        return None
    items = [_build(s, it) for s in t[2]]
    if kind == "namedtuple":
        return t[1](*items)
    return items if kind == "list" else tuple(items)


def unflatten(treedef: Any, leaves: list) -> Any:
    """Inverse of :func:`flatten`."""
    return _build(treedef, iter(leaves))


def tree_map(fn: Callable, nest: Any, *rest: Any) -> Any:
    """Apply fn leaf-wise over one or more nests of the same structure."""
    leaves, treedef = flatten(nest)
    others = [flatten(r) for r in rest]
    for _, other_def in others:
        if other_def != treedef:
            raise ReplicateError(f"nests differ in structure: {treedef} vs {other_def}")
    return unflatten(treedef, [fn(*xs) for xs in zip(leaves, *[o[0] for o in others])])
