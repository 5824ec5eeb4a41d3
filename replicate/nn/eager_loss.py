"""Eager mode's softmax cross-entropy with integer labels as two NumPy kernels
(``eager_kernels.Kernel``): the forward is the ``replicate.numpy`` definition's ops in their
order (``log_softmax`` through ``logsumexp``, the label's entry picked, negated) and the
backward the ops the tape would run for it, in the tape's order — so the same bits
(``tests/api/test_eager_loss_kernel.py``) for the ~35 ops' dispatch of two. Higher derivatives
replay the definition, as every kernel's do.
"""

from __future__ import annotations

import numpy as np

from .. import numpy as rnp
from ..dtypes import autocast_dtype
from ..graph.autodiff import grad
from .eager_kernels import Kernel, eager_operands


def _definition(logits, labels):
    """``softmax_cross_entropy``'s integer-label road (``functional.py``)."""
    logp = logits - rnp.logsumexp(logits, axis=-1, keepdims=True)
    picked = rnp.take_along_axis(logp, rnp.expand_dims(labels, -1), -1, nonnegative=True)
    return -rnp.squeeze(picked, -1)


def _fwd(x, labels):
    zero = x.dtype.type(0.0)
    m = np.maximum.reduce(x, axis=(1,)).reshape((x.shape[0], 1))
    m = np.where(np.isfinite(m), m, zero)
    e = np.exp(np.subtract(x, m))
    s = np.add.reduce(e, axis=(1,)).reshape((x.shape[0], 1))
    logp = np.subtract(x, np.add(np.log(s), m))
    rows = np.arange(x.shape[0]).reshape((-1, 1))
    key = (rows, labels.reshape((-1, 1)))
    return np.negative(logp[key].reshape(-1)), (e, s, key)


def _bwd(res, g, needs):
    e, s, key = res
    picked = np.zeros(e.shape, e.dtype)  # the gather's gradient: a scatter-add into zeros
    np.add.at(picked, key, np.negative(g).reshape((-1, 1)))
    total = np.add.reduce(np.negative(picked), axis=(1,)).reshape((e.shape[0], 1))
    dx = np.multiply(np.true_divide(total, s), e)  # log's g / s, then exp's g * e
    return (np.add(picked, dx, out=dx),)


def _slow_fwd(x, labels):
    loss = _definition(x, labels)
    return loss, (x, loss)


def _slow_bwd(res, g):
    x, loss = res
    return (grad(loss, x, y_grad=g),)


LOSS = Kernel("softmax_cross_entropy", _fwd, _bwd, _slow_fwd, _slow_bwd)


def softmax_cross_entropy(logits, labels):
    """The per-example loss as one kernel where it may (eager mode, 2-D float32/float64 logits
    without autocast, integer labels of one per row, each in range), else None."""
    arrays = eager_operands(logits)
    if arrays is None or autocast_dtype() is not None or arrays[0].ndim != 2:
        return None
    value = getattr(labels, "value", labels)
    if not isinstance(value, np.ndarray) or getattr(labels, "symbolic", False) \
            or not np.issubdtype(value.dtype, np.integer) \
            or value.shape != arrays[0].shape[:1] \
            or value.min() < 0 or value.max() >= arrays[0].shape[1]:
        return None
    return LOSS(arrays, value)


__all__ = ["LOSS", "softmax_cross_entropy"]
