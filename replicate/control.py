"""Traced control flow: ``cond`` and ``switch``, with the same meaning in both modes.

Eager mode runs the chosen branch only (a Python ``if``). Graph mode traces every branch and
selects: the results elementwise by the predicate, and so are the branches' writes to
``Variable``s — a write made in a branch is committed only when that branch is taken, and each
branch reads the variables as they were before the choice (not as another branch left them).
So a gradient-accumulation step written with ``rp.cond`` updates its weights every n-th step in
graph mode exactly as in eager mode.

Every branch runs in graph mode, so its collectives run on every step whichever branch is
taken (their results are selected like any value), and its cost is paid on every step. Its
gradient is the taken branch's, as in eager mode: each value a branch reads from outside reaches
it through a ``branch_input`` node whose cotangent is a select by whether the branch is taken —
so the untaken branch's backward pass, run on a cotangent of zeros, cannot leak what it makes of
them (``sqrt`` at 0: 0 * inf, NaN) into the gradient. (Not yet under model parallelism,
``logical_devices > 1``: there the untaken branch's backward pass still adds its zeros, and a
NaN it makes reaches the gradient.)
"""

from __future__ import annotations

import numbers

import numpy as np

from . import tree
from .errors import ReplicateError
from .graph.core import Array, bind, current_trace
from .graph.primitives import is_float
from .numpy import as_array, cast, equal, logical_and, logical_not, logical_or, where


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


def _taken(preds) -> list:
    """Whether each branch is the one taken: ``preds[i]`` and no later one (later branches win;
    branch 0 when none holds)."""
    taken, later = [None] * len(preds), None
    for i in range(len(preds) - 1, 0, -1):
        taken[i] = preds[i] if later is None else logical_and(preds[i], logical_not(later))
        later = preds[i] if later is None else logical_or(later, preds[i])
    taken[0] = logical_not(later) if later is not None else None
    return taken


def _gate(trace, start, end, taken) -> int:
    """Route the float values that the branch's nodes (``trace.nodes[start:end]``) read from
    outside it (made by no node of the branch: earlier values, graph inputs — a variable first
    read in the branch is one) through ``branch_input`` nodes, placed before the branch's first
    node: the branch's gradient reaches them only where it is taken. Returns how many nodes
    it placed there."""
    if taken is None or trace.placement is not None:  # (one branch: always taken. Model
        return 0  # parallelism: not gated — a gate would need each reader's device and transfers)
    body, gates, n = trace.nodes[start:end], {}, len(trace.nodes)
    made = {node.out.id for node in body}
    for node in body:
        for x in node.inputs:
            if x.id not in made and x.id not in gates and is_float(x.dtype):
                gates[x.id] = bind("branch_input", x, taken)
    moved = trace.nodes[n:]  # the gates just recorded: moved before the branch
    del trace.nodes[n:]
    trace.nodes[start:start] = moved
    for node in body:
        node.inputs = tuple(gates.get(x.id, x) for x in node.inputs)
    return len(moved)


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
    taken = _taken(preds)
    before = trace.branch_state()
    outs, states, spans = [], [], []
    for fn in branches:
        trace.set_branch_state(before)
        start = len(trace.nodes)
        outs.append(fn(*operands))
        states.append(trace.branch_state())
        spans.append((start, len(trace.nodes)))
    shift = 0  # (the gates placed before a branch move the later branches along)
    for (start, end), mask in zip(spans, taken):
        shift += _gate(trace, start + shift, end + shift, mask)
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
