"""Distributions and mixed precision that gave a wrong number without a word (an audit against
PyTorch, session 13), in every mode and backend:

1. a compiled step traced with autocast off was reused inside ``rp.autocast`` (its guard took
   the key ``None`` — autocast off — for "no key");
2. ``Normal(0, 1)``: integer parameters drew integer noise, all 0; ``Normal(float32, 1.0)``
   came out float64 (PyTorch: float32);
3. float16/bfloat16 uniforms rounded up to 1.0: infinite normal draws, categories of
   probability 0 drawn;
4. ``Categorical(probs=...)`` with a zero probability: NaN gradients;
5. autocast cast float64 operands down (PyTorch leaves doubles);
6. ``Categorical.log_prob(1.7)`` read category 1 (PyTorch validates): float values are an error.
"""

from __future__ import annotations

import numpy as np
import pytest

import replicate as rp
import replicate.numpy as rnp

D = rp.distributions
MODES = [dict(mode="eager"), dict(backend="numpy"), dict(backend="jax")]
IDS = ["eager", "numpy", "jax"]


@pytest.mark.parametrize("backend", ["numpy", "jax"])
def test_a_step_traced_without_autocast_is_not_reused_inside_it(backend):
    a = np.full((2, 2), 1 + 2.0 ** -10, np.float32)
    f = rp.function(lambda x: x @ x, backend=backend)
    assert f(a).dtype == np.float32
    with rp.autocast("bfloat16"):
        got = f(a)
    assert got.dtype == rp.bfloat16 and float(got[0, 0]) == 2.0 and f.trace_count == 2
    assert f(a).dtype == np.float32 and f.trace_count == 2  # (each setting's step, kept)


@pytest.mark.parametrize("kw", MODES, ids=IDS)
def test_normal_parameters_are_floats_as_pytorchs(kw):
    def f(scale):
        a = D.Normal(0, 1).sample(rnp.random.key(0), (1000,))
        b = D.Normal(np.array([0, 10]), scale).rsample(rnp.random.key(1), (500,))
        c = D.Normal(rnp.zeros(2, np.float32), 1.0)
        return a, b, c.sample(rnp.random.key(2)), c.log_prob(np.zeros(2, np.float32))
    a, b, c, lp = (np.asarray(v) for v in rp.function(f, **kw)(np.array([1.0, 2.0],
                                                                         np.float32)))
    assert a.dtype == b.dtype == c.dtype == lp.dtype == np.float32
    assert 0.9 < a.std() < 1.1 and abs(a.mean()) < 0.1
    assert 1.8 < b[:, 1].std() < 2.2 and 9.8 < b[:, 1].mean() < 10.2


@pytest.mark.parametrize("kw", MODES, ids=IDS)
@pytest.mark.parametrize("dtype", [rp.bfloat16, np.float16])
def test_low_precision_draws_stay_in_their_ranges(kw, dtype):
    def f(logits):
        u = rnp.random.uniform(rnp.random.key(0), (100_000,), dtype)
        z = D.Normal(rnp.zeros((), dtype), rnp.ones((), dtype)).sample(rnp.random.key(1),
                                                                        (100_000,))
        c = D.Categorical(logits=logits).sample(rnp.random.key(2), (100_000,))
        return u, z, c
    u, z, c = (np.asarray(v).astype(np.float64) for v in rp.function(f, **kw)(
        np.array([0.0, -np.inf, 2.0], dtype)))
    assert u.min() >= 0 and u.max() < 1
    assert np.isfinite(z).all() and np.abs(z).max() > 3.5  # (tails: drawn in float32)
    assert (c == 1).sum() == 0 and abs((c == 2).mean() - 1 / (1 + np.exp(-2))) < 0.01


@pytest.mark.parametrize("kw", MODES, ids=IDS)
def test_categorical_probs_with_zeros_have_finite_gradients(kw):
    z = np.array([[1.0, 2.0, -np.inf]])

    def grads(as_probs):
        def f(z):
            p = rnp.exp(z - rnp.logsumexp(z, axis=-1, keepdims=True))
            d = D.Categorical(probs=p) if as_probs else D.Categorical(logits=z)
            return rp.grad(rnp.sum(d.log_prob(np.array([0]))), z)
        return f
    with np.errstate(all="ignore"):
        got, want = (np.asarray(rp.function(grads(p), **kw)(z)) for p in (True, False))
    np.testing.assert_allclose(got, want, rtol=1e-12)
    np.testing.assert_allclose(got[0, :2], [np.e / (1 + np.e), -np.e / (1 + np.e)], rtol=1e-12)


@pytest.mark.parametrize("kw", MODES, ids=IDS)
def test_autocast_leaves_float64_operands(kw):
    a = np.array([[1 + 2.0 ** -20, 3.0]])

    def f(a):
        with rp.autocast("bfloat16"):
            return a @ rnp.eye(2), rnp.asarray(a, np.float32) @ rnp.eye(2, dtype=np.float32)
    wide, narrow = rp.function(f, **kw)(a)
    assert wide.dtype == np.float64 and wide[0, 0] == 1 + 2.0 ** -20
    assert narrow.dtype == rp.bfloat16


@pytest.mark.parametrize("kw", MODES, ids=IDS)
def test_categorical_log_prob_takes_integer_categories(kw):
    f = rp.function(lambda v: D.Categorical(logits=rnp.zeros(3)).log_prob(v), **kw)
    assert float(f(np.int32(1))) == pytest.approx(-np.log(3.0))
    with pytest.raises(rp.DTypeError, match="integer categories, got float64"):
        f(np.float64(1.7))
