"""Functions whose result's size depends on the values: ``nonzero``, ``unique`` and the Array
API's ``unique_*``.

Eager, they give NumPy's answer. A traced step's shapes are fixed when it is traced, so there
they take jax.numpy's ``size=`` (the result's length, a static int) and ``fill_value=`` (what
pads it when fewer are found; the extra ones are dropped); without ``size`` a traced call is a
``TracerConversionError`` that says so. Either way they are compositions of ``argsort``, indexing
and ``where``: every backend runs them, and ``unique``'s values differentiate as the entries
they were taken from (their cotangents go back there; a padded entry's nowhere).

>>> import numpy as np, replicate as rp, replicate.numpy as rnp
>>> rnp.unique(rnp.asarray([3, 1, 3, 2])).tolist()
[1, 2, 3]
>>> rp.function(lambda x: rnp.unique(x, size=4, fill_value=-1))(np.array([3, 1, 3, 2])).tolist()
[1, 2, 3, -1]
"""

from __future__ import annotations

import math
import numbers
from collections import namedtuple

import numpy as np

from ..dtypes import is_float
from ..errors import ShapeError, TracerConversionError
from ._base import as_array, cast
from ._creation import arange, full
from ._elementwise import logical_and, logical_not, not_equal, where
from ._reductions import cumsum, sum
from ._reorder import argsort
from ._shape import concatenate, getitem, ravel, reshape, take

UniqueAllResult = namedtuple("UniqueAllResult", "values indices inverse_indices counts")
UniqueCountsResult = namedtuple("UniqueCountsResult", "values counts")
UniqueInverseResult = namedtuple("UniqueInverseResult", "values inverse_indices")


def _size(mask, size, what):
    """The result's length: ``size``, or (eager) how many of ``mask`` are true."""
    if size is not None:
        if isinstance(size, bool) or not isinstance(size, (numbers.Integral, np.integer)) \
                or size < 0:
            raise ShapeError(f"{what}: size is a static int >= 0, got {size!r}")
        return int(size)
    if mask.symbolic:
        raise TracerConversionError(
            f"{what}: the length of the result depends on the values, which a traced step does "
            f"not know; pass size= (its length: a static int) and fill_value= (what pads it), "
            f"as in jax.numpy")
    return int(np.count_nonzero(mask.value))


def _positions(mask, size):
    """The indices of ``mask``'s (1-D) true entries in order, the first ``size`` (int64), with
    ``n`` past them; and which are found."""
    n = mask.shape[0]
    order = argsort(cast(logical_not(mask), np.int8))  # stable: the true entries first
    if size > n:
        order = concatenate([order, full((size - n,), n)])
    else:
        order = getitem(order, slice(0, size))
    found = arange(size) < sum(mask)
    return where(found, order, n), found


def nonzero(x, *, size=None, fill_value=None):
    """The indices of ``x``'s nonzero entries (NaN is nonzero), one int64 array per axis, in
    row-major order (``np.nonzero``). Traced, the length is ``size`` and the rest
    ``fill_value`` (0, or one value per axis), as ``jnp.nonzero``. A 0-d ``x`` is refused
    (NumPy 2 refuses it too).

    >>> import replicate.numpy as rnp
    >>> [a.tolist() for a in rnp.nonzero(rnp.asarray([[0, 5], [7, 0]]))]
    [[0, 1], [1, 0]]
    """
    x = as_array(x)
    if x.ndim == 0:
        raise ShapeError("nonzero of a 0-d array is not defined (NumPy 2 refuses it); use "
                         "nonzero(atleast_1d(x)) or reshape(x, (1,))")
    mask = ravel(x if x.dtype == np.bool_ else not_equal(x, 0))
    size = _size(mask, size, "nonzero")
    pos, found = _positions(mask, size)
    fills = fill_value if isinstance(fill_value, (tuple, list)) else (fill_value,) * x.ndim
    if len(fills) != x.ndim:
        raise ShapeError(f"nonzero: {len(fills)} fill values for an array of rank {x.ndim}")
    out = []
    for i, (d, fill) in enumerate(zip(x.shape, fills)):
        coord = (pos // max(math.prod(x.shape[i + 1:]), 1)) % max(d, 1)
        out.append(where(found, coord, cast(0 if fill is None else fill, np.int64)))
    return tuple(out)


def unique(x, return_index=False, return_inverse=False, return_counts=False, axis=None, *,
           equal_nan=True, size=None, fill_value=None):
    """``np.unique`` of the flattened ``x``: its distinct values, sorted (NaNs last, one NaN
    unless ``equal_nan=False``); with ``return_index`` the index of each one's first occurrence,
    ``return_inverse`` each entry's position among them (``x``'s shape, as NumPy 2),
    ``return_counts`` how often each occurs (all int64). Traced, the length is ``size``; the
    values are padded with ``fill_value`` (by default the smallest value, as ``jnp.unique``),
    the indices and counts with 0. ``axis`` must be None.

    >>> import replicate.numpy as rnp
    >>> [a.tolist() for a in rnp.unique(rnp.asarray([2, 1, 2]), return_counts=True)]
    [[1, 2], [1, 2]]
    """
    x = as_array(x)
    if axis is not None:
        raise ShapeError("unique: only axis=None (the flattened array) is supported")
    flat = ravel(x)
    n = flat.shape[0]
    order = argsort(flat)  # stable: the first of equal entries first
    ordered = take(flat, order)
    if n:
        differ = not_equal(getitem(ordered, slice(1, None)), getitem(ordered, slice(None, -1)))
        if equal_nan and is_float(x.dtype):  # NaN != NaN: two NaNs next to each other are one
            both = logical_and(not_equal(getitem(ordered, slice(1, None)),
                                         getitem(ordered, slice(1, None))),
                               not_equal(getitem(ordered, slice(None, -1)),
                                         getitem(ordered, slice(None, -1))))
            differ = logical_and(differ, logical_not(both))
        first = concatenate([as_array(np.ones(1, bool)), differ])
    else:
        first = as_array(np.zeros(0, bool))
    size = _size(first, size, "unique")
    pos, found = _positions(first, size + 1)  # one more: where the last one's run ends
    start = getitem(pos, slice(0, size))
    valid = getitem(found, slice(0, size))
    at = where(valid, start, 0) if n else start
    fill = (getitem(ordered, 0) if n else 0) if fill_value is None else fill_value
    values = where(valid, take(ordered, at), cast(fill, x.dtype)) if n else full((size,), fill,
                                                                                x.dtype)
    results = [values]
    if return_index:
        results.append(where(valid, take(order, at), 0) if n else full((size,), 0, np.int64))
    if return_inverse:
        group = cumsum(cast(first, np.int64)) - 1
        results.append(reshape(take(group, argsort(order)), x.shape) if n else
                       full(x.shape, 0, np.int64))
    if return_counts:
        results.append(getitem(pos, slice(1, None)) - start)
    return results[0] if len(results) == 1 else tuple(results)


def unique_values(x, *, size=None, fill_value=None):
    """The Array API's ``unique_values``: ``unique(x, equal_nan=False)`` (every NaN its own
    value, as the standard says); ``size``/``fill_value`` as ``unique``'s (``jnp``'s too).

    >>> import replicate.numpy as rnp
    >>> rnp.unique_values(rnp.asarray([2.0, rnp.nan, 2.0, rnp.nan])).tolist()
    [2.0, nan, nan]
    """
    return unique(x, equal_nan=False, size=size, fill_value=fill_value)


def unique_counts(x, *, size=None, fill_value=None):
    """The Array API's ``unique_counts``: ``(values, counts)``, NaNs distinct."""
    return UniqueCountsResult(*unique(x, return_counts=True, equal_nan=False, size=size,
                                      fill_value=fill_value))


def unique_inverse(x, *, size=None, fill_value=None):
    """The Array API's ``unique_inverse``: ``(values, inverse_indices)``, NaNs distinct; the
    inverse indices have ``x``'s shape."""
    return UniqueInverseResult(*unique(x, return_inverse=True, equal_nan=False, size=size,
                                       fill_value=fill_value))


def unique_all(x, *, size=None, fill_value=None):
    """The Array API's ``unique_all``: ``(values, indices, inverse_indices, counts)``, NaNs
    distinct (``np.unique_all``)."""
    return UniqueAllResult(*unique(x, True, True, True, equal_nan=False, size=size,
                                   fill_value=fill_value))


__all__ = ["nonzero", "unique", "unique_all", "unique_counts", "unique_inverse", "unique_values"]
