"""Counter-based random numbers driven by explicit keys, and a ``Generator`` whose key is state.

A key is a ``uint32[2]`` array. The same key always gives the same numbers; ``split`` derives new
independent keys. In graph mode a ``Generator``'s key is a traced variable, so a compiled step
draws fresh numbers on every call.

>>> import replicate.numpy as rnp
>>> k = rnp.random.key(0)
>>> a, b = rnp.random.split(k)
>>> rnp.random.uniform(a, (3,)).shape
(3,)
"""

from __future__ import annotations

import numpy as np

from ..errors import ReplicateError
from ..graph.core import bind
from ._base import as_array, float_operand
from ._elementwise import cos, less, log, multiply, negative, sqrt, subtract
from ._reductions import argmax

_GOLDEN = 0x9E3779B97F4A7C15


def key(seed: int):
    """A key from an integer seed."""
    seed = int(seed) & 0xFFFFFFFFFFFFFFFF
    mixed = (seed * _GOLDEN + 0x6A09E667F3BCC909) & 0xFFFFFFFFFFFFFFFF
    return as_array(np.array([mixed & 0xFFFFFFFF, mixed >> 32], dtype=np.uint32))


def _check_key(k):
    k = as_array(k)
    if k.shape != (2,) or k.dtype != np.uint32:
        raise ReplicateError(f"a random key is a uint32[2] array (rnp.random.key(seed)); got {k}")
    return k


def split(k, num=2):
    """``num`` new keys, as a ``uint32[num, 2]`` array (iterate or index it)."""
    return bind("random_bits", _check_key(k), shape=(int(num), 2), dtype=np.dtype(np.uint32),
                stream=1)


def fold_in(k, data: int):
    """A new key derived from ``k`` and a Python integer (e.g. a replica id or step)."""
    return bind("random_bits", _check_key(k), shape=(2,), dtype=np.dtype(np.uint32),
                stream=3 + (int(data) & 0x3FFFFFFF))


def uniform(k, shape=(), dtype=np.float32, minval=0.0, maxval=1.0):
    """Uniform numbers in ``[minval, maxval)``."""
    u = bind("random_uniform", _check_key(k), shape=tuple(shape), dtype=np.dtype(dtype))
    if minval == 0.0 and maxval == 1.0:
        return u
    return u * (maxval - minval) + minval


def normal(k, shape=(), dtype=np.float32):
    """Standard normal numbers (Box–Muller)."""
    k1, k2 = split(k)
    u1 = subtract(1.0, uniform(k1, shape, dtype))  # in (0, 1]
    u2 = uniform(k2, shape, dtype)
    return multiply(sqrt(multiply(-2.0, log(u1))), cos(multiply(2 * np.pi, u2)))


def bernoulli(k, p=0.5, shape=None):
    """Booleans that are true with probability ``p``."""
    p = as_array(p)
    shape = p.shape if shape is None else tuple(shape)
    return less(uniform(k, shape, p.dtype if p.dtype.kind == "f" else np.float32), p)


def categorical(k, logits, axis=-1):
    """Sample category indices from unnormalised log-probabilities (Gumbel-max)."""
    logits = float_operand(logits)
    u = uniform(k, logits.shape, logits.dtype)
    tiny = np.finfo(logits.dtype).tiny
    gumbel = negative(log(negative(log(u + tiny))))
    return argmax(logits + gumbel, axis=axis)


class Generator:
    """A stream of random numbers whose key lives in a ``Variable`` (traced in graph mode).

    >>> import replicate.numpy as rnp
    >>> g = rnp.random.Generator(seed=1)
    >>> a, b = g.normal((2,)), g.normal((2,))
    >>> bool((a.numpy() != b.numpy()).all())
    True
    """

    def __init__(self, seed: int = 0, name: str = "rng"):
        from ..state import Variable  # state sits above the op namespace (it installs its ops)

        self.state = Variable(key(seed).numpy(), name=name)

    def next_key(self):
        """A fresh key; advances the generator's state."""
        new_state, sub = split(self.state.read())
        self.state.assign(new_state)
        from ..context import replica_key_fold  # context sits above: it folds with fold_in

        return replica_key_fold(sub)

    def uniform(self, shape=(), dtype=np.float32, minval=0.0, maxval=1.0):
        return uniform(self.next_key(), shape, dtype, minval, maxval)

    def normal(self, shape=(), dtype=np.float32):
        return normal(self.next_key(), shape, dtype)

    def bernoulli(self, p=0.5, shape=None):
        return bernoulli(self.next_key(), p, shape)

    def categorical(self, logits, axis=-1):
        return categorical(self.next_key(), logits, axis)
