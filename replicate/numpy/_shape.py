"""Shape manipulation, indexing and array creation."""

from __future__ import annotations

import math
import numbers

import numpy as np

from ..errors import CopyError, DTypeError, IndexOutOfRangeError, ReplicateError, ShapeError
from ..graph.core import Array, bind, concrete
from ..graph.index_bounds import NONNEGATIVE, bounds_message, first_out_of_bounds
from ._base import as_array, cast, check_device, from_foreign, norm_axes, promote, static_axis
from ._elementwise import equal


# -- creation ---------------------------------------------------------------------------------
def asarray(x, dtype=None, copy=None, *, device=None) -> Array:
    """Make an Array from a NumPy array, nested list or number (``np.asarray``, the Array API's
    ``asarray``). A NumPy array's memory is shared, as NumPy's (writing to it writes to the
    Array) unless ``copy=True``; ``copy=False`` refuses (``CopyError``, a ``ValueError``) where
    a copy is needed: a list, a number, another dtype. An Array is never written to: it comes
    back as it is (cast to ``dtype``), whatever ``copy`` says.

    >>> import numpy as np, replicate.numpy as rnp
    >>> rnp.asarray([1, 2]).dtype
    dtype('int64')
    >>> a = np.zeros(2); x = rnp.asarray(a, copy=True); a[0] = 5; x.tolist()
    [0.0, 0.0]
    """
    check_device(device, "asarray")
    if copy is None:
        return as_array(x, dtype)
    y = as_array(x)
    if copy is False:
        shared = isinstance(x, (Array, np.ndarray, np.generic)) or hasattr(x, "read") or hasattr(
            x, "__dlpack__")
        if not shared or dtype is not None and np.dtype(dtype) != y.dtype:
            into = "an Array" if dtype is None else f"an Array of {np.dtype(dtype)}"
            raise CopyError(f"asarray(copy=False): a {type(x).__name__} of {y.dtype} becomes "
                            f"{into} only by a copy")
        return y
    y = as_array(y, dtype)
    return y if y.symbolic else as_array(np.array(y.value))


array = asarray


def from_dlpack(x, *, device=None, copy=None) -> Array:
    """An Array from any object with ``__dlpack__`` (a JAX, PyTorch or CuPy array; NumPy 2's
    ``np.from_dlpack`` contract): zero-copy for values in host memory, so writing to the source
    writes to the Array, unless ``copy=True`` (``copy=False`` refuses where a copy is needed,
    as ``asarray``). (``rnp.asarray`` accepts the same objects.)

    >>> import numpy as np, replicate.numpy as rnp
    >>> rnp.from_dlpack(np.arange(3.0)).tolist()
    [0.0, 1.0, 2.0]
    """
    check_device(device, "from_dlpack")
    if isinstance(x, Array) or hasattr(x, "read"):  # already ours (traced values too)
        return as_array(x)
    if not hasattr(x, "__dlpack__"):
        raise ReplicateError(f"from_dlpack: {type(x).__name__} has no __dlpack__")
    return asarray(from_foreign(x), copy=copy)


# -- shapes -----------------------------------------------------------------------------------
def reshape(x, shape, *, copy=None):
    """Reshape; one dimension may be -1. ``copy`` (the Array API's) is moot: an Array is never
    written to, so a view is as good as a copy."""
    x = as_array(x)
    if type(shape) is not tuple or not all(type(d) is int for d in shape):
        shape = (shape,) if isinstance(shape, numbers.Integral) else tuple(shape)
        if not all(isinstance(d, numbers.Integral) and not isinstance(d, bool) for d in shape):
            raise ReplicateError(f"reshape: a shape is a tuple of ints, got {shape!r}")
        shape = tuple(int(d) for d in shape)
    if shape.count(-1) > 1:
        raise ReplicateError(f"reshape: more than one -1 in {shape}")
    if -1 in shape:
        known = math.prod(d for d in shape if d != -1)
        if known == 0 or x.size % known:
            raise ReplicateError(f"cannot reshape {x.shape} to {shape}")
        shape = tuple(x.size // known if d == -1 else d for d in shape)
    if shape == x.shape:
        return x
    return bind("reshape", x, shape=shape)


def ravel(x):
    """The elements along one axis, in C order (``np.ravel``)."""
    return reshape(x, (-1,))


def transpose(x, axes=None):
    """The axes permuted by ``axes``, reversed when None (``np.transpose``)."""
    x = as_array(x)
    perm = tuple(reversed(range(x.ndim))) if axes is None else norm_perm(axes, x.ndim)
    if perm == tuple(range(x.ndim)):
        return x
    return bind("transpose", x, perm=perm)


def _axis(a, ndim, what):
    """``a`` as a non-negative axis of an ndim-array (NumPy's range check; no silent wrap)."""
    a = static_axis(a)
    if not -ndim <= a < ndim:
        raise ReplicateError(f"{what}: axis {a} is out of range for an array of rank {ndim}")
    return a % ndim


def norm_perm(axes, ndim):
    perm = tuple(_axis(a, ndim, "transpose") for a in axes)
    if sorted(perm) != list(range(ndim)):
        raise ReplicateError(f"transpose: {tuple(axes)} is not a permutation of {ndim} axes")
    return perm


def swapaxes(x, a, b):
    """Axes ``a`` and ``b`` exchanged (``np.swapaxes``); an axis out of range is an error."""
    x = as_array(x)
    a, b = _axis(a, x.ndim, "swapaxes"), _axis(b, x.ndim, "swapaxes")
    perm = list(range(x.ndim))
    perm[a], perm[b] = perm[b], perm[a]
    return transpose(x, perm)


def moveaxis(x, source, destination):
    """``np.moveaxis``: axis ``source`` (an int, or a sequence of them) moved to
    ``destination`` (as many), the others in their order."""
    x = as_array(x)
    many = not isinstance(source, numbers.Integral)
    source = [_axis(a, x.ndim, "moveaxis") for a in (source if many else [source])]
    destination = [_axis(a, x.ndim, "moveaxis") for a in (
        destination if not isinstance(destination, numbers.Integral) else [destination])]
    if len(source) != len(destination) or len(set(source)) != len(source) \
            or len(set(destination)) != len(destination):
        raise ReplicateError(f"moveaxis: sources {source} and destinations {destination} do "
                             "not pair up")
    rest = iter(i for i in range(x.ndim) if i not in source)
    placed = dict(zip(destination, source))
    return transpose(x, [placed[i] if i in placed else next(rest) for i in range(x.ndim)])


def broadcast_to(x, shape):
    """``x`` broadcast to ``shape`` by NumPy's rules (``np.broadcast_to``); its gradient sums."""
    x = as_array(x)
    shape = tuple(shape)
    if shape == x.shape:
        return x
    return bind("broadcast_to", x, shape=shape)


def expand_dims(x, axis):
    """New axes of size 1 at ``axis`` (an int or a tuple), as ``np.expand_dims``."""
    x = as_array(x)
    axes = (axis,) if isinstance(axis, numbers.Integral) else tuple(axis)
    ndim = x.ndim + len(axes)
    axes = sorted(_axis(a, ndim, "expand_dims") for a in axes)
    if len(set(axes)) != len(axes):
        raise ReplicateError(f"expand_dims: repeated axis in {axis}")
    shape = list(x.shape)
    for a in axes:
        shape.insert(a, 1)
    return reshape(x, shape)


def squeeze(x, axis=None):
    """Axes of size 1 removed: all, or ``axis``, each of which must be 1 (``np.squeeze``)."""
    x = as_array(x)
    if axis is None:
        axes = tuple(i for i, d in enumerate(x.shape) if d == 1)
    else:
        axes = (axis,) if isinstance(axis, numbers.Integral) else tuple(axis)
        axes = tuple(_axis(a, x.ndim, "squeeze") for a in axes)
        for a in axes:
            if x.shape[a] != 1:
                raise ShapeError(f"squeeze: axis {a} of shape {x.shape} is not 1")
    return reshape(x, tuple(d for i, d in enumerate(x.shape) if i not in axes))


def concatenate(xs, axis=0):
    """Join arrays along an existing axis (the flattened arrays when ``axis`` is None)."""
    if not len(xs):
        raise ReplicateError("concatenate needs at least one array")
    xs = promote(*xs)
    if axis is None:  # NumPy's: the arrays flattened
        xs, axis = [ravel(x) for x in xs], 0
    if len(xs) == 1:
        return xs[0]
    (axis,) = norm_axes(axis, xs[0].ndim)
    return bind("concatenate", *xs, axis=axis)


def stack(xs, axis=0):
    """Join arrays along a new axis."""
    if not len(xs):
        raise ReplicateError("stack needs at least one array")
    xs = promote(*xs)
    return concatenate([expand_dims(x, axis) for x in xs], axis)


def split(x, indices_or_sections, axis=0):
    """Split into a list of sub-arrays, as ``np.split``: ``indices_or_sections`` equal sections
    (a ``ShapeError``, a ``ValueError``, when they are not equal) or slices between the given
    indices. Slices, so each piece's gradient goes back to its place.

    >>> import replicate.numpy as rnp
    >>> [p.tolist() for p in rnp.split(rnp.arange(5), [2, 3])]
    [[0, 1], [2], [3, 4]]
    """
    x = as_array(x)
    axis = _axis(axis, x.ndim, "split")
    n = x.shape[axis]
    if isinstance(indices_or_sections, numbers.Integral):
        if indices_or_sections <= 0:
            raise ShapeError(f"split: the number of sections must be positive, got "
                             f"{indices_or_sections}")
        if n % indices_or_sections:
            raise ShapeError(f"split: {n} is not divisible into {indices_or_sections} sections "
                             "(NumPy's ValueError: an unequal division)")
        step = n // indices_or_sections
        bounds = list(range(0, n + 1, step)) if step else [0] * (indices_or_sections + 1)
    else:
        bounds = [0, *indices_or_sections, n]
    pre = (slice(None),) * axis
    return [x[pre + (slice(lo, hi),)] for lo, hi in zip(bounds[:-1], bounds[1:])]


def pad(x, pad_width, constant_values=0):
    """Constant padding; ``pad_width`` as in ``np.pad`` (int, pair, or a pair per axis)."""
    x = as_array(x)
    try:
        widths = np.broadcast_to(np.asarray(pad_width, dtype=np.int64), (x.ndim, 2))
    except (TypeError, ValueError) as e:
        raise ReplicateError(f"pad: pad_width {pad_width!r} does not fit an array of rank "
                             f"{x.ndim} ({e})") from None
    widths = tuple((int(lo), int(hi)) for lo, hi in widths)
    if any(w < 0 for pair in widths for w in pair):
        raise ReplicateError(f"pad: negative pad_width {pad_width!r}")
    if all(w == (0, 0) for w in widths):
        return x
    return bind("pad", x, widths=widths, value=float(constant_values))


# -- indexing ---------------------------------------------------------------------------------
def _is_index_array(item):
    return isinstance(item, (Array, np.ndarray, list)) or hasattr(item, "read")


def _scalar_bool(item):
    """``item`` as a Python bool if it is a bool scalar (a Python or NumPy bool, a 0-d bool
    array known when traced), else None."""
    if isinstance(item, (bool, np.bool_)):
        return bool(item)
    if _is_index_array(item):
        arr = as_array(item)
        if arr.dtype == np.bool_ and arr.ndim == 0 and not arr.symbolic:
            return bool(arr.value)
    return None


def _scalar_bool_axes(x, key):
    """NumPy's 0-d boolean index (one, among slices, None and Ellipsis): a new axis of length 1
    (True) or 0 (False) where it stands. ``key`` with it as None, and the result axes to empty
    (the new one, if False)."""
    flags = [_scalar_bool(item) for item in key]
    if all(f is None for f in flags):
        return key, []
    # with ints or index arrays NumPy broadcasts it with them (and may move the axis first)
    if sum(f is not None for f in flags) > 1 or not all(
            f is not None or item is None or item is Ellipsis or isinstance(item, slice)
            for f, item in zip(flags, key)):
        raise ReplicateError("a 0-d boolean index beside ints, index arrays or another one is "
                             "not supported; index in two steps")
    consumed = sum(isinstance(item, slice) for item in key)
    empty, axis = [], 0
    for f, item in zip(flags, key):
        if f is False:
            empty.append(axis)
        axis += x.ndim - consumed if item is Ellipsis else 1
    return tuple(None if f is not None else item for f, item in zip(flags, key)), empty


def getitem(x, key):
    """``x[key]``: ints, slices, None, Ellipsis, integer arrays and concrete boolean masks
    (NumPy semantics; a 0-d boolean adds an axis of length 1 or 0, as in NumPy)."""
    x = as_array(x)
    if not isinstance(key, tuple):
        key = (key,)
    key, empty = _scalar_bool_axes(x, key)
    out = _getitem(x, key)
    if empty:
        out = _getitem(out, tuple(slice(0, 0) if a in empty else slice(None)
                                  for a in range(max(empty) + 1)))
    return out


def _getitem(x, key, nonnegative=()):
    """``x[key]``; the integer index arrays at the positions ``nonnegative`` of ``key`` may
    not hold negative indices (an error, not an index from the end)."""
    spec, arrays = [], []
    for position, item in enumerate(key):
        if item is None:
            spec.append(("none",))
        elif item is Ellipsis:
            spec.append(("ellipsis",))
        elif isinstance(item, slice):
            bounds = (item.start, item.stop, item.step)
            parts = [None if v is None else _static_int(v) for v in bounds]
            spec.append(("slice", *parts))
        elif isinstance(item, (numbers.Integral, np.integer)) and not isinstance(item, bool):
            spec.append(("int", int(item)))
        elif _is_index_array(item):
            arr = as_array(item)
            if arr.dtype == np.bool_:
                if arr.symbolic:
                    raise ReplicateError(
                        "boolean-mask indexing gives a data-dependent shape and cannot be traced; "
                        "use rnp.where(mask, x, 0) or run in eager mode")
                parts = [concrete(i) for i in np.nonzero(arr.value)]
            elif np.issubdtype(arr.dtype, np.integer):
                parts = [arr]
            else:
                raise DTypeError(f"index arrays must be integers, got {arr.dtype}")
            mark = (NONNEGATIVE,) if position in nonnegative else ()
            for part in parts:
                spec.append(("array", len(arrays), *mark))
                arrays.append(part)
        else:
            raise ReplicateError(f"unsupported index {item!r}")
    _check_index_arrays(x.shape, spec, arrays)
    return bind("getitem", x, *arrays, index=tuple(spec))


def _check_index_arrays(shape, spec, arrays):
    """Concrete integer index arrays must be in range (as in NumPy); a traced step would
    otherwise fail only when it runs."""
    known = [np.zeros(0, np.intp) if a.symbolic else a.value for a in arrays]
    bad = first_out_of_bounds(shape, spec, known)
    if bad is not None:
        raise IndexOutOfRangeError(bounds_message(*bad))


def _static_int(v):
    if isinstance(v, Array):
        return v.__index__()  # raises the tracer error for a traced bound
    if isinstance(v, bool) or not isinstance(v, (numbers.Integral, np.integer)):
        raise ReplicateError(f"slice bounds and split points are ints, got {v!r}")
    return int(v)


def take(x, indices, axis=None, *, nonnegative=False):
    """Gather entries along ``axis`` (flattened when None) at integer ``indices``.
    ``nonnegative=True`` (not NumPy's): a negative index is an ``IndexError`` instead of an
    index from the end, as in PyTorch's gathers (embedding ids)."""
    x, indices = as_array(x), as_array(indices)
    if axis is None:
        x, axis = ravel(x), 0
    (axis,) = norm_axes(axis, x.ndim)
    key = (slice(None),) * axis + (indices,)
    return _getitem(x, key, (axis,)) if nonnegative else getitem(x, key)


def take_along_axis(x, indices, axis, *, nonnegative=False):
    """Pick ``x[..., indices[...], ...]`` along ``axis``, other axes matched (NumPy semantics;
    ``nonnegative=True`` as ``take``'s: class labels)."""
    x, indices = as_array(x), as_array(indices)
    (axis,) = norm_axes(axis, x.ndim)
    if indices.ndim != x.ndim:
        raise ReplicateError("take_along_axis: indices must have the same rank as x")
    key = []
    for i in range(x.ndim):
        if i == axis:
            key.append(indices)
        else:
            shape = [1] * x.ndim
            shape[i] = x.shape[i]
            key.append(concrete(np.arange(x.shape[i]).reshape(shape)))
    return _getitem(x, tuple(key), (axis,) if nonnegative else ())


def one_hot(indices, num_classes, dtype=np.float32):
    """One-hot encode integer ``indices`` into a new last axis of size ``num_classes``.

    >>> import replicate.numpy as rnp
    >>> rnp.one_hot(rnp.asarray([0, 2]), 3).tolist()
    [[1.0, 0.0, 0.0], [0.0, 0.0, 1.0]]
    """
    indices = as_array(indices)
    hot = equal(expand_dims(indices, -1), concrete(np.arange(num_classes, dtype=indices.dtype)))
    return cast(hot, dtype)
