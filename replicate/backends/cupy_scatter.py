"""Deterministic scatter-add for the CuPy backend: the gradient of every gather (``x[idx]``,
an embedding lookup) is the same bits run to run, and NumPy's bits.

CuPy's ``cupyx.scatter_add`` (like ``ndarray.at``-style adds in any GPU library) uses atomic
adds: where indices repeat, their order — and so the rounding of the float sum — depends on
thread scheduling. Here instead:

1. each update's flat position in the output is computed (one gather per axis, from a
   zero-stride view of ``arange``: no array of the output's size);
2. the positions are sorted stably (``cupy.argsort`` is stable), so the updates of one output
   element sit together, in the order they came;
3. one kernel over the sorted updates (``segment_sum``): the thread of each run's first update
   adds the run in that order, from 0 — ``((0 + g1) + g2) + ...``, as ``np.add.at`` does — and
   writes the sum with a plain assignment (positions are distinct now); the others return.

Nothing is read back to the host (finding the runs with ``nonzero`` cost a synchronisation per
step, a quarter of an MLP step's host time on an H200). Cost: a sort of the updates' positions
and one pass over them; a position repeated n times is n sequential adds by one thread.
"""

from __future__ import annotations

import math

import numpy as np

from .cuda_codegen import KernelSpec, ctype, dtype_name
from .cuda_launches import LAUNCHES


def segment_sum(dtype) -> tuple:
    """(in_params, out_params, operation, name) of the ``cupy.ElementwiseKernel`` that sums each
    run of equal sorted positions ``pos`` of ``vals`` in order, from 0, into ``out[pos]``: one
    thread per update, the first of each run doing the adds (``p`` is ``pos`` again, not raw:
    it sets the kernel's size; a block, not a ``return``, since CuPy's grid-stride loop gives a
    thread several updates)."""
    t = ctype(dtype)
    return (f"int64 p, raw int64 pos, raw {dtype_name(dtype)} vals",
            f"raw {dtype_name(dtype)} out",
            f"if (i == 0 || pos[i - 1] != p) {{\n  {t} acc = 0;\n"
            "  for (long long k = i; k < _ind.size() && pos[k] == p; ++k) acc += vals[k];\n"
            "  out[p] = acc;\n}", "replicate_segment_sum")


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
        spec, kernel = self.kernel(g.dtype)
        args = (pos, pos, vals, out.reshape(-1))  # (a view: out is C-contiguous)
        LAUNCHES.elementwise(spec, args)
        kernel(*args)
        return out


__all__ = ["ScatterAdd", "flat_positions", "segment_sum"]
