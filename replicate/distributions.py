"""Distributions for reinforcement learning (``torch.distributions``' names and answers):
``Categorical`` and ``Normal`` with ``log_prob``, ``entropy``, ``sample`` and
``kl_divergence``, written with ``replicate.numpy`` (so differentiable, traced and eager).

Sampling takes the library's keyed randomness: ``sample(rng)`` with an
``rnp.random.Generator`` (its key a Variable: each replica draws its own, every run the same)
or a key (``rnp.random.key(seed)``, ``rnp.random.split``).

>>> import numpy as np, replicate as rp, replicate.numpy as rnp
>>> pi = rp.distributions.Categorical(logits=np.log([[0.25, 0.75]]))
>>> round(float(pi.log_prob(np.array([1]))[0]), 4), round(float(pi.entropy()[0]), 4)
(-0.2877, 0.5623)
>>> pi.sample(rnp.random.Generator(seed=0), (5,)).shape
(5, 1)
"""

from __future__ import annotations

import math

import numpy as np

from . import numpy as rnp
from .dtypes import is_float, result_type
from .errors import DTypeError, ReplicateError


def _key(rng):
    """A key from a Generator (advancing it) or a key itself."""
    if isinstance(rng, rnp.random.Generator):
        return rng.next_key()
    if rng is None:
        raise ReplicateError("sample(rng): pass an rnp.random.Generator (a stream whose key is "
                             "a Variable: replicas draw differently, runs repeat) or a key "
                             "(rnp.random.key(seed)); there is no hidden global stream")
    return rng


def _float_parameters(*xs) -> list:
    """The parameters as arrays of one float dtype, PyTorch's: the arrays' (integers: float32,
    the default float), Python numbers taking the arrays' dtype (``Normal(0, 1)`` is float32;
    an integer ``loc`` drew integer noise, all 0)."""
    arrays = [rnp.asarray(x) for x in xs if not isinstance(x, (bool, int, float))]
    floats = [a.dtype for a in arrays if is_float(a.dtype)]
    dtype = result_type(*floats) if floats else np.dtype(np.float32)
    return [rnp.cast(rnp.asarray(x), dtype) for x in xs]


class Categorical:
    """A categorical distribution over the last axis of ``logits`` (unnormalised
    log-probabilities) or ``probs``; the leading axes are the batch."""

    def __init__(self, logits=None, probs=None):
        if (logits is None) == (probs is None):
            raise ReplicateError("Categorical takes logits or probs (one of them)")
        if probs is not None:  # (a 0 is -inf; through a select, so its gradient is 0, not NaN)
            probs = rnp.asarray(probs)
            some = probs > 0
            logits = rnp.where(some, rnp.log(rnp.where(some, probs, 1.0)), -np.inf)
        logits = rnp.asarray(logits)
        if logits.ndim < 1:
            raise ReplicateError("Categorical: logits need a last axis of categories")
        self.logits = logits - rnp.logsumexp(logits, axis=-1, keepdims=True)  # normalised

    @property
    def probs(self):
        return rnp.exp(self.logits)

    @property
    def batch_shape(self) -> tuple:
        return tuple(self.logits.shape[:-1])

    @property
    def mode(self):
        return rnp.argmax(self.logits, axis=-1)

    def log_prob(self, value):
        """The log-probability of the integer categories ``value`` (shaped like the batch)."""
        value = rnp.asarray(value)
        if value.dtype.kind not in "iub":  # (1.7 would be read as category 1)
            raise DTypeError(f"Categorical.log_prob takes integer categories, got {value.dtype} "
                             "values: cast whole numbers with rnp.astype(value, 'int64')")
        shape = tuple(np.broadcast_shapes(value.shape, self.batch_shape))
        logits = rnp.broadcast_to(self.logits, shape + self.logits.shape[-1:])
        index = rnp.expand_dims(rnp.broadcast_to(value, shape), -1)
        return rnp.take_along_axis(logits, rnp.astype(index, np.int64), axis=-1,
                                   nonnegative=True)[..., 0]

    def _finite_logits(self):  # (as PyTorch: 0 * log 0 is 0, not nan, and so is its gradient)
        return rnp.maximum(self.logits, rnp.finfo(self.logits.dtype).min)

    def entropy(self):
        return -rnp.sum(self.probs * self._finite_logits(), axis=-1)

    def sample(self, rng, sample_shape=()):
        """Categories drawn with ``rng``: shape ``sample_shape + batch_shape`` (no gradient)."""
        shape = tuple(sample_shape) + self.logits.shape
        logits = rnp.broadcast_to(rnp.stop_gradient(self.logits), shape)
        return rnp.random.categorical(_key(rng), logits, axis=-1)


class Normal:
    """A normal distribution with mean ``loc`` and standard deviation ``scale``
    (broadcast together: the batch)."""

    def __init__(self, loc, scale):
        self.loc, self.scale = _float_parameters(loc, scale)
        shape = tuple(np.broadcast_shapes(self.loc.shape, self.scale.shape))
        self.loc, self.scale = rnp.broadcast_to(self.loc, shape), rnp.broadcast_to(
            self.scale, shape)

    @property
    def batch_shape(self) -> tuple:
        return tuple(self.loc.shape)

    mean = mode = property(lambda self: self.loc)
    stddev = property(lambda self: self.scale)
    variance = property(lambda self: self.scale * self.scale)

    def log_prob(self, value):
        z = (rnp.asarray(value) - self.loc) / self.scale
        return -0.5 * z * z - rnp.log(self.scale) - 0.5 * math.log(2 * math.pi)

    def entropy(self):
        return 0.5 + 0.5 * math.log(2 * math.pi) + rnp.log(self.scale)

    def rsample(self, rng, sample_shape=()):
        """``loc + scale * eps`` (the reparameterised draw: gradients reach loc and scale)."""
        shape = tuple(sample_shape) + self.batch_shape
        eps = rnp.random.normal(_key(rng), shape, self.loc.dtype)
        return self.loc + self.scale * eps

    def sample(self, rng, sample_shape=()):
        """A draw without gradient: shape ``sample_shape + batch_shape``."""
        return rnp.stop_gradient(self.rsample(rng, sample_shape))


def kl_divergence(p, q):
    """KL(p || q) for two ``Categorical``s or two ``Normal``s (over the batch)."""
    if isinstance(p, Categorical) and isinstance(q, Categorical):
        diff = p._finite_logits() - q.logits  # (q 0 where p is not: inf, as PyTorch's)
        return rnp.sum(p.probs * rnp.where(p.probs > 0, diff, 0.0), axis=-1)
    if isinstance(p, Normal) and isinstance(q, Normal):
        ratio = p.scale / q.scale
        diff = (p.loc - q.loc) / q.scale
        return 0.5 * (ratio * ratio + diff * diff - 1.0) - rnp.log(ratio)
    raise ReplicateError(f"kl_divergence of {type(p).__name__} and {type(q).__name__}: "
                         "Categorical/Categorical and Normal/Normal are written")


__all__ = ["Categorical", "Normal", "kl_divergence"]
