"""Reordering and repeating: sort, argsort, searchsorted, top_k, flip, roll, repeat, tile.

``sort``, ``argsort``, ``searchsorted`` and the indices of ``top_k`` are primitives (NumPy's
stable sort; JAX's stable sort and ``lax.top_k``). ``flip``, ``roll``, ``repeat`` and ``tile`` are
compositions of strided slices, concatenation, broadcasting and reshapes: exact, each a view or
one copy of the output's size as in NumPy, and their gradients are those of the pieces.
"""

from __future__ import annotations

import numbers

import numpy as np

from ..errors import ReplicateError, ShapeError
from ..graph.core import Array, bind, concrete
from ._base import as_array, promote
from ._elementwise import subtract
from ._shape import (
    _axis,
    broadcast_to,
    concatenate,
    expand_dims,
    getitem,
    ravel,
    reshape,
    take,
    take_along_axis,
)


def _static_ints(v, what):
    """A static int or sequence of ints (a traced value would make the shape depend on data)."""
    if isinstance(v, Array):
        if v.symbolic:
            raise ReplicateError(f"{what} must be known when the step is traced (the result's "
                                 "shape depends on it), not a traced value")
        v = v.value
    a = np.asarray(v)
    if a.dtype.kind not in "iu" or a.ndim > 1:
        raise ReplicateError(f"{what} must be an int or a sequence of ints, got {v!r}")
    return a


def sort(x, axis=-1, descending=False, stable=True):
    """``x`` sorted along ``axis`` (the flattened array when None), stable, NaNs last: as
    ``np.sort(x, axis, kind="stable")``. A primitive; its gradient sends each sorted value's
    cotangent back to the entry it came from. ``descending`` (the Array API's keyword): largest
    first, NaNs first, equal entries in their order (the ascending sort of ``x`` reversed along
    ``axis``, reversed); ``stable`` is accepted (the sort always is).

    >>> import replicate.numpy as rnp
    >>> rnp.sort(rnp.asarray([[3.0, 1.0, 2.0]])).tolist()
    [[1.0, 2.0, 3.0]]
    >>> rnp.sort(rnp.asarray([3.0, 1.0, 2.0]), descending=True).tolist()
    [3.0, 2.0, 1.0]
    """
    x = as_array(x)
    if axis is None:
        x, axis = ravel(x), 0
    axis = _axis(axis, x.ndim, "sort")
    if descending:
        return flip(bind("sort", flip(x, axis), axis=axis), axis)
    return bind("sort", x, axis=axis)


def argsort(x, axis=-1, descending=False, stable=True):
    """The indices that sort ``x`` along ``axis`` (the flattened array when None), stable: equal
    entries keep their order, NaNs last (``np.argsort(x, axis, kind="stable")``). A primitive.
    ``descending`` (the Array API's keyword): largest first, NaNs first, equal entries still in
    their order (``n - 1 -`` the ascending indices of ``x`` reversed, reversed).

    >>> import replicate.numpy as rnp
    >>> rnp.argsort(rnp.asarray([2, 1, 2, 0])).tolist()
    [3, 1, 0, 2]
    >>> rnp.argsort(rnp.asarray([2, 1, 2, 0]), descending=True).tolist()
    [0, 2, 1, 3]
    """
    x = as_array(x)
    if axis is None:
        x, axis = ravel(x), 0
    axis = _axis(axis, x.ndim, "argsort")
    if descending:
        order = flip(bind("argsort", flip(x, axis), axis=axis), axis)
        return subtract(np.int64(x.shape[axis] - 1), order)
    return bind("argsort", x, axis=axis)


def searchsorted(a, v, side="left", sorter=None):
    """Where each value of ``v`` would go in the sorted 1-D ``a`` to keep it sorted, as
    ``np.searchsorted``: ``side="left"`` the first such index (the count of entries below the
    value), ``"right"`` the last; NaNs sort last (a NaN value's left index is the count of
    non-NaN entries). ``sorter``: the indices that sort ``a`` (``a`` is then read as
    ``a[sorter]``). int64 indices of ``v``'s shape; ``a`` and ``v`` are compared in their common
    dtype. A primitive (NumPy's, ``jnp.searchsorted``, CuPy's), no gradient. As in NumPy, an
    ``a`` that is not sorted gives indices of no meaning.

    >>> import replicate.numpy as rnp
    >>> a = rnp.asarray([1.0, 2.0, 2.0, 3.0])
    >>> rnp.searchsorted(a, [2.0, 0.5, 9.0]).tolist(), rnp.searchsorted(a, 2.0, "right").tolist()
    ([1, 0, 4], 3)
    """
    if side not in ("left", "right"):
        raise ShapeError(f"searchsorted: side must be 'left' or 'right', got {side!r}")
    a = as_array(a)
    if a.ndim != 1:
        raise ShapeError(f"searchsorted needs a 1-D array to search, got shape {a.shape}")
    if sorter is not None:
        a = take(a, sorter)
    a, v = promote(a, v)
    return bind("searchsorted", a, v, side=side)


def top_k(x, k):
    """The ``k`` largest entries along the last axis, largest first, and their indices, as
    ``jax.lax.top_k``: ``(values, indices)``; equal entries in index order, NaNs largest. The
    indices are a primitive (JAX ``lax.top_k``; NumPy a stable sort), the values gathered with
    them, so their gradient goes to the selected entries.

    >>> import replicate.numpy as rnp
    >>> values, indices = rnp.top_k(rnp.asarray([1.0, 3.0, 2.0, 3.0]), 3)
    >>> values.tolist(), indices.tolist()
    ([3.0, 3.0, 2.0], [1, 3, 2])
    """
    x = as_array(x)
    k = int(_static_ints(k, "top_k's k"))
    if x.ndim == 0:
        raise ReplicateError("top_k needs an array of rank 1 or more")
    indices = bind("top_k_indices", x, k=k)
    return take_along_axis(x, indices, -1), indices


def flip(x, axis=None):
    """``x`` reversed along ``axis`` (an int, a tuple, or every axis when None), as ``np.flip``:
    a strided view (``x[..., ::-1]``).

    >>> import replicate.numpy as rnp
    >>> rnp.flip(rnp.asarray([[1, 2], [3, 4]]), 1).tolist()
    [[2, 1], [4, 3]]
    """
    x = as_array(x)
    if axis is None:
        axes = set(range(x.ndim))
    else:
        axes = {_axis(a, x.ndim, "flip")
                for a in ((axis,) if isinstance(axis, numbers.Integral) else axis)}
    if not axes:
        return x
    return getitem(x, tuple(slice(None, None, -1) if i in axes else slice(None)
                            for i in range(x.ndim)))


def roll(x, shift, axis=None):
    """``x`` shifted by ``shift`` places along ``axis``, the entries pushed off one end coming
    back at the other, as ``np.roll`` (the flattened array when ``axis`` is None; ``shift`` and
    ``axis`` may be tuples). Two slices concatenated per axis.

    >>> import replicate.numpy as rnp
    >>> rnp.roll(rnp.asarray([1, 2, 3, 4]), 1).tolist()
    [4, 1, 2, 3]
    """
    x = as_array(x)
    shifts = _static_ints(shift, "roll's shift")
    if axis is None:
        return reshape(roll(ravel(x), int(shifts.sum()), 0), x.shape)
    axes = _static_ints(axis, "roll's axis")
    try:
        shifts, axes = np.broadcast_arrays(shifts, axes)
    except ValueError:
        raise ReplicateError(f"roll: shift {shift!r} and axis {axis!r} do not match") from None
    total = {}
    for s, a in zip(shifts.reshape(-1), axes.reshape(-1)):
        a = _axis(int(a), x.ndim, "roll")
        total[a] = total.get(a, 0) + int(s)
    for a, s in sorted(total.items()):
        n = x.shape[a]
        s = s % n if n else 0
        if s:
            pre = (slice(None),) * a
            x = concatenate([x[pre + (slice(n - s, None),)], x[pre + (slice(0, n - s),)]], a)
    return x


def repeat(x, repeats, axis=None):
    """Each entry of ``x`` repeated along ``axis`` (the flattened array when None), as
    ``np.repeat``: ``repeats`` an int (a broadcast and a reshape) or one int per entry (a gather
    with a constant index).

    >>> import replicate.numpy as rnp
    >>> rnp.repeat(rnp.asarray([[1, 2]]), 2, axis=1).tolist()
    [[1, 1, 2, 2]]
    >>> rnp.repeat(rnp.asarray([1, 2]), [1, 3]).tolist()
    [1, 2, 2, 2]
    """
    x = as_array(x)
    if axis is None:
        x, axis = ravel(x), 0
    axis = _axis(axis, x.ndim, "repeat")
    reps = _static_ints(repeats, "repeat's repeats")
    if np.any(reps < 0):
        raise ReplicateError(f"repeat: negative repeats {repeats!r}")
    n = x.shape[axis]
    if reps.ndim == 0 or reps.size == 1:
        r = int(reps.reshape(-1)[0])
        wide = list(x.shape)
        wide.insert(axis + 1, r)
        shape = list(x.shape)
        shape[axis] = n * r
        return reshape(broadcast_to(expand_dims(x, axis + 1), wide), shape)
    if reps.size != n:
        raise ReplicateError(f"repeat: {reps.size} repeats for an axis of size {n}")
    return take(x, concrete(np.repeat(np.arange(n), reps)), axis)


def tile(x, reps):
    """``x`` repeated ``reps`` times along each axis, as ``np.tile`` (a shorter ``reps`` counts
    from the last axis; a longer one gives ``x`` new leading axes): one broadcast and reshapes.

    >>> import replicate.numpy as rnp
    >>> rnp.tile(rnp.asarray([1, 2]), (2, 2)).tolist()
    [[1, 2, 1, 2], [1, 2, 1, 2]]
    """
    x = as_array(x)
    reps = [int(r) for r in np.atleast_1d(_static_ints(reps, "tile's reps"))]
    if any(r < 0 for r in reps):
        raise ReplicateError(f"tile: negative reps {reps}")
    d = max(len(reps), x.ndim)
    reps = [1] * (d - len(reps)) + reps
    shape = [1] * (d - x.ndim) + list(x.shape)
    if all(r == 1 for r in reps):
        return reshape(x, shape)
    pairs = [v for s in shape for v in (1, s)]
    wide = [v for r, s in zip(reps, shape) for v in (r, s)]
    return reshape(broadcast_to(reshape(x, pairs), wide), [r * s for r, s in zip(reps, shape)])
