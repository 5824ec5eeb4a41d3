"""The bounds check for backends whose indexing does not check (CuPy wraps an out-of-range
index around; XLA clamps it). An index array that comes from the host — a graph input (labels
``y`` for ``logits[rows, y]``, through reshapes) or a constant — is checked there, before the
call (``HostIndices``); any other on the device (CuPy: a flag per op read at the call's end;
JAX: ``checkify``)."""

from __future__ import annotations

import numpy as np

from .index_bounds import NONNEGATIVE, bounds_message, index_axes, nonnegative
from .interpret import note_failure
from .primitives import REGISTRY


def index_bounds_flag(shape, index, arrays, xp=np):
    """One boolean (a 0-d array of ``xp``): whether any index array holds an index outside its
    axis; None when nothing is indexed by an array. Computed where the arrays are (a device
    backend reads it later, with others: no synchronisation per op)."""
    checks = index_axes(shape, index, arrays)
    if not checks:
        return None
    bad = [xp.any((idx < low) | (idx >= n)) for _, idx, n, low in checks]
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
    bad = [xp.any((idx < low) | (idx >= n)) for _, idx, n, low in checks]
    flags = xp.stack(bad) if len(bad) > 1 else bad[0].reshape(1)
    if not bool(flags.any()):
        return None
    for (ax, idx, n, low), flag in zip(checks,
                                       flags.tolist() if hasattr(flags, "tolist") else flags):
        if flag:
            values = idx.reshape(-1)
            first = values[xp.argmax((values < low) | (values >= n))]
            return bounds_message(int(first), ax, n, low)
    return None


def indexed_shape(node) -> tuple:
    """The shape of the array an indexing node (``getitem``, ``scatter_add``) indexes."""
    return node.inputs[0].shape if node.prim == "getitem" else node.attrs["shape"]


class HostIndices:
    """The indexing ops of a lowered ``graph`` whose every index array comes from the host: a
    graph input (through views and broadcasts: the same values) or a constant. ``plans``: (node,
    [(graph input position or the constant's values, axis, axis size)]); ``check(inputs)``
    checks them against a call's inputs before it runs, with NumPy's message."""

    def __init__(self, graph):
        self.positions = {x.id: i for i, x in enumerate(graph.inputs)}
        self.producer = {n.out.id: n for n in graph.nodes}
        self.plans = []
        for node in graph.nodes:
            if REGISTRY[node.prim].indexes and len(node.inputs) > 1:
                sources = self.plan(node)
                if sources is not None:
                    self.plans.append((node, sources))
        self.nodes = {id(node) for node, _ in self.plans}

    def source(self, x):
        """Where the values of index array ``x`` are on the host: the position of the graph
        input, or a constant's value; None if they are made on the device."""
        while x.id not in self.positions:
            node = self.producer.get(x.id)
            if node is not None and node.prim == "const":
                return np.asarray(node.attrs["value"])
            spec = REGISTRY.get(node.prim) if node is not None else None
            if spec is None or not (spec.alias or spec.repeats):  # (the same values, in order)
                return None
            x = node.inputs[0]
        return self.positions[x.id]

    def plan(self, node):
        """``node``'s index arrays as (source, axis, axis size), or None when one of them is
        made on the device (or nothing is indexed by an array)."""
        checks = index_axes(indexed_shape(node), node.attrs["index"],
                            list(range(len(node.inputs) - 1)))
        sources = [(self.source(node.inputs[1 + j]), ax, n, low) for ax, j, n, low in checks]
        return sources if checks and all(s[0] is not None for s in sources) else None

    def check(self, inputs, to_host=None) -> set:
        """Check every planned op's index arrays among a call's ``inputs``; raises NumPy's
        ``IndexError`` naming the op and the user's line. ``to_host``: how to read an input
        that is not a NumPy array (None: such an op is left to the device). Returns the ids of
        the nodes checked."""
        done = set()
        for node, sources in self.plans:
            values = [s if isinstance(s, np.ndarray) else inputs[s] for s, *_ in sources]
            if not all(isinstance(v, np.ndarray) for v in values):
                if to_host is None:
                    continue  # handed in on the device: checked there
                values = [v if isinstance(v, np.ndarray) else to_host(v) for v in values]
            for v, (_, ax, n, low) in zip(values, sources):
                flat = v.reshape(-1)
                bad = flat[(flat < low) | (flat >= n)]
                if bad.size:
                    raise_index_error(node, bounds_message(int(bad[0]), ax, n, low))
            done.add(id(node))
        return done


def raise_index_error(node, error):
    """Raise ``error`` (an ``IndexError`` or its message) as raised by ``node``."""
    if isinstance(error, str):
        error = IndexError(error)
    note_failure(error, node)  # (no operands: a fused group is named as a whole)
    raise error


__all__ = ["NONNEGATIVE", "HostIndices", "bounds_message", "index_axes", "index_bounds_error",
           "index_bounds_flag", "indexed_shape", "nonnegative", "raise_index_error"]
