"""``replicate.numpy``: the NumPy-like op namespace. Every function works traced and eager.

>>> import replicate.numpy as rnp
>>> x = rnp.asarray([[1.0, 2.0], [3.0, 4.0]])
>>> (x @ x.T).tolist()
[[5.0, 11.0], [11.0, 25.0]]

The dtypes are NumPy's own types (``rnp.float32`` is ``np.float32``): ``float16``, ``float32``,
``float64``, ``int8``, ``int16``, ``int32``, ``int64``, ``uint8``, ``uint16``, ``uint32``,
``uint64``, ``bool_`` (and the Array API's ``bool``); ``newaxis`` is NumPy's too (``None``).

Dtypes are NumPy's (NumPy 2 promotion, Python scalars weak), result for result; the differences
are deliberate and few (``tests/api/test_numpy_dtypes.py`` checks every elementwise function on
every dtype against NumPy, and lists these):

* the default float is float32 (JAX's and PyTorch's) wherever a function makes float values
  from Python numbers: ``zeros``, ``ones``, ``empty`` and ``eye`` without a dtype, ``full`` of
  a Python float (``full`` otherwise takes its fill value's dtype: bool, int64 for an int —
  PyTorch's rule), ``arange`` with a Python float and ``linspace`` of Python numbers. What
  converts data keeps NumPy's dtype: ``asarray`` of Python floats is float64, and a NumPy value
  given to ``arange``, ``linspace`` or ``full`` keeps its own dtype. Where float32 would change
  such values beyond rounding (two made one past 2**24, a finite one made inf) it is a
  ``DTypeError`` naming ``dtype=rnp.float64``, never a silently repeated or infinite value;
* float functions (``exp``, ``sqrt``, ``sin``, ...) of bools and integers are NumPy's: float16
  for bools and 8-bit integers, float64 for 32- and 64-bit ones; ``mean``/``var``/``std`` of
  them are float64;
* ``round``, ``floor`` and ``ceil`` return integers and bools as they are (NumPy's ``round``
  makes bools float16); an integer divided by 0 is 0 (``reciprocal`` too, where NumPy's value
  depends on the platform); float ``floor_divide`` is NumPy's (``inf // 2`` is NaN);
* ``~`` is bitwise not of integers and logical not of bools; ``&``, ``|``, ``^``, ``<<`` and
  ``>>`` are NumPy's bitwise ops (``&`` of bools is logical and, a bool).

>>> [rnp.full((), v).dtype.name for v in (True, 3, 0.5)], rnp.exp(rnp.asarray(True)).dtype
(['bool', 'int64', 'float32'], dtype('float16'))
"""

from __future__ import annotations

import sys as _sys

import numpy as _np

from ..errors import PlacementError as _PlacementError
from ..graph.core import Array
from ..graph.core import register_op_namespace as _register_op_namespace
from . import _elementwise, fft, linalg, random
from ._arrayapi import (
    astype,
    broadcast_arrays,
    can_cast,
    concat,
    masked_fill,
    matrix_transpose,
    permute_dims,
    result_type,
    vecdot,
)
from ._base import as_array, cast
from ._bitwise import (
    bitwise_and,
    bitwise_left_shift,
    bitwise_or,
    bitwise_right_shift,
    bitwise_xor,
    left_shift,
    right_shift,
)
from ._creation import (
    arange,
    empty,
    empty_like,
    eye,
    full,
    full_like,
    linspace,
    meshgrid,
    ones,
    ones_like,
    tril,
    triu,
    zeros,
    zeros_like,
)
from ._elementwise import *  # noqa: F403  (every op wrapper; its __all__ lists them)
from ._linalg import avg_pool2d, conv2d, conv_transpose2d, dot, einsum, matmul, max_pool2d
from ._namespace import *  # noqa: F403  (the Array API's names; its __all__ lists them)
from ._namespace import __array_api_version__, __array_namespace_info__
from ._reductions import (
    argmax,
    argmin,
    cumprod,
    cumsum,
    logsumexp,
    max,
    mean,
    min,
    prod,
    std,
    sum,
    var,
)
from ._reorder import argsort, flip, repeat, roll, searchsorted, sort, tile, top_k
from ._sets import nonzero, unique, unique_all, unique_counts, unique_inverse, unique_values
from ._shape import (
    array,
    asarray,
    broadcast_to,
    concatenate,
    expand_dims,
    from_dlpack,
    getitem,
    moveaxis,
    one_hot,
    pad,
    ravel,
    reshape,
    split,
    squeeze,
    stack,
    swapaxes,
    take,
    take_along_axis,
    transpose,
)
from ._signs import copysign, hypot, signbit

float16, float32, float64 = _np.float16, _np.float32, _np.float64
int8, int16, int32, int64 = _np.int8, _np.int16, _np.int32, _np.int64
uint8, uint16, uint32, uint64, bool_ = _np.uint8, _np.uint16, _np.uint32, _np.uint64, _np.bool_
pi, e, inf, nan, newaxis = _np.pi, _np.e, _np.inf, _np.nan, None
for _name in _elementwise.__all__:  # the wrappers _unary and _binary made, by their names here
    if "<locals>" in globals()[_name].__qualname__:  # (the API reference finds them by it)
        globals()[_name].__qualname__ = _name
del _name


def _install_operators(cls):
    """Give ``cls`` (Array, Variable) NumPy's operators, each a call into this namespace."""

    def swap(fn):
        return lambda self, other: fn(other, self)

    ops = {
        "__add__": add, "__sub__": subtract, "__mul__": multiply, "__truediv__": divide,
        "__pow__": power, "__matmul__": matmul, "__floordiv__": floor_divide, "__mod__": mod,
        "__radd__": swap(add), "__rsub__": swap(subtract), "__rmul__": swap(multiply),
        "__rtruediv__": swap(divide), "__rpow__": swap(power), "__rmatmul__": swap(matmul),
        "__rmod__": swap(mod), "__rfloordiv__": swap(floor_divide),
        "__lt__": less, "__le__": less_equal, "__gt__": greater, "__ge__": greater_equal,
        "__eq__": equal, "__ne__": not_equal,
        "__and__": bitwise_and, "__or__": bitwise_or, "__xor__": bitwise_xor,
        "__lshift__": left_shift, "__rshift__": right_shift,
        "__rand__": swap(bitwise_and), "__ror__": swap(bitwise_or), "__rxor__": swap(bitwise_xor),
        "__rlshift__": swap(left_shift), "__rrshift__": swap(right_shift),
        "__invert__": invert,
        "__neg__": negative, "__pos__": lambda self: self, "__abs__": abs,
        "__getitem__": getitem,
        "sum": sum, "mean": mean, "max": max, "min": min, "prod": prod, "var": var, "std": std,
        "argmax": argmax, "argmin": argmin, "reshape": lambda self, *s: reshape(
            self, s[0] if len(s) == 1 else s),
        "transpose": lambda self, *axes: transpose(self, axes or None),
        "astype": astype, "ravel": ravel, "squeeze": squeeze,
        "__array_namespace__": lambda self, api_version=None: _namespace_module(),
    }
    for name, fn in ops.items():
        setattr(cls, name, fn)
    cls.T = property(lambda self: transpose(self))
    cls.mT = property(lambda self: matrix_transpose(self))
    cls.device = property(lambda self: "cpu")  # the Array API's: a step places values itself
    cls.to_device = _to_device
    cls.__hash__ = object.__hash__


def _to_device(self, device, stream=None):
    """The Array API's ``to_device``: "cpu" (``x.device``) only; a step places values itself."""
    if device != "cpu":
        raise _PlacementError(f"to_device({device!r}): an Array's device is 'cpu'; a compiled "
                             "step places its values on its backend's device itself")
    return self


def _namespace_module():
    return _sys.modules[__name__]


_install_operators(Array)

__all__ = [n for n in dir() if not n.startswith("_") and n != "annotations"]  # (not __future__'s)
globals()["bool"] = _np.bool_  # the Array API's name (not in __all__: a star import keeps Python's)

# NumPy functions on Arrays and Variables refuse, naming the function here of the same name; the
# ufuncs NumPy's operators call (``ndarray * x`` is np.multiply(ndarray, x)) get the op instead.
_register_op_namespace(
    [n for n in __all__ if callable(globals()[n]) and not isinstance(globals()[n], type)],
    {_np.add: add, _np.subtract: subtract, _np.multiply: multiply, _np.divide: divide,
     _np.power: power, _np.matmul: matmul, _np.floor_divide: floor_divide, _np.remainder: mod,
     _np.less: less, _np.less_equal: less_equal, _np.greater: greater,
     _np.greater_equal: greater_equal, _np.equal: equal, _np.not_equal: not_equal,
     _np.bitwise_and: bitwise_and, _np.bitwise_or: bitwise_or, _np.bitwise_xor: bitwise_xor,
     _np.left_shift: left_shift, _np.right_shift: right_shift})
