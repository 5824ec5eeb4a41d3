"""Traced control flow."""

from __future__ import annotations

from . import tree
from .graph.core import Array
from .numpy import as_array, where


def cond(pred, true_fn, false_fn, *operands):
    """``true_fn(*operands)`` if ``pred`` else ``false_fn(*operands)``, in both modes.

    Eager mode runs one branch (a Python ``if``). Graph mode traces both branches and selects
    elementwise, so both must return nests of the same structure and shapes.

    >>> import replicate as rp, replicate.numpy as rnp
    >>> float(rp.cond(rnp.asarray(2.0) > 1, lambda x: x * 10, lambda x: x, rnp.asarray(2.0)))
    20.0
    """
    pred = as_array(pred)
    if not pred.symbolic:
        return true_fn(*operands) if bool(pred) else false_fn(*operands)
    a, b = true_fn(*operands), false_fn(*operands)
    return tree.tree_map(lambda x, y: where(pred, x, y), a, b)


__all__ = ["cond", "Array"]
