"""Activations and losses (per-example losses; reduce them with ``.mean()``)."""

from __future__ import annotations

import math

import numpy as np

from .. import numpy as rnp
from ..dtypes import is_float
from ..errors import ReplicateError
from ..numpy._base import wide_operand
from .eager_kernels import relu as _relu
from .eager_loss import softmax_cross_entropy as eager_softmax_cross_entropy
from .written_grads import gelu_tanh


def relu(x):
    """``max(x, 0)``, elementwise (eager mode: one kernel, ``eager_kernels.py``)."""
    return _relu(x)


def leaky_relu(x, negative_slope=0.01):
    """``x`` where positive, ``negative_slope * x`` elsewhere (PyTorch's default slope)."""
    return rnp.where(rnp.as_array(x) > 0, x, rnp.multiply(x, negative_slope))


def gelu(x, approximate=True):
    """GELU: ``x * Phi(x)``, Phi the standard normal distribution function.

    ``approximate=True`` (the default; also ``"tanh"``): the tanh approximation of BERT and
    GPT-2, ``0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x**3)))``. ``approximate=False`` (also
    ``"none"``, PyTorch's default): exact, ``0.5 x (1 + erf(x / sqrt(2)))``.

    >>> import replicate.numpy as rnp
    >>> [round(v, 6) for v in gelu(rnp.asarray([1.0, -1.0]), approximate=False).tolist()]
    [0.841345, -0.158655]
    """
    x = rnp.as_array(x)
    if approximate in (False, "none"):
        return 0.5 * x * (1.0 + rnp.erf(x * math.sqrt(0.5)))  # Python floats: weak
    if approximate not in (True, "tanh"):
        raise ReplicateError(f"gelu: approximate is True/'tanh' or False/'none', got "
                             f"{approximate!r}")
    return gelu_tanh(x)  # (its gradient written out: written_grads.py)


tanh = rnp.tanh
sigmoid = rnp.sigmoid


def _scales(scale_factor):
    scales = (scale_factor,) * 2 if np.isscalar(scale_factor) else tuple(scale_factor)
    if len(scales) != 2 or not all(float(s) > 0 for s in scales):
        raise ReplicateError(f"upsample: scale_factor is a positive number or a pair, got "
                             f"{scale_factor!r}")
    return [float(s) for s in scales]


def _nearest(x, axis, scale):
    """PyTorch's nearest source index ``min(floor(dst * float32(1 / scale)), n - 1)``."""
    n = x.shape[axis]
    size = int(math.floor(n * scale))
    if size == n * round(scale) and (size in (n, 2 * n) or np.array_equal(
            _nearest_index(n, size, scale), np.arange(size) // round(scale))):
        return rnp.repeat(x, round(scale), axis)  # an integer factor: a broadcast
    return rnp.take(x, _nearest_index(n, size, scale), axis)


def _nearest_index(n, size, scale):
    step = np.float32(1.0 / scale)
    return np.minimum(np.floor(np.arange(size, dtype=np.float32) * step).astype(np.int64), n - 1)


def _linear(x, axis, scale):
    """PyTorch's linear interpolation (align_corners=False) along one axis: source position
    ``(dst + 0.5) / scale - 0.5``, clamped at 0; the two neighbours gathered and weighted."""
    n = x.shape[axis]
    size = int(math.floor(n * scale))
    src = np.maximum((np.arange(size) + 0.5) / scale - 0.5, 0.0)
    lo = np.minimum(np.floor(src).astype(np.int64), n - 1)
    hi = lo + (lo < n - 1)
    frac = np.clip(src - lo, 0.0, 1.0)
    shape = [1] * x.ndim
    shape[axis] = size
    weight = lambda w: rnp.asarray(w.reshape(shape).astype(x.dtype))  # noqa: E731
    return rnp.take(x, lo, axis) * weight(1.0 - frac) + rnp.take(x, hi, axis) * weight(frac)


def upsample(x, scale_factor, mode="nearest"):
    """Upsample an NCHW batch by ``scale_factor`` (a number or an (h, w) pair), as
    ``torch.nn.functional.interpolate(x, scale_factor=..., mode=...)``: the output is
    ``floor(H * scale)`` by ``floor(W * scale)``. ``mode="nearest"``: PyTorch's source pixel
    (a broadcast for an integer factor, else a gather); ``"bilinear"``: PyTorch's
    ``align_corners=False`` weights, two gathers and a weighted sum per axis. A composition, so
    the gradient flows back to the source pixels.

    >>> import replicate.numpy as rnp
    >>> upsample(rnp.asarray([[[[1.0, 2.0]]]]), 2, "bilinear").tolist()
    [[[[1.0, 1.25, 1.75, 2.0], [1.0, 1.25, 1.75, 2.0]]]]
    """
    x = rnp.as_array(x)
    if x.ndim != 4:
        raise ReplicateError(f"upsample: expected an NCHW input, got shape {x.shape}")
    if mode not in ("nearest", "bilinear"):
        raise ReplicateError(f"upsample: mode is 'nearest' or 'bilinear', got {mode!r}")
    if mode == "bilinear" and not is_float(x.dtype):
        raise ReplicateError(f"upsample: bilinear needs a float input, got {x.dtype}")
    step = _nearest if mode == "nearest" else _linear
    sh, sw = _scales(scale_factor)
    return step(step(x, 2, sh), 3, sw)


def log_softmax(x, axis=-1):
    """``x - logsumexp(x)`` along ``axis`` (inside ``rp.autocast``, a float16/bfloat16 ``x`` in
    float32)."""
    x = wide_operand(x)
    return x - rnp.logsumexp(x, axis=axis, keepdims=True)


def softmax(x, axis=-1):
    """``exp(log_softmax(x, axis))``: the probabilities along ``axis``."""
    return rnp.exp(log_softmax(x, axis))


def softmax_cross_entropy(logits, labels):
    """Per-example cross-entropy; ``labels`` are integer classes or one-hot/probability rows.
    An integer label outside ``[0, classes)`` is an ``IndexError``, a negative one too (as in
    PyTorch; NumPy's indexing would take it from the end).

    >>> import replicate.numpy as rnp
    >>> loss = softmax_cross_entropy(rnp.zeros((2, 4)), rnp.asarray([0, 3]))
    >>> [round(v, 4) for v in loss.tolist()]
    [1.3863, 1.3863]
    """
    loss = eager_softmax_cross_entropy(logits, labels)  # (eager mode: one kernel)
    if loss is not None:
        return loss
    logp = log_softmax(logits)
    labels = rnp.as_array(labels)
    if np.issubdtype(labels.dtype, np.integer):
        if labels.shape != logp.shape[:-1]:
            raise ReplicateError(f"integer labels of shape {labels.shape} do not fit logits "
                                 f"{logp.shape}")
        return -rnp.squeeze(rnp.take_along_axis(logp, rnp.expand_dims(labels, -1), -1,
                                                nonnegative=True), -1)
    if labels.shape != logp.shape:
        raise ReplicateError(f"one-hot labels {labels.shape} do not match logits {logp.shape}")
    return -rnp.sum(labels * logp, axis=-1)


def sigmoid_binary_cross_entropy(logits, targets):
    """Per-element binary cross-entropy from logits, computed stably."""
    logits = wide_operand(logits)
    return rnp.softplus(logits) - logits * rnp.cast(targets, logits.dtype)


def mse(pred, target):
    """The squared error ``(pred - target)**2`` per element (not averaged)."""
    d = rnp.subtract(wide_operand(pred), wide_operand(target))
    return d * d


def huber(pred, target, delta=1.0):
    """The Huber loss per element: quadratic below ``delta``, linear from it (not averaged;
    PyTorch's ``huber_loss`` with ``reduction="none"``). The quadratic part is of the residual
    itself, so its second derivative is 1 at a residual of 0 (through ``|r|`` it came out 0)."""
    r = rnp.subtract(wide_operand(pred), wide_operand(target))
    d = rnp.abs(r)
    inside = rnp.less(d, delta)
    near = rnp.where(inside, r, 0.0)  # (each branch fed 0 where the other is taken)
    return rnp.where(inside, 0.5 * near * near, 0.5 * delta * delta + delta * (d - delta))


def one_hot(labels, num_classes, dtype=np.float32):
    """``rnp.one_hot`` with PyTorch's argument checks: rows of ``num_classes`` entries, 1 at
    each label and 0 elsewhere, shape ``labels.shape + (num_classes,)``. As
    ``torch.nn.functional.one_hot`` except that ``num_classes`` is required (a traced step
    cannot read it from the labels), the result is ``dtype`` (float32 by default; PyTorch's is
    int64) and a label outside ``[0, num_classes)`` gives a row of zeros instead of an error
    (as ``jax.nn.one_hot``).

    >>> import replicate.numpy as rnp
    >>> one_hot(rnp.asarray([0, 2]), 3).tolist()
    [[1.0, 0.0, 0.0], [0.0, 0.0, 1.0]]
    """
    labels = rnp.as_array(labels)
    if not np.issubdtype(labels.dtype, np.integer):
        raise ReplicateError(f"one_hot: labels must be integers, got {labels.dtype}")
    if int(num_classes) < 1:
        raise ReplicateError(f"one_hot: num_classes must be positive, got {num_classes}")
    return rnp.one_hot(labels, int(num_classes), np.dtype(dtype))  # the checks are PyTorch's


def nll_loss(log_probs, targets, reduction="none", ignore_index=-100):
    """Negative log-likelihood of integer ``targets`` under ``log_probs`` (log-softmax output),
    PyTorch's layout: ``log_probs`` is (N, C) or (N, C, d1, ...) (classes on axis 1; a 1-D
    (C,) input takes a scalar target) and ``targets`` (N,) or (N, d1, ...).

    Unlike ``torch.nn.functional.nll_loss`` (whose default is ``"mean"``) the default
    ``reduction`` is ``"none"``: per-example, as every loss of ``rp.nn``; ``"mean"`` and
    ``"sum"`` reduce as PyTorch's. Targets equal to ``ignore_index`` give 0 and are left out of
    ``"mean"``'s count, as PyTorch's (a mean over no targets is nan); any other target outside
    ``[0, C)`` is an ``IndexError``, a negative one too. No class weights.

    >>> import replicate.numpy as rnp
    >>> nll_loss(rnp.log(rnp.asarray([[0.5, 0.5], [0.25, 0.75]])), rnp.asarray([0, 1]),
    ...          "sum").tolist() == float(-np.log(0.5) - np.log(0.75))
    True
    """
    logp = wide_operand(log_probs)
    targets = rnp.as_array(targets)
    if reduction not in ("none", "mean", "sum"):
        raise ReplicateError(f"nll_loss: reduction is 'none', 'mean' or 'sum', got "
                             f"{reduction!r}")
    if not np.issubdtype(targets.dtype, np.integer):
        raise ReplicateError(f"nll_loss: targets must be integer classes, got {targets.dtype}")
    axis = 1 if logp.ndim >= 2 else 0
    expected = logp.shape[:axis] + logp.shape[axis + 1:]
    if targets.shape != expected:
        raise ReplicateError(f"nll_loss: targets of shape {targets.shape} do not fit log_probs "
                             f"{logp.shape} (classes on axis {axis}; expected {expected})")
    keep = rnp.not_equal(targets, ignore_index)
    safe = rnp.where(keep, targets, 0)
    picked = rnp.squeeze(rnp.take_along_axis(logp, rnp.expand_dims(safe, axis), axis,
                                             nonnegative=True), axis)
    loss = rnp.where(keep, -picked, 0.0)
    if reduction == "sum":
        return rnp.sum(loss)
    if reduction == "mean":
        return rnp.sum(loss) / rnp.sum(rnp.cast(keep, loss.dtype))
    return loss


def flatten(x, start_dim=1, end_dim=-1):
    """Merge the axes ``start_dim`` to ``end_dim`` (inclusive) into one. The default keeps the
    batch axis, as ``torch.nn.Flatten``'s (``torch.flatten``'s default ``start_dim`` is 0).

    >>> import replicate.numpy as rnp
    >>> flatten(rnp.zeros((2, 3, 4, 5))).shape, flatten(rnp.zeros((2, 3, 4, 5)), 0, 1).shape
    ((2, 60), (6, 4, 5))
    """
    x = rnp.as_array(x)
    n = max(x.ndim, 1)
    start, end = (d + n if d < 0 else d for d in (int(start_dim), int(end_dim)))
    if not (0 <= start < n and 0 <= end < n) or start > end:
        raise ReplicateError(f"flatten: dims {start_dim}..{end_dim} do not fit shape {x.shape}")
    if x.ndim == 0:
        return rnp.reshape(x, (1,))
    merged = int(np.prod(x.shape[start:end + 1]))
    return rnp.reshape(x, x.shape[:start] + (merged,) + x.shape[end + 1:])
