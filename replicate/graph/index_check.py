"""The bounds check for backends whose indexing does not check (CuPy wraps an out-of-range
index around; XLA clamps it — the JAX backend uses ``checkify`` instead)."""

from __future__ import annotations

import numpy as np


def index_axes(shape, index, arrays) -> list:
    """(axis, index array, axis size) of each index array of ``index`` that meets an axis."""
    consumed = sum(entry[0] in ("int", "slice", "array") for entry in index)
    axes, axis = [], 0
    for entry in index:
        if entry[0] == "ellipsis":
            axis += len(shape) - consumed
        elif entry[0] == "array":
            axes.append((axis, arrays[entry[1]]))
            axis += 1
        elif entry[0] in ("int", "slice"):
            axis += 1
    return [(ax, idx, shape[ax]) for ax, idx in axes if ax < len(shape)]


def index_bounds_flag(shape, index, arrays, xp=np):
    """One boolean (a 0-d array of ``xp``): whether any index array holds an index outside its
    axis; None when nothing is indexed by an array. Computed where the arrays are (a device
    backend reads it later, with others: no synchronisation per op)."""
    checks = index_axes(shape, index, arrays)
    if not checks:
        return None
    bad = [xp.any((idx < -n) | (idx >= n)) for _, idx, n in checks]
    return xp.stack(bad).any() if len(bad) > 1 else bad[0]


def index_bounds_error(shape, index, arrays, xp=np) -> str | None:
    """NumPy's message for the first index array holding an index outside its axis of an array
    of ``shape`` indexed by ``index`` (``index_tuple``'s spec), or None when all are inside.

    For backends whose indexing does not check (CuPy wraps an out-of-range index around, XLA
    clamps it): one reduction over the index arrays, read once on the host.

    >>> index_bounds_error((10, 4), (("array", 0),), [np.array([1, 12])])
    'index 12 is out of bounds for axis 0 with size 10'
    >>> index_bounds_error((10, 4), (("slice", None, None, None), ("array", 0)), [np.array([-4])])
    """
    checks = index_axes(shape, index, arrays)
    if not checks:
        return None
    bad = [xp.any((idx < -n) | (idx >= n)) for _, idx, n in checks]
    flags = xp.stack(bad) if len(bad) > 1 else bad[0].reshape(1)
    if not bool(flags.any()):
        return None
    for (ax, idx, n), flag in zip(checks, flags.tolist() if hasattr(flags, "tolist") else flags):
        if flag:
            values = idx.reshape(-1)
            first = values[xp.argmax((values < -n) | (values >= n))]
            return f"index {int(first)} is out of bounds for axis {ax} with size {n}"
    return None


__all__ = ["index_axes", "index_bounds_error", "index_bounds_flag"]
