"""The NumPy rows' scatter-add by one index array (an embedding's gradient): a stable sort and
one ``add.reduceat`` in place of ``np.add.at`` — the same sums (exact on integer-valued data,
to rounding otherwise), negative indices, repeated and absent rows, index arrays of any shape,
and ``add.at``'s IndexError out of range; through ``rp.grad`` of an embedding lookup."""

from __future__ import annotations

import numpy as np
import pytest

import replicate as rp
import replicate.numpy as rnp
from replicate.graph.reference import _scatter_add_np

rng = np.random.default_rng(11)


@pytest.mark.parametrize("idx_shape", [(7,), (3, 4), (1,), (50,)])
@pytest.mark.parametrize("rows", [1, 5, 40])
def test_equals_add_at(idx_shape, rows):
    idx = rng.integers(-rows, rows, size=idx_shape)
    g = rng.integers(-4, 5, size=idx_shape + (3, 2)).astype(np.float64)
    want = np.zeros((rows, 3, 2))
    np.add.at(want, idx, g)
    got = _scatter_add_np(g, idx, index=(("array", 0),), shape=(rows, 3, 2))
    np.testing.assert_array_equal(got, want)  # integer values: exact in any order
    g32 = rng.standard_normal(idx_shape + (3, 2)).astype(np.float32)
    want32 = np.zeros((rows, 3, 2), np.float32)
    np.add.at(want32, idx, g32)
    got32 = _scatter_add_np(g32, idx, index=(("array", 0),), shape=(rows, 3, 2))
    assert got32.dtype == np.float32
    np.testing.assert_allclose(got32, want32, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("bad", [5, -6])
def test_out_of_range_is_add_ats_index_error(bad):
    idx = np.array([0, bad, 1])
    with pytest.raises(IndexError):
        _scatter_add_np(np.ones((3, 2)), idx, index=(("array", 0),), shape=(5, 2))


@pytest.mark.parametrize("mode", ["eager", "graph"])
def test_an_embeddings_gradient(mode):
    table = rng.standard_normal((9, 4))
    ids = rng.integers(0, 9, size=(6, 5))
    cot = rng.standard_normal((6, 5, 4))

    def f(t, ids):
        return rp.grad(rnp.sum(t[ids] * cot), t)

    want = np.zeros((9, 4))
    np.add.at(want, ids, cot)
    np.testing.assert_allclose(np.asarray(rp.function(f, mode=mode)(table, ids)), want,
                               rtol=1e-12, atol=1e-12)
