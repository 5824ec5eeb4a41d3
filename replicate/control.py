"""Traced control flow: ``cond`` and ``switch``, with the same meaning in both modes.

Eager mode runs the chosen branch only (a Python ``if``). Graph mode traces every branch and
selects: the results elementwise by the predicate, and so are the branches' writes to
``Variable``s — a write made in a branch is committed only when that branch is taken, and each
branch reads the variables as they were before the choice (not as another branch left them).
So a gradient-accumulation step written with ``rp.cond`` updates its weights every n-th step in
graph mode exactly as in eager mode.

Every branch runs in graph mode, so its collectives run on every step whichever branch is
taken (their results are selected like any value), and its cost is paid on every step.
"""

from __future__ import annotations

import numbers

import numpy as np

from . import tree
from .errors import ReplicateError
from .graph.core import Array, current_trace
from .numpy import as_array, cast, equal, where


def cond(pred, true_fn, false_fn, *operands):
    """``true_fn(*operands)`` if ``pred`` else ``false_fn(*operands)``, in both modes.

    ``pred`` is a scalar (a bool or number array, or a Python value). Both branches must return
    nests of the same structure, shapes and dtypes. Variable writes inside the branches take
    effect only for the branch taken (see the module docstring).

    >>> import replicate as rp, replicate.numpy as rnp
    >>> float(rp.cond(rnp.asarray(2.0) > 1, lambda x: x * 10, lambda x: x, rnp.asarray(2.0)))
    20.0
    """
    pred = _scalar(pred, "cond", "predicate")
    if not pred.symbolic:
        return true_fn(*operands) if bool(pred.numpy()) else false_fn(*operands)
    if pred.dtype != np.bool_:
        pred = pred != 0
    return _traced([false_fn, true_fn], [None, pred], operands, "cond")


def switch(index, branches, *operands):
    """``branches[index](*operands)`` in both modes (``index`` clamped to the valid range, as
    ``jax.lax.switch`` does). Variable writes take effect only for the branch taken.

    >>> import replicate as rp, replicate.numpy as rnp
    >>> fns = [lambda x: x, lambda x: x * 2, lambda x: x * 3]
    >>> float(rp.switch(rnp.asarray(2), fns, rnp.asarray(1.0)))
    3.0
    """
    branches = list(branches)
    if not branches or not all(callable(b) for b in branches):
        raise ReplicateError("switch: branches must be a non-empty list of callables")
    index = _scalar(index, "switch", "index")
    if index.dtype.kind not in "iub":
        raise ReplicateError(f"switch: the index must be an integer, got {index.dtype}")
    if not index.symbolic:
        i = int(np.clip(int(index.numpy()), 0, len(branches) - 1))
        return branches[i](*operands)
    index = cast(index, np.int64)
    preds = [None] + [equal(index, i) for i in range(1, len(branches))]
    if len(branches) > 1:  # out of range: clamp (below 0 falls through to branch 0)
        preds[-1] = index >= len(branches) - 1
    return _traced(branches, preds, operands, "switch")


def _scalar(x, what, name) -> Array:
    if isinstance(x, (bool, numbers.Number, np.generic)) and not isinstance(x, Array):
        x = as_array(x)
    x = as_array(x)
    if x.shape != ():
        raise ReplicateError(f"{what}: the {name} must be a scalar, got shape {x.shape} (reduce "
                             "it first, e.g. with rnp.all/rnp.any, or select elementwise with "
                             "rnp.where)")
    return x


def _traced(branches, preds, operands, what):
    """Trace every branch from the same variable state; select results and writes.

    ``preds[i]`` (``i >= 1``) is branch i's condition; branch 0 is the default. Later branches
    win where several conditions hold."""
    trace = current_trace()
    before = trace.branch_state()
    outs, states = [], []
    for fn in branches:
        trace.set_branch_state(before)
        outs.append(fn(*operands))
        states.append(trace.branch_state())
    try:
        structures = {tree.flatten(o)[1] for o in outs}
    except ReplicateError:
        structures = set()
    if len(structures) > 1:
        raise ReplicateError(f"{what}: the branches return differently structured values: "
                             + "; ".join(repr(tree.flatten(o)[1]) for o in outs))

    def select(*values):
        values = [as_array(v) for v in values]
        if len({(v.shape, v.dtype) for v in values}) > 1:
            raise ReplicateError(f"{what}: the branches return different shapes or dtypes: "
                                 + ", ".join(f"{v.dtype}{list(v.shape)}" for v in values))
        out = values[0]
        for p, v in zip(preds[1:], values[1:]):
            out = out if v is out else where(p, v, out)
        return out

    written = {vid for s in states for vid, (value, _) in s.items()
               if vid not in before or before[vid][0] is not value}
    merged = dict(before)
    trace.set_branch_state(before)
    for vid in written:
        base = before[vid][0] if vid in before else trace.variable_value(vid)
        values = [s[vid][0] if vid in s else base for s in states]
        where_ = next((s[vid][1] for s in reversed(states) if vid in s and s[vid][0] is not base),
                      None)
        merged[vid] = (trace.lift(select(*values)), where_)
    trace.set_branch_state(merged)
    return tree.tree_map(select, *outs)


__all__ = ["Array", "cond", "switch"]
