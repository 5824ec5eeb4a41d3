"""``nonzero``, ``unique`` and the Array API's ``unique_*``: NumPy's answers eager; in a traced step
jax.numpy's ``size=``/``fill_value=`` (and a clear error without them), on NumPy and JAX; the
values' gradient; ``empty_like``."""

from __future__ import annotations

import importlib.util

import numpy as np
import pytest

import replicate as rp
import replicate.numpy as rnp
from replicate.errors import TracerConversionError

BACKENDS = ["numpy"] + (["jax"] if importlib.util.find_spec("jax") else [])
rng = np.random.default_rng(0)
ARRAYS = {
    "ints": rng.integers(-3, 4, (4, 5)),
    "floats-nan": np.array([2.0, np.nan, -0.0, 1.5, np.nan, 2.0, 0.0, -np.inf]),
    "bools": rng.random((3, 3)) < 0.5,
    "int8": np.array([5, -1, 5, 0, 127], np.int8),
    "empty": np.zeros((0, 3)),
    "one": np.array([7.0]),
    "all-zero": np.zeros((2, 2), np.int32),
}


def _same(got, want):
    got = np.asarray(got)
    assert got.dtype == np.asarray(want).dtype and got.shape == np.asarray(want).shape
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("name", sorted(ARRAYS))
@pytest.mark.parametrize("equal_nan", [True, False])
def test_unique_is_numpys_eager(name, equal_nan):
    x = ARRAYS[name]
    got = rnp.unique(rnp.asarray(x), True, True, True, equal_nan=equal_nan)
    want = np.unique(x, True, True, True, equal_nan=equal_nan)
    for g, w in zip(got, want):
        _same(g, w)
    _same(rnp.unique(x, equal_nan=equal_nan), np.unique(x, equal_nan=equal_nan))


@pytest.mark.parametrize("name", sorted(ARRAYS))
def test_array_api_unique_functions_are_numpys(name):
    x = ARRAYS[name]
    _same(rnp.unique_values(x), np.sort(np.unique_values(x)))  # (NumPy's may come unsorted)
    for fn in ("unique_counts", "unique_inverse", "unique_all"):
        got, want = getattr(rnp, fn)(x), getattr(np, fn)(x)
        assert got._fields == want._fields
        for g, w in zip(got, want):
            _same(g, w)


@pytest.mark.parametrize("name", sorted(ARRAYS))
def test_nonzero_is_numpys_eager(name):
    x = ARRAYS[name]
    got, want = rnp.nonzero(rnp.asarray(x)), np.nonzero(x)
    assert len(got) == len(want)
    for g, w in zip(got, want):
        _same(g, w)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("size", [0, 2, 5, 30])
def test_traced_with_size(backend, size):
    x = ARRAYS["floats-nan"]

    def f(v):
        values, index, inverse, counts = rnp.unique(v, True, True, True, size=size)
        return values, index, inverse, counts, *rnp.nonzero(v, size=size, fill_value=-1)

    got = rp.function(f, backend=backend)(x)
    values, index, inverse, counts = np.unique(x, True, True, True)
    k = min(size, values.size)
    pad = size - k
    _same(got[0], np.concatenate([values[:k], np.full(pad, values[0])]))  # the smallest pads
    _same(got[1], np.concatenate([index[:k], np.zeros(pad, np.int64)]))
    _same(got[2], inverse)
    _same(got[3], np.concatenate([counts[:k], np.zeros(pad, np.int64)]))
    (nz,) = np.nonzero(x)
    k = min(size, nz.size)
    _same(got[4], np.concatenate([nz[:k], np.full(size - k, -1)]))


def test_traced_fill_values():
    def f(v):
        return rnp.unique(v, size=4, fill_value=9), rnp.nonzero(v, size=4, fill_value=(7, 8))

    (u, (r, c)) = rp.function(f)(np.array([[0, 3], [3, 0]]))
    assert u.tolist() == [0, 3, 9, 9]
    assert r.tolist() == [0, 1, 7, 7] and c.tolist() == [1, 0, 8, 8]


@pytest.mark.parametrize("fn", [rnp.unique, rnp.nonzero, rnp.unique_values])
def test_traced_without_size_says_pass_size(fn):
    with pytest.raises(TracerConversionError, match="pass size="):
        rp.function(fn)(np.array([1.0, 2.0]))


@pytest.mark.parametrize("mode", ["eager", "graph"])
def test_unique_values_differentiate_as_the_entries_they_came_from(mode):
    def f(x):
        u = rnp.unique(x, size=4, fill_value=0.0)
        return rp.grad(rnp.sum(u * rnp.asarray([1.0, 2.0, 3.0, 4.0])), x)

    # unique of [3, 1, 3, 2] is [1, 2, 3] (+ a fill): each cotangent to the first occurrence
    got = rp.function(f, mode=mode)(np.array([3.0, 1.0, 3.0, 2.0]))
    assert np.asarray(got).tolist() == [3.0, 1.0, 0.0, 2.0]


def test_nonzero_of_a_scalar_is_refused():
    with pytest.raises(rp.ShapeError, match="0-d"):
        rnp.nonzero(rnp.asarray(1.0))


def test_empty_like():
    x = rnp.asarray([[1.5, 2.5]])
    assert rnp.empty_like(x).dtype == np.float64 and rnp.empty_like(x).shape == (1, 2)
    assert rnp.empty_like(x, "int8").tolist() == [[0, 0]]
