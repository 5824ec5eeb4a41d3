"""Activations and losses (per-example losses; reduce them with ``.mean()``)."""

from __future__ import annotations

import numpy as np

from .. import numpy as rnp
from ..errors import ReplicateError
from ..numpy._base import wide_operand


def relu(x):
    return rnp.maximum(x, 0.0)


def leaky_relu(x, negative_slope=0.01):
    return rnp.where(rnp.as_array(x) > 0, x, rnp.multiply(x, negative_slope))


def gelu(x):
    """GELU, tanh approximation (as in BERT/GPT-2)."""
    x = rnp.as_array(x)
    c = float(np.sqrt(2.0 / np.pi))  # a Python float is weak: float32 stays float32
    return 0.5 * x * (1.0 + rnp.tanh(c * (x + 0.044715 * x * x * x)))


tanh = rnp.tanh
sigmoid = rnp.sigmoid


def log_softmax(x, axis=-1):
    x = wide_operand(x)
    return x - rnp.logsumexp(x, axis=axis, keepdims=True)


def softmax(x, axis=-1):
    return rnp.exp(log_softmax(x, axis))


def softmax_cross_entropy(logits, labels):
    """Per-example cross-entropy; ``labels`` are integer classes or one-hot/probability rows.

    >>> import replicate.numpy as rnp
    >>> loss = softmax_cross_entropy(rnp.zeros((2, 4)), rnp.asarray([0, 3]))
    >>> [round(v, 4) for v in loss.tolist()]
    [1.3863, 1.3863]
    """
    logp = log_softmax(logits)
    labels = rnp.as_array(labels)
    if np.issubdtype(labels.dtype, np.integer):
        if labels.shape != logp.shape[:-1]:
            raise ReplicateError(f"integer labels of shape {labels.shape} do not fit logits "
                                 f"{logp.shape}")
        return -rnp.squeeze(rnp.take_along_axis(logp, rnp.expand_dims(labels, -1), -1), -1)
    if labels.shape != logp.shape:
        raise ReplicateError(f"one-hot labels {labels.shape} do not match logits {logp.shape}")
    return -rnp.sum(labels * logp, axis=-1)


def sigmoid_binary_cross_entropy(logits, targets):
    """Per-element binary cross-entropy from logits, computed stably."""
    logits = wide_operand(logits)
    return rnp.softplus(logits) - logits * rnp.cast(targets, logits.dtype)


def mse(pred, target):
    d = rnp.subtract(wide_operand(pred), wide_operand(target))
    return d * d


def huber(pred, target, delta=1.0):
    d = rnp.abs(rnp.subtract(wide_operand(pred), wide_operand(target)))
    quadratic = rnp.minimum(d, delta)
    return 0.5 * quadratic * quadratic + delta * (d - quadratic)
