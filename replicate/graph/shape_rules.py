"""Shape and dtype rules: each primitive's ``shape_rule``, from its operands' ``AVal``s (and its
attributes) to its result's ``AVal``, raising ``ShapeError``/``DTypeError`` for operands it does
not take. ``primitives.py`` declares each primitive with one of these; the helpers every array
module shares for the index and einsum attributes (``index_tuple``, ``parse_einsum``) live here
too.

>>> import numpy as np
>>> from replicate.graph.aval import AVal
>>> str(_binary(AVal((2, 1), np.dtype("float32")), AVal((3,), np.dtype("float32"))))
'f32[2,3]'
"""

from __future__ import annotations

import math

import numpy as np

from ..dtypes import is_float, is_supported
from ..errors import DTypeError, ShapeError
from .aval import AVal

FLOATS = ("float16", "bfloat16", "float32", "float64")


def _unary(a, **_):
    return a


def _unary_signed(a, **_):
    if a.dtype == bool:
        raise DTypeError("neg and sign need numbers, got bool (logical_not negates a bool)")
    return a


def _binary_signed(a, b, **_):
    if a.dtype == bool or b.dtype == bool:
        raise DTypeError("cannot subtract bools; use logical_xor (a != b)")
    return _binary(a, b)


def _unary_integer(a, **_):
    """invert (bitwise not): integers only (``rnp.invert`` takes bools to ``logical_not``)."""
    if a.dtype.kind not in "iu":
        raise DTypeError(f"invert needs an integer operand, got {a.dtype}")
    return a


def _bitwise(a, b, **_):
    """bitwise_and/or/xor: integers or bools, one dtype (the wrapper promotes, as NumPy)."""
    if a.dtype.kind not in "biu" or b.dtype.kind not in "biu":
        raise DTypeError(f"bitwise ops need integer or bool operands, got {a.dtype} and {b.dtype}")
    return _binary(a, b)


def _shift(a, b, **_):
    """left_shift/right_shift: integers only (the wrapper makes bools int8, as NumPy)."""
    if a.dtype.kind not in "iu" or b.dtype.kind not in "iu":
        raise DTypeError(f"shifts need integer operands, got {a.dtype} and {b.dtype}")
    return _binary(a, b)


def _logical_not(a, **_):
    if a.dtype != bool:
        raise DTypeError("logical ops need bool operands")
    return a


def _unary_float(a, **_):
    if not is_float(a.dtype):
        raise DTypeError(f"needs a floating-point operand, got {a.dtype}")
    return a


def _signbit(a, **_):
    """signbit: a float in (the wrapper makes integers NumPy's float), a bool out."""
    return AVal(_unary_float(a).shape, np.dtype(bool))


def _broadcast(*avals):
    first = avals[0].shape
    if all(a.shape == first for a in avals):
        return first
    try:
        return tuple(np.broadcast_shapes(*[a.shape for a in avals]))
    except ValueError:
        raise ShapeError("shapes " + " and ".join(str(a.shape) for a in avals)
                         + " do not broadcast") from None


def _same_dtype(*avals):
    first = avals[0].dtype
    if all(a.dtype == first for a in avals):
        return first
    dtypes = {np.dtype(a.dtype) for a in avals}
    if len(dtypes) != 1:
        raise DTypeError(f"operand dtypes differ: {sorted(str(d) for d in dtypes)}")
    return avals[0].dtype


def _binary(a, b, **_):
    if a.shape == b.shape and (a.dtype is b.dtype or a.dtype == b.dtype):
        return a  # (eager mode's common case)
    return AVal(_broadcast(a, b), _same_dtype(a, b))


def _binary_float(a, b, **_):
    if not (is_float(a.dtype) and is_float(b.dtype)):
        raise DTypeError(f"needs floating-point operands, got {a.dtype} and {b.dtype}")
    return _binary(a, b)


def _mod(a, b, **_):
    if a.dtype == bool and b.dtype == bool:
        raise DTypeError("mod of two bools; cast them to an integer type first")
    return _binary(a, b)


def _compare(a, b, **_):
    _same_dtype(a, b)
    return AVal(_broadcast(a, b), np.dtype(bool))


def _logical(a, b, **_):
    if a.dtype != bool or b.dtype != bool:
        raise DTypeError("logical ops need bool operands")
    return AVal(_broadcast(a, b), np.dtype(bool))


def _select(c, a, b, **_):
    if c.dtype != bool:
        raise DTypeError(f"select's condition must be bool, got {c.dtype}")
    return AVal(_broadcast(c, a, b), _same_dtype(a, b))


def _cast(a, dtype):
    if not is_supported(dtype):
        raise DTypeError(f"cannot cast to {np.dtype(dtype)}: the dtypes are bool, integers and "
                         "floats (float16, bfloat16, float32, float64)")
    return AVal(a.shape, np.dtype(dtype))


def _check_axes(a, axes):
    for ax in axes:
        if not 0 <= ax < len(a.shape):
            raise ShapeError(f"axis {ax} out of range for shape {a.shape}")
    if len(set(axes)) != len(axes):
        raise ShapeError(f"repeated axis in {axes}")


def _reduce(a, axes):
    _check_axes(a, axes)
    return AVal(tuple(d for i, d in enumerate(a.shape) if i not in axes), a.dtype)


def _reduce_nonempty(a, axes):
    if any(a.shape[ax] == 0 for ax in axes):
        raise ShapeError("max/min/argmax/argmin of an empty axis")
    return _reduce(a, axes)


def _arg_reduce(a, axis):
    out = _reduce_nonempty(a, (axis,))
    return AVal(out.shape, np.dtype(np.int64))


def _scan(a, axis, reverse=False):
    """cumsum, cumprod: the operand's shape and dtype (the wrapper picks the accumulator)."""
    _check_axes(a, (axis,))
    return a


def _sort(a, axis):
    _check_axes(a, (axis,))
    return a


def _argsort(a, axis):
    _check_axes(a, (axis,))
    return AVal(a.shape, np.dtype(np.int64))


def _searchsorted(a, v, side):
    """searchsorted: a sorted 1-D ``a`` and values ``v`` of its dtype; an int64 index per value."""
    if len(a.shape) != 1:
        raise ShapeError(f"searchsorted needs a 1-D array to search, got shape {a.shape}")
    if side not in ("left", "right"):
        raise ShapeError(f"searchsorted: side must be 'left' or 'right', got {side!r}")
    _same_dtype(a, v)
    return AVal(v.shape, np.dtype(np.int64))


def _top_k(a, k):
    """The indices of the k largest entries along the last axis."""
    if not a.shape:
        raise ShapeError("top_k needs an array of rank 1 or more")
    if not 0 <= k <= a.shape[-1]:
        raise ShapeError(f"top_k: k={k} is out of range for a last axis of size {a.shape[-1]}")
    return AVal(a.shape[:-1] + (k,), np.dtype(np.int64))


def _reshape(a, shape):
    if math.prod(shape) != math.prod(a.shape):
        raise ShapeError(f"cannot reshape {a.shape} to {shape}")
    return AVal(tuple(shape), a.dtype)


def _transpose(a, perm):
    if sorted(perm) != list(range(len(a.shape))):
        raise ShapeError(f"bad permutation {perm} for shape {a.shape}")
    return AVal(tuple(a.shape[p] for p in perm), a.dtype)


def _broadcast_to(a, shape):
    if tuple(np.broadcast_shapes(a.shape, shape)) != tuple(shape):
        raise ShapeError(f"cannot broadcast {a.shape} to {shape}")
    return AVal(tuple(shape), a.dtype)


def _concatenate(*avals, axis):
    dtype = _same_dtype(*avals)
    first = avals[0].shape
    if not 0 <= axis < len(first):
        raise ShapeError(f"axis {axis} out of range for shape {first}")
    for a in avals:
        if len(a.shape) != len(first) or any(
                d != e for i, (d, e) in enumerate(zip(a.shape, first)) if i != axis):
            raise ShapeError(f"cannot concatenate shapes {[x.shape for x in avals]} on axis {axis}")
    shape = list(first)
    shape[axis] = sum(a.shape[axis] for a in avals)
    return AVal(tuple(shape), dtype)


def _pad(a, widths, value):
    if len(widths) != len(a.shape) or any(lo < 0 or hi < 0 for lo, hi in widths):
        raise ShapeError(f"bad pad widths {widths} for shape {a.shape}")
    return AVal(tuple(d + lo + hi for d, (lo, hi) in zip(a.shape, widths)), a.dtype)


def index_tuple(index, arrays):
    """Turn a static index spec plus index arrays into a NumPy index tuple."""
    out = []
    for entry in index:
        tag = entry[0]
        if tag == "int":
            out.append(entry[1])
        elif tag == "slice":
            out.append(slice(*entry[1:]))
        elif tag == "none":
            out.append(None)
        elif tag == "ellipsis":
            out.append(Ellipsis)
        else:  # ("array", k)
            out.append(arrays[entry[1]])
    return tuple(out)


def _dummy(shape, dtype):
    return np.lib.stride_tricks.as_strided(np.zeros(1, dtype), shape, (0,) * len(shape))


def _getitem(a, *idx, index):
    for i in idx:
        if not np.issubdtype(i.dtype, np.integer):
            raise DTypeError(f"index arrays must be integers, got {i.dtype}")
    arrays = [np.zeros(i.shape, np.intp) for i in idx]
    try:
        shape = _dummy(a.shape, a.dtype)[index_tuple(index, arrays)].shape
    except IndexError as e:
        raise ShapeError(str(e)) from None
    return AVal(tuple(shape), a.dtype)


def _scatter_add(g, *idx, index, shape):
    expect = _getitem(AVal(tuple(shape), g.dtype), *idx, index=index)
    if expect.shape != g.shape:
        raise ShapeError(f"scatter_add update {g.shape} does not match {expect.shape}")
    return AVal(tuple(shape), g.dtype)


def _matmul(a, b):
    if len(a.shape) < 2 or len(b.shape) < 2:
        raise ShapeError("matmul primitive needs rank >= 2 operands")
    if a.shape[-1] != b.shape[-2]:
        raise ShapeError(f"matmul contraction mismatch: {a.shape} @ {b.shape}")
    batch = tuple(np.broadcast_shapes(a.shape[:-2], b.shape[:-2]))
    return AVal(batch + (a.shape[-2], b.shape[-1]), _same_dtype(a, b))


def parse_einsum(subscripts: str):
    lhs, out = subscripts.replace(" ", "").split("->")
    return lhs.split(","), out


def _einsum(*avals, subscripts):
    ins, out = parse_einsum(subscripts)
    if len(ins) != len(avals):
        raise ShapeError(f"einsum {subscripts!r} expects {len(ins)} operands, got {len(avals)}")
    sizes: dict = {}
    for term, a in zip(ins, avals):
        if len(term) != len(a.shape):
            raise ShapeError(f"einsum term {term!r} does not match shape {a.shape}")
        for letter, d in zip(term, a.shape):
            if sizes.setdefault(letter, d) != d:
                raise ShapeError(f"einsum index {letter!r} has sizes {sizes[letter]} and {d}")
    return AVal(tuple(sizes[c] for c in out), _same_dtype(*avals))


def _random(key, shape, dtype, stream=0, bits=None):
    if key.shape != (2,) or key.dtype != np.uint32:
        raise ShapeError(f"a random key is uint32[2], got {key}")
    return AVal(tuple(shape), np.dtype(dtype))


def _const(*, value):
    return AVal(tuple(value.shape), value.dtype)
