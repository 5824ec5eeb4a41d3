"""Sign bits and magnitudes: ``signbit``, ``copysign``, ``hypot`` — each a primitive (NumPy's,
``jax.numpy``'s, CuPy's and C's own), so that the sign of a NaN or a zero and the range of
``hypot`` are NumPy's on every backend. Integers and bools are computed in the float NumPy's
float ufuncs give them (float16 for bools and 8-bit integers, float64 for 32- and 64-bit ones)."""

from __future__ import annotations

from ..graph.core import bind
from ._base import float_ufunc_operands, ufunc_float_operand


def signbit(x):
    """Whether the sign bit of each entry is set (``np.signbit``): True for negatives, -0.0 and
    a NaN with its sign bit set (``-np.nan``); a bool array. No gradient.

    >>> import numpy as np, replicate.numpy as rnp
    >>> rnp.signbit(rnp.asarray([-1.0, -0.0, 0.0, -np.nan, np.nan])).tolist()
    [True, True, False, True, False]
    """
    return bind("signbit", ufunc_float_operand(x))


def copysign(a, b):
    """The magnitude of ``a`` with the sign bit of ``b`` (``np.copysign``: a NaN's and a zero's
    sign bits count, ``copysign(1, -0.0)`` is -1). Gradient: ``±1`` into ``a`` (+ where the
    sign bits of ``a`` and ``b`` agree), 0 into ``b``.

    >>> import replicate.numpy as rnp
    >>> rnp.copysign(rnp.asarray([1.5, -2.0, 3.0]), rnp.asarray([-0.0, 1.0, -1.0])).tolist()
    [-1.5, 2.0, -3.0]
    """
    return bind("copysign", *float_ufunc_operands(a, b))


def hypot(a, b):
    """``sqrt(a**2 + b**2)`` without overflow or underflow of the squares (``np.hypot``: libm's
    ``hypot``; ``hypot(1e200, 1e200)`` is ``1.414e200``, ``hypot(inf, nan)`` is inf). Gradient
    ``(a, b) / hypot(a, b)``, 0 at the origin (a subgradient, as the 2-norm's).

    >>> import replicate.numpy as rnp
    >>> [f"{v:.12g}" for v in rnp.hypot(rnp.asarray([3.0, 1e200]),
    ...                                  rnp.asarray([4.0, 1e200])).tolist()]  # (libm's last bit)
    ['5', '1.41421356237e+200']
    """
    return bind("hypot", *float_ufunc_operands(a, b))


__all__ = ["copysign", "hypot", "signbit"]
