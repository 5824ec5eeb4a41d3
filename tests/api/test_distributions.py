"""rp.distributions against torch.distributions: log_prob, entropy, KL and their gradients in
both modes; sampling with keyed randomness (the same draws in both modes, different replicas
draw differently, the frequencies right)."""

from __future__ import annotations

import numpy as np
import pytest

import replicate as rp
import replicate.numpy as rnp

torch = pytest.importorskip("torch")
D = rp.distributions
MODES = ["graph", "eager"]

rng = np.random.default_rng(0)
LOGITS = rng.normal(size=(4, 5)) * 2
LOGITS[0, 2] = -np.inf  # a category of probability 0: entropy and KL stay finite
LOGITS_Q = rng.normal(size=(4, 5))
ACTIONS = np.array([1, 0, 4, 3])
LOC, SCALE = rng.normal(size=(3, 2)), np.exp(rng.normal(size=(3, 2)))
LOC_Q, SCALE_Q = rng.normal(size=(3, 2)), np.exp(rng.normal(size=(3, 2)))
X = rng.normal(size=(3, 2))


def _run(fn, mode, *args):
    return [np.asarray(v) for v in rp.function(fn, mode=mode)(*args)]


@pytest.mark.parametrize("mode", MODES)
def test_categorical_matches_torch(mode):
    def f(logits, q, actions):
        p = D.Categorical(logits=logits)
        return (p.log_prob(actions), p.entropy(), p.probs,
                D.kl_divergence(p, D.Categorical(logits=q)), p.mode)

    got = _run(f, mode, LOGITS, LOGITS_Q, ACTIONS)
    p = torch.distributions.Categorical(logits=torch.tensor(LOGITS))
    q = torch.distributions.Categorical(logits=torch.tensor(LOGITS_Q))
    want = [p.log_prob(torch.tensor(ACTIONS)), p.entropy(), p.probs,
            torch.distributions.kl_divergence(p, q), p.probs.argmax(-1)]
    for name, g, w in zip(["log_prob", "entropy", "probs", "kl", "mode"], got, want):
        np.testing.assert_allclose(g, w.numpy(), rtol=1e-12, atol=1e-14, err_msg=name)
    with np.errstate(divide="ignore"):  # (log 0 = -inf, NumPy's warning)
        from_probs = D.Categorical(probs=np.exp(LOGITS) / np.exp(LOGITS).sum(-1, keepdims=True))
    x = rnp.asarray(LOGITS)
    grad = rp.grad(rnp.sum(D.Categorical(logits=x).entropy()) + rnp.sum(D.kl_divergence(
        D.Categorical(logits=x), D.Categorical(logits=LOGITS_Q))), x)
    assert np.isfinite(np.asarray(grad)).all()  # (a category of probability 0: no nan)
    np.testing.assert_allclose(from_probs.log_prob(ACTIONS).numpy(), want[0].numpy(), rtol=1e-12)


@pytest.mark.parametrize("mode", MODES)
def test_normal_matches_torch(mode):
    def f(loc, scale, lq, sq, x):
        p = D.Normal(loc, scale)
        return p.log_prob(x), p.entropy(), D.kl_divergence(p, D.Normal(lq, sq))

    got = _run(f, mode, LOC, SCALE, LOC_Q, SCALE_Q, X)
    p = torch.distributions.Normal(torch.tensor(LOC), torch.tensor(SCALE))
    q = torch.distributions.Normal(torch.tensor(LOC_Q), torch.tensor(SCALE_Q))
    want = [p.log_prob(torch.tensor(X)), p.entropy(), torch.distributions.kl_divergence(p, q)]
    for name, g, w in zip(["log_prob", "entropy", "kl"], got, want):
        np.testing.assert_allclose(g, w.numpy(), rtol=1e-12, atol=1e-14, err_msg=name)


@pytest.mark.parametrize("mode", MODES)
def test_gradients_of_a_policy_loss_match_torch(mode):
    """The PPO pieces: d/d(logits, loc, log scale) of log-probabilities and entropies."""
    def loss(logits, loc, log_scale):
        pi, nd = D.Categorical(logits=logits), D.Normal(loc, rnp.exp(log_scale))
        return rnp.sum(pi.log_prob(ACTIONS) * np.arange(1.0, 5.0)) + rnp.sum(
            nd.log_prob(X)) + 0.1 * rnp.sum(pi.entropy()) + 0.3 * rnp.sum(nd.entropy())

    logits = np.where(np.isfinite(LOGITS), LOGITS, -30.0)
    f = rp.function(lambda a, b, c: rp.grad(loss(a, b, c), [a, b, c]), mode=mode)
    got = f(logits, LOC, np.log(SCALE))
    ts = [torch.tensor(v, requires_grad=True) for v in (logits, LOC, np.log(SCALE))]
    pi = torch.distributions.Categorical(logits=ts[0])
    nd = torch.distributions.Normal(ts[1], ts[2].exp())
    total = (pi.log_prob(torch.tensor(ACTIONS)) * torch.arange(1.0, 5.0, dtype=torch.float64)
             ).sum() + nd.log_prob(torch.tensor(X)).sum() + 0.1 * pi.entropy().sum() \
        + 0.3 * nd.entropy().sum()
    total.backward()
    for g, t in zip(got, ts):
        np.testing.assert_allclose(np.asarray(g), t.grad.numpy(), rtol=1e-10, atol=1e-12)


def test_samples_repeat_across_modes_and_follow_the_probabilities():
    probs = np.array([0.1, 0.6, 0.3])
    draws = {}
    for mode in MODES:
        g = rnp.random.Generator(seed=3)
        f = rp.function(lambda lg: (D.Categorical(logits=lg).sample(g, (4000,)),
                                    D.Normal(np.zeros(2), np.array([1.0, 3.0])).sample(g, (4000,))),
                        mode=mode)
        draws[mode] = [np.asarray(v) for v in f(np.log(probs))]
    for a, b in zip(draws["graph"], draws["eager"]):
        np.testing.assert_array_equal(a, b)  # the same keyed stream in both modes
    cats, normals = draws["graph"]
    assert cats.shape == (4000,) and normals.shape == (4000, 2)
    np.testing.assert_allclose(np.bincount(cats, minlength=3) / 4000, probs, atol=0.03)
    np.testing.assert_allclose(normals.std(0), [1.0, 3.0], rtol=0.06)
    np.testing.assert_allclose(normals.mean(0), [0.0, 0.0], atol=0.15)


def test_replicas_draw_differently_and_rsample_carries_the_gradient():
    g = rnp.random.Generator(seed=0)

    def step(x):
        a = D.Categorical(logits=rnp.zeros((16, 4)) + x[0]).sample(g)
        return {"actions": a}

    out = rp.Replicator(lambda ctx: iter([np.zeros(1)] * 2), step, replicas_per_rank=2,
                        outputs="per_replica").run(1)
    assert (out[0]["actions"][0] != out[0]["actions"][1]).any()
    loc = rnp.asarray(np.array([0.5, -1.0]))
    d_loc = rp.grad(rnp.sum(D.Normal(loc, 2.0).rsample(rnp.random.key(1))), loc)
    np.testing.assert_array_equal(np.asarray(d_loc), [1.0, 1.0])
    assert float(rnp.sum(rp.grad(rnp.sum(D.Normal(loc, 2.0).sample(rnp.random.key(1))),
                                 loc))) == 0.0


def test_bad_input_is_refused():
    with pytest.raises(rp.ReplicateError, match="logits or probs"):
        D.Categorical()
    with pytest.raises(rp.ReplicateError, match="Generator"):
        D.Normal(0.0, 1.0).sample(None)
    with pytest.raises(rp.ReplicateError, match="kl_divergence"):
        D.kl_divergence(D.Normal(0.0, 1.0), D.Categorical(logits=np.zeros(2)))
