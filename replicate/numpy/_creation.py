"""Array creation: constants (``zeros``, ``ones``, ``full``, ``eye``, ``arange``, ``linspace``,
... known when traced, as NumPy's) and the triangle masks ``tril``/``triu`` and ``meshgrid``,
compositions of ``where``, reshapes and broadcasts (their gradients those of the pieces)."""

from __future__ import annotations

import numbers

import numpy as np

from ..errors import DTypeError, ReplicateError, ShapeError
from ..graph.core import Array, concrete
from ._base import as_array, cast, check_device
from ._elementwise import where
from ._shape import broadcast_to, ravel, reshape

# the default float of zeros/ones/eye/full(float) (float32: JAX, PyTorch; NumPy's is float64)
DEFAULT_FLOAT = np.dtype(np.float32)


def zeros(shape, dtype=DEFAULT_FLOAT, *, device=None):
    """Zeros; float32 unless ``dtype`` is given (NumPy: float64; ``replicate.numpy``)."""
    check_device(device, "zeros")
    return concrete(np.zeros(shape, dtype))


def ones(shape, dtype=DEFAULT_FLOAT, *, device=None):
    """An array of ones; float32 unless ``dtype`` is given (NumPy's default is float64)."""
    check_device(device, "ones")
    return concrete(np.ones(shape, dtype))


def full(shape, fill_value, dtype=None, *, device=None):
    """An array of ``fill_value``, by default of its dtype: bool, int64 for a Python int, float32
    for a Python float (NumPy: float64), a NumPy scalar's own — PyTorch's rule; never rounded.

    >>> import replicate.numpy as rnp
    >>> [rnp.full((2,), v).dtype.name for v in (True, 16777217, 0.5)]
    ['bool', 'int64', 'float32']
    >>> rnp.full((2,), 16777217).tolist()
    [16777217, 16777217]
    """
    check_device(device, "full")
    value = as_array(fill_value)  # refuses what is not a supported array or number
    if dtype is None:
        dtype = DEFAULT_FLOAT if type(fill_value) is float else value.dtype
        if type(fill_value) is float:  # (one beyond float32's range is refused, not inf)
            _in_default_float(np.asarray([fill_value]), "full")
    # a Python number as it is: NumPy refuses one out of the dtype's range (300 in int8)
    fill = fill_value if isinstance(fill_value, numbers.Number) else value.value
    return concrete(np.full(shape, fill, dtype))


def zeros_like(x, dtype=None, *, device=None):
    """Zeros of ``x``'s shape and dtype, or ``dtype`` (``np.zeros_like``); ``device``: None or
    ``"cpu"``, the one device an Array reports (anything else is a ``PlacementError``)."""
    check_device(device, "zeros_like")
    x = as_array(x)
    return zeros(x.shape, dtype or x.dtype)


def ones_like(x, dtype=None, *, device=None):
    """Ones of ``x``'s shape and dtype, or ``dtype`` (``np.ones_like``); ``device`` as
    ``zeros_like``'s."""
    check_device(device, "ones_like")
    x = as_array(x)
    return ones(x.shape, dtype or x.dtype)


def _numbers_only(*values) -> bool:
    """Every value a Python number (or None): what gives NumPy float64 by default, and here the
    default float. A NumPy scalar or array keeps its own dtype, as in NumPy."""
    return all(v is None or type(v) in (bool, int, float) for v in values)


def _in_default_float(value: np.ndarray, what: str) -> np.ndarray:
    """A float64 sequence made from Python numbers, rounded once to the default float — refused
    where that changes it beyond rounding: two distinct values made one (past 2**24 float32
    steps by 2 and more) or a finite value made infinite. NumPy's float64 would keep them; a
    silently repeated or infinite coordinate is a wrong number, not a precision choice."""
    with np.errstate(over="ignore"):  # (refused below)
        low = value.astype(DEFAULT_FLOAT)
    lost = np.isinf(low) & np.isfinite(value)
    merged = (low[1:] == low[:-1]) & (value[1:] != value[:-1])
    if lost.any():
        i = int(np.argmax(lost))
        said = f"{float(value[i])!r} becomes inf"
    elif merged.any():
        i = int(np.argmax(merged))
        said = (f"{float(value[i])!r} and {float(value[i + 1])!r} both become "
                f"{float(low[i])!r}")
    else:
        return low
    raise DTypeError(
        f"{what} of Python numbers is float32 here (the default float, as JAX's and PyTorch's), "
        f"and in float32 {said}: pass dtype=rnp.float64 (NumPy's default), or integers")


def arange(start, stop=None, step=None, dtype=None, *, device=None):
    """``np.arange``: ``start`` to ``stop`` (``0`` to ``start`` when ``stop`` is None) by ``step``
    (1 when None), a constant (known when traced). Python ints give int64 and Python floats the
    default float, float32 (NumPy: float64; a NumPy float64 value keeps float64).

    >>> import replicate.numpy as rnp
    >>> rnp.arange(3).dtype, rnp.arange(0, 1, 0.25).dtype, rnp.arange(0, 1, 0.25).tolist()
    (dtype('int64'), dtype('float32'), [0.0, 0.25, 0.5, 0.75])
    """
    check_device(device, "arange")
    value = np.arange(start, stop, step, dtype=dtype)
    if dtype is None and value.dtype == np.float64 and _numbers_only(start, stop, step):
        value = _in_default_float(value, "arange")  # (computed in float64, rounded once)
    return concrete(value)


def _known(v, what):
    """``v`` as a NumPy value: a number, an eager Array, a Variable outside a step; a traced
    value is refused (what it makes would depend on data)."""
    if isinstance(v, Array) or hasattr(v, "read"):
        v = as_array(v)
        if v.symbolic:
            raise ReplicateError(f"{what} must be known when the step is traced (the result is a "
                                 "constant), not a traced value")
        return v.value
    return v


def _static_int(v, what):
    if isinstance(v, bool) or not isinstance(v, (numbers.Integral, np.integer)):
        raise ReplicateError(f"{what} is an int, got {v!r}")
    return int(v)


def eye(n, M=None, k=0, dtype=DEFAULT_FLOAT, *, device=None):
    """``np.eye``: ``n`` rows, ``M`` columns (``n`` when None), ones on diagonal ``k`` (above the
    main one when positive); float32 unless ``dtype`` is given (NumPy: float64).

    >>> import replicate.numpy as rnp
    >>> rnp.eye(2, 3, k=1, dtype="int32").tolist()
    [[0, 1, 0], [0, 0, 1]]
    """
    check_device(device, "eye")
    n = _static_int(n, "eye's n")
    if M is not None and not isinstance(M, (numbers.Integral, np.integer)):
        raise ReplicateError(f"eye's M is the column count, an int, got {M!r} (the dtype is "
                             "the keyword dtype=, as NumPy's)")
    M = n if M is None else _static_int(M, "eye's M")
    return concrete(np.eye(n, M, _static_int(k, "eye's k"), dtype=dtype))


def empty(shape, dtype=DEFAULT_FLOAT, *, device=None):
    """``np.empty``, which here is ``zeros`` (an Array is never uninitialised memory); float32
    unless ``dtype`` is given.

    >>> import replicate.numpy as rnp
    >>> rnp.empty((2,), "int8").tolist()
    [0, 0]
    """
    check_device(device, "empty")
    return zeros(shape, dtype)


def empty_like(x, dtype=None, *, device=None):
    """``np.empty_like``, which here is ``zeros_like`` (an Array is never uninitialised memory):
    ``x``'s shape, its dtype unless ``dtype`` is given.

    >>> import replicate.numpy as rnp
    >>> rnp.empty_like(rnp.asarray([1.5, 2.5]), "int32").tolist()
    [0, 0]
    """
    check_device(device, "empty_like")
    return zeros_like(x, dtype)


def full_like(x, fill_value, dtype=None, *, device=None):
    """``np.full_like``: an array of ``x``'s shape filled with ``fill_value``, of ``x``'s dtype
    unless ``dtype`` is given (the value converted to it, as NumPy: 2.7 in an int array is 2).
    A traced ``fill_value`` is broadcast (its gradient the sum of the result's).

    >>> import replicate.numpy as rnp
    >>> rnp.full_like(rnp.asarray([1, 2, 3]), 2.7).tolist()
    [2, 2, 2]
    """
    check_device(device, "full_like")
    x = as_array(x)
    dtype = x.dtype if dtype is None else dtype
    if isinstance(fill_value, Array) or hasattr(fill_value, "read"):
        return broadcast_to(cast(fill_value, dtype), x.shape)
    as_array(fill_value)  # refuses what is not an array or number
    return concrete(np.full(x.shape, fill_value, dtype))


def linspace(start, stop, num=50, endpoint=True, dtype=None, *, device=None):
    """``np.linspace``: ``num`` evenly spaced values from ``start`` to ``stop`` (``stop`` left out
    when ``endpoint`` is False). Python numbers give the default float, float32 (NumPy: float64);
    NumPy values and Arrays NumPy's dtype (a float64 ``start`` gives float64). A constant, as
    ``arange``: its arguments must be known when traced.

    >>> import replicate.numpy as rnp
    >>> rnp.linspace(0, 1, 5).tolist(), rnp.linspace(0, 1, 4, endpoint=False).dtype
    ([0.0, 0.25, 0.5, 0.75, 1.0], dtype('float32'))
    """
    check_device(device, "linspace")
    start, stop = _known(start, "linspace's start"), _known(stop, "linspace's stop")
    num = _static_int(_known(num, "linspace's num"), "linspace's num")
    if num < 0:
        raise ValueError(f"linspace: num must be non-negative, got {num}")
    value = np.linspace(start, stop, num, endpoint=bool(endpoint), dtype=dtype)
    if dtype is None and value.dtype == np.float64 and _numbers_only(start, stop):
        value = _in_default_float(value, "linspace")  # (computed in float64, rounded once)
    return as_array(value)


def _triangle(x, k, upper, what):
    x = as_array(x)
    if x.ndim == 0:
        raise ShapeError(f"{what} needs an array of rank 1 or more (NumPy's ValueError)")
    k = _static_int(k, f"{what}'s k")
    n, m = (x.shape[0], x.shape[0]) if x.ndim == 1 else x.shape[-2:]
    offset = np.arange(m)[None, :] - np.arange(n)[:, None]  # column - row
    keep = offset >= k if upper else offset <= k
    # as NumPy: a 1-D x is a row, broadcast to n by n
    return where(concrete(keep), x, concrete(np.zeros((), x.dtype)))


def tril(x, k=0):
    """``np.tril``: ``x`` with the entries above diagonal ``k`` of its last two axes zeroed (a
    1-D ``x`` broadcast to a square, as NumPy). An arange comparison mask and ``where``: any
    dtype, and the gradient passes the kept entries.

    >>> import replicate.numpy as rnp
    >>> rnp.tril(rnp.ones((2, 3), "int32"), k=1).tolist()
    [[1, 1, 0], [1, 1, 1]]
    """
    return _triangle(x, k, False, "tril")


def triu(x, k=0):
    """``np.triu``: ``x`` with the entries below diagonal ``k`` of its last two axes zeroed (as
    ``tril``).

    >>> import replicate.numpy as rnp
    >>> rnp.triu(rnp.asarray([[1.0, 2.0], [3.0, 4.0]])).tolist()
    [[1.0, 2.0], [0.0, 4.0]]
    """
    return _triangle(x, k, True, "triu")


def meshgrid(*xs, indexing="xy", sparse=False):
    """``np.meshgrid``: coordinate arrays from 1-D ones (any shape flattened), a tuple, each of its
    input's dtype; ``indexing="xy"`` (Cartesian: the first two axes swapped) or ``"ij"``;
    ``sparse`` keeps the size-1 axes. Reshapes and broadcasts, so differentiable.

    >>> import replicate.numpy as rnp
    >>> X, Y = rnp.meshgrid(rnp.asarray([1, 2, 3]), rnp.asarray([4.0, 5.0]))
    >>> X.tolist(), Y.shape
    ([[1, 2, 3], [1, 2, 3]], (2, 3))
    """
    if indexing not in ("xy", "ij"):
        raise ValueError(f"meshgrid: indexing is 'xy' or 'ij', got {indexing!r}")
    xs = [ravel(as_array(x)) for x in xs]
    axes = list(range(len(xs)))
    if indexing == "xy" and len(xs) > 1:
        axes[0], axes[1] = 1, 0
    shape = [1] * len(xs)
    for x, a in zip(xs, axes):
        shape[a] = x.shape[0]
    out = []
    for x, a in zip(xs, axes):
        one = [1] * len(xs)
        one[a] = x.shape[0]
        x = reshape(x, one)
        out.append(x if sparse else broadcast_to(x, shape))
    return tuple(out)
