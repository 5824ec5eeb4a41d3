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

import numpy as np

from .. import numpy as rnp
from .. import profile as _profile
from ..backends.numpy_backend import _select as select_bits
from ..custom import custom_vjp
from ..dtypes import autocast_dtype
from ..errors import source_line, user_frame
from ..graph import conv, reference
from ..graph.autodiff import backward_region
from ..graph.core import Array, Node, bind, concrete, current_trace
from ..graph.vjp_rules import VJP, _matmul_rhs_grad, unbroadcast
from ..numpy._linalg import _check_window as check_window
from ..numpy._linalg import _geometry as conv_geometry

FAST_DTYPES = frozenset(["float32", "float64"])
_FAST = frozenset(np.dtype(name) for name in FAST_DTYPES)  # (a dtype's ``.name`` costs µs)
_matmul = reference._matmul_np  # (the table's row less its float16 widening: not needed here)
ENABLED = True  # (False: every layer runs op by op — what the tests compare the kernels with)


def eager_operands(*xs) -> list | None:
    """The operands as Arrays (a Variable read, a NumPy array wrapped) when the layer may take
    the NumPy road: eager mode, every operand an Array, Variable or NumPy array of one dtype,
    float32 or float64; else None."""
    if not ENABLED or current_trace() is not None:
        return None
    arrays = []
    for x in xs:
        if type(x) is np.ndarray and x.dtype in _FAST:
            x = concrete(x)  # (what ``rnp.as_array`` makes of it)
        elif not isinstance(x, Array):
            read = getattr(x, "read", None)
            if read is None:
                return None
            x = read()
            if not isinstance(x, Array):
                return None
        arrays.append(x)
    dtype = arrays[0].aval.dtype
    if dtype not in _FAST or any(a.aval.dtype != dtype for a in arrays) \
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
        return _taped(out, arrays, _Forward(self, res, static))

    def replay(self, arrays, g, static) -> tuple:
        """The cotangents by the ``replicate.numpy`` definition, on the tape."""
        return tuple(self.slow_bwd(self.slow_fwd(*arrays, *static)[1], g))[:len(arrays)]


def _taped(value, inputs, rule) -> Array:
    """``value`` on the tape: a ``custom_vjp`` node of ``inputs`` whose gradient is ``rule``'s
    (what ``bind`` makes in eager mode, less the checks a kernel's own value needs not)."""
    leaf = concrete(value)
    return Array(leaf.aval, Node("custom_vjp", (leaf, *inputs), {"rule": rule}), leaf.value)


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
                _taped(ct, inputs, _Backward(kernel, i, self.static))
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


# -- layers whose gradient the tape would take op by op: Linear, attention's weights -----------
def _linear_fwd(x, w, b):
    y = _matmul(x, w)
    return np.add(y, b, out=y), (x, w, b)


def _linear_bwd(res, g, needs):
    x, w, b = res
    dx = _matmul(g, w.transpose((1, 0))) if needs[0] else None
    dw = np.matmul(x.reshape((-1 if x.size else 0, x.shape[-1])).transpose((1, 0)),
                   g.reshape((-1 if g.size else 0, g.shape[-1]))) if needs[1] else None
    db = np.add.reduce(g, axis=tuple(range(g.ndim - 1))) if needs[2] else None
    return dx, dw, db


def _linear_slow_fwd(x, w, b):
    return rnp.matmul(x, w) + b, (x, w, b)


def _linear_slow_bwd(res, g):
    x, w, b = res
    return (unbroadcast(rnp.matmul(g, rnp.swapaxes(w, -1, -2)), x.shape),
            _matmul_rhs_grad(g, x, w), unbroadcast(g, b.shape))


LINEAR = Kernel("linear", _linear_fwd, _linear_bwd, _linear_slow_fwd, _linear_slow_bwd)


def linear(x, weight, bias):
    """``x @ weight + bias`` (``rp.nn.Linear``): one kernel in eager mode where it may (float32
    or float64, ``x`` at least 2-D, no autocast), else the ops."""
    arrays = eager_operands(x, weight, bias)
    if arrays is None or autocast_dtype() is not None or arrays[0].ndim < 2 \
            or arrays[1].ndim != 2 or arrays[0].shape[-1] != arrays[1].shape[0] \
            or arrays[2].shape != arrays[1].shape[1:]:
        return rnp.matmul(x, weight) + bias
    return LINEAR(arrays)


def _attention_fwd(q, k, scale, causal):
    w = reference.IMPL["attention_weights"](q, k, scale=scale, causal=causal, masking="none")
    return w, (w, q, k, scale)


def _attention_bwd(res, g, needs):
    w, q, k, scale = res
    ds = np.multiply(g, w)
    total = np.add.reduce(ds, axis=(ds.ndim - 1,))
    np.subtract(g, total.reshape(total.shape + (1,)), out=ds)
    np.multiply(w, ds, out=ds)  # w (g - sum(g w)): the softmax's gradient
    scale = w.dtype.type(scale)
    dq = dk = None
    if needs[0]:
        dq = _matmul(ds, k)
        np.multiply(dq, scale, out=dq)
    if needs[1]:
        swap = tuple(range(ds.ndim - 2)) + (ds.ndim - 1, ds.ndim - 2)
        dk = _matmul(ds.transpose(swap), q)
        np.multiply(dk, scale, out=dk)
    return dq, dk


def _attention_slow_fwd(q, k, scale, causal):
    w = bind("attention_weights", q, k, scale=scale, causal=causal, masking="none")
    return w, (w, q, k, scale, causal)


def _attention_slow_bwd(res, g):
    w, q, k, scale, causal = res
    return VJP["attention_weights"](g, w, (True, True), q, k, scale=scale, causal=causal,
                                    masking="none")


ATTENTION = Kernel("attention_weights", _attention_fwd, _attention_bwd, _attention_slow_fwd,
                   _attention_slow_bwd)


def attention_weights(q, k, scale, causal):
    """``attention_weights(q, k)`` without a mask: one kernel in eager mode where it may (float32
    or float64, the same leading axes), else the primitive."""
    arrays = eager_operands(q, k)
    if arrays is None or arrays[0].ndim < 2 or arrays[0].shape[:-2] != arrays[1].shape[:-2]:
        return bind("attention_weights", q, k, scale=scale, causal=causal, masking="none")
    return ATTENTION(arrays, scale, causal)


# -- ReLU: ``maximum(x, 0)``, its gradient ``g`` where ``x > 0``, 0 elsewhere ---------------------
# 0 at x = 0, as PyTorch's ``relu`` and ``jax.nn.relu`` (a subgradient; ``maximum``'s own rule
# would give g / 2 there, a tie): its own rule in every mode (``_relu_traced`` below: traced,
# and eager in the low precisions)
def _relu_fwd(x):
    return reference.IMPL["maximum"](x, x.dtype.type(0.0)), (x,)


def _relu_bwd(res, g, needs):
    x, = res
    # a select, not g * mask: a masked inf or NaN cotangent gives 0, as PyTorch's and JAX's;
    # by bits, as the NumPy backend's select (np.where branches per element: 14x slower here)
    return (select_bits(np.greater(x, x.dtype.type(0.0)), g, np.zeros((), g.dtype),
                        np.empty_like(g)),)


def _relu_slow_fwd(x):
    return rnp.maximum(x, 0.0), (x,)


def _relu_slow_bwd(res, g):
    x, = res
    return (rnp.where(x > 0, g, rnp.zeros((), g.dtype)),)


RELU = Kernel("relu", _relu_fwd, _relu_bwd, _relu_slow_fwd, _relu_slow_bwd)


def relu(x):
    """``max(x, 0)`` (``rp.nn.relu``), gradient 0 at 0: one kernel in eager mode where it may
    (float32 or float64), else ``maximum`` with the gradient written out (``rp.custom_vjp``)."""
    arrays = eager_operands(x)
    if arrays is None:
        return _relu_traced(x)
    return RELU(arrays)


@custom_vjp
def _relu_traced(x):
    return rnp.maximum(x, 0.0)


_relu_traced.defvjp(_relu_slow_fwd, _relu_slow_bwd)


# -- Conv2d with a bias: the im2col the forward made is kept for the weight gradient ----------
def _bias_axes(g):
    """The axes ``unbroadcast`` sums ``g`` (N, O, OH, OW) over for a (1, O, 1, 1) bias."""
    return tuple(i for i in range(g.ndim) if i != 1 and g.shape[i] != 1)


def _conv_fwd(x, w, b, stride, padding, dilation):
    y, cols = conv.conv2d_keeping_cols(x, w, stride, padding, dilation)
    np.add(y, b.reshape((1, -1, 1, 1)), out=y)
    return y, (cols, x.shape, w, (stride, padding, dilation))


def _conv_bwd(res, g, needs):
    cols, x_shape, w, (stride, padding, dilation) = res
    dx = reference.IMPL["conv2d_input_grad"](g, w, size=x_shape[2:], stride=stride,
                                             padding=padding, dilation=dilation) \
        if needs[0] else None
    dw = conv.conv2d_weight_grad_from_cols(cols, g, w.shape[2:]) if needs[1] else None
    db = np.add.reduce(g, axis=_bias_axes(g)).reshape(w.shape[:1]) if needs[2] else None
    return dx, dw, db


def _conv_slow_fwd(x, w, b, stride, padding, dilation):
    geometry = dict(stride=stride, padding=padding, dilation=dilation)
    y = bind("conv2d", x, w, **geometry) + rnp.reshape(b, (1, -1, 1, 1))
    return y, (x, w, b, geometry)


def _conv_slow_bwd(res, g):
    x, w, b, geometry = res
    dx, dw = VJP["conv2d"](g, None, (True, True), x, w, **geometry)
    return dx, dw, rnp.reshape(unbroadcast(g, (1, b.shape[0], 1, 1)), b.shape)


CONV2D = Kernel("conv2d", _conv_fwd, _conv_bwd, _conv_slow_fwd, _conv_slow_bwd)


def conv2d(x, weight, bias, stride, padding, dilation):
    """``conv2d(x, weight) + bias`` per output channel (``rp.nn.Conv2d``): one kernel in eager
    mode where it may (float32 or float64, no autocast; a bad geometry raises as
    ``rnp.conv2d``), else None (the caller runs the ops)."""
    arrays = eager_operands(x, weight, bias)
    if arrays is None or autocast_dtype() is not None or arrays[0].ndim != 4 \
            or arrays[1].ndim != 4 or arrays[0].shape[1] != arrays[1].shape[1] \
            or arrays[2].shape != arrays[1].shape[:1]:
        return None
    geometry = conv_geometry(stride, padding, dilation)
    check_window(arrays[0].shape[2:], arrays[1].shape[2:], geometry)
    return CONV2D(arrays, geometry["stride"], geometry["padding"], geometry["dilation"])


__all__ = ["ATTENTION", "CONV2D", "ENABLED", "FAST_DTYPES", "LINEAR", "Kernel", "RELU",
           "attention_weights", "conv2d", "eager_operands", "linear", "relu"]
