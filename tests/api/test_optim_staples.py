"""Adagrad, Adadelta and PyTorch's learning-rate schedulers against ``torch.optim`` (float64,
every update, graph and eager mode); an optimiser of one's own; ReduceLROnPlateau changing
the rate of a compiled step without tracing it again."""

from __future__ import annotations

import numpy as np
import pytest

import replicate as rp
import replicate.numpy as rnp

torch = pytest.importorskip("torch")  # (the tests extra; PyTorch is the reference here)

MODES = ["graph", "eager"]
SHAPES = [(3, 2), (4,), ()]
STEPS = 7

OPTIMIZERS = {  # name: (ours, torch's, {our slot: torch's state key})
    "adagrad": (lambda ps: rp.optim.Adagrad(ps, lr=0.1),
                lambda ps: torch.optim.Adagrad(ps, lr=0.1), {"sum": "sum"}),
    "adagrad-all": (
        lambda ps: rp.optim.Adagrad(ps, lr=0.05, lr_decay=0.1, weight_decay=0.2,
                                    initial_accumulator_value=0.3, eps=1e-6),
        lambda ps: torch.optim.Adagrad(ps, lr=0.05, lr_decay=0.1, weight_decay=0.2,
                                       initial_accumulator_value=0.3, eps=1e-6), {"sum": "sum"}),
    "adadelta": (lambda ps: rp.optim.Adadelta(ps),
                 lambda ps: torch.optim.Adadelta(ps),
                 {"square_avg": "square_avg", "acc_delta": "acc_delta"}),
    "adadelta-all": (lambda ps: rp.optim.Adadelta(ps, lr=0.5, rho=0.7, eps=1e-4,
                                                  weight_decay=0.1),
                     lambda ps: torch.optim.Adadelta(ps, lr=0.5, rho=0.7, eps=1e-4,
                                                     weight_decay=0.1),
                     {"square_avg": "square_avg", "acc_delta": "acc_delta"}),
    "sgd-steplr": (lambda ps: rp.optim.SGD(ps, lr=rp.optim.StepLR(0.1, 2, gamma=0.5)),
                   lambda ps: torch.optim.SGD(ps, lr=0.1), {}),
}
SCHEDULERS = {"sgd-steplr": lambda opt: torch.optim.lr_scheduler.StepLR(opt, 2, gamma=0.5)}


def _data(dtype=np.float64):
    rng = np.random.default_rng(0)
    init = [rng.normal(size=s).astype(dtype) for s in SHAPES]
    grads = [[rng.normal(size=s).astype(dtype) for s in SHAPES] for _ in range(STEPS)]
    return init, grads


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("name", list(OPTIMIZERS))
def test_optimizer_matches_torch(name, mode):
    ours, theirs, slots = OPTIMIZERS[name]
    init, grads = _data()
    params = [rp.Variable(v, name=f"p{i}") for i, v in enumerate(init)]
    opt = ours(params)
    step = rp.function(lambda gs: opt.apply(gs) or rnp.zeros(()), mode=mode)
    tparams = [torch.tensor(v, requires_grad=True) for v in init]
    topt = theirs(tparams)
    sched = SCHEDULERS[name](topt) if name in SCHEDULERS else None
    for t, gs in enumerate(grads, start=1):
        step(gs)
        for p, g in zip(tparams, gs):
            p.grad = torch.tensor(g)
        topt.step()
        if sched is not None:
            sched.step()
        for i, (p, tp) in enumerate(zip(params, tparams)):
            np.testing.assert_allclose(p.numpy(), tp.detach().numpy(), rtol=1e-12, atol=1e-15,
                                       err_msg=f"{name} p{i} after update {t} ({mode})")
    if mode == "graph":
        assert step.trace_count == 1
    variables = opt.variables()
    assert set(variables) == {"step"} | {f"{s}/{i}" for s in slots for i in range(len(SHAPES))}
    for slot, key in slots.items():
        for i, tp in enumerate(tparams):
            np.testing.assert_allclose(variables[f"{slot}/{i}"].numpy(),
                                       topt.state[tp][key].numpy(), rtol=1e-12, atol=1e-15)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("name", ["adagrad-all", "adadelta-all"])
def test_eager_updates_equal_the_compiled_ones_bitwise(name, dtype):
    """``eager_numpy``: eager mode runs the update on NumPy arrays, to the compiled step's bit
    (master weights included for bfloat16)."""
    make = OPTIMIZERS[name][0]
    dt = rp.dtypes.bfloat16 if dtype == "bfloat16" else np.float32
    init, grads = _data(np.float32)
    results = {}
    for mode in MODES:
        params = [rp.Variable(v.astype(dt)) for v in init]
        opt = make(params)
        step = rp.function(lambda gs: opt.apply(gs) or rnp.zeros(()), mode=mode)
        for gs in grads:
            step([g.astype(dt) for g in gs])
        results[mode] = {k: v.numpy() for k, v in opt.variables().items()}
        results[mode].update({f"param/{i}": p.numpy() for i, p in enumerate(params)})
    assert results["eager"].keys() == results["graph"].keys()
    for key, want in results["graph"].items():
        got = results["eager"][key]
        assert got.dtype == want.dtype, key
        np.testing.assert_array_equal(np.atleast_1d(got).view(np.uint8),
                                      np.atleast_1d(want).view(np.uint8), err_msg=key)


def test_an_optimiser_of_ones_own_runs_in_both_modes_and_checkpoints(tmp_path):
    class Lion(rp.optim.Optimizer):  # (Chen et al.; docs/guides/toolkit.md)
        eager_numpy = True

        def __init__(self, params, lr=1e-4, b1=0.9, b2=0.99):
            super().__init__(params, lr)
            self.b1, self.b2, self.m = b1, b2, self.slot("m")

        def update(self, i, p, g, lr, step):
            m = self.xp.read(self.m[i])
            c = self.b1 * m + (1 - self.b1) * g
            self.m[i].assign(self.b2 * m + (1 - self.b2) * g)
            return p - lr * self.xp.where(c > 0, 1.0, self.xp.where(c < 0, -1.0, 0.0))

    init, grads = _data()
    out = {}
    for mode in MODES:
        params = [rp.Variable(v) for v in init]
        opt = Lion(params, lr=0.01)
        step = rp.function(lambda gs: opt.apply(gs) or rnp.zeros(()), mode=mode)
        for gs in grads:
            step(gs)
        out[mode] = [p.numpy() for p in params]
        rp.checkpoint.save(str(tmp_path / f"{mode}.npz"), opt.variables(), STEPS)
    m, want = [np.zeros(s) for s in SHAPES], [v.copy() for v in init]
    for gs in grads:  # NumPy reference
        for i, g in enumerate(gs):
            c = 0.9 * m[i] + 0.1 * g
            m[i] = 0.99 * m[i] + 0.01 * g
            want[i] = want[i] - 0.01 * np.sign(c)
    for mode in MODES:
        for got, w in zip(out[mode], want):
            np.testing.assert_allclose(got, w, rtol=1e-13, err_msg=mode)
    assert sorted(np.load(tmp_path / "graph.npz").files)[:1]  # (state saved by name)


# -- schedulers -----------------------------------------------------------------------------------
T = torch.optim.lr_scheduler
SCHEDULES = {  # ours, torch's (on an SGD with lr=base)
    "step": (lambda: rp.optim.StepLR(0.1, 3, gamma=0.5), lambda o: T.StepLR(o, 3, gamma=0.5)),
    "multistep": (lambda: rp.optim.MultiStepLR(0.1, [2, 5, 5], gamma=0.3),
                  lambda o: T.MultiStepLR(o, [2, 5, 5], gamma=0.3)),
    "exponential": (lambda: rp.optim.ExponentialLR(0.1, 0.9), lambda o: T.ExponentialLR(o, 0.9)),
    "cosine": (lambda: rp.optim.CosineAnnealingLR(0.1, 6, eta_min=0.01),
               lambda o: T.CosineAnnealingLR(o, 6, eta_min=0.01)),
    "linear-warmup": (lambda: rp.optim.LinearLR(0.1, 0.25, 1.0, total_iters=4),
                      lambda o: T.LinearLR(o, 0.25, 1.0, total_iters=4)),
    "linear-decay": (lambda: rp.optim.LinearLR(0.1, 1.0, 0.1, total_iters=5),
                     lambda o: T.LinearLR(o, 1.0, 0.1, total_iters=5)),
}


def _torch_rates(make, updates, base=0.1):
    opt = torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=base)
    sched, rates = make(opt), []
    for _ in range(updates):
        rates.append(opt.param_groups[0]["lr"])  # the rate this update uses
        opt.step()
        sched.step()
    return rates


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("name", list(SCHEDULES))
def test_schedule_matches_torch_scheduler(name, mode):
    ours, theirs = SCHEDULES[name]
    want = _torch_rates(theirs, 14)
    s = ours()
    f = rp.function(lambda t: s(t), mode=mode)
    got = [float(f(np.int64(t))) for t in range(1, 15)]  # update t reads schedule(t)
    np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-15)
    # through an optimiser: update t used want[t - 1] (gradient 1: the step is the rate)
    w = rp.Variable(np.zeros(()), name="w")
    opt = rp.optim.SGD([w], lr=ours())
    step = rp.function(lambda: opt.apply([np.float64(1.0)]) or rnp.zeros(()), mode=mode)
    seen = []
    for _ in range(14):
        assert opt.learning_rate == pytest.approx(want[len(seen)], rel=1e-12)
        before = float(w.numpy())
        step()
        seen.append(before - float(w.numpy()))
    np.testing.assert_allclose(seen, want, rtol=1e-9)


def test_a_warmup_over_a_cosine_multiplies_them():
    s = rp.optim.LinearLR(rp.optim.CosineAnnealingLR(1.0, 10), 0.1, 1.0, total_iters=3)
    for t in range(1, 12):
        n = t - 1
        want = (0.1 + 0.9 * min(n, 3) / 3) * (1 + np.cos(np.pi * n / 10)) / 2
        assert float(s(rnp.asarray(t))) == pytest.approx(want, rel=1e-12)


PLATEAU = [dict(), dict(mode="max"), dict(threshold_mode="abs", threshold=0.05),
           dict(patience=1, cooldown=2, factor=0.5, min_lr=0.004), dict(patience=0, factor=0.2)]
METRICS = [1.0, 0.9, 0.95, 0.95, 0.91, 0.9, 0.9, 0.89, 0.9, 0.92, 0.93, 0.7, 0.8, 0.8, 0.8, 0.8,
           0.8, 0.8, 0.8, 0.8, 0.8, 0.8, 0.8, 0.8, 0.8]


@pytest.mark.parametrize("kwargs", PLATEAU, ids=str)
def test_reduce_on_plateau_matches_torch(kwargs):
    kw = {"patience": 2, **kwargs}
    plateau = rp.optim.ReduceLROnPlateau(0.1, **kw)
    opt = torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=0.1)
    sched = T.ReduceLROnPlateau(opt, **kw)
    for metric in METRICS:
        sched.step(metric)
        assert plateau.step(metric) == opt.param_groups[0]["lr"]
        assert float(plateau(rnp.asarray(1))) == opt.param_groups[0]["lr"]
    assert opt.param_groups[0]["lr"] < 0.1  # (the metrics reach a plateau in every case)


@pytest.mark.parametrize("mode", MODES)
def test_reduce_on_plateau_changes_a_compiled_step_without_tracing_again(mode):
    w = rp.Variable(np.zeros(()), name="w")
    plateau = rp.optim.ReduceLROnPlateau(1.0, patience=0, factor=0.5)
    opt = rp.optim.SGD([w], lr=plateau)
    step = rp.function(lambda: opt.apply([np.float64(1.0)]) or rnp.zeros(()), mode=mode)
    moves = []
    for metric in [3.0, 3.0, 3.0, 2.0]:  # (no improvement twice: 1 -> 0.5 -> 0.25)
        before = float(w.numpy())
        step()
        moves.append(before - float(w.numpy()))
        plateau.step(metric)
    assert moves == [1.0, 1.0, 0.5, 0.25]
    if mode == "graph":
        assert step.trace_count == 1
    assert set(plateau.variables()) == {"lr", "best", "bad", "cooldown"}


def test_a_plateau_fed_by_a_replicator_callback_on_two_replicas():
    w = rp.Variable(np.zeros(2, np.float32), name="w")
    plateau = rp.optim.ReduceLROnPlateau(0.5, patience=1, factor=0.1)
    opt = rp.wrap_optimizer(rp.optim.SGD([w], lr=plateau))

    def step_fn(x):
        loss = rnp.mean((x - w) ** 2)
        opt.apply([rp.grad(loss, w)])
        return {"loss": rnp.asarray(1.0) + 0.0 * loss}  # a loss that never improves

    rep = rp.Replicator(lambda ctx: iter([np.ones((4, 2), np.float32)] * 6), step_fn,
                        replicas_per_rank=2)
    rep.run(6, callbacks=[lambda r, s, out: plateau.step(out["loss"])])
    assert opt.learning_rate == pytest.approx(0.5 * 0.1 ** 2) and rep.trace_count == 1


def test_a_schedule_has_no_step_to_call():
    with pytest.raises(rp.HabitError, match="nothing to call"):
        rp.optim.StepLR(0.1, 10).step()
