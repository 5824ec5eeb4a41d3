"""Float ``floor_divide`` is NumPy's bit for bit (eager, graph on NumPy and JAX, constant-folded),
its gradient is zero, and ``copy=`` of ``asarray``/``astype`` keeps the Array API's contract."""

from __future__ import annotations

import importlib.util

import numpy as np
import pytest

import replicate as rp
import replicate.numpy as rnp
from replicate.errors import CopyError
from replicate.graph.reference import floor_divide_of

HAVE_JAX = importlib.util.find_spec("jax") is not None
FLOATS = ("float16", "float32", "float64")


def _grid(dtype):
    """Every pair of the edge values: NaN, ±0, ±inf, ±1, halves, values whose quotient rounds
    onto an integer it is not (0.7 // 0.1 is 6), the extremes."""
    f = np.finfo(dtype)
    v = np.array([np.nan, 0.0, -0.0, np.inf, -np.inf, 1.0, -1.0, 0.5, -2.5, 3.0, 7.0, -7.0, 0.7,
                  0.1, -0.1, 1e-3, f.max, -f.max, f.tiny, -f.smallest_subnormal], dtype)
    a, b = np.meshgrid(v, v)
    return a.reshape(-1), b.reshape(-1)


def _same(got, want):
    got, want = np.asarray(got), np.asarray(want)
    assert got.dtype == want.dtype
    nan = np.isnan(want)
    np.testing.assert_array_equal(np.isnan(got), nan)
    np.testing.assert_array_equal(got[~nan], want[~nan])
    np.testing.assert_array_equal(np.signbit(got[~nan]), np.signbit(want[~nan]))  # -0.0


def _numpy(a, b):
    with np.errstate(all="ignore"):
        return np.floor_divide(a, b)


@pytest.mark.parametrize("dtype", FLOATS)
def test_the_formula_is_numpys(dtype):
    # the rows of JAX and CuPy: NumPy's algorithm in array-module operations (float16 in
    # float32, as NumPy's half loop and those backends compute it)
    a, b = _grid(dtype)
    wide = np.float32 if dtype == "float16" else dtype
    with np.errstate(all="ignore"):
        got = floor_divide_of(np, a.astype(wide), b.astype(wide)).astype(dtype)
    _same(got, _numpy(a, b))


MODES = ["eager", "numpy", "folded"] + (["jax"] if HAVE_JAX else [])


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("dtype", FLOATS)
def test_floor_divide_of_floats_is_numpys(dtype, mode):
    a, b = _grid(dtype)
    with np.errstate(all="ignore"):
        if mode == "eager":
            got = rnp.asarray(a) // rnp.asarray(b)
        elif mode == "folded":  # both operands constants: the compiler computes it
            got = rp.function(lambda: rnp.floor_divide(rnp.asarray(a), rnp.asarray(b)))()
        else:
            got = rp.function(lambda x, y: x // y, backend=mode)(a, b)
    want = _numpy(a, b)
    if mode == "jax" and dtype != "float16":  # XLA on a CPU reads denormals as 0 (float16
        # computes in float32, where its denormals are normal)
        normal = (np.abs(a) >= np.finfo(dtype).tiny) | (a == 0) | np.isnan(a)
        keep = normal & ((np.abs(b) >= np.finfo(dtype).tiny) | (b == 0) | np.isnan(b))
        got, want = np.asarray(got)[keep], want[keep]
    _same(got, want)


@pytest.mark.parametrize("mode", ["eager", "graph"])
def test_floor_divide_has_a_zero_gradient(mode):
    def f(x, y):
        return rp.grad(rnp.sum(rnp.floor_divide(x, y) * x), [x, y])

    gx, gy = rp.function(f, mode=mode)(np.array([7.5, -3.0]), np.array([2.0, 2.0]))
    np.testing.assert_array_equal(gx, [3.0, -2.0])  # only the factor x's own derivative
    np.testing.assert_array_equal(gy, [0.0, 0.0])


def test_integers_and_bools_still_floor_as_numpy():
    a = np.array([7, -7, 7, 0], np.int32)
    np.testing.assert_array_equal(rnp.floor_divide(a, np.int32(-2)), np.floor_divide(a, -2))
    got = rnp.floor_divide(np.array([True, False]), np.array([True, True]))
    assert got.dtype == np.int8 and got.tolist() == [1, 0]


def test_asarray_copy():
    a = np.zeros(3)
    shared, copied = rnp.asarray(a, copy=False), rnp.asarray(a, copy=True)
    a[0] = 5.0
    assert shared.tolist() == [5.0, 0.0, 0.0] and copied.tolist() == [0.0, 0.0, 0.0]
    assert rnp.asarray(a).tolist()[0] == 5.0  # copy=None shares, as np.asarray
    with pytest.raises(CopyError, match="only by a copy") as e:
        rnp.asarray([1, 2], copy=False)
    assert isinstance(e.value, ValueError)
    with pytest.raises(CopyError, match="float32"):
        rnp.asarray(a, dtype="float32", copy=False)
    x = rnp.asarray([1.5])
    assert rnp.asarray(x, copy=False) is x
    assert rnp.asarray(x, "int32", copy=True).tolist() == [1]


def test_asarray_copy_traces():
    def f(x):
        return rnp.asarray(x, copy=True) + rnp.asarray(x, copy=False)

    assert rp.function(f)(np.array([1.0])).tolist() == [2.0]


def test_astype_copy():
    x = rnp.asarray([1.5, -2.5])
    assert rnp.astype(x, "float64", copy=False) is x
    assert rnp.astype(x, "int8", copy=True).tolist() == [1, -2]
