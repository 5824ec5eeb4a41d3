"""Gradients where a function has no derivative: at a kink or a tie the library picks the value
PyTorch and JAX pick, in every mode and on every backend, so a step ported from either trains on
the same numbers.

* ``rp.nn.relu`` at 0: 0 (``torch.relu``, ``jax.nn.relu``), though ``max(x, 0)`` is what it
  computes: its own rule, not ``maximum``'s;
* ``maximum`` / ``minimum`` at a tie: each operand gets half (``torch.maximum``, ``jnp.maximum``;
  also the central difference, and the library's ``max`` reduction, whose tied elements share);
* so what is built from them is right at its kinks: ``softplus`` is ``maximum(x, 0) +
  log1p(exp(-|x|))``, whose derivative at 0 is ``sigmoid(0) = 0.5`` (with the tie given whole to
  ``x`` it was 1).

JAX, where it is installed, is the outside reference of every value here.
"""

from __future__ import annotations

import importlib.util

import numpy as np
import pytest

import replicate as rp
import replicate.numpy as rnp
from conftest import column, optional_torch
from replicate.backends import available

RUNS = {"eager": dict(mode="eager"), "numpy": dict(mode="graph")}
if "jax" in available():
    RUNS["jax"] = dict(backend="jax")
DTYPES = ["float32", "float64", "bfloat16"]  # eager: float32/64 take relu's kernel, bf16 not
HAVE_JAX = importlib.util.find_spec("jax") is not None
torch, needs_torch_kinks = optional_torch()

X = np.array([-2.0, -0.0, 0.0, 0.5, 3.0, np.nan])
A = np.array([1.0, 2.0, -0.0, 0.0, -1.5, np.inf, 4.0, np.nan])
B = np.array([1.0, 3.0, 0.0, -0.0, -1.5, np.inf, 2.0, 1.0])


def _dtype(name):
    return np.dtype(rp.bfloat16 if name == "bfloat16" else name)


def _run(f, args, where):
    with np.errstate(invalid="ignore"):
        return [np.asarray(v).astype(np.float64)
                for v in rp.function(f, **RUNS[where])(*args)]


def _relu_grad_want(x):
    with np.errstate(invalid="ignore"):
        return np.where(x > 0, 1.0, 0.0)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("where", list(RUNS), ids=column)
def test_relu_gradient_is_0_at_0(where, dtype):
    x = X.astype(_dtype(dtype))

    def f(v):
        return rp.nn.relu(v), rp.grad(rnp.sum(rp.nn.relu(v)), v)

    out, g = _run(f, [x], where)
    with np.errstate(invalid="ignore"):
        np.testing.assert_array_equal(out, np.maximum(x.astype(np.float64), 0.0))
    assert np.isnan(out[-1])  # relu(nan) is nan, as torch.relu
    np.testing.assert_array_equal(g, _relu_grad_want(X))


@pytest.mark.parametrize("where", list(RUNS), ids=column)
def test_relu_second_derivative_is_0(where):
    def f(v):
        return (rp.grad(rnp.sum(rp.grad(rnp.sum(rp.nn.relu(v) * v), v)), v),)

    got, = _run(f, [X[:5].astype(np.float32)], where)
    # d/dx (relu(x) + x relu'(x)) = 2 relu'(x) (relu'' = 0): 0 at 0
    np.testing.assert_array_equal(got, 2 * _relu_grad_want(X[:5]))


def _ties_want(a, b, minimum=False):
    """d/da, d/db of sum(maximum(a, b) * c) with c = 1..n: half to each at a tie, 0 to both
    where either is NaN."""
    c = np.arange(1.0, a.size + 1)
    first = (a < b) if minimum else (a > b)
    second = (a > b) if minimum else (a < b)
    tie = a == b
    return c * (first + 0.5 * tie), c * (second + 0.5 * tie)


@pytest.mark.parametrize("op", ["maximum", "minimum"])
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("where", list(RUNS), ids=column)
def test_maximum_and_minimum_split_a_tie(where, dtype, op):
    a, b = A.astype(_dtype(dtype)), B.astype(_dtype(dtype))
    c = np.arange(1.0, A.size + 1).astype(_dtype(dtype))
    fn = getattr(rnp, op)

    def f(u, v):
        return rp.grad(rnp.sum(fn(u, v) * c), [u, v])

    ga, gb = _run(f, [a, b], where)
    want_a, want_b = _ties_want(A, B, minimum=op == "minimum")
    np.testing.assert_array_equal(ga, want_a)
    np.testing.assert_array_equal(gb, want_b)


@pytest.mark.parametrize("where", list(RUNS), ids=column)
def test_softplus_derivative_at_0_is_one_half(where):
    x = np.array([-1.0, 0.0, 1.0], np.float32)

    def f(v):
        return (rp.grad(rnp.sum(rnp.softplus(v)), v),)

    got, = _run(f, [x], where)
    np.testing.assert_allclose(got, 1 / (1 + np.exp(-x.astype(np.float64))), rtol=1e-6)


# a 1 x 1 x 4 x 4 image of ties: pooled 2 x 2 (stride 2) and 3 x 3 (stride 1, padded: windows
# overlap, so an element gets what every window it is first in sends)
POOL_X = np.array([[[[1.0, 1.0, 2.0, 0.0], [1.0, 0.5, 2.0, 2.0],
                     [-0.0, 0.0, 3.0, np.nan], [0.0, -1.0, 3.0, 1.0]]]])
POOL_CASES = {"2x2": dict(kernel_size=2), "3x3 overlapping": dict(kernel_size=3, stride=1,
                                                                  padding=1)}


def _first_max_grad(x, kernel_size, stride=None, padding=0):
    """PyTorch's rule: each window's gradient (1 here) to its first maximum in row-major
    order (NaN is the maximum), nothing to the other tied entries."""
    k, s = kernel_size, stride or kernel_size
    xp = np.pad(x[0, 0], padding, constant_values=-np.inf)
    g = np.zeros_like(xp)
    for i in range(0, xp.shape[0] - k + 1, s):
        for j in range(0, xp.shape[1] - k + 1, s):
            w = xp[i:i + k, j:j + k].ravel()
            nan = np.flatnonzero(np.isnan(w))
            first = int(nan[0]) if nan.size else int(np.argmax(w))
            g[i + first // k, j + first % k] += 1.0
    return g[padding:g.shape[0] - padding, padding:g.shape[1] - padding][None, None]


@pytest.mark.parametrize("case", list(POOL_CASES))
@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("where", list(RUNS), ids=column)
def test_max_pool_gives_a_windows_gradient_to_its_first_maximum(where, dtype, case):
    """A window's tied maxima do not share its gradient: the first takes it all (PyTorch's
    ``max_pool2d``; ``rnp.max``'s own rule, sharing, would give each a part)."""
    kw = POOL_CASES[case]
    x = POOL_X.astype(dtype)

    def f(v):
        return rnp.max_pool2d(v, **kw), rp.grad(rnp.sum(rnp.max_pool2d(v, **kw)), v)

    out, g = _run(f, [x], where)
    np.testing.assert_array_equal(g, _first_max_grad(POOL_X, **kw))
    assert out.shape[:2] == (1, 1) and np.isnan(out).any()


@needs_torch_kinks
def test_the_pooling_rule_is_pytorchs():
    for kw in POOL_CASES.values():
        t = torch.tensor(POOL_X, requires_grad=True)
        torch.nn.functional.max_pool2d(t, **kw).sum().backward()
        np.testing.assert_array_equal(t.grad.numpy(), _first_max_grad(POOL_X, **kw))


@pytest.mark.skipif(not HAVE_JAX, reason="jax not installed (the outside reference)")
def test_the_conventions_are_jaxs():
    """The wanted values above, read from JAX itself."""
    import jax
    import jax.numpy as jnp

    f32 = lambda v: jnp.asarray(v, jnp.float32)  # noqa: E731  (every value here is exact)
    c = jnp.arange(1.0, A.size + 1, dtype=jnp.float32)
    ga, gb = jax.grad(lambda u, v: jnp.sum(jnp.maximum(u, v) * c), (0, 1))(f32(A), f32(B))
    want = _ties_want(A, B)
    finite = np.isfinite(A) & np.isfinite(B)  # (JAX's rule at inf and NaN: not compared)
    np.testing.assert_array_equal(np.asarray(ga)[finite], want[0][finite])
    np.testing.assert_array_equal(np.asarray(gb)[finite], want[1][finite])
    g = jax.grad(lambda v: jnp.sum(jax.nn.relu(v)))(f32(X[:5]))
    np.testing.assert_array_equal(np.asarray(g), _relu_grad_want(X[:5]))
    g = jax.grad(lambda v: jnp.sum(jax.nn.softplus(v)))(f32([0.0]))
    assert float(g[0]) == 0.5
