"""The NumPy backend's ``select`` (``rnp.where`` in a compiled step: ReLU, leaky ReLU and their
gradients, masks): the bits of ``np.where(c, a, b)`` for every dtype, special value and
broadcast, also when the memory plan makes the output the same buffer as an input."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

import replicate as rp
import replicate.numpy as rnp
from replicate.backends import numpy_backend

rng = np.random.default_rng(5)
SPECIAL = [0.0, -0.0, np.inf, -np.inf, np.nan, 1.0, -2.5, 1e-40]  # 1e-40: a float32 subnormal


def values(dtype, shape):
    if dtype == np.bool_:
        return rng.random(shape) < 0.5
    if np.dtype(dtype).kind in "iu":
        info = np.iinfo(dtype)
        return rng.integers(info.min, info.max, shape, dtype=dtype, endpoint=True)
    x = rng.standard_normal(shape).astype(dtype)
    n = min(len(SPECIAL), x.size)
    x.reshape(-1)[:n] = np.array(SPECIAL[:n]).astype(dtype)
    return x


def bits(x):
    return np.asarray(x).view(np.uint8)


DTYPES = [np.float64, np.float32, np.float16, ml_dtypes.bfloat16, np.int64, np.int32, np.int8,
          np.uint16, np.bool_]
SHAPES = {  # (c, a, b), out's shape the broadcast of them
    "same": ((6, 5), (6, 5), (6, 5)),
    "row a": ((6, 5), (5,), (6, 5)),
    "scalar b": ((6, 5), (6, 5), ()),
    "column c": ((6, 1), (6, 5), (6, 5)),
}


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("shapes", list(SHAPES))
def test_the_bits_of_np_where(dtype, shapes):
    cs, as_, bs = SHAPES[shapes]
    c, a, b = rng.random(cs) < 0.5, values(dtype, as_), values(dtype, bs)
    want = np.where(c, a, b)
    out = np.empty(want.shape, dtype)
    assert numpy_backend._select(c, a, b, out) is out
    np.testing.assert_array_equal(bits(out), bits(want))


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("zero", ["+0 as b", "+0 as a", "-0 as b", "-0 as a"])
def test_a_zero_branch(dtype, zero):
    """``where(c, x, 0)`` (a ReLU and its gradient) takes a shorter road; -0.0 must not."""
    sign, side = zero.split(" as ")
    c, x = rng.random((6, 5)) < 0.5, values(dtype, (6, 5))
    z = np.array(-0.0 if sign == "-0" else 0).astype(dtype)
    a, b = (x, z) if side == "b" else (z, x)
    want = np.where(c, a, b)
    for out in (np.empty(want.shape, dtype), x):  # x: written in place
        numpy_backend._select(c, a, b, out)
        np.testing.assert_array_equal(bits(out), bits(want))


IN_PLACE = [(d, into) for d in (np.float32, np.int16, np.bool_)
            for into in ("a", "b", "a and b", "c") if into != "c" or d == np.bool_]


@pytest.mark.parametrize("dtype, into", IN_PLACE, ids=lambda v: getattr(np.dtype(v), "name", v)
                         if not isinstance(v, str) else v)
def test_in_place_over_an_input(dtype, into):
    """The memory plan may give ``select`` the buffer of one of its inputs as its output (``c``
    only when the output is boolean: a buffer is shared only by values of one dtype)."""
    c, a, b = rng.random((7, 9)) < 0.5, values(dtype, (7, 9)), values(dtype, (7, 9))
    if into == "a and b":
        b = a
    if into == "c":
        c = c.copy()
    want = np.where(c, a, b)
    out = {"a": a, "b": b, "c": c, "a and b": a}[into]
    numpy_backend._select(c, a, b, out)
    np.testing.assert_array_equal(bits(out), bits(want))


def test_leaky_relu_and_its_gradient_in_a_compiled_step():
    """Forward and gradient of a leaky ReLU (both ``select``) against NumPy: the forward bit for
    bit (signed zeros, infinities, NaN), the gradient by value (the definition's gradient is
    the sum of both branches' parts, so its zeros' signs are the sum's)."""
    x, w = values(np.float32, (64, 128)), values(np.float32, (64, 128))
    slope = np.float32(0.01)

    def f(x, w):
        y = rnp.where(x > 0, x, x * slope)
        return y, rp.grad((y * w).sum(), x)

    y, g = rp.function(f)(x, w)
    np.testing.assert_array_equal(bits(y), bits(np.where(x > 0, x, x * slope)))
    np.testing.assert_array_equal(g, np.where(x > 0, w, w * slope))
