"""Eager mode's road for a layer whose gradient is written out (``written_grads.py``): its forward
and backward run as NumPy kernels, not op by op through the tape.

A ``Kernel`` pairs the layer's ``replicate.numpy`` definition (``slow_fwd``, ``slow_bwd``: what
graph mode traces) with NumPy functions that run the same ops in the same order (in place, and
an elementwise chain block by block while the blocks fit a core's cache), so the values are the
same to the bit (``tests/api/test_eager_kernels.py``). In eager mode, for float32/float64
operands of one dtype, the layer's forward is one ``custom_vjp`` node on the tape whose inputs
are the operands; the gradient walk runs the NumPy backward there. Each cotangent it gives is a
``custom_vjp`` node too, with inputs ``(*operands, g)``: a gradient of the gradient runs the
layer's ``replicate.numpy`` forward and backward again on those inputs, on the tape, and walks
that back (``autodiff.backward_region``) — so higher derivatives are what the plain definition
gives, and only the first-order road is NumPy.
"""

from __future__ import annotations

from .. import profile as _profile
from ..errors import source_line, user_frame
from ..graph.autodiff import backward_region
from ..graph.core import Array, bind, concrete, current_trace

FAST_DTYPES = frozenset(["float32", "float64"])


def eager_operands(*xs) -> list | None:
    """The operands as Arrays (a Variable read) when the layer may take the NumPy road: eager
    mode, every operand an Array or Variable of one dtype, float32 or float64; else None."""
    if current_trace() is not None:
        return None
    arrays = []
    for x in xs:
        if not isinstance(x, Array):
            read = getattr(x, "read", None)
            if read is None:
                return None
            x = read()
            if not isinstance(x, Array):
                return None
        arrays.append(x)
    dtype = arrays[0].aval.dtype
    if dtype.name not in FAST_DTYPES or any(a.aval.dtype != dtype for a in arrays) \
            or any(a.value is None or a.size == 0 for a in arrays):
        return None
    return arrays


class Kernel:
    """One layer: ``fwd(*values, *static) -> (out, residuals)`` and ``bwd(residuals, g, needs)
    -> one cotangent (or None where not needed) per operand`` on NumPy arrays, and the
    ``replicate.numpy`` pair they equal, ``slow_fwd(*arrays, *static) -> (out, residuals)`` and
    ``slow_bwd(residuals, g) -> cotangents`` (the custom_vjp's ``fwd`` and ``bwd``)."""

    def __init__(self, name, fwd, bwd, slow_fwd, slow_bwd):
        self.name = name
        self.fwd, self.bwd = fwd, bwd
        self.slow_fwd, self.slow_bwd = slow_fwd, slow_bwd

    def __call__(self, arrays, *static) -> Array:
        """The layer on ``arrays`` (from ``eager_operands``): one node on the tape."""
        out, res = _timed(self.name, self.fwd, *[a.value for a in arrays], *static)
        return bind("custom_vjp", concrete(out), *arrays, rule=_Forward(self, res, static))

    def replay(self, arrays, g, static) -> tuple:
        """The cotangents by the ``replicate.numpy`` definition, on the tape."""
        return tuple(self.slow_bwd(self.slow_fwd(*arrays, *static)[1], g))[:len(arrays)]


def _timed(name, fn, *args):
    profiler = _profile.active()
    if profiler is None:
        return fn(*args)
    start = profiler.now()
    result = fn(*args)
    profiler.add(name, "compute", start, profiler.now(), line=source_line(user_frame()))
    return result


class _Forward:
    """The ``rule`` of the layer's node: the NumPy backward on the residuals the forward kept."""

    def __init__(self, kernel, residuals, static):
        self.kernel, self.residuals, self.static = kernel, residuals, static

    def __repr__(self):
        return f"<eager kernel {self.kernel.name}>"

    def cotangents(self, g, needs, args):
        kernel = self.kernel
        if g.aval.dtype != args[0].aval.dtype:  # (not what a step gives: the plain definition)
            cts = kernel.replay(args, g, self.static)
            return [ct if need else None for ct, need in zip(cts, needs)]
        cts = _timed(f"{kernel.name} backward", kernel.bwd, self.residuals, g.value, needs)
        inputs = (*args, g)
        return [None if ct is None or not need else
                bind("custom_vjp", concrete(ct), *inputs, rule=_Backward(kernel, i, self.static))
                for i, (ct, need) in enumerate(zip(cts, needs))]


class _Backward:
    """The ``rule`` of a cotangent's node: the gradient of the written-out backward pass, by
    running the layer's ``replicate.numpy`` forward and backward again and walking them back."""

    def __init__(self, kernel, index, static):
        self.kernel, self.index, self.static = kernel, index, static

    def __repr__(self):
        return f"<eager kernel {self.kernel.name} backward, cotangent {self.index}>"

    def cotangents(self, g, needs, inputs):
        inputs = list(inputs)
        ct = self.kernel.replay(inputs[:-1], inputs[-1], self.static)[self.index]
        return backward_region([ct], inputs, [g], inputs)


__all__ = ["FAST_DTYPES", "Kernel", "eager_operands"]
