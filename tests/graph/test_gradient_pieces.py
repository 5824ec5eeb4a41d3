"""An array read piece by piece gets its gradient joined, not scattered and added
(``replicate/graph/pieces.py``): disjoint pieces that tile one axis are concatenated (one pass,
no zero-filled copies of the whole); any other set of pieces takes the scatter-and-add path.
Values against NumPy's gradient written out by hand, in both modes and on both graph backends."""

from __future__ import annotations

import numpy as np
import pytest

import replicate as rp
import replicate.numpy as rnp

MODES = [("eager", "numpy"), ("graph", "numpy"), ("graph", "jax")]
rng = np.random.default_rng(0)
X = rng.standard_normal((3, 4, 6))
W = [rng.standard_normal((4, 6)) for _ in range(3)]


def _grad(fn, mode, backend, x=X):
    f = rp.function(lambda x: rp.grad(fn(x), x), mode=mode, backend=backend)
    return f, np.asarray(f(x))


def _prims(f, x=X):
    return [n.prim for n in f.executable(x).graph.nodes]


@pytest.mark.parametrize("mode,backend", MODES)
def test_three_pieces_of_one_axis_are_joined(mode, backend):
    """``q, k, v = x[0], x[1], x[2]`` (the attention projection's split): the gradient of each
    piece lands in its place."""
    def loss(x):
        q, k, v = x[0], x[1], x[2]
        return rnp.sum(q * W[0]) + rnp.sum(k * k * W[1]) + rnp.sum(rnp.sin(v) * W[2])

    f, g = _grad(loss, mode, backend)
    want = np.stack([W[0], 2 * X[1] * W[1], np.cos(X[2]) * W[2]])
    np.testing.assert_allclose(g, want, rtol=1e-12 if backend == "numpy" else 1e-6)
    if mode == "graph" and backend == "numpy":
        prims = _prims(f)
        assert "scatter_add" not in prims and "concatenate" in prims, prims


@pytest.mark.parametrize("mode,backend", MODES)
def test_split_along_an_inner_axis_is_joined(mode, backend):
    """``rnp.split`` into unequal slices along axis 2, read in any order."""
    def loss(x):
        a, b, c = rnp.split(x, [1, 4], axis=2)
        return rnp.sum(c * 3.0) + rnp.sum(a * a) + rnp.sum(b * X[:, :, 1:4])

    f, g = _grad(loss, mode, backend)
    want = np.concatenate([2 * X[:, :, :1], X[:, :, 1:4], np.full((3, 4, 2), 3.0)], axis=2)
    np.testing.assert_allclose(g, want, rtol=1e-12 if backend == "numpy" else 1e-6)
    if mode == "graph" and backend == "numpy":
        assert "scatter_add" not in _prims(f)


@pytest.mark.parametrize("mode,backend", MODES)
@pytest.mark.parametrize("case", ["overlap", "gap", "twice", "strided", "two axes", "dense too"])
def test_other_pieces_are_scattered_and_added(mode, backend, case):
    """Pieces that do not tile one axis exactly keep the scatter-and-add path, with the same
    values."""
    pieces = {
        "overlap": lambda x: rnp.sum(x[0:2] * 2.0) + rnp.sum(x[1:3] ** 2),
        "gap": lambda x: rnp.sum(x[0] * 2.0) + rnp.sum(x[2] ** 2),
        "twice": lambda x: rnp.sum(x[0] * 2.0) + rnp.sum(x[0] ** 2) + rnp.sum(x[1:] * 5.0),
        "strided": lambda x: rnp.sum(x[::2] * 2.0) + rnp.sum(x[1] ** 2),
        "two axes": lambda x: rnp.sum(x[0, :2] * 2.0) + rnp.sum(x[1:] ** 2) + rnp.sum(x[0, 2:]),
        "dense too": lambda x: rnp.sum(x * x) + rnp.sum(x[0] * 2.0) + rnp.sum(x[1:] * 5.0),
    }
    want = {
        "overlap": np.stack([np.full((4, 6), 2.0), 2.0 + 2 * X[1], 2 * X[2]]),
        "gap": np.stack([np.full((4, 6), 2.0), np.zeros((4, 6)), 2 * X[2]]),
        "twice": np.concatenate([2.0 + 2 * X[:1], np.full((2, 4, 6), 5.0)]),
        "strided": np.stack([np.full((4, 6), 2.0), 2 * X[1], np.full((4, 6), 2.0)]),
        "two axes": np.concatenate([np.concatenate([np.full((1, 2, 6), 2.0),
                                                    np.ones((1, 2, 6))], axis=1), 2 * X[1:]]),
        "dense too": 2 * X + np.concatenate([np.full((1, 4, 6), 2.0),
                                             np.full((2, 4, 6), 5.0)]),
    }
    _, g = _grad(pieces[case], mode, backend)
    np.testing.assert_allclose(g, want[case], rtol=1e-12 if backend == "numpy" else 1e-6)


def test_negative_indices_and_grad_of_grad():
    """Negative ints name the same places; the joined gradient is differentiable again."""
    def loss(x):
        return rnp.sum(x[-1] ** 3) + rnp.sum(x[0] ** 3) + rnp.sum(x[-2] ** 3)

    def second(x):
        return rnp.sum(rp.grad(loss(x), x) * W[0])

    for mode in ("eager", "graph"):
        g2 = np.asarray(rp.function(lambda x: rp.grad(second(x), x), mode=mode)(X))
        np.testing.assert_allclose(g2, 6 * X * W[0], rtol=1e-12)
