"""Which indices an indexing op's index arrays may hold, and NumPy's message for one that is
outside: the part of the bounds check every backend shares (no imports of the graph: the
reference rules use it). The checks themselves: ``index_check.py``."""

from __future__ import annotations

import numpy as np

# The mark of an index array entry (``("array", k, NONNEGATIVE)``) whose negative indices are
# an error instead of counting from the end: the gathers of class labels and embedding ids
# (PyTorch's gathers raise there; a label of -1 picking the last class is a silent wrong loss)
NONNEGATIVE = "nonnegative"


def index_axes(shape, index, arrays) -> list:
    """(axis, index array, axis size, lowest index allowed) of each index array of ``index``
    that meets an axis: ``-size``, or 0 for an array marked ``NONNEGATIVE``."""
    consumed = sum(entry[0] in ("int", "slice", "array") for entry in index)
    axes, axis = [], 0
    for entry in index:
        if entry[0] == "ellipsis":
            axis += max(0, len(shape) - consumed)  # (too many indices: the shape rule says)
        elif entry[0] == "array":
            axes.append((axis, arrays[entry[1]], NONNEGATIVE in entry[2:]))
            axis += 1
        elif entry[0] in ("int", "slice"):
            axis += 1
    return [(ax, idx, shape[ax], 0 if nonneg else -shape[ax])
            for ax, idx, nonneg in axes if ax < len(shape)]


def nonnegative(index) -> bool:
    """Whether an index spec has an index array whose negative indices are an error."""
    return any(entry[0] == "array" and NONNEGATIVE in entry[2:] for entry in index)


def bounds_message(value, axis, n, low) -> str:
    """NumPy's message for index ``value`` outside ``[low, n)`` on ``axis`` of size ``n``."""
    message = f"index {value} is out of bounds for axis {axis} with size {n}"
    if low == 0 and -n <= value < 0:
        message += (" (class labels and embedding ids count from 0: a negative one is an "
                    "error, as in PyTorch, not an index from the end)")
    return message


def first_out_of_bounds(shape, index, arrays):
    """(value, axis, size, lowest) of the first index outside its axis among concrete NumPy
    ``arrays``, or None when all are inside (a NumPy gather raises for the rest itself, but
    not for a negative index of a ``NONNEGATIVE`` array)."""
    for ax, idx, n, low in index_axes(shape, index, arrays):
        flat = np.asarray(idx).reshape(-1)
        bad = flat[(flat < low) | (flat >= n)]
        if bad.size:
            return int(bad[0]), ax, n, low
    return None


def check_nonnegative(shape, index, arrays) -> None:
    """Raise ``IndexError`` for a negative index of an array marked ``NONNEGATIVE`` (NumPy's
    own indexing checks the rest); nothing to do for an index without such an array."""
    if nonnegative(index):
        bad = first_out_of_bounds(shape, index, arrays)
        if bad is not None:
            raise IndexError(bounds_message(*bad))


__all__ = ["NONNEGATIVE", "bounds_message", "check_nonnegative", "first_out_of_bounds",
           "index_axes", "nonnegative"]
