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

from ..graph.index_check import (
    HostIndices,
    index_bounds_error,
    index_bounds_flag,
    indexed_shape,
    raise_index_error,
)


class IndexChecks:
    """The checks of one lowered graph: ``wrap`` each indexing op's function, call ``before``
    with a call's inputs and ``after`` at its end."""

    def __init__(self, graph, cupy, device):
        self.cp, self.device = cupy, device
        self.flags: list = []      # this call's (device flag, node, error maker)
        self.on_host: set = set()  # ids of the nodes whose index arrays were checked there
        self.host = HostIndices(graph)

    def wrap(self, fn, node):
        attrs, dtype, shape = node.attrs, node.out.dtype, indexed_shape(node)

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
        self.on_host = self.host.check(inputs)

    def after(self) -> None:
        """Read this call's device flags (one transfer) and raise for the first that is set."""
        if not self.flags:
            return
        cp = self.cp
        hits = self.device.to_host(cp.concatenate([(flag != 0).reshape(-1).any().reshape(1)
                                                   for flag, _, _ in self.flags]))
        for hit, (_, node, error) in zip(hits, self.flags):
            if hit:
                raise_index_error(node, error())


__all__ = ["IndexChecks"]
