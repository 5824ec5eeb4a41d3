"""Bounds checks for the CuPy backend's indexing: CuPy wraps an out-of-range index around where
NumPy raises ``IndexError``, so every index array is checked — without a synchronisation per op:

* an index array that is a batch leaf handed in from the host (labels ``y`` for
  ``logits[rows, y]``, through reshapes) or a constant (``rows``) is checked there, before the
  call: nothing extra crosses;
* any other (computed on the device, or handed in as a device array) gets one flag computed on
  the device; the flags of a call are read together at its end (one byte each), before the
  call returns — so before any variable is written.

Either way the error is NumPy's message, raised by the op and the user's line that indexed.

The same end-of-call read carries the other values NumPy raises on and a kernel cannot: an
integer raised to a negative integer power (``add``: the error flag a generated kernel writes,
``cuda_ops.py``, or the unfused ``pow``'s own check).
"""

from __future__ import annotations

import numpy as np

from ..graph.index_check import index_axes, index_bounds_error, index_bounds_flag
from ..graph.interpret import note_failure
from ..graph.primitives import REGISTRY


def _shape(node):
    return node.inputs[0].shape if node.prim == "getitem" else node.attrs["shape"]


class IndexChecks:
    """The checks of one lowered graph: ``wrap`` each indexing op's function, call ``before``
    with a call's inputs and ``after`` at its end."""

    def __init__(self, graph, cupy, device):
        self.cp, self.device = cupy, device
        self.flags: list = []      # this call's (device flag, node, error maker)
        self.on_host: set = set()  # ids of the nodes whose index arrays were checked there
        self.plans: list = []      # (node, [(graph input position, axis, axis size)])
        producer = {n.out.id: n for n in graph.nodes}
        self.positions = {x.id: i for i, x in enumerate(graph.inputs)}
        self.producer = producer

    def _source(self, x):
        """Where the values of index array ``x`` are on the host (through views): the position
        of the graph input, or a constant's value; None if they are only on the device."""
        while x.id not in self.positions:
            node = self.producer.get(x.id)
            if node is not None and node.prim == "const":
                return np.asarray(node.attrs["value"])
            spec = REGISTRY.get(node.prim) if node is not None else None
            if spec is None or not (spec.alias or spec.repeats):  # (the same values, in order)
                return None
            x = node.inputs[0]
        return self.positions[x.id]

    def wrap(self, fn, node):
        attrs, dtype, shape = node.attrs, node.out.dtype, _shape(node)
        checks = index_axes(shape, attrs["index"], list(range(len(node.inputs) - 1)))
        sources = [(self._source(node.inputs[1 + j]), ax, n) for ax, j, n in checks]
        if checks and all(s is not None for s, _, _ in sources):
            self.plans.append((node, sources))

        def run(x, *idx):
            if id(node) not in self.on_host:
                flag = index_bounds_flag(shape, attrs["index"], idx, self.cp)
                if flag is not None:
                    self.add(flag, node, lambda: IndexError(index_bounds_error(
                        shape, attrs["index"], [self.device.to_host(i) for i in idx])))
            value = self.cp.asarray(fn(x, *idx, **attrs))
            return value if value.dtype == dtype else value.astype(dtype)
        return run

    def add(self, flag, node, error) -> None:
        """Raise ``error()`` (from ``node``, at the call's end) if device value ``flag`` (any
        shape: any nonzero element) is set."""
        self.flags.append((flag, node, error))

    def before(self, inputs) -> None:
        """Check the index arrays that are host inputs of this call (raises IndexError)."""
        self.flags.clear()
        self.on_host.clear()
        for node, sources in self.plans:
            values = [s if isinstance(s, np.ndarray) else inputs[s] for s, _, _ in sources]
            if not all(isinstance(v, np.ndarray) for v in values):
                continue  # handed in on the device: checked there
            for v, (_, ax, n) in zip(values, sources):
                flat = v.reshape(-1)
                bad = flat[(flat < -n) | (flat >= n)]
                if bad.size:
                    _raise(node, f"index {int(bad[0])} is out of bounds for axis {ax} with "
                                 f"size {n}")
            self.on_host.add(id(node))

    def after(self) -> None:
        """Read this call's device flags (one transfer) and raise for the first that is set."""
        if not self.flags:
            return
        cp = self.cp
        hits = self.device.to_host(cp.concatenate([(flag != 0).reshape(-1).any().reshape(1)
                                                   for flag, _, _ in self.flags]))
        for hit, (_, node, error) in zip(hits, self.flags):
            if hit:
                _raise(node, error())


def _raise(node, error):
    if isinstance(error, str):
        error = IndexError(error)
    note_failure(error, node)  # (no operands: a fused group is named as a whole)
    raise error


__all__ = ["IndexChecks"]
