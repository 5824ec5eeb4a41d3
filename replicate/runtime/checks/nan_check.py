"""``Replicator(check_finite=True)``: stop at the first step that produces NaN or Inf.

After each step, before its variable updates are written, the outputs (already reduced over
every replica) and the variables' new values are checked; each rank's verdict on its updates
travels with the outputs (one exchange, no extra message), so every rank raises the same
``NonFiniteError`` and no rank writes the update: the variables keep their last finite values,
and no callback — no checkpoint — sees the broken step. In graph mode the step is then run
again node by node with the NumPy reference implementations on the same inputs, and the error
names the first node whose value is not finite although its inputs are — its op and the user's
source line.
"""

from __future__ import annotations

import contextlib

import numpy as np

from ... import tree
from ...backends.base import device_of
from ...dtypes import is_float, is_low_precision
from ...errors import NonFiniteError, source_line
from ...graph.interpret import eval_graph
from ...graph.primitives import REGISTRY
from ...graph.reference import IMPL
from .entry import leaf_paths


def _bad(value) -> str | None:
    device = device_of(value)
    if device is not None:  # a device step's update: checked there, copied down only if bad
        if device.finite(value):
            return None
        value = device.to_host(value)
    a = np.asarray(value)
    if not is_float(a.dtype) or a.size == 0:
        return None
    finite = np.isfinite(a.astype(np.float32) if is_low_precision(a.dtype) else a)
    if finite.all():
        return None
    kinds = [name for name, hit in (("nan", np.isnan(a).any()), ("inf", np.isinf(a).any()))
             if hit]
    return f"{'/'.join(kinds)} in {int(a.size - finite.sum())} of {a.size} value(s)"


def non_finite_outputs(outputs) -> list[str]:
    leaves, treedef = tree.flatten(outputs)
    return [f"output{path}: {problem}" for leaf, path in zip(leaves, leaf_paths(treedef))
            if (problem := _bad(leaf))]


class WriteJournal:
    """Eager mode: the values a step overwrote (``Variable``'s write hook calls ``remember``),
    so a step found non-finite can be taken back whole."""

    def __init__(self):
        self.old: dict[int, tuple] = {}

    def clear(self) -> None:
        self.old.clear()

    def remember(self, var) -> None:
        self.old.setdefault(id(var), (var, var.value))

    def updates(self) -> list:
        """``(variable, new value)`` of every variable written since ``clear``."""
        return [(var, var.value) for var, _ in self.old.values()]

    @contextlib.contextmanager
    def undo_on_error(self):
        try:
            yield
        except BaseException:
            for var, old in self.old.values():
                var.load(old)
            self.old.clear()
            raise


def non_finite_updates(updates) -> list[str]:
    """``updates``: ``(variable, new value)`` pairs; a line per variable that is not finite."""
    return [f"variable {var.name!r} (this step's update, not written): {problem}"
            for var, value in updates if (problem := _bad(value))]


def first_non_finite_node(graph, inputs):
    """Run ``graph`` node by node with the NumPy reference on ``inputs``; return a description
    of the first place a non-finite value appears (an input, or a node with finite operands).

    The whole graph runs even after a find: its cross-process collectives must run on every
    rank alike (every rank re-runs its step together)."""
    found = None
    inputs = [d.to_host(x) if (d := device_of(x)) is not None else x for x in inputs]
    names = graph.meta.get("input_names") or [f"input {i}" for i in range(len(graph.inputs))]
    for x, value, name in zip(graph.inputs, inputs, names):
        problem = _bad(value)
        if problem and found is None:
            found = f"graph input {name!r} ({x.aval}) already holds {problem}"

    def run(node, args):
        with np.errstate(all="ignore"):  # the values are checked below
            value = np.asarray(IMPL[node.prim](*args, **node.attrs))
        return value if value.dtype == node.out.aval.dtype else value.astype(node.out.aval.dtype)

    def look(node, value):
        nonlocal found
        problem = None if found is not None else _bad(value)
        if problem:
            where = source_line(node.where) if node.where else "?"
            operands = ", ".join(str(i.aval) for i in node.inputs)
            found = f"{node.prim}({operands}) -> {node.out.aval} at {where}: {problem}"
            found += (", received from another rank" if REGISTRY[node.prim].exchange else
                      ", from finite operands")

    eval_graph(graph, inputs, run, look)
    return found


def check(outputs, step, updates=(), flags=None, *, rank=0, world_rank=None,
          last_step=None) -> None:
    """Raise ``NonFiniteError`` (on every rank alike) if the reduced outputs, or any rank's
    variable updates, are not finite. ``updates``: this rank's findings
    (``non_finite_updates``); ``flags``: per process of the outputs' communicator, whether it
    found any (``world_rank``: such a process's world rank, with model parallelism);
    ``last_step``: graph mode, ``(graph, inputs)`` of the step, re-run to name the first op."""
    bad = non_finite_outputs(outputs) + list(updates)
    rank_of = world_rank or (lambda r: r)
    ranks = [] if flags is None else [rank_of(r) for r, f in enumerate(flags)
                                      if f and rank_of(r) != rank]
    if not bad and not ranks:
        return
    lines = [f"step {step}: non-finite values (check_finite=True); the variables keep their "
             "values from before this step:"]
    lines += [f"  {b}" for b in bad]
    if ranks:
        lines.append(f"  rank(s) {ranks} found non-finite values in their variable updates")
    if last_step is not None:
        graph, inputs = last_step
        found = first_non_finite_node(graph, inputs)
        lines.append(f"  first non-finite value (rank {rank}, NumPy reference re-run): "
                     + (found or "none on this rank: it comes from another rank's replicas"))
    else:
        lines.append("  (graph mode also names the first op that produced it)")
    error = NonFiniteError("\n".join(lines))
    error.consistent = True  # the outputs are the same on every rank: every rank raises this
    raise error
