"""The first examples a new user writes (issue 37): examples/transformer.py, mnist.py and ppo.py.

Each runs a few steps through ``main(argv)`` in one process (values checked: the first loss,
the loss going down, PPO's loss against NumPy), and once under ``python -m replicate.launch -n 2``
with one replica per process, whose losses equal the one-process run with 2 replicas (the
library's promise: R replicas give the same steps however the processes hold them).
"""

from __future__ import annotations

import json
import os
import sys

import numpy as np
import pytest
from test_examples import assert_decreases, assert_png, load_example

import replicate.numpy as rnp
from conftest import MPIEXEC, ROOT, child_env, report, run

pytest.importorskip("gymnasium", reason="ppo.py needs gymnasium (pip install '.[examples]')")

needs_mpi = pytest.mark.skipif(not os.path.exists(MPIEXEC),
                               reason="needs mpiexec (mpich wheel) for the 2-process run")


def launched(name, tmp_path, *args):
    """examples/<name>.py under the launcher, 2 processes x 1 replica; its --log JSON."""
    log = str(tmp_path / f"{name}-2p.json")
    cmd = [sys.executable, "-m", "replicate.launch", "-n", "2",
           os.path.join(ROOT, "examples", f"{name}.py"), *args, "--replicas-per-rank", "1",
           "--log", log, "--plot", str(tmp_path / f"{name}-2p.png")]
    result = run(cmd, cwd=tmp_path, timeout=600, env=child_env())
    assert result.returncode == 0, report(result)
    with open(log) as f:
        return json.load(f)


def in_process(name, tmp_path, *args):
    """examples/<name>.py's main in this process, 2 replicas; its --log JSON and return value."""
    log, plot = str(tmp_path / f"{name}.json"), str(tmp_path / f"{name}.png")
    out = load_example(name).main([*args, "--replicas-per-rank", "2", "--log", log,
                                   "--plot", plot])
    assert_png(plot)
    with open(log) as f:
        return json.load(f), out


TRANSFORMER = ["--steps", "8", "--context", "32", "--batch-size", "4", "--d", "32",
               "--warmup", "2", "--lr", "1e-2"]


@needs_mpi
@pytest.mark.mpi
def test_transformer(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    log, (losses, before, after) = in_process("transformer", tmp_path, *TRANSFORMER)
    out = capsys.readouterr().out
    assert len(losses) == 8 and losses == log["losses"]
    # PyTorch's default initialisation: the first loss is near ln(vocabulary), not above it by
    # more than the head's logit variance (1/3: + 1/6) and the noise of 8 windows
    assert np.log(log["vocab"]) < losses[0] < np.log(log["vocab"]) + 0.4, losses[0]
    assert_decreases(losses, "transformer")
    assert after < before - 0.3, (before, after)
    assert "held-out loss" in out and "sample" in out
    two = launched("transformer", tmp_path, *TRANSFORMER)
    np.testing.assert_allclose(two["losses"], losses, rtol=1e-5)
    np.testing.assert_allclose(two["held_out"], [before, after], rtol=1e-5)


@needs_mpi
@pytest.mark.mpi
def test_mnist(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    args = ["--steps", "12", "--epochs", "1"]
    rnp.random.default_seed()  # a generator made earlier in this process: the example seeds its own
    log, (losses, tests) = in_process("mnist", tmp_path, *args)
    assert len(losses) == 12 and len(tests) == 1
    assert abs(losses[0] - np.log(10)) < 0.15, losses[0]  # small first logits
    assert_decreases(losses, "mnist")
    assert 0.3 < tests[0][1] <= 1.0, tests  # far above chance (0.1) after 12 steps
    assert "Test set (epoch 1): Average loss" in capsys.readouterr().out
    two = launched("mnist", tmp_path, *args)  # dropout too: each replica's own stream
    np.testing.assert_allclose(two["losses"], losses, rtol=1e-5)
    np.testing.assert_allclose(two["tests"], tests, rtol=1e-5)


def test_ppo_loss_is_the_clipped_surrogate():
    ppo = load_example("ppo")
    rng = np.random.default_rng(0)
    n = 16
    logits, value = rng.normal(size=(n, 2)), rng.normal(size=n)
    act, old_logp = rng.integers(0, 2, n), np.log(rng.uniform(0.2, 0.8, n))
    adv, ret = rng.normal(size=n), rng.normal(size=n)
    loss, kl, entropy = ppo.ppo_loss(logits, value, (None, act, old_logp, adv, ret), 0.2, 0.5, 0.01)
    logp_all = logits - np.log(np.exp(logits).sum(-1, keepdims=True))
    logp = logp_all[np.arange(n), act]
    a = (adv - adv.mean()) / (adv.std() + 1e-8)
    ratio = np.exp(logp - old_logp)
    surrogate = np.minimum(ratio * a, np.clip(ratio, 0.8, 1.2) * a).mean()
    ent = -(np.exp(logp_all) * logp_all).sum(-1).mean()
    expected = -surrogate + 0.5 * 0.5 * ((ret - value) ** 2).mean() - 0.01 * ent
    np.testing.assert_allclose(float(loss), expected, rtol=1e-12)
    np.testing.assert_allclose(float(kl), (old_logp - logp).mean(), rtol=1e-12)
    np.testing.assert_allclose(float(entropy), ent, rtol=1e-12)


@needs_mpi
@pytest.mark.mpi
def test_ppo(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    args = ["--rollouts", "2", "--rollout", "32", "--envs", "2", "--epochs", "2",
            "--minibatches", "2"]
    log, (last20, returns, history) = in_process("ppo", tmp_path, *args)
    assert len(history) == 2 * 2 * 2 and returns == log["returns"]
    # 2 replicas x 2 environments x 64 steps, all episodes counted: their lengths add up
    assert len(returns) > 0 and sum(returns) <= 2 * 2 * 64 and min(returns) >= 8
    for h in history:
        assert np.isfinite(float(h["loss"])) and abs(float(h["kl"])) < 0.1
        assert 0 < float(h["entropy"]) <= np.log(2) + 1e-6
    assert "mean return of the last 20 episodes" in capsys.readouterr().out
    two = launched("ppo", tmp_path, *args)
    assert two["returns"] == returns
    np.testing.assert_allclose(two["losses"], log["losses"], rtol=1e-5)
