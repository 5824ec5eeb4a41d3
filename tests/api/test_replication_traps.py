"""Replicated training that gave a wrong number without a word (an audit of session 13), each
held here against the number the docs promise:

1. ``opt.lr = ...`` on a wrapped optimiser set the wrapper's own attribute: no update used it;
2. ``rp.all_reduce(flags, "sum")`` (and ``rp.host.all_reduce``) of bools or-ed them: a count is
   NumPy's ``sum`` of bools;
3. ``ReduceLROnPlateau``'s rate was not in ``opt.variables()``: a resumed run went back to the
   first rate;
4. gradients nested differently from the parameters (a list for a dict) were matched by
   position with the dict's sorted keys: each landed on another parameter of its shape;
5. replicas handed batches of different sizes: the mean over replicas is the mean of their
   means (as DDP's) — now said by a warning; ``BatchNorm(cross_replica=True)`` weighs each
   replica's statistics by its size, so it is exact whatever the split;
6. ``rp.shard_batches(data, B)`` without ``ctx`` gives every replica the same rows — now said by
   a warning when a process's replicas get the same first batch.
"""

from __future__ import annotations

import warnings

import numpy as np
import pytest

import replicate as rp
import replicate.numpy as rnp

MODES = ["graph", "eager"]


@pytest.mark.parametrize("mode", MODES)
def test_a_learning_rate_set_on_the_wrapped_optimiser_is_the_one_used(mode):
    w = rp.Variable(np.zeros(1), name="w")
    opt = rp.wrap_optimizer(rp.optim.SGD([w], lr=1.0, momentum=0.0))

    def step(x):
        opt.apply([rp.grad(rnp.sum(w * -1.0), w)])  # (a gradient of -1: w grows by lr)
        return {}
    rep = rp.Replicator(lambda ctx: iter([np.zeros(1)] * 4), step, mode=mode)
    rep.run(1)
    opt.lr *= 0.001
    rep.run(1)
    assert w.numpy()[0] == pytest.approx(1.001, abs=1e-12)
    assert opt.optimizer.lr == opt.lr == pytest.approx(0.001)
    opt.max_grad_norm = 5.0  # (the wrapper's own setting stays the wrapper's)
    assert opt.__dict__["max_grad_norm"] == 5.0 and not hasattr(opt.optimizer, "max_grad_norm")


def test_a_sum_of_flags_over_replicas_counts_them():
    def input_fn(ctx):
        while True:
            yield np.array([1.0 if ctx.replica_id < 3 else -1.0])

    def step(x):
        flag = x[0] > 0
        return {"count": rp.all_reduce(flag, "sum"), "any": rp.all_reduce(flag, "max"),
                "scatter": rp.reduce_scatter(rnp.stack([flag] * 4), "sum")}
    out = rp.Replicator(input_fn, step, replicas_per_rank=4, outputs="per_replica").run(1)[0]
    assert out["count"].tolist() == [3, 3, 3, 3] and out["count"].dtype == np.int64
    assert out["any"].tolist() == [True] * 4 and out["any"].dtype == np.bool_
    assert out["scatter"].tolist() == [[3]] * 4


def test_a_host_sum_of_flags_counts_them():
    got = rp.host.all_reduce(np.array([True, False]), "sum")
    assert got.dtype == np.int64 and got.tolist() == [1, 0]


def test_a_plateau_schedule_resumes_at_its_reduced_rate(tmp_path):
    rng = np.random.default_rng(0)
    x, y = rng.normal(size=(64, 3)), rng.normal(size=64)

    def trainer():
        w = rp.Variable(np.zeros(3), name="w")
        plateau = rp.optim.ReduceLROnPlateau(0.1, patience=0, factor=0.5)
        opt = rp.wrap_optimizer(rp.optim.SGD([w], lr=plateau))

        def step(xb):
            loss = rnp.mean((xb @ w - y) ** 2)
            opt.apply([rp.grad(loss, w)])
            return {"loss": loss}
        rep = rp.Replicator(lambda ctx: iter([x] * 100), step)
        return rep, {"w": w, "opt": opt.variables()}, opt, \
            (lambda r, s, out: plateau.step(out["loss"]))

    rep, state, opt, cb = trainer()
    rep.run(20, callbacks=[cb])
    assert "lr/lr" in state["opt"]
    saved = opt.learning_rate
    assert saved < 0.1
    rp.checkpoint.save(str(tmp_path / "plateau.npz"), state, step=20)
    rep, state, opt, _ = trainer()
    rep.restore(str(tmp_path / "plateau.npz"), state)
    assert opt.learning_rate == saved


@pytest.mark.parametrize("wrapped", [False, True])
def test_gradients_nested_unlike_the_parameters_are_refused(wrapped):
    layers = [rp.nn.Linear(4, 4, bias=False) for _ in range(11)]
    params = rp.nn.Sequential(*layers).parameters()  # "0.weight" ... "10.weight"
    opt = rp.optim.SGD(params, lr=1.0)
    opt = rp.wrap_optimizer(opt) if wrapped else opt

    def step(x):
        loss = rnp.sum(layers[2](x))
        opt.apply(rp.grad(loss, list(params.values())))  # (a list for a dict)
        return {}
    with pytest.raises(rp.ReplicateError, match="nested differently"):
        rp.Replicator(lambda ctx: iter([np.ones((1, 4), np.float32)]), step).run(1)


def _batches(cuts, x):
    return lambda ctx: iter([x[cuts[ctx.replica_id]:cuts[ctx.replica_id + 1]]])


def test_replicas_of_different_batch_sizes_are_warned_of():
    x = np.random.default_rng(0).normal(size=(16, 3))
    w = rp.Variable(np.zeros(3), name="w")
    opt = rp.wrap_optimizer(rp.optim.SGD([w], lr=0.1))

    def step(xb):
        opt.apply([rp.grad(rnp.mean((xb @ w - 1.0) ** 2), w)])
        return {}
    with pytest.warns(UserWarning, match=r"differ in size \(\[4, 12\].*mean of the replicas"):
        rp.Replicator(_batches([0, 4, 16], x), step, replicas_per_rank=2).run(1)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        rp.Replicator(_batches([0, 8, 16], x), step, replicas_per_rank=2).run(1)


@pytest.mark.parametrize("mode", MODES)
def test_cross_replica_batchnorm_weighs_replicas_by_their_batch_sizes(mode):
    x = np.random.default_rng(0).normal(size=(16, 3)) + np.arange(16)[:, None]

    def run(cuts, k):
        bn = rp.nn.BatchNorm(3, cross_replica=True, dtype=np.float64)
        def step(xb):
            y = bn(xb)  # (its sums over the batch: every replica's outputs of one shape)
            return {"y": rnp.stack([rnp.sum(y, axis=0), rnp.sum(y * xb, axis=0)])}
        out = rp.Replicator(_batches(cuts, x), step, replicas_per_rank=k,
                            outputs="per_replica", mode=mode).run(1)[0]["y"]
        return out, bn.running_mean.numpy(), bn.running_var.numpy()

    whole, mean, var = run([0, 16], 1)
    np.testing.assert_allclose(mean, 0.1 * x.mean(0), rtol=1e-12)
    if mode == "eager":  # (one replica a process: the split is what two processes would do)
        return
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # (the uneven batches' warning: said above)
        split, mean2, var2 = run([0, 4, 16], 2)
    np.testing.assert_allclose(mean2, mean, rtol=1e-12)
    np.testing.assert_allclose(var2, var, rtol=1e-12)
    np.testing.assert_allclose(split[0] + split[1], whole[0], rtol=1e-10, atol=1e-10)


def test_replicas_handed_the_same_batch_are_warned_of():
    x = np.arange(16.0).reshape(8, 2)
    w = rp.Variable(np.zeros(2), name="w")
    opt = rp.wrap_optimizer(rp.optim.SGD([w], lr=0.1))

    def step(xb):
        opt.apply([rp.grad(rnp.mean(xb @ w), w)])
        return {}
    with pytest.warns(UserWarning, match="same first batch: did it leave out ctx"):
        rp.Replicator(lambda ctx: rp.shard_batches(x, 2, shuffle=False), step,
                      replicas_per_rank=2).run(1)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        rp.Replicator(lambda ctx: rp.shard_batches(x, 2, ctx, shuffle=False), step,
                      replicas_per_rank=2).run(1)
