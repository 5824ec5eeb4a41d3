"""Conversions and dtype promotion shared by the op namespace."""

from __future__ import annotations

import numbers

import numpy as np

from ..dtypes import (
    as_dtype,
    autocast_dtype,
    is_float,
    is_low_precision,
    is_supported,
    result_type,
)
from ..errors import DTypeError, PlacementError, ReplicateError
from ..graph.core import Array, bind, concrete
from ..interop import from_foreign


def as_array(x, dtype=None) -> Array:
    """Turn an Array, Variable, NumPy array or Python number into an Array."""
    if isinstance(x, Array):
        return x if dtype is None or x.dtype == as_dtype(dtype) else cast(x, dtype)
    read = getattr(x, "read", None)
    if read is not None:
        return as_array(read(), dtype)
    if isinstance(x, (np.ndarray, np.generic, numbers.Number, list, tuple)):
        if isinstance(x, (np.ndarray, np.generic)) and not is_supported(x.dtype):
            raise DTypeError(f"cannot make an array from {type(x).__name__} of dtype {x.dtype}: "
                             "the dtypes are bool, integers and floats")  # not cast to ``dtype``
        try:
            value = np.asarray(x, dtype=None if dtype is None else as_dtype(dtype))
        except (TypeError, ValueError, OverflowError) as e:
            raise ReplicateError(f"cannot make an array from {type(x).__name__}: {e}") from None
        if not is_supported(value.dtype):  # complex, objects, strings, records, dates
            raise DTypeError(f"cannot make an array from {type(x).__name__} of dtype "
                             f"{value.dtype}: the dtypes are bool, integers and floats")
        return concrete(value)
    if hasattr(x, "__dlpack__") or hasattr(x, "__array__"):  # JAX, PyTorch, CuPy, ...
        return as_array(from_foreign(x), dtype)
    raise ReplicateError(f"expected an array or number, got {type(x).__name__}")




def check_device(device, what) -> None:
    """The Array API's ``device=`` keyword: None or ``"cpu"`` (every Array's ``x.device``, the
    namespace's only device; a compiled step places its values on its backend's device itself);
    anything else a ``PlacementError`` (a ``ValueError``)."""
    if device is not None and not (isinstance(device, str) and device == "cpu"):
        raise PlacementError(f"{what}(device={device!r}): the library's one device is 'cpu' "
                             "(x.device); a compiled step places its values on its backend's "
                             "device itself")


def dtype_key(x):
    """What np.result_type should see: Python scalars stay weak (NEP 50)."""
    if isinstance(x, (bool, int, float, complex)) and not isinstance(x, np.generic):
        return x
    if isinstance(x, Array):
        return x.dtype
    read = getattr(x, "read", None)
    if read is not None:
        return x.dtype
    return np.asarray(x).dtype


def result_dtype(*xs):
    if not xs:
        raise ReplicateError("no operands")
    try:
        return result_type(*[dtype_key(x) for x in xs])
    except (TypeError, ValueError) as e:  # (a ragged list is a ValueError)
        raise ReplicateError(f"no common dtype: {e}") from None


def _plain_number(x) -> bool:
    return type(x) is float or (type(x) is int and -2 ** 53 <= x <= 2 ** 53)


def promote(*xs, floating=False):
    """Convert operands to Arrays of one common dtype (NumPy promotion, weak Python scalars)."""
    if len(xs) == 2 and type(xs[0]) is Array and type(xs[1]) is Array \
            and xs[0].aval.dtype == xs[1].aval.dtype \
            and (not floating or is_float(xs[0].aval.dtype)):
        return list(xs)  # the common case, kept cheap for eager mode
    if len(xs) == 2:  # a float Array and a Python float (or exact int): its dtype (NEP 50)
        a, b = xs
        if type(a) is Array and _plain_number(b) and is_float(a.aval.dtype):
            return [a, concrete(np.asarray(b, a.aval.dtype))]
        if type(b) is Array and _plain_number(a) and is_float(b.aval.dtype):
            return [concrete(np.asarray(a, b.aval.dtype)), b]
    dtype = result_dtype(*xs)
    if floating and not is_float(dtype):
        dtype = np.dtype(np.float64)
    return [as_array(x, dtype) for x in xs]


def cast(x, dtype) -> Array:
    """Convert to ``dtype`` (differentiable between float types).

    >>> import replicate.numpy as rnp
    >>> rnp.cast(rnp.asarray([1.7, -2.2]), "int32").tolist()
    [1, -2]
    """
    x = as_array(x)
    try:
        dtype = as_dtype(dtype)
    except Exception:  # noqa: BLE001 - NumPy says TypeError, or SyntaxError for ","
        raise DTypeError(f"cast: {dtype!r} is not a dtype") from None
    if x.dtype == dtype:
        return x
    return bind("cast", x, dtype=dtype)


def autocast_operands(*xs) -> list:
    """Inside ``rp.autocast(dtype)``: float operands cast to ``dtype`` (matrix products) —
    float64 ones left as they are, as ``torch.autocast`` leaves doubles (a float64 model asked
    for float64)."""
    dtype = autocast_dtype()
    if dtype is None:
        return list(xs)
    return [cast(x, dtype) if is_float(x.dtype) and x.dtype not in (dtype, _F64) else x
            for x in xs]


_F64 = np.dtype(np.float64)


def wide_operand(x) -> Array:
    """Inside ``rp.autocast``: a float16/bfloat16 operand of a reduction, softmax, statistic or
    loss in float32."""
    x = as_array(x)
    if autocast_dtype() is not None and is_low_precision(x.dtype):
        return cast(x, np.float32)
    return x


def float_operand(x) -> Array:
    """``x``, a bool or integer array in float64 (what NumPy's ``mean``/``var`` compute in)."""
    x = as_array(x)
    return x if is_float(x.dtype) else cast(x, np.float64)


def ufunc_float_operand(x) -> Array:
    """``x`` in the float type NumPy's float ufuncs (``exp``, ``sqrt``, ...) pick for it: the
    smallest that holds its values — float16 for bools and 8-bit integers, float32 for 16-bit
    ones, float64 for wider integers; a float array as it is."""
    x = as_array(x)
    return x if is_float(x.dtype) else cast(x, np.result_type(x.dtype, np.float16))


def float_ufunc_operands(a, b) -> list:
    """The operands of a binary float ufunc (``np.arctan2``, ``np.hypot``) in the dtype NumPy's
    loop gives them: floats as promoted; bools and integers in the smallest float each of them
    casts to safely (float16 for int8 with uint8, float32 for int16, float64 for int32), a
    Python scalar taking the array's."""
    keys = [dtype_key(x) for x in (a, b)]
    a, b = promote(a, b)
    if is_float(a.dtype):
        return [a, b]
    arrays = [k for k in keys if isinstance(k, np.dtype)]
    if len(arrays) < 2 and a.dtype not in arrays:  # a bool and a Python int: int64's float
        arrays = [a.dtype]
    dtype = np.result_type(*(np.result_type(k, np.float16) for k in arrays))
    return [cast(a, dtype), cast(b, dtype)]


def static_axis(a) -> int:
    """An axis argument as an int (NumPy refuses floats and strings too)."""
    if type(a) is int:
        return a
    if isinstance(a, bool) or not isinstance(a, (numbers.Integral, np.integer)):
        raise ReplicateError(f"an axis is an int, got {a!r}")
    return int(a)


def norm_axes(axis, ndim) -> tuple:
    if axis is None:
        return tuple(range(ndim))
    axes = (axis,) if isinstance(axis, numbers.Integral) else tuple(axis)
    out = []
    for a in axes:
        a = static_axis(a)
        if not -ndim <= a < max(ndim, 1):
            raise ReplicateError(f"axis {a} is out of range for an array of rank {ndim}")
        out.append(a % ndim if ndim else 0)
    return tuple(sorted(out))
