"""Gradients of the pieces of one array, joined instead of added.

An array read piece by piece (``q, k, v = qkv[0], qkv[1], qkv[2]``, ``rnp.split``) gets one
cotangent per piece; each piece's rule alone is a scatter into an array of zeros the size of the
whole, so the whole's gradient would be k zero-filled arrays and k - 1 additions. When the pieces
are disjoint and cover one axis, the gradient is their concatenation along it: one pass. Any
other set of pieces (overlapping, with gaps, indexed by arrays or on several axes) is scattered
and added in arrival order, as before. The values are the same either way (a sum with zeros is
exact), but for the sign of a zero: ``-0.0`` stays ``-0.0`` in the concatenation.
"""

from __future__ import annotations

from ..numpy import add, concatenate, expand_dims
from .core import bind


class Cotangent:
    """A value's cotangent as it accumulates: dense contributions and basic-index pieces, in
    arrival order."""

    __slots__ = ("parts",)

    def __init__(self):
        self.parts = []  # ("dense", g) or ("piece", index, g)

    def add_dense(self, g):
        self.parts.append(("dense", g))

    def add_piece(self, index, g):
        self.parts.append(("piece", index, g))

    def value(self, shape):
        """The accumulated cotangent of an array of ``shape``."""
        if len(self.parts) == 1 and self.parts[0][0] == "dense":
            return self.parts[0][1]  # (most values: one use)
        pieces = [p for p in self.parts if p[0] == "piece"]
        joined = _join(pieces, shape) if len(pieces) > 1 else None
        total = None
        if joined is not None:
            parts = [p for p in self.parts if p[0] == "dense"] + [("dense", joined)]
        else:
            parts = self.parts
        for part in parts:
            g = part[1] if part[0] == "dense" else bind(
                "scatter_add", part[2], index=part[1], shape=tuple(shape))
            total = g if total is None else add(total, g)
        return total


def _span(index, shape):
    """``(axis, lo, hi, is_int)`` when ``index`` selects ``[lo, hi)`` on one axis and all of the
    others; None otherwise."""
    axis = None
    for i, entry in enumerate(index):
        if i >= len(shape) or entry[0] not in ("int", "slice"):
            return None
        dim = shape[i]
        if entry[0] == "int":
            k = entry[1] + dim if entry[1] < 0 else entry[1]
            span = (i, k, k + 1, True)
        else:
            lo, hi, step = slice(*entry[1:]).indices(dim)
            if (lo, hi, step) == (0, dim, 1):
                continue
            if step != 1 or hi <= lo:
                return None
            span = (i, lo, hi, False)
        if axis is not None:
            return None
        axis = span
    return axis


def _join(pieces, shape):
    """The pieces' concatenation along their axis when they tile it exactly; else None."""
    spans = [_span(p[1], shape) for p in pieces]
    if any(s is None for s in spans) or len({s[0] for s in spans}) != 1:
        return None
    order = sorted(range(len(pieces)), key=lambda j: spans[j][1])
    axis, at = spans[0][0], 0
    for j in order:
        if spans[j][1] != at:
            return None  # a gap or an overlap
        at = spans[j][2]
    if at != shape[axis]:
        return None
    parts = [expand_dims(pieces[j][2], axis) if spans[j][3] else pieces[j][2] for j in order]
    shape = tuple(shape)
    if any(tuple(p.shape[:axis]) != shape[:axis] or tuple(p.shape[axis + 1:]) != shape[axis + 1:]
           for p in parts):
        return None
    return concatenate(parts, axis=axis)
