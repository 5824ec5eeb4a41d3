"""``rp.memory_report()``: each kind's figure against the arrays the process actually holds
(the sharded figures, about 1/N of the unsharded ones, are checked under mpiexec in
``tests/runtime/test_shard_state.py``)."""

import gc

import numpy as np
import pytest

import replicate as rp
import replicate.numpy as rnp


def _mlp(dtype="float32"):
    rng = np.random.default_rng(0)
    return [rp.Variable(rng.normal(size=(8, 16)), dtype=dtype, name="w1"),
            rp.Variable(np.zeros(16), dtype=dtype, name="b1"),
            rp.Variable(rng.normal(size=(16, 4)), dtype=dtype, name="w2")]


def _train(params, opt, steps=2):
    def step(x):
        h = rnp.tanh(x @ params[0] + params[1])
        loss = rnp.mean(rnp.cast(h @ params[2], "float32") ** 2)
        opt.apply(rp.grad(loss, params))
        return loss

    f = rp.function(step)
    x = np.ones((32, 8), np.float32)
    for _ in range(steps):
        f(x)
    return f, x


def test_adam_figures_are_the_arrays_held():
    params = _mlp()
    opt = rp.optim.Adam(params)
    f, x = _train(params, opt)
    r = rp.memory_report(opt)
    assert r["parameters"] == sum(p.value.nbytes for p in params) == 4 * (128 + 16 + 64)
    assert r["optimizer_state"] == sum(v.value.nbytes for v in opt.variables().values())
    assert r["optimizer_state"] == 2 * r["parameters"] + 8  # m, v and the step counter
    assert r["master_weights"] == 0 and r["gradients"] == 0
    plan = f.executable(x).graph.meta.memory_plan.nbytes
    assert r["activations_planned"] == plan > 0
    assert r["total"] == r["parameters"] + r["optimizer_state"] + plan
    assert "other_variables" not in r or r["other_variables"] == 0


def test_master_weights_and_accumulated_gradients():
    params = _mlp("bfloat16")
    opt = rp.wrap_optimizer(rp.optim.AdamW(params), accumulate=2)
    _train(params, opt, steps=3)
    r = rp.memory_report(opt)
    n = sum(p.size for p in params)
    assert r["parameters"] == 2 * n  # bfloat16
    assert r["master_weights"] == 4 * n == sum(m.value.nbytes for m in opt.master)
    assert r["gradients"] == 4 * n == sum(b.value.nbytes for b in opt.buffers)  # float32, k=1
    assert r["optimizer_state"] == 8 * n + 8 + 8  # m, v; step and micro-step counters


def test_without_arguments_every_live_variable_counts_once():
    gc.collect()
    params = _mlp()
    opt = rp.optim.SGD(params, momentum=0.9)
    stats = rp.Variable(np.zeros(1000, np.float64), name="running_stats")
    r = rp.memory_report()
    mine = rp.memory_report(opt)
    assert r["parameters"] >= mine["parameters"] == 4 * 208
    assert r["other_variables"] >= stats.value.nbytes
    every = sum(v.held.nbytes for v in rp.state.live_variables())
    assert r["parameters"] + r["gradients"] + r["optimizer_state"] + r["master_weights"] \
        + r["other_variables"] == every


@pytest.mark.parametrize("bad", [3, "adam"])
def test_non_optimisers_are_refused(bad):
    with pytest.raises(rp.ReplicateError, match="memory_report counts rp.optim"):
        rp.memory_report(bad)
