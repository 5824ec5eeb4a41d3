"""Gradients that came out wrong without an error (an audit against JAX, PyTorch and finite
differences, session 13), held in every mode and backend:

1. ``rp.cond``/``rp.switch`` in graph mode: the untaken branch's backward pass on a zero
   cotangent made NaN (``sqrt`` at 0: 0 * inf) and it reached the gradient — now the taken
   branch's alone, as in eager mode and ``jax.lax.cond``;
2. ``x ** 0`` at 0 (and so the higher derivatives of ``x ** n`` there): NaN, now 0; the
   exponent's derivative hid a NaN or negative base behind 0, now NaN (JAX's and PyTorch's);
3. ``softplus``'s second derivative at 0 was 0 (it is 0.25): its two kinks' curvatures lost;
4. ``huber``'s second derivative at a residual of 0 was 0 (it is 1);
5. the JAX backend's ``cholesky``/``eigh`` read ``(a + a.T) / 2``, NumPy's the lower triangle;
6. the gradient of ``svd``'s S of a non-square matrix with full matrices was a ShapeError;
7. ``rp.grad`` with respect to integers gave zeros whatever the function: now an error;
8. ``prod``'s gradient divided the product by each entry: NaN for an infinite one.
"""

from __future__ import annotations

import numpy as np
import pytest

import replicate as rp
import replicate.numpy as rnp

MODES = [dict(mode="eager"), dict(backend="numpy"), dict(backend="jax")]
IDS = ["eager", "numpy", "jax"]


def run(fn, kw, *args):
    out = rp.function(fn, **kw)(*args)
    return [np.asarray(v) for v in out] if isinstance(out, (list, tuple)) else np.asarray(out)


@pytest.mark.parametrize("kw", MODES, ids=IDS)
def test_the_gradient_of_cond_is_the_taken_branchs(kw):
    w = rp.Variable(np.float64(0.0), name="w")
    ref = np.float64(0.0)

    def f(x, c):
        sq = rp.grad(rp.cond(x > 0, lambda x: rnp.sqrt(x), lambda x: -x, x), x)
        guarded = rp.grad(rp.cond(c > 0, lambda t, c: t / c, lambda t, c: t * 0.0, x + 3.0, c), x)
        inner = rp.grad(rp.cond(c > 0, lambda: rnp.log(w.read() + x), lambda: x * 2.0), x)
        closed = rp.grad(rp.cond(x > 0, lambda: rnp.sqrt(x * (ref + 1.0)), lambda: x), x)
        sw = rp.grad(rp.switch(rnp.asarray(1) + rnp.cast(c, np.int64),
                               [lambda x: rnp.log(x), lambda x: 2.0 * x, lambda x: rnp.sqrt(x)],
                               x), x)
        return sq, guarded, inner, closed, sw
    with np.errstate(all="ignore"):
        got = run(f, kw, np.float64(0.0), np.float64(0.0))
    assert [float(v) for v in got] == [-1.0, 0.0, 2.0, 1.0, 2.0]


@pytest.mark.parametrize("kw", MODES, ids=IDS)
def test_the_gradient_through_a_taken_branch_is_unchanged(kw):
    def f(x):
        return rp.grad(rp.cond(x > 0, lambda x: rnp.sqrt(x) * x, lambda x: -x, x), x)
    assert float(run(f, kw, np.float64(4.0))) == pytest.approx(3.0, rel=1e-15)


@pytest.mark.parametrize("kw", MODES, ids=IDS)
def test_powers_at_zero_have_their_derivatives(kw):
    def f(x):
        d1 = rp.grad(x ** 0, x)
        d2 = rp.grad(rp.grad(x ** 1, x), x)
        d3 = rp.grad(rp.grad(rp.grad(x ** 2, x), x), x)
        return d1, d2, d3, rp.grad(x ** 0.5, x)  # (sqrt's derivative at 0 stays inf)
    with np.errstate(all="ignore"):
        assert [float(v) for v in run(f, kw, np.float64(0.0))] == [0.0, 0.0, 0.0, np.inf]
    assert [float(v) for v in run(f, kw, np.float64(2.25))] == [0.0, 0.0, 0.0, 0.5 / 1.5]


@pytest.mark.parametrize("kw", MODES, ids=IDS)
def test_the_exponents_derivative_keeps_a_nan_or_negative_bases_nan(kw):
    a = np.float64([-2.0, np.nan, 0.0, 2.0])
    with np.errstate(all="ignore"):
        got = run(lambda b: rp.grad(rnp.sum(a ** b), b), kw, np.float64([3.0, 2.0, 2.0, 3.0]))
    assert np.isnan(got[0]) and np.isnan(got[1]) and got[2] == 0.0
    assert got[3] == pytest.approx(8 * np.log(2.0), rel=1e-15)


@pytest.mark.parametrize("kw", MODES, ids=IDS)
def test_softplus_has_its_curvature_at_zero(kw):
    x = np.float64([0.0, -3.0, 2.5, -800.0, 800.0])

    def f(x):
        g = rp.grad(rnp.sum(rnp.softplus(x)), x)
        return rnp.softplus(x), g, rp.grad(rnp.sum(g), x)
    value, first, second = run(f, kw, x)
    sig = 1 / (1 + np.exp(-x))
    np.testing.assert_allclose(value, np.logaddexp(0.0, x), rtol=1e-15)
    np.testing.assert_allclose(first, sig, rtol=1e-15)
    np.testing.assert_allclose(second, sig * (1 - sig), rtol=1e-12, atol=1e-300)
    assert second[0] == 0.25


@pytest.mark.parametrize("kw", MODES, ids=IDS)
def test_huber_has_its_curvature_at_zero_residual(kw):
    p, t = np.float64([0.3, 0.5, 0.0, 1.0]), np.float64([0.3, 0.2, 2.0, 0.0])

    def f(p):
        loss = rp.nn.huber(p, t, 1.0)
        g = rp.grad(rnp.sum(loss), p)
        return loss, g, rp.grad(rnp.sum(g), p)
    loss, g, h = run(f, kw, p)
    np.testing.assert_allclose(loss, [0.0, 0.045, 1.5, 0.5], rtol=1e-12)
    np.testing.assert_allclose(g, [0.0, 0.3, -1.0, 1.0], rtol=1e-12)
    assert h.tolist() == [1.0, 1.0, 0.0, 0.0]  # (PyTorch's: the linear part from |r| = delta)


@pytest.mark.parametrize("kw", MODES, ids=IDS)
def test_cholesky_and_eigh_read_the_lower_triangle(kw):
    a = np.float64([[4.0, 9.0, 9.0], [1.0, 3.0, 9.0], [0.5, 0.2, 2.0]])  # (junk above)
    chol, w, v = run(lambda a: (rnp.linalg.cholesky(a), *rnp.linalg.eigh(a)), kw, a)
    np.testing.assert_allclose(chol, np.linalg.cholesky(a), rtol=1e-12)
    np.testing.assert_allclose(w, np.linalg.eigvalsh(a), rtol=1e-12)
    np.testing.assert_allclose(np.abs(v), np.abs(np.linalg.eigh(a)[1]), rtol=1e-10)


@pytest.mark.parametrize("kw", MODES, ids=IDS)
@pytest.mark.parametrize("shape", [(3, 2), (2, 3), (2, 4, 3)])
def test_the_gradient_of_svds_values_with_full_matrices(kw, shape):
    a = np.random.default_rng(0).standard_normal(shape)
    weights = np.arange(1.0, 1.0 + min(shape[-2:]))

    def f(full):
        return lambda a: rp.grad(rnp.sum(rnp.linalg.svd(a, full_matrices=full)[1] * weights), a)
    np.testing.assert_allclose(run(f(True), kw, a), run(f(False), kw, a), rtol=1e-12)


@pytest.mark.parametrize("kw", MODES, ids=IDS)
def test_a_gradient_with_respect_to_integers_is_an_error(kw):
    with pytest.raises(rp.ReplicateError, match="array of int64"):
        run(lambda x: rp.grad(rnp.sum(x * 2.5), x), kw, np.array([1, 2, 3]))


def _others(x, axes):
    """The product of the other entries of each one's reduced slice, by brute force."""
    out = np.empty_like(x)
    for i in np.ndindex(x.shape):
        mask = np.zeros(x.shape, bool)
        mask[tuple(slice(None) if a in axes else i[a] for a in range(x.ndim))] = True
        mask[i] = False
        out[i] = np.prod(x[mask])
    return out


@pytest.mark.parametrize("kw", MODES, ids=IDS)
def test_the_gradient_of_prod_is_the_product_of_the_others(kw):
    for x in ([2.0, np.inf, 3.0], [1.0, np.nan, 3.0], [2.0, 0.0, 3.0], [0.0, 0.0, 3.0],
              [2.0, -np.inf, 0.0]):
        x = np.float64(x)
        with np.errstate(all="ignore"):
            got = run(lambda x: rp.grad(rnp.prod(x), x), kw, x)
            np.testing.assert_array_equal(got, _others(x, (0,)))
    x = np.random.default_rng(1).standard_normal((2, 3, 2))
    x[1, 2, 0] = np.inf
    for axes in [(0, 2), (1,), (0, 1, 2)]:
        with np.errstate(all="ignore"):
            got = run(lambda x: rp.grad(rnp.sum(rnp.prod(x, axis=axes) * 1.5), x), kw, x)
            np.testing.assert_allclose(got, 1.5 * _others(x, axes), rtol=1e-13)
