"""The Array API's names and dtype queries, and PyTorch's ``masked_fill``: compositions of the
namespace's functions (``concat`` is ``concatenate``, ``vecdot`` a product summed, ...), so they
trace, run on every backend and differentiate as their pieces do."""

from __future__ import annotations

import numpy as np

from ..dtypes import is_supported
from ..dtypes import result_type as _promote
from ..errors import DTypeError, ShapeError
from ..graph.core import Array
from ._base import as_array, cast, check_device, promote
from ._elementwise import multiply, where
from ._reductions import sum
from ._shape import _axis, broadcast_to, concatenate, moveaxis, swapaxes, transpose


def astype(x, dtype, copy=True, *, device=None):
    """The Array API's ``astype`` (NumPy 2's ``np.astype``): ``cast``. ``copy`` is accepted and
    moot: an Array is never written to, so a result that is ``x`` itself (``copy=False`` or not,
    when the dtype is already ``dtype``) is as good as a copy. ``device``: None or "cpu".

    >>> import replicate.numpy as rnp
    >>> rnp.astype([1.5, -2.5], "int8", copy=False).tolist()
    [1, -2]
    """
    check_device(device, "astype")
    return cast(x, dtype)


def concat(arrays, axis=0):
    """The Array API's ``concat``: ``concatenate`` (promoted to one dtype; the flattened arrays
    when ``axis`` is None).

    >>> import replicate.numpy as rnp
    >>> rnp.concat([rnp.asarray([1, 2]), rnp.asarray([3.5])]).tolist()
    [1.0, 2.0, 3.5]
    """
    return concatenate(arrays, axis)


def permute_dims(x, axes):
    """The Array API's ``permute_dims``: ``transpose`` with ``axes`` (a permutation, required).

    >>> import replicate.numpy as rnp
    >>> rnp.permute_dims(rnp.zeros((2, 3, 4)), (2, 0, 1)).shape
    (4, 2, 3)
    """
    return transpose(x, tuple(axes))


def matrix_transpose(x):
    """The Array API's ``matrix_transpose`` (NumPy 2's ``np.matrix_transpose``): the last two
    axes swapped, a stack of matrices each transposed; rank 2 or more (``ShapeError``).

    >>> import replicate.numpy as rnp
    >>> rnp.matrix_transpose(rnp.zeros((5, 2, 3))).shape
    (5, 3, 2)
    """
    x = as_array(x)
    if x.ndim < 2:
        raise ShapeError(f"matrix_transpose needs an array of rank 2 or more, got shape {x.shape}")
    return swapaxes(x, -1, -2)


def vecdot(x1, x2, axis=-1):
    """The Array API's ``vecdot`` (NumPy 2's ``np.vecdot``): the dot products of the vectors along
    ``axis`` of each operand (the same length), the other axes broadcast; the promoted dtype
    (integers wrap as NumPy's, bools are any(x1 & x2)). A product summed: the gradient of each
    operand is the other times the cotangent.

    >>> import replicate.numpy as rnp
    >>> rnp.vecdot(rnp.asarray([[1.0, 2.0], [3.0, 4.0]]), rnp.asarray([1.0, 1.0])).tolist()
    [3.0, 7.0]
    """
    a, b = promote(x1, x2)
    if a.ndim == 0 or b.ndim == 0:
        raise ShapeError("vecdot needs arrays of rank 1 or more")
    a = moveaxis(a, _axis(axis, a.ndim, "vecdot"), -1)
    b = moveaxis(b, _axis(axis, b.ndim, "vecdot"), -1)
    if a.shape[-1] != b.shape[-1]:
        raise ShapeError(f"vecdot: vectors of lengths {a.shape[-1]} and {b.shape[-1]} along "
                         f"axis {axis}")
    dtype = a.dtype
    product = multiply(a, b)
    return cast(sum(product, -1), dtype)  # (sum widens bools and small integers)


def broadcast_arrays(*arrays):
    """``np.broadcast_arrays`` (the Array API's too): the arrays broadcast to their common shape,
    a tuple, each keeping its dtype; a ``ShapeError`` (a ``ValueError``, as NumPy's) when the
    shapes do not broadcast.

    >>> import replicate.numpy as rnp
    >>> [a.shape for a in rnp.broadcast_arrays(rnp.zeros((2, 1)), rnp.arange(3))]
    [(2, 3), (2, 3)]
    """
    xs = [as_array(x) for x in arrays]
    try:
        shape = np.broadcast_shapes(*[x.shape for x in xs])
    except ValueError:
        raise ShapeError(f"broadcast_arrays: shapes {[x.shape for x in xs]} do not "
                         "broadcast") from None
    return tuple(broadcast_to(x, shape) for x in xs)


def _dtype_of(x):
    """What promotion sees for ``x``: an array's or dtype's dtype; a Python scalar as it is."""
    if isinstance(x, (bool, int, float)) and not isinstance(x, np.generic):
        return x
    if isinstance(x, Array) or hasattr(x, "read") or hasattr(x, "dtype") and not isinstance(
            x, (type, np.dtype)):
        return np.dtype(x.dtype)
    try:
        return np.dtype(x)
    except TypeError:
        raise DTypeError(f"{x!r} is neither an array nor a dtype") from None


def result_type(*arrays_and_dtypes):
    """``np.result_type`` (the Array API's too): the dtype promotion gives arrays, dtypes and
    Python scalars (weak, NEP 50, as everywhere in this namespace); a ``DTypeError`` (a
    ``TypeError``, as NumPy's) for none or for a dtype the library does not have.

    >>> import numpy as np, replicate.numpy as rnp
    >>> rnp.result_type(rnp.asarray([1], "int8"), 1), rnp.result_type("int32", np.float32, 1.0)
    (dtype('int8'), dtype('float64'))
    """
    if not arrays_and_dtypes:
        raise DTypeError("result_type needs at least one array or dtype")
    keys = [_dtype_of(x) for x in arrays_and_dtypes]
    try:
        dtype = np.dtype(_promote(*keys))
    except TypeError as e:
        raise DTypeError(f"result_type: no common dtype: {e}") from None
    if not is_supported(dtype):
        raise DTypeError(f"result_type: {dtype} is not a dtype of the library (bool, integers, "
                         "floats)")
    return dtype


def can_cast(from_, to, casting="safe"):
    """``np.can_cast`` (the Array API's too): whether an array of dtype ``from_`` (an array or a
    dtype) converts to ``to`` under the ``casting`` rule ("no", "equiv", "safe", "same_kind",
    "unsafe"). A Python scalar is refused with NumPy 2's ``TypeError`` (a ``DTypeError``).

    >>> import replicate.numpy as rnp
    >>> rnp.can_cast(rnp.asarray([1], "int32"), "float64"), rnp.can_cast("float64", "int32")
    (True, False)
    """
    if isinstance(from_, (bool, int, float, complex)) and not isinstance(from_, np.generic):
        raise DTypeError("can_cast of a Python scalar is ambiguous (NumPy 2 refuses it): pass an "
                         "array or a dtype")
    source = _dtype_of(from_)
    if casting not in ("no", "equiv", "safe", "same_kind", "unsafe"):
        raise ValueError(f"can_cast: casting must be 'no', 'equiv', 'safe', 'same_kind' or "
                         f"'unsafe', got {casting!r}")
    return bool(np.can_cast(source, np.dtype(_dtype_of(to)), casting))


def masked_fill(x, mask, value):
    """PyTorch's ``masked_fill``: ``x`` with ``value`` where the bool ``mask`` (broadcast to
    ``x``'s shape) is true — ``where(mask, value, x)`` in ``x``'s dtype (``value`` converted,
    as PyTorch). The gradient goes to ``x`` where the mask is false, and to an array ``value``
    summed where it is true.

    >>> import replicate.numpy as rnp
    >>> x = rnp.asarray([1, 2, 3])
    >>> rnp.masked_fill(x, x > 1, 0.5).tolist()
    [1, 0, 0]
    """
    x, mask = as_array(x), as_array(mask)
    if mask.dtype != np.bool_:
        raise DTypeError(f"masked_fill: the mask must be bool, got {mask.dtype}")
    try:
        shape = np.broadcast_shapes(x.shape, mask.shape)
    except ValueError:
        shape = None
    if shape != x.shape:
        raise ShapeError(f"masked_fill: a mask of shape {mask.shape} does not broadcast to x's "
                         f"shape {x.shape}")
    return where(mask, cast(value, x.dtype), x)
