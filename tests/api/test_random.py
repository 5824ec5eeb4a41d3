"""Random numbers (``rnp.random``): keys in, numbers out; the same key gives the same numbers in
graph mode, eager mode and by direct calls; shapes, dtypes, statistics and independent keys."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from harness.ops import (
    EXPECTED,
    LOGITS,
    draws,
    run_forward,
)

import replicate as rp
import replicate.numpy as rnp


def run_draws(mode, seed):
    k = rnp.random.key(seed).numpy()
    return run_forward(lambda k, lg: [v for _, v in sorted(draws(k, lg).items())], [k, LOGITS],
                       mode)


def test_key_is_a_uint32_pair_and_seeds_differ():
    keys = [rnp.random.key(s).numpy() for s in (0, 1, 2, 2**40)]
    assert all(k.shape == (2,) and k.dtype == np.uint32 for k in keys)
    assert len({k.tobytes() for k in keys}) == 4
    np.testing.assert_array_equal(rnp.random.key(5).numpy(), rnp.random.key(5).numpy())


@pytest.mark.parametrize("mode", ["graph", "eager", "direct"])
def test_random_shapes_dtypes_and_determinism(mode):
    first, again = run_draws(mode, 0), run_draws(mode, 0)
    other = run_draws(mode, 1)
    for (name, (shape, dtype)), x, y, z in zip(sorted(EXPECTED.items()), first, again, other):
        assert x.shape == shape and x.dtype == dtype, (name, x.shape, x.dtype)
        np.testing.assert_array_equal(x, y, err_msg=f"{name}: same key, different numbers")
        if x.size > 2 and x.dtype.kind in "fu":
            assert not np.array_equal(x, z), f"{name}: different keys, same numbers"


@pytest.mark.parametrize("mode", ["eager", "direct"])
def test_random_graph_equals_eager_bitwise(mode):
    for name, x, y in zip(sorted(EXPECTED), run_draws("graph", 3), run_draws(mode, 3)):
        assert x.dtype == y.dtype and x.tobytes() == y.tobytes(), name


def test_split_keys_are_distinct_and_independent():
    k = rnp.random.key(11)
    keys = rnp.random.split(k, 8).numpy()
    assert len({row.tobytes() for row in keys}) == 8
    assert keys[0].tobytes() != k.numpy().tobytes()
    u, v = (rnp.random.uniform(keys[i], (20000,), np.float64).numpy() for i in (0, 1))
    assert abs(np.corrcoef(u, v)[0, 1]) < 0.03
    folded = {rnp.random.fold_in(k, i).numpy().tobytes() for i in range(6)}
    assert len(folded) == 6


N = 20000


def test_uniform_statistics():
    k = rnp.random.key(2)
    u = rnp.random.uniform(k, (N,)).numpy()
    assert u.min() >= 0.0 and u.max() < 1.0
    assert abs(u.mean() - 0.5) < 0.01 and abs(u.var() - 1 / 12) < 0.005
    hist, _ = np.histogram(u, bins=10, range=(0, 1))
    assert np.all(np.abs(hist / N - 0.1) < 0.012)
    w = rnp.random.uniform(k, (N,), np.float64, minval=-2.0, maxval=3.0).numpy()
    assert w.min() >= -2.0 and w.max() < 3.0 and abs(w.mean() - 0.5) < 0.06


def test_normal_statistics():
    z = rnp.random.normal(rnp.random.key(3), (N,), np.float64).numpy()
    assert np.all(np.isfinite(z))
    assert abs(z.mean()) < 0.03 and abs(z.std() - 1.0) < 0.02
    assert abs(np.mean(np.abs(z) < 1.0) - 0.6827) < 0.012
    assert abs(np.mean(z ** 3)) < 0.1  # symmetric


def test_bernoulli_statistics():
    k = rnp.random.key(4)
    b = rnp.random.bernoulli(k, 0.3, (N,)).numpy()
    assert b.dtype == np.bool_ and abs(b.mean() - 0.3) < 0.015
    p = np.array([0.05, 0.5, 0.95])
    bp = rnp.random.bernoulli(k, rnp.broadcast_to(rnp.asarray(p), (N // 4, 3))).numpy()
    np.testing.assert_allclose(bp.mean(axis=0), p, atol=0.025)


def test_categorical_statistics():
    probs = np.array([0.1, 0.2, 0.3, 0.4])
    logits = np.broadcast_to(np.log(probs) + 5.0, (N, 4))  # unnormalised on purpose
    c = rnp.random.categorical(rnp.random.key(5), logits).numpy()
    assert c.shape == (N,) and c.min() >= 0 and c.max() <= 3
    np.testing.assert_allclose(np.bincount(c, minlength=4) / N, probs, atol=0.015)


@pytest.mark.parametrize("mode", ["graph", "eager"])
def test_generator_draws_fresh_numbers_each_call(mode):
    gen = rnp.random.Generator(seed=7)

    def step(x):
        return x + gen.normal((4,)), gen.uniform((2,)), gen.bernoulli(0.5, (3,))

    f = rp.function(step, mode=mode)
    calls = [f(np.zeros(4)) for _ in range(3)]
    for a, b in itertools.combinations(calls, 2):
        assert not np.array_equal(a[0], b[0]) and not np.array_equal(a[1], b[1])
    if mode == "graph":
        assert f.trace_count == 1  # the key is traced state, not a baked-in constant
    # a generator with the same seed replays the same sequence, whatever the mode
    gen2 = rnp.random.Generator(seed=7)
    other = rp.function(lambda x: (x + gen2.normal((4,)), gen2.uniform((2,)),
                                   gen2.bernoulli(0.5, (3,))), mode="eager" if mode == "graph"
                        else "graph")
    for got in calls:
        for x, y in zip(got, other(np.zeros(4))):
            assert x.tobytes() == y.tobytes()
