"""Every public op of ``replicate.numpy`` against its NumPy reference: the ``Case``s of the op
harness (``tests/harness/ops.py``: the op on replicate arrays, a plain-NumPy reference, and the
inputs: shape, dtype, value domain). For every case,

* forward: the result equals the NumPy reference (values, shape and dtype) in graph mode
  (``rp.function(f)``), in eager mode (``rp.function(f, mode="eager")``) and by direct calls;
* gradient: for float64 cases, ``rp.grad`` of ``sum(out * cotangent)`` w.r.t. every float input
  equals central finite differences of the NumPy reference, in graph and in eager mode;
* gradient of a gradient for a selection of cases, against finite differences of the gradient.

Gradients that need hand-picked inputs (``stop_gradient``, ``cast``, ties, zeros) have their own
tests at the end, and ``test_every_public_op_is_covered`` fails when an op is added to
``replicate.numpy`` without a case. Random numbers: ``test_random.py``; property tests over
generated shapes: ``test_ops_properties.py``.
"""

from __future__ import annotations

import builtins
import math
import zlib

import numpy as np
import pytest
from harness.ops import (
    CASES,
    F32,
    F64,
    GG_CASES,
    GRAD_CASES,
    assert_same,
    cotangents,
    finite_differences,
    float_inputs,
    leaves,
    library_grad,
    loss_of,
    reference_loss,
    run_forward,
    to_numpy,
)

import replicate as rp
import replicate.numpy as rnp


# ================================================================================================
# The checks.
# ================================================================================================
@pytest.mark.parametrize("mode", ["graph", "eager", "direct"])
@pytest.mark.parametrize("c", CASES, ids=[c.id for c in CASES])
def test_forward(c, mode):
    xs = c.sample()
    # 1 / False, inf - inf, MIN // -1: as NumPy
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        expected = [np.asarray(o) for o in leaves(c.ref(*xs))]
        actual = run_forward(c.fn, xs, mode)
    assert_same(actual, expected, c.rtol, what=f"{c.id} in {mode} mode")


@pytest.mark.parametrize("mode", ["graph", "eager"])
@pytest.mark.parametrize("c", GRAD_CASES, ids=[c.id for c in GRAD_CASES])
def test_gradient(c, mode):
    xs = c.sample()
    cots = cotangents(c, xs)
    wrt = float_inputs(xs)
    got = library_grad(c, xs, cots, mode)
    want = finite_differences(lambda v: reference_loss(c.ref, v, cots), xs, wrt, c.fd_eps)
    for i, g, w in zip(wrt, got, want):
        assert g.shape == xs[i].shape and g.dtype == xs[i].dtype, (g.shape, g.dtype)
        np.testing.assert_allclose(g, w, rtol=c.grad_rtol, atol=c.grad_atol,
                                   err_msg=f"d/d input {i} of {c.id} in {mode} mode")




@pytest.mark.parametrize("mode", ["graph", "eager"])
@pytest.mark.parametrize("c", GG_CASES, ids=[c.id for c in GG_CASES])
def test_gradient_of_gradient(c, mode):
    """d/dx <grad(loss)(x), v> against central differences of the (eager) gradient."""
    xs = c.sample()
    cots = cotangents(c, xs)
    wrt = float_inputs(xs)
    rng = np.random.default_rng(zlib.crc32(("v" + c.id).encode()))
    vs = [rng.standard_normal(xs[i].shape) for i in wrt]
    loss = loss_of(c, cots)

    def inner(*args):
        grads = rp.grad(loss(*args), [args[i] for i in wrt])
        return builtins.sum(rnp.sum(g * v) for g, v in zip(grads, vs))

    def outer(*args):
        return rp.grad(inner(*args), [args[i] for i in wrt])

    got = [to_numpy(g) for g in rp.function(outer, mode=mode)(*xs)]
    eager_inner = rp.function(inner, mode="eager")
    want = finite_differences(lambda v: float(eager_inner(*v)), xs, wrt, 1e-5)
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-5, err_msg=f"{c.id} in {mode} mode")


def test_grad_of_grad_is_exercised():
    assert {c.op for c in GG_CASES} >= {"tanh", "matmul", "conv2d", "power", "logsumexp"}


def test_every_public_op_is_covered():
    public = {n for n in rnp.__all__ if callable(getattr(rnp, n))
              and not isinstance(getattr(rnp, n), type)}
    covered = {part for c in CASES for part in c.op.split("+")}
    assert public - covered == set(), "public ops without a test case"
    random_public = {"key", "split", "fold_in", "uniform", "normal", "bernoulli", "categorical",
                     "Generator"}
    assert {n for n in dir(rnp.random) if n in random_public} == random_public


def test_every_differentiable_op_has_a_gradient_case():
    not_differentiable = {"argmax", "argmin", "equal", "not_equal", "less", "less_equal",
                          "greater", "greater_equal", "logical_and", "logical_or", "logical_not",
                          "invert", "bitwise_not", "bitwise_and", "bitwise_or", "bitwise_xor",
                          "left_shift", "right_shift", "bitwise_left_shift",
                          "bitwise_right_shift",
                          "isfinite", "floor_divide", "one_hot", "stop_gradient", "arange", "eye",
                          "zeros", "ones", "full", "asarray", "array", "as_array", "astype",
                          "argsort", "empty", "linspace", "result_type", "can_cast",
                          "empty_like", "nonzero", "unique_counts", "unique_inverse",
                          "unique_all", "bitwise_invert", "isnan", "isinf", "logical_xor", "all",
                          "any", "finfo", "iinfo", "isdtype", "signbit", "searchsorted", "imag"}
    public = {n for n in rnp.__all__ if callable(getattr(rnp, n))
              and not isinstance(getattr(rnp, n), type)}
    with_grad = {part for c in GRAD_CASES for part in c.op.split("+")}
    assert public - not_differentiable - with_grad == set()


# ================================================================================================
# Gradients that need hand-picked inputs or an analytic answer.
# ================================================================================================
@pytest.mark.parametrize("mode", ["graph", "eager"])
@pytest.mark.parametrize("axis", [None, 0, 1])
def test_prod_gradient_with_zeros(mode, axis):
    # rows with no zero, one zero and two zeros; prod is a polynomial, so differences are exact
    x = np.array([[0.0, 2.0, 3.0], [1.5, 0.0, 0.0], [2.0, -3.0, 0.5]])
    cot = np.array([1.0, -2.0, 0.5]) if axis is not None else np.array(1.5)
    got = rp.function(lambda v: rp.grad(rnp.sum(rnp.prod(v, axis=axis) * cot), v), mode=mode)(x)
    want = finite_differences(lambda v: float(np.sum(np.prod(v[0], axis=axis) * cot)), [x], [0],
                              1e-3)[0]
    assert np.all(np.isfinite(got))
    np.testing.assert_allclose(got, want, rtol=1e-9, atol=1e-9)


@pytest.mark.parametrize("mode", ["graph", "eager"])
@pytest.mark.parametrize("axis", [0, 1])
def test_cumprod_gradient_with_zeros(mode, axis):
    # rows with no zero, a zero first, in the middle, last, and two zeros; cumprod is multilinear,
    # so central differences are exact
    x = np.array([[1.5, -2.0, 0.5, 3.0], [0.0, 2.0, -1.0, 0.5], [2.0, 0.5, 0.0, -3.0],
                  [1.0, 2.0, -0.5, 0.0], [0.0, 2.0, 0.0, 4.0]])
    x = x if axis == 1 else x.T.copy()
    cot = np.random.default_rng(0).standard_normal(x.shape)
    got = rp.function(lambda v: rp.grad(rnp.sum(rnp.cumprod(v, axis) * cot), v), mode=mode)(x)
    want = finite_differences(lambda v: float(np.sum(np.cumprod(v[0], axis) * cot)), [x], [0],
                              1e-3)[0]
    assert np.all(np.isfinite(got))
    np.testing.assert_allclose(got, want, rtol=1e-9, atol=1e-9)


def test_erf_reference_is_float64_accurate():
    """The NumPy reference (fdlibm's algorithm) against ``math.erf``, over every branch: within
    one unit in the last place."""
    from replicate.graph.reference import IMPL

    rng = np.random.default_rng(0)
    x = np.concatenate([np.linspace(-7.0, 7.0, 20001), rng.standard_normal(5000) * 3.0,
                        np.logspace(-310, 0.5, 2000), -np.logspace(-30, 0.9, 500),
                        [0.84375, np.nextafter(0.84375, 0), 1.25, np.nextafter(1.25, 0), 6.0,
                         1 / 0.35, 2.0 ** -28, 5e-324, 28.0, 1e300]])
    want = np.array([math.erf(v) for v in x])
    got = IMPL["erf"](x)
    ulps = np.abs(got - want) / np.spacing(np.abs(want))
    assert ulps.max() <= 1.0
    special = IMPL["erf"](np.array([np.nan, np.inf, -np.inf, -0.0]))
    assert np.isnan(special[0]) and special[1:3].tolist() == [1.0, -1.0]
    assert special[3] == 0.0 and np.signbit(special[3])


@pytest.mark.parametrize("mode", ["graph", "eager"])
def test_round_halves_to_even_and_mod_takes_the_divisor_sign(mode):
    def f(x, a, b, i, j):
        return rnp.round(x), rnp.mod(a, b), a % b, i % j, rnp.mod(i, 0), rp.grad(
            rnp.sum(rnp.round(x) + rnp.floor(x) + rnp.ceil(x)), x)

    x = np.array([0.5, 1.5, 2.5, -0.5, -1.5, -2.5, 0.49999999999999994])
    a, b = np.array([7.0, -7.0, 7.0, -7.0, -0.5]), np.array([3.0, 3.0, -3.0, -3.0, 2.0])
    i, j = np.array([7, -7, 7, -7]), np.array([3, 3, -3, -3])
    with np.errstate(divide="ignore"):
        r, m, op, im, zero, g = rp.function(f, mode=mode)(x, a, b, i, j)
    assert r.tolist() == [0.0, 2.0, 2.0, -0.0, -2.0, -2.0, 0.0]
    assert m.tolist() == op.tolist() == [1.0, 2.0, -2.0, -1.0, 1.5]
    assert im.tolist() == [1, 2, -2, -1] and zero.tolist() == [0, 0, 0, 0]
    assert g.tolist() == [0.0] * 7


@pytest.mark.parametrize("mode", ["graph", "eager"])
@pytest.mark.parametrize("dtype", [F64, F32])
@pytest.mark.parametrize("decimals", [1, 2, 3, -1, -2])
def test_round_with_decimals(mode, dtype, decimals):
    """NumPy's formula, in the input's dtype: the same values, bit for bit, and zero gradient."""
    x = (np.random.default_rng(decimals + 5).standard_normal(50) * 300.0).astype(dtype)
    got, g = rp.function(lambda v: (rnp.round(v, decimals),
                                    rp.grad(rnp.sum(rnp.round(v, decimals)), v)), mode=mode)(x)
    assert got.dtype == dtype and got.tobytes() == np.round(x, decimals).tobytes()
    assert not g.any()


@pytest.mark.parametrize("mode", ["graph", "eager"])
def test_mod_on_a_variable_and_its_gradient(mode):
    w = rp.Variable(np.array([5.5, -5.5, 2.0]))

    def f(b):
        return w % b, 10.0 % w, rp.grad(rnp.sum(w % b), [w, b])

    m, r, (gw, gb) = rp.function(f, mode=mode)(np.array([2.0, 2.0, -3.0]))
    np.testing.assert_array_equal(m, [1.5, 0.5, -1.0])
    np.testing.assert_array_equal(r, np.mod(10.0, [5.5, -5.5, 2.0]))
    np.testing.assert_array_equal(gw, [1.0, 1.0, 1.0])
    np.testing.assert_array_equal(gb, -np.floor(np.array([5.5, -5.5, 2.0]) / [2.0, 2.0, -3.0]))


@pytest.mark.parametrize("mode", ["graph", "eager"])
def test_sort_and_top_k_gradients_go_to_the_selected_entries(mode):
    x = np.array([[0.3, -1.0, 2.0, 0.7], [1.0, 1.0, -0.5, 4.0]])  # a tie in row 1
    cot = np.array([[1.0, 2.0, 3.0, 4.0], [10.0, 20.0, 30.0, 40.0]])

    def f(v):
        return (rp.grad(rnp.sum(rnp.sort(v) * cot), v),
                rp.grad(rnp.sum(rnp.top_k(v, 2)[0] * cot[:, :2]), v))

    g_sort, g_top = rp.function(f, mode=mode)(x)
    np.testing.assert_array_equal(g_sort, [[2.0, 1.0, 4.0, 3.0], [20.0, 30.0, 10.0, 40.0]])
    np.testing.assert_array_equal(g_top, [[0.0, 0.0, 1.0, 2.0], [20.0, 0.0, 0.0, 10.0]])


@pytest.mark.parametrize("mode", ["graph", "eager"])
def test_conv_transpose2d_is_the_gradient_of_conv2d(mode):
    """conv_transpose2d(y, w) is the transpose of x -> conv2d(x, w) (padding and stride alike):
    <conv2d(x, w), y> = <x, conv_transpose2d(y, w)>."""
    rng = np.random.default_rng(1)
    x, w = rng.standard_normal((2, 3, 7, 6)), rng.standard_normal((4, 3, 3, 2))
    kw = dict(stride=2, padding=1, dilation=(1, 2))

    def f(x, w, y):
        return rp.grad(rnp.sum(rnp.conv2d(x, w, **kw) * y), x), rnp.conv_transpose2d(
            y, w, output_padding=(0, 1), **kw)

    y = rng.standard_normal(rnp.conv2d(x, w, **kw).shape)
    g, t = rp.function(f, mode=mode)(x, w, y)
    assert t.shape == x.shape
    np.testing.assert_allclose(t, g, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("mode", ["graph", "eager"])
def test_stop_gradient(mode):
    x = np.array([1.0, -2.0, 3.0])

    def f(v):
        return (rp.grad(rnp.sum(rnp.stop_gradient(v) * v), v),  # = x, not 2x
                rp.grad(rnp.sum(rnp.stop_gradient(v * v)), v),  # no path: zeros
                rp.grad(rnp.sum(rnp.stop_gradient(v) ** 2 + v), v))  # = 1

    a, b, c = rp.function(f, mode=mode)(x)
    np.testing.assert_array_equal(a, x)
    np.testing.assert_array_equal(b, np.zeros(3))
    np.testing.assert_array_equal(c, np.ones(3))


@pytest.mark.parametrize("mode", ["graph", "eager"])
def test_gradient_keeps_the_input_dtype(mode):
    x32 = np.array([1.0, 2.0], np.float32)

    def f(x):
        y = rnp.cast(x, np.float64) * 3.0  # computed in float64
        return rp.grad(rnp.sum(y * y), x), rp.grad(rnp.sum(x * 2.0), x)

    g1, g2 = rp.function(f, mode=mode)(x32)
    assert g1.dtype == np.float32 and g2.dtype == np.float32
    np.testing.assert_allclose(g1, 18.0 * x32)
    np.testing.assert_allclose(g2, [2.0, 2.0])


@pytest.mark.parametrize("mode", ["graph", "eager"])
def test_no_gradient_through_integer_casts_and_comparisons(mode):
    x = np.array([1.7, -2.2, 0.4])

    def f(v):
        through_int = rnp.cast(rnp.cast(v, np.int32), np.float64) * v
        through_cmp = rnp.cast(v > 0, np.float64) * v
        return rp.grad(rnp.sum(through_int), v), rp.grad(rnp.sum(through_cmp), v)

    g_int, g_cmp = rp.function(f, mode=mode)(x)
    np.testing.assert_array_equal(g_int, x.astype(np.int32).astype(np.float64))
    np.testing.assert_array_equal(g_cmp, (x > 0).astype(np.float64))


@pytest.mark.parametrize("mode", ["graph", "eager"])
def test_argmax_and_sign_have_zero_gradient(mode):
    x = np.array([[0.3, -1.0, 2.0], [1.0, 0.5, -0.5]])

    def f(v):
        picked = rnp.take_along_axis(v, rnp.expand_dims(rnp.argmax(v, axis=1), 1), 1)
        return rp.grad(rnp.sum(picked * 2.0) + rnp.sum(rnp.sign(v)), v)

    want = np.zeros_like(x)
    want[np.arange(2), x.argmax(1)] = 2.0
    np.testing.assert_array_equal(rp.function(f, mode=mode)(x), want)


@pytest.mark.parametrize("mode", ["graph", "eager"])
def test_gradient_of_max_splits_ties(mode):
    x = np.array([1.0, 3.0, 3.0, -1.0])
    g = rp.function(lambda v: rp.grad(rnp.max(v), v), mode=mode)(x)
    np.testing.assert_array_equal(g, [0.0, 0.5, 0.5, 0.0])  # a subgradient; sums to 1


@pytest.mark.parametrize("mode", ["graph", "eager"])
def test_gradient_wrt_an_intermediate_and_unused_inputs(mode):
    def f(x, y):
        h = rnp.tanh(x)
        z = rnp.sum(h * h)
        return rp.grad(z, h), *rp.grad(z, [x, y])

    x = np.array([0.5, -1.0])
    gh, gx, gy = rp.function(f, mode=mode)(x, np.ones(3))
    np.testing.assert_allclose(gh, 2 * np.tanh(x))
    np.testing.assert_allclose(gx, 2 * np.tanh(x) * (1 - np.tanh(x) ** 2))
    np.testing.assert_array_equal(gy, np.zeros(3))


@pytest.mark.parametrize("mode", ["graph", "eager"])
def test_gradient_wrt_nested_targets_is_the_total_derivative(mode):
    def f(x, y):
        h = rnp.tanh(x)
        z = rnp.sum(h * h)
        return rp.grad(z, [h, x, y])

    x = np.array([0.5, -1.0])
    gh, gx, gy = rp.function(f, mode=mode)(x, np.ones(3))
    np.testing.assert_allclose(gh, 2 * np.tanh(x))
    np.testing.assert_allclose(gx, 2 * np.tanh(x) * (1 - np.tanh(x) ** 2))
    np.testing.assert_array_equal(gy, np.zeros(3))
