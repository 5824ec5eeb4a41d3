"""``rnp.linalg``: values against ``numpy.linalg`` and gradients against finite differences, eager,
traced on NumPy and on JAX (batched stacks, tall and wide matrices, every norm; ``cross``,
``diagonal``, ``matrix_power``, ``pinv``), and NumPy's answers at the edges."""

from __future__ import annotations

import importlib.util

import numpy as np
import pytest

import replicate as rp
import replicate.numpy as rnp

L = rnp.linalg
RUNS = [("eager", "numpy"), ("graph", "numpy")] + (
    [("graph", "jax")] if importlib.util.find_spec("jax") else [])
IDS = [f"{m}-{b}" for m, b in RUNS]
rng = np.random.default_rng(0)


def _sym(x, xp):
    """A symmetric positive-definite matrix (stack) made from any ``x``: what cholesky and
    eigh read, so that finite differences of ``x`` see the symmetric gradient."""
    return xp.matmul(x, xp.swapaxes(x, -1, -2)) + 3.0 * xp.eye(x.shape[-1])


def _gauge(v, xp):
    """A function of singular or eigen vectors that their signs do not change."""
    return v * v * xp.arange(1, v.shape[-1] + 1)


# name -> (rnp function, NumPy function, input shapes)
CASES = {
    "solve": (L.solve, np.linalg.solve, [(3, 3), (3, 2)]),
    "solve-vector": (L.solve, np.linalg.solve, [(3, 3), (3,)]),
    "solve-batched": (L.solve, np.linalg.solve, [(2, 3, 3), (3, 1)]),
    "inv": (L.inv, np.linalg.inv, [(2, 3, 3)]),
    "cholesky": (lambda x: L.cholesky(_sym(x, rnp)), lambda x: np.linalg.cholesky(_sym(x, np)),
                 [(2, 3, 3)]),
    "cholesky-upper": (lambda x: L.cholesky(_sym(x, rnp), upper=True),
                       lambda x: np.linalg.cholesky(_sym(x, np)).swapaxes(-1, -2), [(3, 3)]),
    "qr-tall": (lambda x: tuple(L.qr(x)), lambda x: np.linalg.qr(x), [(4, 3)]),
    "qr-square": (lambda x: tuple(L.qr(x)), lambda x: np.linalg.qr(x), [(2, 3, 3)]),
    "qr-r": (lambda x: L.qr(x, mode="r"), lambda x: np.linalg.qr(x, mode="r"), [(4, 2)]),
    "svd-s": (lambda x: L.svd(x, compute_uv=False), lambda x: np.linalg.svd(x, compute_uv=False),
              [(2, 4, 3)]),
    "svdvals-wide": (L.svdvals, lambda x: np.linalg.svd(x, compute_uv=False), [(2, 4)]),
    "svd-tall": (lambda x: [_gauge(u, rnp) for u in (L.svd(x, False)[0], L.svd(x, False)[2].T)]
                 + [L.svd(x, False)[1]],
                 lambda x: [_gauge(u, np) for u in (np.linalg.svd(x, False)[0],
                                                    np.linalg.svd(x, False)[2].T)]
                 + [np.linalg.svd(x, False)[1]], [(4, 3)]),
    "svd-wide": (lambda x: [_gauge(L.svd(x, False)[0], rnp), _gauge(L.svd(x, False)[2].T, rnp)],
                 lambda x: [_gauge(np.linalg.svd(x, False)[0], np),
                            _gauge(np.linalg.svd(x, False)[2].T, np)], [(2, 4)]),
    "svd-square-full": (lambda x: _gauge(L.svd(x)[0], rnp) + _gauge(L.svd(x)[2].T, rnp),
                        lambda x: _gauge(np.linalg.svd(x)[0], np) + _gauge(np.linalg.svd(x)[2].T,
                                                                           np), [(3, 3)]),
    "eigh": (lambda x: [L.eigh(_sym(x, rnp))[0], _gauge(L.eigh(_sym(x, rnp))[1], rnp)],
             lambda x: [np.linalg.eigh(_sym(x, np))[0], _gauge(np.linalg.eigh(_sym(x, np))[1],
                                                               np)], [(2, 3, 3)]),
    "eigvalsh": (lambda x: L.eigvalsh(_sym(x, rnp)), lambda x: np.linalg.eigvalsh(_sym(x, np)),
                 [(3, 3)]),
    "det": (L.det, np.linalg.det, [(2, 3, 3)]),
    "slogdet": (lambda x: tuple(L.slogdet(x)), lambda x: np.linalg.slogdet(x), [(2, 3, 3)]),
    "outer": (L.outer, np.outer, [(3,), (2,)]),
    "trace": (lambda x: L.trace(x, 1), lambda x: np.trace(x, 1, -2, -1), [(2, 3, 4)]),
    "cross": (L.cross, np.linalg.cross, [(2, 1, 3), (4, 3)]),
    "cross-axis": (lambda a, b: L.cross(a, b, axis=1), lambda a, b: np.linalg.cross(a, b, axis=1),
                   [(2, 3, 2), (2, 3, 2)]),
    "diagonal": (lambda x: L.diagonal(x, offset=-1), lambda x: np.linalg.diagonal(x, offset=-1),
                 [(2, 4, 3)]),
    "matrix_power-7": (lambda x: L.matrix_power(x, 7), lambda x: np.linalg.matrix_power(x, 7),
                       [(2, 3, 3)]),
    "matrix_power-neg": (lambda x: L.matrix_power(x, -2),
                         lambda x: np.linalg.matrix_power(x, -2), [(3, 3)]),
    "pinv-tall": (L.pinv, np.linalg.pinv, [(2, 4, 3)]),
    "pinv-wide": (L.pinv, np.linalg.pinv, [(3, 5)]),
    "pinv-hermitian": (lambda x: L.pinv(_sym(x, rnp), hermitian=True),
                       lambda x: np.linalg.pinv(_sym(x, np), hermitian=True), [(3, 3)]),
}
NORMS = [(None, None), (None, 1), (None, (0, 2)), (2, None), (1, None), (np.inf, None),
         (-np.inf, None), (0, None), (3.5, None), ("fro", (1, 2)), ("nuc", (1, 2)), (1, (1, 2)),
         (-1, (2, 1)), (np.inf, (1, 2)), (-np.inf, (1, 2)), (2, (1, 2)), (-2, (1, 2))]
for _ord, _axis in NORMS:
    shape = (3, 4) if _axis is None and _ord is not None else (2, 3, 4)
    if _axis is None and _ord is not None and not isinstance(_ord, str):
        shape = (5,)  # a vector norm of a 1-D array
    CASES[f"norm-{_ord}-{_axis}"] = (lambda x, o=_ord, a=_axis: L.norm(x, o, a),
                                     lambda x, o=_ord, a=_axis: np.linalg.norm(x, o, a), [shape])
CASES["vector_norm"] = (lambda x: L.vector_norm(x, (0, 2), keepdims=True, ord=3),
                        lambda x: np.linalg.vector_norm(x, axis=(0, 2), keepdims=True, ord=3),
                        [(2, 3, 4)])
CASES["matrix_norm"] = (lambda x: L.matrix_norm(x, keepdims=True, ord="nuc"),
                        lambda x: np.linalg.matrix_norm(x, keepdims=True, ord="nuc"), [(2, 3, 4)])
NOT_DIFFERENTIABLE = {"norm-0-None"}  # a count


def _leaves(out):
    return [np.asarray(o) for o in (out if isinstance(out, (list, tuple)) else [out])]


def _inputs(name):
    seed = int.from_bytes(name.encode(), "little") % (2 ** 32)
    r = np.random.default_rng(seed)
    return [r.standard_normal(s) + (2.0 * np.eye(s[-1]) if len(s) >= 2 and s[-1] == s[-2]
                                     else 0.0) for s in CASES[name][2]]


@pytest.mark.parametrize("run", RUNS, ids=IDS)
@pytest.mark.parametrize("name", sorted(CASES))
def test_values_are_numpys(name, run):
    fn, ref, _ = CASES[name]
    xs = _inputs(name)
    mode, backend = run
    got = _leaves(rp.function(fn, mode=mode, backend=backend)(*xs))
    want = _leaves(ref(*xs))
    assert len(got) == len(want)
    for g, w in zip(got, want):
        assert g.shape == w.shape and g.dtype == w.dtype, (g.shape, w.shape, g.dtype, w.dtype)
        np.testing.assert_allclose(g, w, rtol=1e-9, atol=1e-10)


def _finite_differences(loss, xs, eps=1e-6):
    grads = []
    for i, x in enumerate(xs):
        g = np.zeros_like(x)
        for j in np.ndindex(x.shape):
            up, down = [v.copy() for v in xs], [v.copy() for v in xs]
            up[i][j] += eps
            down[i][j] -= eps
            g[j] = (loss(up) - loss(down)) / (2 * eps)
        grads.append(g)
    return grads


@pytest.mark.parametrize("run", RUNS, ids=IDS)
@pytest.mark.parametrize("name", sorted(set(CASES) - NOT_DIFFERENTIABLE))
def test_gradients_match_finite_differences(name, run):
    fn, ref, _ = CASES[name]
    xs = _inputs(name)
    cots = [np.random.default_rng(1).standard_normal(w.shape) for w in _leaves(ref(*xs))]

    def loss(*args):
        return sum(rnp.sum(o * c) for o, c in zip(
            fn(*args) if isinstance(fn(*args), (list, tuple)) else [fn(*args)], cots))

    mode, backend = run
    got = rp.function(lambda *a: rp.grad(loss(*a), list(a)), mode=mode, backend=backend)(*xs)
    want = _finite_differences(lambda v: sum(float(np.sum(o * c)) for o, c in
                                             zip(_leaves(ref(*v)), cots)), xs)
    for g, w in zip(got, want):
        np.testing.assert_allclose(np.asarray(g), w, rtol=1e-5, atol=1e-6)


def test_norm_gradient_at_zero_is_zero():
    g = rp.function(lambda x: rp.grad(L.norm(x), x))(np.zeros(3))
    assert np.asarray(g).tolist() == [0.0, 0.0, 0.0]


def test_integers_compute_in_float64_and_float32_stays():
    assert L.det(np.eye(2, dtype=np.int32)).dtype == np.float64
    assert L.inv(np.eye(2, dtype=np.float32)).dtype == np.float32
    assert L.norm(np.array([3, 4])).tolist() == 5.0


def test_matrix_rank_pinv_and_matrix_power_as_numpys_at_their_edges():
    rank_deficient = np.outer([1.0, 2.0, 3.0], [1.0, -1.0, 0.5])
    for mode in ("eager", "graph"):
        got = rp.function(lambda a: (L.matrix_rank(a), L.pinv(a), L.pinv(a, rtol=None),
                                     L.matrix_power(a, 0), L.matrix_rank(a[0]),
                                     L.matrix_rank(a[:, :0])), mode=mode)(rank_deficient)
        want = (np.linalg.matrix_rank(rank_deficient), np.linalg.pinv(rank_deficient),
                np.linalg.pinv(rank_deficient, rtol=None), np.eye(3),
                np.linalg.matrix_rank(rank_deficient[0]), 0)
        for g, w in zip(got, want):
            assert np.asarray(g).dtype == np.asarray(w).dtype
            np.testing.assert_allclose(g, w, rtol=1e-12, atol=1e-15)
    ints = np.array([[1, 1], [0, 1]])
    assert L.matrix_power(ints, 3).dtype == np.int64 and L.matrix_power(ints, 3).tolist() == [
        [1, 3], [0, 1]]
    assert L.matrix_power(ints, -3).tolist() == np.linalg.matrix_power(ints, -3).tolist()
    assert L.pinv(np.zeros((2, 0, 3))).shape == (2, 3, 0)
    with pytest.raises(TypeError, match="integer"):
        L.matrix_power(np.eye(2), 2.0)
    with pytest.raises(np.linalg.LinAlgError):
        L.matrix_power(np.zeros((2, 2)), -1)
    with pytest.raises(ValueError, match="3-vectors"):
        L.cross(np.ones(3), np.ones(2))
    with pytest.raises(ValueError, match="both"):
        L.matrix_rank(np.eye(2), tol=1.0, rtol=0.1)


def test_numpys_errors_and_the_unsupported():
    with pytest.raises(np.linalg.LinAlgError):
        L.inv(np.zeros((2, 2)))
    with pytest.raises(rp.ShapeError, match="square"):
        L.det(np.zeros((2, 3)))
    with pytest.raises(rp.ShapeError, match="m >= n"):
        rp.function(lambda x: rp.grad(rnp.sum(L.qr(x).Q), x))(np.ones((2, 3)))
    with pytest.raises(rp.ShapeError, match="full_matrices=False"):
        rp.function(lambda x: rp.grad(rnp.sum(L.svd(x).U), x))(rng.standard_normal((3, 2)))


@pytest.mark.parametrize("mode", ["eager", "graph"])
def test_a_named_tuple_result_keeps_its_type_in_every_mode(mode):
    """``qr``'s ``QRResult`` comes back as a ``QRResult`` (it was one stacked array in eager mode:
    the nest walker took a named tuple for a leaf)."""
    a = np.random.default_rng(5).normal(size=(4, 3))
    got = rp.function(lambda a: rnp.linalg.qr(a), mode=mode)(a)
    assert type(got).__name__ == "QRResult" and got._fields == ("Q", "R")
    np.testing.assert_allclose(got.Q @ got.R, a, atol=1e-12)
