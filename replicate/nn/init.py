"""Standard initialisers. Each takes a shape and a NumPy ``Generator`` and returns an ndarray.

The layers' defaults are PyTorch's: ``Linear``, ``Conv2d`` and ``ConvTranspose2d`` draw weight and
bias from ``fan_in_uniform`` (U(±1/sqrt(fan_in)), ``torch.nn``'s ``kaiming_uniform_(a=sqrt(5))``),
``Embedding`` from N(0, 1), ``MultiheadAttention``'s packed projection from ``glorot_uniform``
with zero biases."""

from __future__ import annotations

import numpy as np

__all__ = ["default_rng", "fan_in_uniform", "glorot_uniform", "he_normal", "lecun_uniform",
           "normal", "zeros", "ones"]

_default = np.random.default_rng(0)


def default_rng(seed: int | None = None):
    """The generator layers use when none is given; ``default_rng(seed)`` reseeds it."""
    global _default
    if seed is not None:
        _default = np.random.default_rng(seed)
    return _default


def _fans(shape):
    if len(shape) == 1:
        return shape[0], shape[0]
    receptive = int(np.prod(shape[2:])) if len(shape) > 2 else 1
    if len(shape) == 2:  # (in, out) as Linear stores it
        return shape[0], shape[1]
    return shape[1] * receptive, shape[0] * receptive  # (out, in, kh, kw)


def fan_in_uniform(shape, rng=None, dtype=np.float32, *, fan_in=None):
    """Uniform in ``±1 / sqrt(fan_in)``: PyTorch's default for the weights and biases of
    ``Linear`` and the convolutions (a bias passes its weight's ``fan_in``).

    >>> import numpy as np
    >>> w = fan_in_uniform((100, 3), np.random.default_rng(0))
    >>> bool(np.abs(w).max() <= 0.1), w.dtype
    (True, dtype('float32'))
    """
    if fan_in is None:
        fan_in, _ = _fans(shape)
    limit = 1.0 / np.sqrt(fan_in)
    return (rng or _default).uniform(-limit, limit, shape).astype(dtype)


def glorot_uniform(shape, rng=None, dtype=np.float32):
    """Uniform in ``±sqrt(6 / (fan_in + fan_out))`` (Glorot & Bengio)."""
    fan_in, fan_out = _fans(shape)
    limit = np.sqrt(6.0 / (fan_in + fan_out))
    return (rng or _default).uniform(-limit, limit, shape).astype(dtype)


def he_normal(shape, rng=None, dtype=np.float32):
    """Normal with standard deviation ``sqrt(2 / fan_in)`` (He et al.)."""
    fan_in, _ = _fans(shape)
    return ((rng or _default).normal(size=shape) * np.sqrt(2.0 / fan_in)).astype(dtype)


def lecun_uniform(shape, rng=None, dtype=np.float32):
    """Uniform in ``±sqrt(3 / fan_in)``: variance ``1 / fan_in`` (LeCun)."""
    fan_in, _ = _fans(shape)
    limit = np.sqrt(3.0 / fan_in)
    return (rng or _default).uniform(-limit, limit, shape).astype(dtype)


def normal(shape, std=0.01, rng=None, dtype=np.float32):
    """Normal with standard deviation ``std``."""
    return ((rng or _default).normal(size=shape) * std).astype(dtype)


def zeros(shape, rng=None, dtype=np.float32):
    """All zeros (``rng`` is unused: every initialiser takes one)."""
    return np.zeros(shape, dtype)


def ones(shape, rng=None, dtype=np.float32):
    """All ones (``rng`` is unused: every initialiser takes one)."""
    return np.ones(shape, dtype)
