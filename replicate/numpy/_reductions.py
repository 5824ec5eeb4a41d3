"""Reductions over axes, with keepdims."""

from __future__ import annotations

import builtins
import math

import numpy as np

from ..graph.core import bind
from ._base import as_array, cast, float_operand, norm_axes, static_axis, wide_operand
from ._elementwise import (
    divide,
    exp,
    greater,
    isfinite,
    log,
    multiply,
    sqrt,
    stop_gradient,
    subtract,
    where,
)
from ._shape import reshape, squeeze


def _keep(out, x, axes, keepdims):
    if not keepdims:
        return out
    return reshape(out, tuple(1 if i in axes else d for i, d in enumerate(x.shape)))


def _reduce(prim, x, axis, keepdims):
    x = as_array(x)
    axes = norm_axes(axis, x.ndim)
    return _keep(bind(prim, x, axes=axes), x, axes, keepdims)


def sum(x, axis=None, keepdims=False, dtype=None):  # noqa: A001 - mirrors numpy
    """Sum over ``axis`` (all axes when None); bools and small ints sum as int64.

    >>> import replicate.numpy as rnp
    >>> rnp.sum(rnp.asarray([[1.0, 2.0], [3.0, 4.0]]), axis=0).tolist()
    [4.0, 6.0]
    """
    return _reduce("reduce_sum", _accumulator(x, dtype), axis, keepdims)


def _accumulator(x, dtype):
    """What NumPy sums and multiplies in: ``dtype``, or 64-bit for bools and small integers."""
    x = wide_operand(x)
    if dtype is not None:
        return cast(x, dtype)
    kind, size = x.dtype.kind, x.dtype.itemsize  # (bfloat16's kind is "V")
    if kind == "b" or (kind == "i" and size < 8):
        return cast(x, np.int64)
    if kind == "u" and size < 8:
        return cast(x, np.uint64)
    return x


def prod(x, axis=None, keepdims=False, dtype=None):
    """Product over ``axis``; bools and small ints multiply as 64-bit integers (as in NumPy).

    >>> import replicate.numpy as rnp
    >>> rnp.prod(rnp.asarray([[1, 2], [3, 4]], dtype="int32"), axis=1).tolist()
    [2, 12]
    """
    return _reduce("reduce_prod", _accumulator(x, dtype), axis, keepdims)


def _scan(prim, x, axis, dtype, **attrs):
    x = _accumulator(x, dtype)
    if axis is None:
        return bind(prim, reshape(x, (-1,)), axis=0, **attrs)
    (axis,) = norm_axes(static_axis(axis), x.ndim)
    return bind(prim, x, axis=axis, **attrs)


def cumsum(x, axis=None, dtype=None):
    """Running sums along ``axis`` (of the flattened array when None), as ``np.cumsum``; bools
    and small integers add up as 64-bit integers. A primitive (NumPy ``cumsum``, JAX
    ``lax.cumsum``); its gradient is the running sum of the cotangent from the other end.

    >>> import replicate.numpy as rnp
    >>> rnp.cumsum(rnp.asarray([[1, 2], [3, 4]]), axis=0).tolist()
    [[1, 2], [4, 6]]
    """
    return _scan("cumsum", x, axis, dtype, reverse=False)


def cumprod(x, axis=None, dtype=None):
    """Running products along ``axis`` (of the flattened array when None), as ``np.cumprod``.
    A primitive (NumPy ``cumprod``, JAX ``lax.cumprod``). Its gradient is exact with zeros in
    ``x`` too: before a row's first zero it is ``sum_{j>=i} g_j out_j / x_i``, at the first zero
    the same sum with the zero read as 1, after it 0 (second derivatives through the zeros are
    not all exact, as for ``prod``; a running product that underflows to 0 with no zero entry
    loses the terms past it; an inf entry makes NaN of the gradient's entries that divide by
    it, where JAX gives numbers — ``prod``'s gradient divides by nothing and has them).

    >>> import replicate as rp, replicate.numpy as rnp
    >>> x = rnp.asarray([2.0, 0.0, 3.0])
    >>> rnp.cumprod(x).tolist(), rp.grad(rnp.sum(rnp.cumprod(x)), x).tolist()
    ([2.0, 0.0, 0.0], [1.0, 8.0, 0.0])
    """
    return _scan("cumprod", x, axis, dtype)


def max(x, axis=None, keepdims=False):  # noqa: A001
    """The largest element over ``axis`` (an int, a tuple, or None: all) as ``np.max``: NaN
    where any element is NaN. An empty axis is a ``ShapeError`` (NumPy: ``ValueError``).

    >>> import replicate.numpy as rnp
    >>> rnp.max(rnp.asarray([[1, 5], [7, 2]]), axis=0).tolist()
    [7, 5]
    """
    return _reduce("reduce_max", x, axis, keepdims)


def min(x, axis=None, keepdims=False):  # noqa: A001
    """The smallest element over ``axis`` (an int, a tuple, or None: all) as ``np.min``: NaN
    where any element is NaN. An empty axis is a ``ShapeError`` (NumPy: ``ValueError``)."""
    return _reduce("reduce_min", x, axis, keepdims)


def _count(x, axis):
    axes = norm_axes(axis, x.ndim)
    return math.prod(x.shape[a] for a in axes)


def mean(x, axis=None, keepdims=False):
    """Arithmetic mean over ``axis``."""
    x = wide_operand(float_operand(x))
    return divide(sum(x, axis, keepdims), float(_count(x, axis)))


def _ddof(ddof, correction):
    """``correction`` (the Array API's name) as ``ddof``; both given is NumPy 2's ValueError."""
    if correction is None:
        return ddof
    if ddof != 0:
        raise ValueError("var/std: ddof and correction can't be provided simultaneously")
    return correction


def var(x, axis=None, keepdims=False, ddof=0, *, correction=None):
    """Variance over ``axis``: the sum of squared deviations over ``max(n - ddof, 0)``, as
    NumPy (``ddof`` >= the count gives inf, or NaN where every deviation is 0). ``correction``
    is the Array API's name of ``ddof`` (NumPy 2 takes either, not both).

    >>> import replicate.numpy as rnp
    >>> float(rnp.var(rnp.asarray([1.0, 3.0]))), float(rnp.var(rnp.asarray([1.0, 3.0]), ddof=3))
    (1.0, inf)
    >>> float(rnp.var(rnp.asarray([1.0, 3.0]), correction=1))
    2.0
    """
    ddof = _ddof(ddof, correction)
    x = wide_operand(float_operand(x))
    centred = subtract(x, mean(x, axis, keepdims=True))
    count = builtins.max(_count(x, axis) - ddof, 0)
    return divide(sum(multiply(centred, centred), axis, keepdims), float(count))


def std(x, axis=None, keepdims=False, ddof=0, *, correction=None):
    """Standard deviation, ``sqrt(var(x, axis, keepdims, ddof))`` (``correction``: ``ddof``).

    Gradient: where the spread is zero (every value equal) it is 0 — the derivative along every
    direction that keeps the spread zero, and the subgradient of the cone ``std`` is there — not
    NaN (``d sqrt(v) / dv`` is infinite at 0, and JAX gives NaN).

    >>> import replicate as rp, replicate.numpy as rnp
    >>> x = rnp.asarray([2.0, 2.0])
    >>> float(rnp.std(x)), rp.grad(rnp.std(x), x).tolist()
    (0.0, [0.0, 0.0])
    """
    v = var(x, axis, keepdims, _ddof(ddof, correction))
    spread = greater(v, 0.0)
    # sqrt's gradient at the positive variances only; elsewhere the value, with no gradient
    return where(spread, sqrt(where(spread, v, 1.0)), stop_gradient(sqrt(v)))


def logsumexp(x, axis=None, keepdims=False):
    """``log(sum(exp(x)))`` computed stably (the max is subtracted first)."""
    x = wide_operand(float_operand(x))
    m = stop_gradient(max(x, axis, keepdims=True))
    m = where(isfinite(m), m, 0.0)  # an all -inf (or an inf) slice gives -inf (inf), not nan
    out = log(sum(exp(subtract(x, m)), axis, keepdims=True)) + m
    if keepdims:
        return out
    return squeeze(out, norm_axes(axis, x.ndim))


def _arg(prim, x, axis, keepdims):
    x = as_array(x)
    if axis is None:
        out = bind(prim, reshape(x, (-1,)), axis=0)
        return _keep(out, x, tuple(range(x.ndim)), keepdims)
    (ax,) = norm_axes(axis, x.ndim)
    return _keep(bind(prim, x, axis=ax), x, (ax,), keepdims)


def argmax(x, axis=None, keepdims=False):
    """The int64 index of the largest element along ``axis`` (None: of the flattened array), as
    ``np.argmax``: the first of equal ones, the first NaN if there is one. An empty axis is a
    ``ShapeError`` (NumPy: ``ValueError``).

    >>> import replicate.numpy as rnp
    >>> rnp.argmax(rnp.asarray([[1.0, 5.0], [7.0, 7.0]]), axis=1).tolist()
    [1, 0]
    """
    return _arg("argmax", x, axis, keepdims)


def argmin(x, axis=None, keepdims=False):
    """The int64 index of the smallest element along ``axis`` (None: of the flattened array),
    as ``np.argmin``: the first of equal ones, the first NaN if there is one. An empty axis is a
    ``ShapeError`` (NumPy: ``ValueError``)."""
    return _arg("argmin", x, axis, keepdims)
