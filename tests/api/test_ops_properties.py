"""A few property tests of the ops over generated shapes (kept small: the case tables of
``tests/harness/ops.py``, checked by ``test_ops.py``, do the bulk): broadcasting, reductions,
transpose and reshape, and the edges the tables do not draw (infinite slices, bad axes, special
values)."""

from __future__ import annotations

import numpy as np
import pytest
from harness.ops import (
    BINARY,
    F32,
    F64,
    REDUCTIONS,
    Case,
    In,
    assert_same,
    axis_op,
    cotangents,
    finite_differences,
    library_grad,
    reference_loss,
    run_forward,
    to_numpy,
    tolerance,
)
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

import replicate as rp
import replicate.numpy as rnp

PROPERTY = settings(max_examples=25, deadline=None, derandomize=True)


@PROPERTY
@given(shapes=hnp.mutually_broadcastable_shapes(num_shapes=2, min_dims=0, max_dims=3, max_side=3),
       name=st.sampled_from(["add", "subtract", "multiply", "divide", "maximum"]),
       mode=st.sampled_from(["graph", "eager"]))
def test_broadcasting_property(shapes, name, mode):
    op, ref, _, db = BINARY[name]
    c = Case(name, op, ref, (In(shapes.input_shapes[0]), In(shapes.input_shapes[1], F64, db)))
    xs = c.sample()
    out = run_forward(op, xs, mode)
    assert_same(out, [ref(*xs)], what=c.id)
    assert out[0].shape == shapes.result_shape
    cots = cotangents(c, xs)
    got = library_grad(c, xs, cots, mode)
    want = finite_differences(lambda v: reference_loss(ref, v, cots), xs, [0, 1], 1e-6)
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-6)


@PROPERTY
@given(shape=hnp.array_shapes(min_dims=1, max_dims=3, max_side=3), data=st.data(),
       name=st.sampled_from(["sum", "mean", "max", "logsumexp", "var"]),
       keepdims=st.booleans(), mode=st.sampled_from(["graph", "eager"]))
def test_reduction_property(shape, data, name, keepdims, mode):
    axes = data.draw(st.lists(st.integers(-len(shape), len(shape) - 1), max_size=len(shape),
                              unique_by=lambda a: a % len(shape)), label="axes")
    axis = tuple(axes) if axes else None
    op, ref, _ = REDUCTIONS[name]
    c = Case(name, axis_op(op, axis=axis, keepdims=keepdims),
             axis_op(ref, axis=axis, keepdims=keepdims), (In(shape),))
    xs = c.sample()
    assert_same(run_forward(c.fn, xs, mode), [c.ref(*xs)], what=f"{c.id} axis={axis}")
    cots = cotangents(c, xs)
    got = library_grad(c, xs, cots, mode)
    want = finite_differences(lambda v: reference_loss(c.ref, v, cots), xs, [0], 1e-6)
    np.testing.assert_allclose(got[0], want[0], rtol=1e-5, atol=1e-6)


@PROPERTY
@given(shape=hnp.array_shapes(min_dims=0, max_dims=4, max_side=3), data=st.data())
def test_transpose_reshape_roundtrip_property(shape, data):
    perm = data.draw(st.permutations(range(len(shape))), label="perm")
    x = np.arange(int(np.prod(shape)), dtype=np.float64).reshape(shape)

    def f(v):
        t = rnp.transpose(v, perm)
        flat = rnp.reshape(t, (-1,))
        back = rnp.transpose(rnp.reshape(flat, t.shape), tuple(np.argsort(perm)))
        return t, back, rp.grad(rnp.sum(t * rnp.transpose(v, perm)), v)

    t, back, g = rp.function(f)(x)
    np.testing.assert_array_equal(t, np.transpose(x, perm))
    np.testing.assert_array_equal(back, x)
    np.testing.assert_array_equal(g, 2 * x)


@pytest.mark.parametrize("mode", ["graph", "eager", "direct"])
def test_logsumexp_of_infinite_slices(mode):
    x = np.array([[-np.inf, -np.inf, -np.inf], [0.0, 1.0, -np.inf], [np.inf, 0.0, 1.0]])
    with np.errstate(divide="ignore"):
        got = run_forward(lambda v: rnp.logsumexp(v, axis=1), [x], mode)[0]
    np.testing.assert_array_equal(got[[0, 2]], [-np.inf, np.inf])
    assert got[1] == pytest.approx(np.log(1.0 + np.e))


@pytest.mark.parametrize("call", [lambda x: rnp.transpose(x, (0, 3)),
                                  lambda x: rnp.transpose(x, (0, 0)),
                                  lambda x: rnp.expand_dims(x, 3),
                                  lambda x: rnp.expand_dims(x, (0, 0)),
                                  lambda x: rnp.moveaxis(x, 2, 0),
                                  lambda x: rnp.sum(x, axis=2),
                                  lambda x: rnp.squeeze(x, 0),
                                  lambda x: rnp.concatenate([x, x], axis=-3)],
                         ids=["transpose", "transpose-repeat", "expand_dims", "expand_dims-repeat",
                              "moveaxis", "sum", "squeeze", "concatenate"])
def test_bad_axes_are_refused_not_wrapped(call):
    # NumPy raises AxisError for each of these; silently wrapping would compute something else
    with pytest.raises(rp.ReplicateError):
        call(rnp.asarray(np.ones((2, 3))))
    with pytest.raises(rp.ReplicateError):
        rp.function(call)(np.ones((2, 3)))


SPECIAL = np.array([np.nan, np.inf, -np.inf, 0.0, -0.0, 1.0, -1.0, 0.5, -2.5, 800.0, -800.0])
NEW_UNARY = ["tan", "sinh", "cosh", "arcsin", "arccos", "arctan", "arcsinh", "arccosh",
             "arctanh", "log2", "log10", "trunc", "positive"]


def _backend_modes():
    from replicate.backends import available
    return ["eager"] + [pytest.param(b, marks=pytest.mark.skipif(
        b not in available(), reason=f"the {b} backend is not available"))
        for b in ("numpy", "jax", "cupy")]


@pytest.mark.parametrize("dtype", [F32, F64])
@pytest.mark.parametrize("where", _backend_modes())
def test_new_float_functions_give_numpys_special_values(where, dtype):
    """NaN, +-inf, signed zeros, poles and values outside the domain as NumPy gives them (the
    sign of a zero included, and arctan2's quadrant on every pair of them) on every backend:
    logaddexp stays finite where exp overflows and is NumPy's inf / -inf / NaN at the ends."""
    x = SPECIAL.astype(dtype)
    a, b = (v.reshape(-1) for v in np.meshgrid(x, x))

    def step(x, a, b):
        return ([getattr(rnp, n)(x) for n in NEW_UNARY]
                + [rnp.arctan2(a, b), rnp.logaddexp(a, b)])

    with np.errstate(all="ignore"):
        want = [getattr(np, n)(x) for n in NEW_UNARY] + [np.arctan2(a, b), np.logaddexp(a, b)]
        if where == "eager":
            got = step(rnp.asarray(x), rnp.asarray(a), rnp.asarray(b))
        else:
            got = rp.function(step, backend=where)(x, a, b)
        got = [to_numpy(g) for g in got]
    r, t = tolerance(dtype)
    for name, g, w in zip(NEW_UNARY + ["arctan2", "logaddexp"], got, want):
        assert g.dtype == w.dtype, name
        np.testing.assert_allclose(g, w, rtol=r * 4, atol=t, err_msg=f"{name} on {where}")
        assert (np.signbit(g) == np.signbit(w))[~np.isnan(w)].all(), f"{name}: sign of a zero"
    # NumPy's bits at powers of the base, where NumPy is exact (log(x) / log(2) is not:
    # log2(2.0**29) would be 29.000000000000004); JAX's own log2 is log(x) / log(2)
    if where != "jax":
        k = np.arange(-30, 31).astype(dtype)
        for fn, ref, base in ((rnp.log2, np.log2, 2.0), (rnp.log10, np.log10, 10.0)):
            x = base ** k
            f = fn if where == "eager" else rp.function(fn, backend=where)
            np.testing.assert_array_equal(to_numpy(f(rnp.asarray(x) if where == "eager" else x)),
                                          ref(x), err_msg=f"{fn.__name__} on {where}")
