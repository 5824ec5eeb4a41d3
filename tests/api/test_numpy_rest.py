"""The last of NumPy's names (issue 30), at their edges: ``signbit`` and ``copysign`` bit for bit
(-0.0 and -NaN; eager, graph on NumPy, JAX and CuPy, constant-folded), ``hypot`` without overflow
and its gradient, ``searchsorted``'s errors, the Array API's ``device=`` keyword, and ``rnp.fft``
(its real functions NumPy's; the complex transforms refused). The harness
(``tests/harness/ops_numpy_rest.py``) has the values and gradients of the ordinary cases."""

from __future__ import annotations

import importlib.util

import numpy as np
import pytest

import replicate as rp
import replicate.numpy as rnp
from replicate.backends import available
from replicate.errors import DTypeError, PlacementError

MODES = ["eager", "numpy", "folded"] + (["jax"] if importlib.util.find_spec("jax") else []) + (
    ["cupy"] if "cupy" in available() else [])
FLOATS = ("float16", "float32", "float64")
NEG_NAN = -np.float64(np.nan)


def _edges(dtype):
    """NaN and -NaN, ±0, ±inf, ±1, the extremes and the smallest normal and subnormal."""
    f = np.finfo(dtype)
    return np.array([np.nan, NEG_NAN, 0.0, -0.0, np.inf, -np.inf, 1.0, -1.0, 2.5, f.max, -f.max,
                     f.tiny, -f.tiny, f.smallest_subnormal, -f.smallest_subnormal], dtype)


def _run(fn, args, mode):
    with np.errstate(all="ignore"):
        if mode == "eager":
            return fn(*[rnp.asarray(a) for a in args])
        if mode == "folded":  # the operands constants: the compiler computes it
            return rp.function(lambda: fn(*[rnp.asarray(a) for a in args]))()
        return rp.function(fn, backend=mode)(*args)


def _bits(x):
    x = np.asarray(x)
    return x.view({2: np.uint16, 4: np.uint32, 8: np.uint64}[x.itemsize])


def _flushed(x, mode):
    """XLA on a CPU reads float32/64 subnormals as 0 (test_floor_divide.py): those entries left
    out on JAX."""
    return mode == "jax" and x.dtype != np.float16 and (0 < np.abs(x)) & (
        np.abs(x) < np.finfo(x.dtype).tiny)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("dtype", FLOATS)
def test_signbit_and_copysign_are_numpys_bit_for_bit(dtype, mode):
    x = _edges(dtype)
    a, b = (v.reshape(-1) for v in np.meshgrid(x, x))
    got = _run(lambda x, a, b: (rnp.signbit(x), rnp.copysign(a, b)), (x, a, b), mode)
    np.testing.assert_array_equal(got[0], np.signbit(x))
    assert got[0].dtype == np.bool_ and got[1].dtype == np.dtype(dtype)
    keep = ~(_flushed(a, mode) | _flushed(b, mode))
    # the sign bit of every result, NaNs included (copysign(nan, -1) is -nan)
    np.testing.assert_array_equal(_bits(got[1])[keep], _bits(np.copysign(a, b))[keep])


@pytest.mark.parametrize("mode", MODES)
def test_signbit_of_integers_and_bools_is_numpys(mode):
    ints = np.array([np.iinfo(np.int64).min, -1, 0, 1], np.int64)
    got = _run(lambda i, u, b: (rnp.signbit(i), rnp.signbit(u), rnp.signbit(b)),
               (ints, np.array([0, 255], np.uint8), np.array([True, False])), mode)
    assert [g.tolist() for g in got] == [[True, True, False, False], [False, False],
                                         [False, False]]


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("dtype", FLOATS)
def test_hypot_is_numpys_without_overflow(dtype, mode):
    x = _edges(dtype)
    a, b = (v.reshape(-1) for v in np.meshgrid(x, x))
    got = np.asarray(_run(rnp.hypot, (a, b), mode))
    with np.errstate(all="ignore"):
        want = np.hypot(a, b)
    assert got.dtype == want.dtype
    keep = ~(_flushed(a, mode) | _flushed(b, mode))
    np.testing.assert_array_equal(np.isnan(got)[keep], np.isnan(want)[keep])
    finite = keep & ~np.isnan(want)
    np.testing.assert_allclose(got[finite], want[finite], rtol=2 * np.finfo(dtype).eps)
    assert np.isinf(want[np.isinf(a) & np.isnan(b)]).all()  # hypot(inf, nan) is inf


@pytest.mark.parametrize("mode", ["eager", "graph"])
def test_hypot_gradient_far_out_and_at_the_origin(mode):
    a, b = np.array([3e200, 0.0, -1e-300]), np.array([4e200, 0.0, 1e-300])
    ga, gb = rp.function(lambda a, b: rp.grad(rnp.sum(rnp.hypot(a, b)), [a, b]), mode=mode)(a, b)
    np.testing.assert_allclose(ga, [0.6, 0.0, -np.sqrt(0.5)], rtol=1e-15)
    np.testing.assert_allclose(gb, [0.8, 0.0, np.sqrt(0.5)], rtol=1e-15)


@pytest.mark.parametrize("mode", ["eager", "graph"])
def test_copysign_gradient_follows_the_sign_bits(mode):
    a, b = np.array([2.0, -2.0, 2.0, -2.0]), np.array([1.0, 1.0, -0.0, -3.0])
    ga, gb = rp.function(lambda a, b: rp.grad(rnp.sum(rnp.copysign(a, b)), [a, b]),
                         mode=mode)(a, b)
    assert ga.tolist() == [1.0, -1.0, -1.0, 1.0] and gb.tolist() == [0.0] * 4


def test_searchsorted_refuses_what_numpy_refuses():
    with pytest.raises(ValueError, match="1-D"):
        rnp.searchsorted(np.zeros((2, 2)), 1.0)
    with pytest.raises(ValueError, match="side"):
        rnp.searchsorted(np.zeros(2), 1.0, side="middle")
    got = rp.function(lambda a, v: rnp.searchsorted(a, v))(np.array([1, 3, 5]), np.array([2.5]))
    assert got.tolist() == [1] and got.dtype == np.int64  # compared in the common dtype


CREATION = {
    "zeros": lambda d: rnp.zeros(2, device=d), "ones": lambda d: rnp.ones(2, device=d),
    "empty": lambda d: rnp.empty(2, device=d), "full": lambda d: rnp.full(2, 1.0, device=d),
    "eye": lambda d: rnp.eye(2, device=d), "arange": lambda d: rnp.arange(3, device=d),
    "linspace": lambda d: rnp.linspace(0, 1, 3, device=d),
    "asarray": lambda d: rnp.asarray([1.0], device=d),
    "zeros_like": lambda d: rnp.zeros_like(np.ones(2), device=d),
    "ones_like": lambda d: rnp.ones_like(np.ones(2), device=d),
    "empty_like": lambda d: rnp.empty_like(np.ones(2), device=d),
    "full_like": lambda d: rnp.full_like(np.ones(2), 3, device=d),
    "from_dlpack": lambda d: rnp.from_dlpack(np.ones(2), device=d),
    "astype": lambda d: rnp.astype(np.ones(2), "int32", device=d),
    "fftfreq": lambda d: rnp.fft.fftfreq(4, device=d),
    "rfftfreq": lambda d: rnp.fft.rfftfreq(4, device=d),
}


@pytest.mark.parametrize("name", sorted(CREATION))
def test_device_keyword_takes_the_arrays_device_and_refuses_others(name):
    make = CREATION[name]
    plain = make(None)
    same = make(rnp.asarray(1.0).device)
    assert np.array_equal(np.asarray(plain), np.asarray(same)) and same.dtype == plain.dtype
    with pytest.raises(PlacementError, match="'cpu'") as e:
        make("cuda:0")
    assert isinstance(e.value, ValueError)
    info = rnp.__array_namespace_info__()
    assert info.dtypes(device=info.default_device()) == info.dtypes()
    with pytest.raises(PlacementError):
        info.default_dtypes(device="gpu")


@pytest.mark.parametrize("mode", ["eager", "graph"])
def test_fft_real_functions_are_numpys(mode):
    x = np.arange(30.0).reshape(2, 3, 5)
    got = rp.function(lambda x: (rnp.fft.fftfreq(7, 0.25), rnp.fft.rfftfreq(7, 0.25),
                                 rnp.fft.fftfreq(6, dtype="float32"), rnp.fft.fftshift(x),
                                 rnp.fft.ifftshift(x, axes=(0, 2)), rnp.fft.fftshift(x, 1)),
                      mode=mode)(x)
    want = (np.fft.fftfreq(7, 0.25), np.fft.rfftfreq(7, 0.25),
            np.fft.fftfreq(6).astype(np.float32), np.fft.fftshift(x),
            np.fft.ifftshift(x, axes=(0, 2)), np.fft.fftshift(x, 1))
    for g, w in zip(got, want):
        assert g.dtype == w.dtype
        np.testing.assert_array_equal(g, w)
    g = rp.function(lambda x: rp.grad(rnp.sum(rnp.fft.fftshift(x) * np.arange(5.0)), x),
                    mode=mode)(np.zeros(5))
    np.testing.assert_array_equal(g, np.fft.ifftshift(np.arange(5.0)))  # the roll back


@pytest.mark.parametrize("name", ["fft", "ifft", "rfft", "irfft", "fft2", "rfftn", "hfft",
                                  "ihfft"])
def test_fft_transforms_refuse_saying_why(name):
    with pytest.raises(DTypeError, match="no complex dtype"):
        getattr(rnp.fft, name)(np.ones(4))


PAIRS = ["bool", "int8", "uint8", "int16", "int32", "uint64", "float16", "float32", "float64"]


@pytest.mark.parametrize("name", ["arctan2", "logaddexp", "hypot", "copysign"])
def test_binary_float_ufuncs_of_mixed_dtypes_are_numpys(name):
    """The float NumPy's loop picks for two dtypes (int8 with uint8: float16, not the float32
    of their promoted int16), and a Python scalar's."""
    for x in PAIRS:
        for y in PAIRS + [3, 2.5, True]:
            a = np.array([1, 0], x)
            b = np.array([1, 1], y) if isinstance(y, str) else y
            with np.errstate(all="ignore"):
                want = getattr(np, name)(a, b)
            got = getattr(rnp, name)(a, b)
            assert got.dtype == want.dtype, (name, x, y)
            np.testing.assert_allclose(np.asarray(got, np.float64), want.astype(np.float64),
                                       rtol=1e-3)
