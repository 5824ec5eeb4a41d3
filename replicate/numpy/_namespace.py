"""The rest of the Array API's namespace (``__array_api_version__`` 2023.12), so that ``rnp`` is
one (``Array.__array_namespace__()`` returns it): the dtype queries ``iinfo``, ``finfo`` and
``isdtype``; the inspection namespace ``__array_namespace_info__()``; the standard's spellings of
functions ``rnp`` has under NumPy's names (``acos`` is ``arccos``, ``pow`` is ``power``, ...);
and compositions of ``rnp``'s functions (``isnan``, ``isinf``, ``logical_xor``, ``all``,
``any``, ``cumulative_sum``, ``unstack``, ``tensordot``), which trace, run on every backend and
differentiate as their pieces do.

>>> import replicate.numpy as rnp
>>> x = rnp.asarray([1.0, rnp.nan, rnp.inf])
>>> x.__array_namespace__() is rnp, rnp.isnan(x).tolist(), bool(rnp.any(rnp.isinf(x)))
(True, [False, True, False], True)
"""

from __future__ import annotations

import builtins
import numbers
import string
from collections import namedtuple

import numpy as np

from .. import dtypes as _dtypes
from ..errors import ShapeError
from ..graph.core import Array
from ._base import as_array, cast, check_device, norm_axes
from ._creation import zeros
from ._elementwise import (
    abs,
    arccos,
    arccosh,
    arcsin,
    arcsinh,
    arctan,
    arctan2,
    arctanh,
    equal,
    invert,
    less,
    logical_not,
    not_equal,
    power,
)
from ._linalg import einsum
from ._reductions import cumsum, sum
from ._shape import concatenate, getitem, moveaxis

__array_api_version__ = "2023.12"
acos, acosh, asin, asinh, atan, atan2, atanh = (arccos, arccosh, arcsin, arcsinh, arctan,
                                                arctan2, arctanh)
pow = power  # noqa: A001 - the standard's name
bitwise_invert = invert


def _dtype(x):
    """The dtype of an array, or a dtype itself."""
    if isinstance(x, Array) or hasattr(x, "read"):
        return np.dtype(x.dtype)
    return _dtypes.as_dtype(x)


def iinfo(type):  # noqa: A002 - the standard's name
    """``np.iinfo`` of an integer dtype or array (``bits``, ``min``, ``max``, ``dtype``)."""
    return np.iinfo(_dtype(type))


FInfo = namedtuple("FInfo", "bits eps max min smallest_normal tiny resolution dtype")


def finfo(type):  # noqa: A002 - the standard's name
    """The Array API's ``finfo`` of a float dtype or array, bfloat16 included: ``np.finfo``'s
    ``bits``, ``eps``, ``max``, ``min``, ``smallest_normal`` (``tiny``), ``resolution`` as Python
    numbers, and ``dtype``."""
    f = _dtypes.finfo(_dtype(type))
    return FInfo(int(f.bits), float(f.eps), float(f.max), float(f.min),
                 float(f.smallest_normal), float(f.smallest_normal), float(f.resolution),
                 np.dtype(f.dtype))


_KINDS = {"bool": "b", "signed integer": "i", "unsigned integer": "u", "integral": "iu",
          "real floating": "f", "complex floating": "c", "numeric": "iufc"}


def isdtype(dtype, kind):
    """Whether ``dtype`` is of ``kind``: a dtype, a kind's name ("bool", "signed integer",
    "unsigned integer", "integral", "real floating", "complex floating", "numeric") or a tuple
    of them (the Array API's ``isdtype``; bfloat16 is a real floating type)."""
    dtype = np.dtype(dtype)
    if isinstance(kind, tuple):
        return builtins.any(isdtype(dtype, k) for k in kind)
    if isinstance(kind, str):
        if kind not in _KINDS:
            raise ValueError(f"isdtype: unknown kind {kind!r}; the kinds are {sorted(_KINDS)}")
        return (dtype == _dtypes.bfloat16 and "f" in _KINDS[kind]) or dtype.kind in _KINDS[kind]
    return dtype == _dtypes.as_dtype(kind)


_ALL = {name: np.dtype(name) for name in ("bool", "int8", "int16", "int32", "int64", "uint8",
                                          "uint16", "uint32", "uint64", "float32", "float64")}


class _Info:
    """What ``__array_namespace_info__()`` returns: the library on the host's CPU ("cpu"; a
    compiled step places its values itself), its default dtypes and dtypes."""

    def capabilities(self):
        return {"boolean indexing": True, "data-dependent shapes": True, "max dimensions": 64}

    def default_device(self):
        return "cpu"

    def devices(self):
        return ["cpu"]

    def default_dtypes(self, *, device=None):
        check_device(device, "default_dtypes")
        # zeros/ones/eye/full of a float are float32 (the project's default float)
        return {"real floating": np.dtype(np.float32), "integral": np.dtype(np.int64),
                "indexing": np.dtype(np.int64)}

    def dtypes(self, *, device=None, kind=None):
        check_device(device, "dtypes")
        return {name: d for name, d in _ALL.items() if kind is None or isdtype(d, kind)}


def __array_namespace_info__():  # noqa: N807 - the standard's name
    return _Info()


def real(x):
    """The real part (``np.real``): of a real array, the array itself (the library has no complex
    dtype)."""
    return as_array(x)


def imag(x):
    """The imaginary part (``np.imag``): of a real array, zeros of its dtype and shape."""
    x = as_array(x)
    return zeros(x.shape, x.dtype)


def conj(x):
    """The complex conjugate (``np.conj``): of a real array, its values (a bool array as int8, as
    NumPy's)."""
    x = as_array(x)
    return cast(x, np.int8) if x.dtype == np.bool_ else x


def isnan(x):
    """Where ``x`` is NaN (never, for integers and bools)."""
    x = as_array(x)
    return not_equal(x, x)


def isinf(x):
    """Where ``x`` is +inf or -inf (never, for integers and bools)."""
    x = as_array(x)
    if not _dtypes.is_float(x.dtype):
        return not_equal(x, x)  # all false
    return equal(abs(x), np.inf)


def _truth(x):
    x = as_array(x)
    return x if x.dtype == np.bool_ else not_equal(x, 0)


def logical_xor(a, b):
    """NumPy's ``logical_xor``: bool, operands read as truth values."""
    return not_equal(_truth(a), _truth(b))


def all(x, axis=None, keepdims=False):  # noqa: A001 - NumPy's name
    """Whether every entry along ``axis`` is true (nonzero; True for none: NumPy's)."""
    return equal(sum(logical_not(_truth(x)), axis=axis, keepdims=keepdims), 0)


def any(x, axis=None, keepdims=False):  # noqa: A001 - NumPy's name
    """Whether some entry along ``axis`` is true (nonzero)."""
    return less(0, sum(_truth(x), axis=axis, keepdims=keepdims))


def cumulative_sum(x, axis=None, dtype=None, include_initial=False):
    """The Array API's ``cumulative_sum``: ``cumsum`` (``axis`` may be None only for a 1-D
    ``x``), with a leading 0 when ``include_initial``."""
    x = as_array(x)
    if axis is None:
        if x.ndim != 1:
            raise ShapeError("cumulative_sum needs axis= for an array of rank other than 1")
        axis = 0
    out = cumsum(x, axis=axis, dtype=dtype)
    if include_initial:
        axis = norm_axes(axis, x.ndim)[0]
        shape = out.shape[:axis] + (1,) + out.shape[axis + 1:]
        out = concatenate([zeros(shape, out.dtype), out], axis=axis)
    return out


def unstack(x, axis=0):
    """The arrays along ``axis``, a tuple (the Array API's ``unstack``)."""
    x = moveaxis(as_array(x), axis, 0)
    return tuple(getitem(x, i) for i in range(x.shape[0]))


def tensordot(a, b, axes=2):
    """``np.tensordot``: the sum over the last ``axes`` axes of ``a`` and the first of ``b`` (an
    int), or over the axes paired in ``axes`` (two sequences); an ``einsum``."""
    a, b = as_array(a), as_array(b)
    if isinstance(axes, numbers.Integral):
        axes = (list(range(a.ndim - axes, a.ndim)), list(range(axes)))
    left, right = ([x] if isinstance(x, numbers.Integral) else list(x) for x in axes)
    if len(left) != len(right):
        raise ShapeError(f"tensordot: {len(left)} axes of a paired with {len(right)} of b")
    left = [norm_axes(i, a.ndim)[0] for i in left]
    right = [norm_axes(i, b.ndim)[0] for i in right]
    letters = iter(string.ascii_letters)
    ta = [next(letters) for _ in range(a.ndim)]
    tb = [next(letters) for _ in range(b.ndim)]
    for i, j in zip(left, right):
        tb[j] = ta[i]
    out = [c for i, c in enumerate(ta) if i not in left] + [c for j, c in enumerate(tb)
                                                             if j not in right]
    if a.dtype != b.dtype:
        dtype = _dtypes.result_type(a.dtype, b.dtype)
        a, b = cast(a, dtype), cast(b, dtype)
    return einsum(f"{''.join(ta)},{''.join(tb)}->{''.join(out)}", a, b)


__all__ = ["acos", "acosh", "all", "any", "asin", "asinh", "atan", "atan2", "atanh",
           "bitwise_invert", "conj", "cumulative_sum", "finfo", "iinfo", "imag", "isdtype",
           "isinf", "isnan", "logical_xor", "pow", "real", "tensordot", "unstack"]
