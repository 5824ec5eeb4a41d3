"""rp.distributions against the textbook formulas written here in NumPy and, where PyTorch is
installed, against torch.distributions: log_prob, entropy, KL and their gradients in both
modes; sampling with keyed randomness (the same draws in both modes, different replicas draw
differently, the sample statistics within a few standard errors of the distribution's).

PyTorch is not in the ``test`` extra (only in ``bench``): without it only the comparisons with
PyTorch skip."""

from __future__ import annotations

import math

import numpy as np
import pytest

import replicate as rp
import replicate.numpy as rnp
from conftest import optional_torch

torch, needs_torch = optional_torch()  # (the NumPy references run without it)
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
WEIGHTS = np.arange(1.0, 5.0)  # the policy loss's weights on the log-probabilities


# -- NumPy references -----------------------------------------------------------------------------
def _log_softmax(logits):
    top = logits.max(-1, keepdims=True)
    return logits - top - np.log(np.exp(logits - top).sum(-1, keepdims=True))


def _categorical(logits, logits_q, actions):
    """log p(a) = l_a - log Σ exp l; H = -Σ p log p; KL(p‖q) = Σ p (log p - log q), with
    0 log 0 = 0; the mode: the most likely category."""
    logp, logq = _log_softmax(logits), _log_softmax(logits_q)
    p = np.exp(logp)
    plogp = np.where(p > 0, p * np.where(p > 0, logp, 0.0), 0.0)
    return {"log_prob": logp[np.arange(len(actions)), actions], "entropy": -plogp.sum(-1),
            "probs": p, "kl": (plogp - np.where(p > 0, p * logq, 0.0)).sum(-1),
            "mode": logits.argmax(-1)}


def _normal(loc, scale, loc_q, scale_q, x):
    """log N(x; μ, σ) = -(x - μ)² / 2σ² - log(σ √(2π)); H = ½ log(2πe σ²);
    KL(p‖q) = log(σ_q / σ_p) + (σ_p² + (μ_p - μ_q)²) / 2σ_q² - ½."""
    return {"log_prob": -(x - loc) ** 2 / (2 * scale ** 2) - np.log(scale * np.sqrt(2 * np.pi)),
            "entropy": 0.5 * np.log(2 * np.pi * np.e * scale ** 2),
            "kl": np.log(scale_q / scale) + (scale ** 2 + (loc - loc_q) ** 2) / (2 * scale_q ** 2)
            - 0.5}


def _run(fn, mode, *args):
    return [np.asarray(v) for v in rp.function(fn, mode=mode)(*args)]


def _categorical_ours(mode):
    def f(logits, q, actions):
        p = D.Categorical(logits=logits)
        return (p.log_prob(actions), p.entropy(), p.probs,
                D.kl_divergence(p, D.Categorical(logits=q)), p.mode)

    return dict(zip(["log_prob", "entropy", "probs", "kl", "mode"],
                    _run(f, mode, LOGITS, LOGITS_Q, ACTIONS)))


def _normal_ours(mode):
    def f(loc, scale, lq, sq, x):
        p = D.Normal(loc, scale)
        return p.log_prob(x), p.entropy(), D.kl_divergence(p, D.Normal(lq, sq))

    return dict(zip(["log_prob", "entropy", "kl"],
                    _run(f, mode, LOC, SCALE, LOC_Q, SCALE_Q, X)))


def _same(got, want):
    assert got.keys() == want.keys()
    for name in want:
        np.testing.assert_allclose(got[name], want[name], rtol=1e-12, atol=1e-14, err_msg=name)


@pytest.mark.parametrize("mode", MODES)
def test_categorical_follows_the_formulas(mode):
    want = _categorical(LOGITS, LOGITS_Q, ACTIONS)
    assert np.isfinite(want["entropy"]).all() and np.isfinite(want["kl"]).all()
    _same(_categorical_ours(mode), want)
    with np.errstate(divide="ignore"):  # (log 0 = -inf, NumPy's warning)
        from_probs = D.Categorical(probs=np.exp(LOGITS) / np.exp(LOGITS).sum(-1, keepdims=True))
    np.testing.assert_allclose(from_probs.log_prob(ACTIONS).numpy(), want["log_prob"],
                               rtol=1e-12)
    x = rnp.asarray(LOGITS)
    grad = rp.grad(rnp.sum(D.Categorical(logits=x).entropy()) + rnp.sum(D.kl_divergence(
        D.Categorical(logits=x), D.Categorical(logits=LOGITS_Q))), x)
    assert np.isfinite(np.asarray(grad)).all()  # (a category of probability 0: no nan)


@pytest.mark.parametrize("mode", MODES)
def test_normal_follows_the_formulas(mode):
    _same(_normal_ours(mode), _normal(LOC, SCALE, LOC_Q, SCALE_Q, X))


@needs_torch
@pytest.mark.parametrize("mode", MODES)
def test_categorical_matches_torch(mode):
    p = torch.distributions.Categorical(logits=torch.tensor(LOGITS))
    q = torch.distributions.Categorical(logits=torch.tensor(LOGITS_Q))
    want = {"log_prob": p.log_prob(torch.tensor(ACTIONS)), "entropy": p.entropy(),
            "probs": p.probs, "kl": torch.distributions.kl_divergence(p, q),
            "mode": p.probs.argmax(-1)}
    _same(_categorical_ours(mode), {k: v.numpy() for k, v in want.items()})


@needs_torch
@pytest.mark.parametrize("mode", MODES)
def test_normal_matches_torch(mode):
    p = torch.distributions.Normal(torch.tensor(LOC), torch.tensor(SCALE))
    q = torch.distributions.Normal(torch.tensor(LOC_Q), torch.tensor(SCALE_Q))
    want = {"log_prob": p.log_prob(torch.tensor(X)), "entropy": p.entropy(),
            "kl": torch.distributions.kl_divergence(p, q)}
    _same(_normal_ours(mode), {k: v.numpy() for k, v in want.items()})


def _policy_loss(logits, loc, log_scale):
    """The PPO pieces: log-probabilities and entropies of a Categorical and a Normal."""
    pi, nd = D.Categorical(logits=logits), D.Normal(loc, rnp.exp(log_scale))
    return rnp.sum(pi.log_prob(ACTIONS) * WEIGHTS) + rnp.sum(nd.log_prob(X)) \
        + 0.1 * rnp.sum(pi.entropy()) + 0.3 * rnp.sum(nd.entropy())


POLICY = (np.where(np.isfinite(LOGITS), LOGITS, -30.0), LOC, np.log(SCALE))


def _policy_grads(mode):
    f = rp.function(lambda a, b, c: rp.grad(_policy_loss(a, b, c), [a, b, c]), mode=mode)
    return [np.asarray(g) for g in f(*POLICY)]


@pytest.mark.parametrize("mode", MODES)
def test_gradients_of_a_policy_loss_follow_the_formulas(mode):
    """d log p(a) / d l = onehot(a) - p; d H / d l = -p (log p + H);
    d log N / d μ = (x - μ) / σ²; d log N / d log σ = z² - 1; d H / d log σ = 1."""
    logits, loc, log_scale = POLICY
    logp = _log_softmax(logits)
    p, entropy = np.exp(logp), -(np.exp(logp) * logp).sum(-1, keepdims=True)
    onehot = np.eye(logits.shape[-1])[ACTIONS]
    want_logits = WEIGHTS[:, None] * (onehot - p) - 0.1 * p * (logp + entropy)
    scale = np.exp(log_scale)
    z = (X - loc) / scale
    want = [want_logits, (X - loc) / scale ** 2, z ** 2 - 1 + 0.3]
    for name, g, w in zip(["logits", "loc", "log_scale"], _policy_grads(mode), want,
                          strict=True):
        np.testing.assert_allclose(g, w, rtol=1e-10, atol=1e-12, err_msg=name)


@needs_torch
@pytest.mark.parametrize("mode", MODES)
def test_gradients_of_a_policy_loss_match_torch(mode):
    ts = [torch.tensor(v, requires_grad=True) for v in POLICY]
    pi = torch.distributions.Categorical(logits=ts[0])
    nd = torch.distributions.Normal(ts[1], ts[2].exp())
    total = (pi.log_prob(torch.tensor(ACTIONS)) * torch.tensor(WEIGHTS)).sum() \
        + nd.log_prob(torch.tensor(X)).sum() + 0.1 * pi.entropy().sum() \
        + 0.3 * nd.entropy().sum()
    total.backward()
    for g, t in zip(_policy_grads(mode), ts, strict=True):
        np.testing.assert_allclose(g, t.grad.numpy(), rtol=1e-10, atol=1e-12)


N = 4000
PROBS = np.array([[0.1, 0.6, 0.3], [0.5, 0.05, 0.45]])
MEAN, STD = np.array([1.5, -2.0]), np.array([1.0, 3.0])


def test_samples_repeat_across_modes_and_follow_the_distribution():
    """Frequencies, mean, variance and the share within one σ, each within 4 standard errors
    of the distribution's (a fixed seed: the same draws every run)."""
    draws = {}
    for mode in MODES:
        g = rnp.random.Generator(seed=3)
        f = rp.function(lambda lg: (D.Categorical(logits=lg).sample(g, (N,)),
                                    D.Normal(MEAN, STD).sample(g, (N,)),
                                    D.Normal(MEAN, STD).rsample(g, (N,))), mode=mode)
        draws[mode] = [np.asarray(v) for v in f(np.log(PROBS))]
    for a, b in zip(draws["graph"], draws["eager"], strict=True):
        np.testing.assert_array_equal(a, b)  # the same keyed stream in both modes
    cats, *normals = draws["graph"]
    assert cats.shape == (N, 2) and all(x.shape == (N, 2) for x in normals)
    for row, probs in enumerate(PROBS):
        freq = np.bincount(cats[:, row], minlength=3) / N
        assert (np.abs(freq - probs) < 4 * np.sqrt(probs * (1 - probs) / N)).all(), (row, freq)
    inside = math.erf(1 / math.sqrt(2))  # P(|x - μ| < σ) = 0.6827
    for x in normals:
        assert (np.abs(x.mean(0) - MEAN) < 4 * STD / np.sqrt(N)).all(), x.mean(0)
        var_se = STD ** 2 * np.sqrt(2 / (N - 1))
        assert (np.abs(x.var(0, ddof=1) - STD ** 2) < 4 * var_se).all(), x.var(0, ddof=1)
        share = (np.abs(x - MEAN) < STD).mean(0)
        assert (np.abs(share - inside) < 4 * np.sqrt(inside * (1 - inside) / N)).all(), share
    assert not np.array_equal(normals[0], normals[1])  # (each draw advances the Generator)


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
