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

from .. import numpy as rnp
from ..custom import custom_vjp
from ..graph.vjp_rules import unbroadcast

GELU_C = math.sqrt(2.0 / math.pi)
GELU_A = 0.044715


@custom_vjp
def gelu_tanh(x):
    """GELU, tanh approximation: ``0.5 x (1 + tanh(c (x + a x^3)))``."""
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


gelu_tanh.defvjp(_gelu_fwd, _gelu_bwd)


@custom_vjp
def layer_norm(x, weight, bias, eps):
    """Normalise over the last axis, then ``* weight + bias``."""
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


layer_norm.defvjp(_layer_norm_fwd, _layer_norm_bwd)
