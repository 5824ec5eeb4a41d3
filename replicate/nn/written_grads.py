"""Layers whose gradient is written out by hand (``rp.custom_vjp``) because the derived one
costs more passes over the activations than it needs.

The forward is the same sequence of ops as the plain definition, so its values do not change;
only the backward pass is shorter. GELU's derived gradient is 16 elementwise ops on the MLP's
widest activation and keeps several of the forward's intermediates alive; written out it is the
derivative of ``0.5 x (1 + t)`` at the saved ``t``. LayerNorm's derived gradient is ~30 ops in
18 kernels; written out it is the textbook ``rstd (dy - mean(dy) - xhat mean(dy xhat))`` with
the weight's and bias's sums beside it. Both bwd functions are ``replicate.numpy`` code, so the
gradient is differentiable again (the residuals are functions of the input in the trace).
"""

from __future__ import annotations

import math

import numpy as np

from .. import numpy as rnp
from ..custom import custom_vjp
from ..graph.vjp_rules import unbroadcast
from .eager_kernels import Kernel, eager_operands

GELU_C = math.sqrt(2.0 / math.pi)
GELU_A = 0.044715


def gelu_tanh(x):
    """GELU, tanh approximation: ``0.5 x (1 + tanh(c (x + a x^3)))``."""
    arrays = eager_operands(x)
    return _gelu_tanh(x) if arrays is None else GELU_KERNEL(arrays)


@custom_vjp
def _gelu_tanh(x):
    return _gelu_fwd(x)[0]


def _gelu_fwd(x):
    t = rnp.tanh(GELU_C * (x + GELU_A * x * x * x))  # Python floats are weak: float32 stays
    return 0.5 * x * (1.0 + t), (x, t)


def _gelu_bwd(res, g):
    x, t = res
    # d/dx 0.5 x (1 + t) = 0.5 (1 + t) + 0.5 x (1 - t^2) c (1 + 3 a x^2)
    slope = (0.5 + 0.5 * t) + (0.5 * x) * (1.0 - t * t) * (
        GELU_C + (3.0 * GELU_A * GELU_C) * (x * x))
    return (g * slope,)


_gelu_tanh.defvjp(_gelu_fwd, _gelu_bwd)


def layer_norm(x, weight, bias, eps):
    """Normalise over the last axis, then ``* weight + bias``."""
    arrays = eager_operands(x, weight, bias)
    if arrays is None or arrays[0].ndim == 0 \
            or not arrays[1].shape == arrays[2].shape == arrays[0].shape[-1:]:
        return _layer_norm(x, weight, bias, eps)
    return LAYER_NORM_KERNEL(arrays, eps)


@custom_vjp
def _layer_norm(x, weight, bias, eps):
    return _layer_norm_fwd(x, weight, bias, eps)[0]


def _layer_norm_fwd(x, weight, bias, eps):
    mean = rnp.mean(x, axis=-1, keepdims=True)
    var = rnp.var(x, axis=-1, keepdims=True)
    rstd = rnp.rsqrt(var + eps)
    xhat = (x - mean) * rstd
    return xhat * weight + bias, (xhat, rstd, weight, bias)


def _layer_norm_bwd(res, g):
    xhat, rstd, weight, bias = res
    dy = g * weight
    dx = rstd * (dy - rnp.mean(dy, axis=-1, keepdims=True)
                 - xhat * rnp.mean(dy * xhat, axis=-1, keepdims=True))
    return (dx, unbroadcast(g * xhat, weight.shape), unbroadcast(g, bias.shape), None)


_layer_norm.defvjp(_layer_norm_fwd, _layer_norm_bwd)


# -- the NumPy kernels of eager mode: each op of the definitions above, in their order ----------
BLOCK = 16384  # elements of an elementwise chain's block (a few blocks of temporaries fit L2)


def _blocks(n):
    return ((lo, min(lo + BLOCK, n)) for lo in range(0, n, BLOCK))


def _gelu_fwd_np(x):
    k = x.dtype.type
    a, c, half, one = k(GELU_A), k(GELU_C), k(0.5), k(1.0)
    xf = x.reshape(-1)
    y, t = np.empty(xf.size, x.dtype), np.empty(xf.size, x.dtype)
    work = np.empty(min(xf.size, BLOCK), x.dtype)
    for lo, hi in _blocks(xf.size):
        xb, tb, yb, w = xf[lo:hi], t[lo:hi], y[lo:hi], work[:hi - lo]
        np.multiply(a, xb, out=w)
        np.multiply(w, xb, out=w)
        np.multiply(w, xb, out=w)
        np.add(xb, w, out=w)
        np.multiply(c, w, out=w)
        np.tanh(w, out=tb)
        np.multiply(half, xb, out=w)
        np.add(one, tb, out=yb)
        np.multiply(w, yb, out=yb)
    return y.reshape(x.shape), (x, t.reshape(x.shape))


def _gelu_bwd_np(res, g, needs):
    x, t = res
    k = x.dtype.type
    c, half, one, k3 = k(GELU_C), k(0.5), k(1.0), k(3.0 * GELU_A * GELU_C)
    xf, tf, gf = x.reshape(-1), t.reshape(-1), g.reshape(-1)
    out = np.empty(xf.size, x.dtype)
    w1, w2 = np.empty(min(xf.size, BLOCK), x.dtype), np.empty(min(xf.size, BLOCK), x.dtype)
    for lo, hi in _blocks(xf.size):
        xb, tb, gb, ob, a, b = xf[lo:hi], tf[lo:hi], gf[lo:hi], out[lo:hi], w1[:hi - lo], \
            w2[:hi - lo]
        np.multiply(half, tb, out=ob)
        np.add(half, ob, out=ob)  # 0.5 + 0.5 t
        np.multiply(half, xb, out=a)
        np.multiply(tb, tb, out=b)
        np.subtract(one, b, out=b)
        np.multiply(a, b, out=a)  # (0.5 x) (1 - t t)
        np.multiply(xb, xb, out=b)
        np.multiply(k3, b, out=b)
        np.add(c, b, out=b)
        np.multiply(a, b, out=a)
        np.add(ob, a, out=ob)
        np.multiply(gb, ob, out=ob)
    return (out.reshape(x.shape),)


def _mean_last(x, axes, count):
    """``rnp.mean(x, axis=-1, keepdims=True)``: the sum over the last axis, over its length."""
    s = np.sum(x, axis=axes)
    s = s.reshape(s.shape + (1,))
    return np.true_divide(s, count, out=s)


def _layer_norm_fwd_np(x, weight, bias, eps):
    k = x.dtype.type
    axes, count = (x.ndim - 1,), k(float(x.shape[-1]))
    mean = _mean_last(x, axes, count)  # (var takes the mean again: the same values)
    centred = np.subtract(x, mean)
    square = np.multiply(centred, centred)
    rstd = _mean_last(square, axes, count)
    np.add(rstd, k(eps), out=rstd)
    np.sqrt(rstd, out=rstd)
    np.true_divide(k(1.0), rstd, out=rstd)
    xhat = np.multiply(centred, rstd, out=centred)
    y = np.multiply(xhat, weight, out=square)
    return np.add(y, bias, out=y), (xhat, rstd, weight)


def _layer_norm_bwd_np(res, g, needs):
    xhat, rstd, weight = res
    k = xhat.dtype.type
    axes, count = (xhat.ndim - 1,), k(float(xhat.shape[-1]))
    lead = tuple(range(xhat.ndim - 1))
    dx = dw = db = None
    work = np.empty_like(xhat)
    if needs[0]:
        dy = np.multiply(g, weight)
        mean_dy = _mean_last(dy, axes, count)
        mean_dyx = _mean_last(np.multiply(dy, xhat, out=work), axes, count)
        np.subtract(dy, mean_dy, out=dy)
        np.subtract(dy, np.multiply(xhat, mean_dyx, out=work), out=dy)
        dx = np.multiply(rstd, dy, out=dy)
    if needs[1]:
        dw = np.multiply(g, xhat, out=work)
        dw = np.sum(dw, axis=lead) if lead else dw
    if needs[2]:
        db = np.sum(g, axis=lead) if lead else g
    return dx, dw, db


GELU_KERNEL = Kernel("gelu_tanh", _gelu_fwd_np, _gelu_bwd_np, _gelu_fwd, _gelu_bwd)
LAYER_NORM_KERNEL = Kernel("layer_norm", _layer_norm_fwd_np, _layer_norm_bwd_np,
                           _layer_norm_fwd, _layer_norm_bwd)
