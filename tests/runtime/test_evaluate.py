"""``Replicator.evaluate`` (every example once over all replicas and processes, the training's
Variables, one trace for every evaluation) and ``run``'s history with gradient accumulation
(one entry per update)."""

from __future__ import annotations

import json
import re

import numpy as np
import pytest

import replicate as rp
import replicate.numpy as rnp
from conftest import have_mpi, mpirun, report

LAYOUTS = [("graph", 1), ("graph", 3), ("eager", 1)]
rng = np.random.default_rng(0)
X, Y = rng.normal(size=(103, 4)), rng.integers(0, 3, size=103)  # 103: no batch size divides it


def _eval_step(w):
    def eval_step(batch):
        (x, y), mask = batch
        return {"count": rnp.sum(mask), "row_sum": rnp.sum(rnp.sum(x, axis=1) * mask),
                "correct": rnp.sum((rnp.argmax(x @ w, axis=-1) == y) * mask)}
    return eval_step


@pytest.mark.parametrize("mode,k", LAYOUTS)
def test_every_example_counts_once_and_the_training_variables_are_read(mode, k):
    w = rp.Variable(rng.normal(size=(4, 3)), name="w")
    opt = rp.wrap_optimizer(rp.optim.SGD([w], lr=0.5))

    def train_step(batch):
        x, y = batch
        loss = rp.nn.softmax_cross_entropy(x @ w, y).mean()
        opt.apply([rp.grad(loss, w)])
        return {"loss": loss}

    rep = rp.Replicator(lambda ctx: rp.shard_batches((X, Y), 8, ctx, epochs=None), train_step,
                        mode=mode, replicas_per_rank=k)
    eval_step, seen, first = _eval_step(w), [], None
    for _ in range(3):  # evaluate every "epoch"
        totals = rep.evaluate((X, Y), eval_step, batch_size=5)
        assert float(totals["count"]) == 103
        assert float(totals["row_sum"]) == pytest.approx(X.sum(), rel=1e-12)
        want = np.sum(np.argmax(X @ w.numpy(), axis=-1) == Y)
        assert float(totals["correct"]) == want  # with the weights trained so far
        seen.append(float(totals["correct"]))
        first = first or rep._evaluators[eval_step][0]
        rep.run(4)
    assert len(set(seen)) > 1  # (training moved the weights in between)
    assert rep._evaluators[eval_step][0] is first  # one evaluator: its compiled step kept
    if mode == "graph":
        assert first.trace_count == 1 and rep.trace_count == 1  # compiled once each


def test_an_input_fn_and_the_model_in_eval_mode():
    model = rp.nn.Sequential(rp.nn.Linear(4, 8), rp.nn.Dropout(0.5), rp.nn.Linear(8, 3))
    rep = rp.Replicator(lambda ctx: iter([]), lambda b: {}, replicas_per_rank=2)

    def eval_step(batch):
        (x, y), mask = batch
        return {"logit_sum": rnp.sum(rnp.sum(model(x), axis=1) * mask)}

    def input_fn(ctx):
        return rp.shard_batches((X, Y), 16, ctx, epochs=1, shuffle=False, remainder="pad")

    a = rep.evaluate(input_fn, eval_step, model=model)
    b = rep.evaluate(input_fn, eval_step, model=model)
    assert model.training  # restored
    model.eval()
    want = float(np.sum(model(X).numpy()))
    assert float(a["logit_sum"]) == pytest.approx(want, rel=1e-6) and a == b  # Dropout off
    with pytest.raises(rp.ReplicateError, match="batch_size"):
        rep.evaluate((X, Y), eval_step)


@pytest.mark.mpi
@pytest.mark.parametrize("mode,k", [("graph", 2), ("eager", 1)])
def test_two_processes_count_every_example_once(mode, k):
    if not have_mpi():
        pytest.skip("needs mpi4py and mpiexec (mpich wheel)")
    result = mpirun("evaluate_mpi.py", mode, str(k), check=True)
    for rank in (0, 1):
        lines = re.findall(rf"^rank {rank} totals (.*) want (.*)$", result.stdout, re.M)
        assert len(lines) == 2, report(result)
        for totals, want in lines:
            totals = json.loads(totals)
            assert totals["count"] == 103 and totals["correct"] == float(want), report(result)
            assert totals["row_sum"] == pytest.approx(X.sum(), rel=1e-12)
        if mode == "graph":
            assert f"rank {rank} traces 1" in result.stdout


# -- one history entry per update with accumulate=n -------------------------------------------
@pytest.mark.parametrize("mode,k", LAYOUTS)
@pytest.mark.parametrize("outputs", ["mean", "sum"])
def test_history_has_one_entry_per_update(mode, k, outputs):
    w = rp.Variable(np.zeros(2), name="w")
    opt = rp.wrap_optimizer(rp.optim.SGD([w], lr=0.1), accumulate=4)

    def input_fn(ctx):
        t = 0
        while True:
            t += 1
            yield np.full((3, 2), 10.0 * t + ctx.replica_id)

    def step_fn(x):
        opt.apply([rp.grad(rnp.sum(x * w), w)])
        return {"x": rnp.mean(x)}

    rep = rp.Replicator(input_fn, step_fn, mode=mode, replicas_per_rank=k, outputs=outputs)
    calls = []
    hist = rep.run(10, callbacks=[lambda r, s, out: calls.append(s)])
    assert calls == list(range(1, 11))  # callbacks: every micro-step
    per_step = [10.0 * t + (k - 1) / 2 for t in range(1, 13)]  # replicas' mean at step t
    if outputs == "sum":
        per_step = [v * k for v in per_step]
    combine = np.sum if outputs == "sum" else np.mean
    assert len(hist) == 2  # updates after steps 4 and 8; 9, 10 wait for the next run
    for i, entry in enumerate(hist):
        assert float(entry["x"]) == pytest.approx(combine(per_step[4 * i:4 * i + 4]))
    hist = rep.run(2)  # steps 11, 12: the third update, with 9 and 10
    assert len(hist) == 1 and float(hist[0]["x"]) == pytest.approx(combine(per_step[8:12]))
    assert int(opt.optimizer.step.numpy()) == 3
