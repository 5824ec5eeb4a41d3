"""Deterministic scatter-add for the CuPy backend: the gradient of every gather (``x[idx]``,
an embedding lookup) is the same bits run to run, and NumPy's bits.

CuPy's ``cupyx.scatter_add`` (like ``ndarray.at``-style adds in any GPU library) uses atomic
adds: where indices repeat, their order — and so the rounding of the float sum — depends on
thread scheduling. Here instead:

1. each update's flat position in the output is computed (one gather per axis, from a
   zero-stride view of ``arange``: no array of the output's size);
2. the positions are sorted stably (``cupy.argsort`` is stable), so the updates of one output
   element sit together, in the order they came;
3. one thread per distinct position adds its run in that order, from 0 (``segment_sum``):
   ``((0 + g1) + g2) + ...``, as ``np.add.at`` does; the sums are written with a plain
   assignment (positions are distinct now).

Cost: a sort of the updates' positions and one pass over them; a position repeated n times is
n sequential adds by one thread.
"""

from __future__ import annotations

import math

import numpy as np

from .cuda_codegen import KernelSpec, ctype, dtype_name
from .cuda_launches import LAUNCHES


def segment_sum(dtype) -> tuple:
    """(in_params, out_params, operation, name) of the ``cupy.ElementwiseKernel`` that sums
    each segment ``vals[start:stop]`` in order, from 0, one thread per segment."""
    t = ctype(dtype)
    return (f"int64 start, int64 stop, raw {dtype_name(dtype)} vals",
            f"{dtype_name(dtype)} total",
            f"{t} acc = 0;\nfor (long long k = start; k < stop; ++k) acc += vals[k];\n"
            "total = acc;", "replicate_segment_sum")


def flat_positions(cp, shape, index):
    """The flat (C-order) position in an array of ``shape`` of each element ``x[index]``
    selects, shaped as ``x[index]``."""
    pos, stride = None, 1
    for axis in reversed(range(len(shape))):
        along = [1] * len(shape)
        along[axis] = shape[axis]
        grid = cp.broadcast_to(cp.arange(shape[axis], dtype=cp.int64).reshape(along), shape)
        term = grid[index] * stride if stride != 1 else grid[index]
        pos = term if pos is None else pos + term
        stride *= shape[axis]
    return pos


class ScatterAdd:
    """``scatter_add(g, index, shape)``: zeros of ``shape`` with ``g`` added at ``index``, each
    element's updates summed in their order (NumPy's ``np.add.at``), the same bits every run."""

    def __init__(self, cp):
        self.cp, self.kernels = cp, {}

    def kernel(self, dtype):
        """(the segment sum's ``KernelSpec``, its ``cupy.ElementwiseKernel``) for ``dtype``."""
        k = self.kernels.get(np.dtype(dtype))
        if k is None:
            in_params, out_params, operation, name = segment_sum(dtype)
            spec = KernelSpec("elementwise", name, in_params, out_params, operation=operation)
            k = self.kernels[np.dtype(dtype)] = (spec, self.cp.ElementwiseKernel(
                in_params, out_params, operation, name))
        return k

    def __call__(self, g, index, shape):
        cp = self.cp
        out = cp.zeros(shape, g.dtype)
        pos = flat_positions(cp, tuple(shape), index)
        if math.prod(shape) == 0 or pos is None or pos.size == 0:
            return out  # nothing to add (an index array indexes at least one axis)
        vals = cp.broadcast_to(g, pos.shape).reshape(-1)
        pos = pos.reshape(-1)
        order = cp.argsort(pos)  # stable: the updates of one element keep their order
        pos, vals = pos[order], cp.ascontiguousarray(vals[order])
        starts = cp.flatnonzero(pos[1:] != pos[:-1]) + 1
        bounds = cp.concatenate([cp.zeros((1,), cp.int64), starts.astype(cp.int64),
                                 cp.full((1,), pos.size, cp.int64)])
        totals = cp.empty((bounds.size - 1,), g.dtype)
        spec, kernel = self.kernel(g.dtype)
        args = (bounds[:-1], bounds[1:], vals, totals)
        LAUNCHES.elementwise(spec, args)
        kernel(*args)
        out.reshape(-1)[pos[bounds[:-1]]] = totals
        return out


__all__ = ["ScatterAdd", "flat_positions", "segment_sum"]
