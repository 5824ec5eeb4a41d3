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

import itertools

import numpy as np

from ..dtypes import finfo, is_float, is_low_precision
from ..errors import ReplicateError
from ..graph.core import bind
from ._base import as_array, cast, float_operand
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
    """Standard normal numbers (Box–Muller; float16 and bfloat16 drawn in float32 and rounded:
    from their own few-bit uniforms no draw would pass 3.3 standard deviations)."""
    k1, k2 = split(k)
    work = np.float32 if is_low_precision(dtype) else np.dtype(dtype)
    u1 = subtract(1.0, uniform(k1, shape, work))  # in (0, 1]
    u2 = uniform(k2, shape, work)
    z = multiply(sqrt(multiply(-2.0, log(u1))), cos(multiply(2 * np.pi, u2)))
    return z if work == np.dtype(dtype) else cast(z, dtype)


def bernoulli(k, p=0.5, shape=None):
    """Booleans that are true with probability ``p``."""
    p = as_array(p)
    shape = p.shape if shape is None else tuple(shape)
    return less(uniform(k, shape, p.dtype if is_float(p.dtype) else np.float32), p)


def categorical(k, logits, axis=-1):
    """Sample category indices from unnormalised log-probabilities (Gumbel-max; float16 and
    bfloat16 logits in float32, whose uniforms resolve small probabilities)."""
    logits = float_operand(logits)
    if is_low_precision(logits.dtype):
        logits = cast(logits, np.float32)
    u = uniform(k, logits.shape, logits.dtype)
    tiny = finfo(logits.dtype).tiny
    gumbel = negative(log(negative(log(u + tiny))))
    return argmax(logits + gumbel, axis=axis)


# Default seeds: the n-th Generator created without a seed in this process (since the last
# ``seed(base)``) takes ``key(_mix64(_mix64(_DEFAULT_TAG ^ base) + n))``: distinct for every n
# (_mix64 is a bijection of 64-bit integers, as ``key`` is) and, being a scrambled 64-bit number,
# in practice never the seed a user writes. Plain integers, no ops: a Generator may be built
# while a step is traced.
_MASK64 = 0xFFFFFFFFFFFFFFFF
_DEFAULT_TAG = 0xD1B54A32D192ED03
_default_base = 0
_default_count = itertools.count()


def _mix64(z: int) -> int:
    """SplitMix64's finaliser: a bijection of 64-bit integers that scrambles every bit."""
    z = (z + _GOLDEN) & _MASK64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK64
    return z ^ (z >> 31)


def seed(base: int = 0) -> None:
    """Restart the default seeds from ``base``: the Generators (and ``rp.nn.Dropout`` layers)
    created afterwards without an explicit seed take, in creation order, the same streams as
    after any other ``seed(base)`` with this ``base``. For a process that builds its model more
    than once (a notebook cell run again, a test); a program run from its start needs no call."""
    global _default_base, _default_count
    _default_base = int(base) & _MASK64
    _default_count = itertools.count()


def default_seed() -> int:
    """The seed of the next Generator created without one (advances the creation count)."""
    return _mix64((_mix64(_DEFAULT_TAG ^ _default_base) + next(_default_count)) & _MASK64)


class Generator:
    """A stream of random numbers whose key lives in a ``Variable`` (traced in graph mode).

    ``seed``: an integer gives the same stream every time (equal seeds, equal streams). ``None``
    (the default) gives every Generator its own stream: the n-th Generator created in the
    process without a seed takes the n-th default seed (``self.seed`` tells which). That is
    deterministic: the same program creates its generators in the same order on every rank and
    in every run, so runs are reproducible and the ranks agree (each replica then folds in its
    id when it draws). No two default Generators share a stream, nor (in practice) a default and
    an explicitly seeded one. ``rnp.random.seed(base)`` restarts the count.

    >>> import replicate.numpy as rnp
    >>> g = rnp.random.Generator(seed=1)
    >>> a, b = g.normal((2,)), g.normal((2,))
    >>> bool((a.numpy() != b.numpy()).all())
    True
    >>> g1, g2 = rnp.random.Generator(), rnp.random.Generator()  # two streams, not one
    >>> g1.uniform((3,)).tolist() != g2.uniform((3,)).tolist()
    True
    """

    def __init__(self, seed: int | None = None, name: str = "rng", *, local: bool = False):
        from ..state import Variable  # state sits above the op namespace (it installs its ops)

        self.seed = default_seed() if seed is None else int(seed)
        # local=True: this process's own stream (an actor's, or one made on one rank only)
        self.state = Variable(key(self.seed).numpy(), name=name, local=local)

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
