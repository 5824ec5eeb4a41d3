"""The JAX backend gives NumPy's numbers where XLA's algebraic simplifier would rewrite the
arithmetic: a bool mask times a float keeps NaN, inf and -0.0; chains of constants are not
folded into one (overflow, lost rounding); adding 0.0 to -0.0 gives 0.0. Each case
compares the JAX backend with NumPy itself, bit for bit, the sign of a zero included (the NumPy
backend is the reference every other test holds it to); also NumPy's sign of a negative zero
and of a float remainder of zero. (What XLA still rewrites, ``x / s`` for a scalar ``s`` into
``x * (1 / s)`` and ``log(exp(x))`` into ``x``: docs/concepts/compiler.md; the first is held to
its 1 ulp below.)"""

from __future__ import annotations

import importlib.util

import numpy as np
import pytest

import replicate as rp
import replicate.numpy as rnp

pytestmark = pytest.mark.skipif(importlib.util.find_spec("jax") is None,
                                reason="jax not installed")

F32 = np.float32
CASES = {
    # (fn, NumPy's own expression, inputs)
    "bool mask times NaN and inf": (
        lambda m, x: m * x, lambda m, x: m * x,
        (np.array([False, True, False]), np.array([np.nan, np.inf, -3.0]))),
    "a comparison as a mask": (
        lambda x: x * (x > 9), lambda x: x * (x > 9),
        (np.array([np.nan, np.inf, -np.inf, 10.0]),)),
    "constants multiplied one after the other": (
        lambda a: (a * 1e30) * 1e10, lambda a: (a * F32(1e30)) * F32(1e10),
        (np.array([1e-30, 0.0], F32),)),
    "a constant added then taken away": (
        lambda b: (b + 1e8) - 1e8, lambda b: (b + F32(1e8)) - F32(1e8),
        (np.array([1.0, 3.0], F32),)),
    "float16 constants": (
        lambda h: (h * 1024) * 64, lambda h: (h * np.float16(1024)) * np.float16(64),
        (np.array([1e-3], np.float16),)),
    "zero added to a negative zero": (
        lambda x: x + 0.0, lambda x: x + 0.0, (np.array([-0.0, 1.0, -2.0]),)),
    "the sign of a negative zero": (
        lambda z: rnp.sign(z), lambda z: np.sign(z), (np.array([-0.0, 0.0, -2.0, np.nan]),)),
    "a float remainder of zero takes the divisor's sign": (
        lambda a, b: a % b, lambda a, b: a % b,
        (np.array([-3.0, -0.0, 3.0, 3.0, 2.5]), np.array([0.5, 3.0, -0.5, 0.5, -2.0]))),
}


@pytest.mark.parametrize("name", list(CASES))
def test_jax_backend_gives_numpys_bits_where_xla_would_rewrite(name):
    fn, numpy_fn, args = CASES[name]
    with np.errstate(all="ignore"):
        want = np.asarray(numpy_fn(*args))
    got = np.asarray(rp.function(fn, backend="jax")(*args))
    reference = np.asarray(rp.function(fn)(*args))  # the NumPy backend
    assert got.dtype == want.dtype == reference.dtype
    assert _bits(reference) == _bits(want), (name, reference, want)
    assert _bits(got) == _bits(want), (name, got, want)


def _bits(a):
    """The values bit for bit (the sign of a zero counts), NaN as one value."""
    a = np.asarray(a)
    if a.dtype.kind == "f":
        a = np.where(np.isnan(a), np.nan, a)
    return a.tobytes()


def test_a_masked_loss_keeps_its_nan_through_the_gradient():
    """``loss * mask`` as a training step writes it: a NaN where the mask is off stays NaN in
    the value and the gradient on the JAX backend, as on the NumPy one."""
    x0 = np.array([np.nan, 1.0, 2.0])
    mask = np.array([False, True, True])

    def step(x, m):
        x = rnp.asarray(x)
        loss = rnp.sum(x * x * m)
        return loss, rp.grad(loss, x)

    for backend in ("numpy", "jax"):
        loss, g = rp.function(step, backend=backend)(x0, mask)
        assert np.isnan(float(loss)), backend
        assert np.isnan(np.asarray(g)[0]) and np.array_equal(np.asarray(g)[1:], [2.0, 4.0]), \
            (backend, g)


def test_a_division_by_a_scalar_is_within_one_ulp():
    """XLA divides by a scalar as a product with its reciprocal (documented): never more than
    1 ulp from NumPy's quotient."""
    rng = np.random.default_rng(0)
    for dtype in (np.float32, np.float64):
        x = (rng.standard_normal(1000) * 1e3).astype(dtype)
        got = np.asarray(rp.function(lambda v: v / 3.0, backend="jax")(x))
        np.testing.assert_array_max_ulp(got, x / dtype(3.0), maxulp=1)
