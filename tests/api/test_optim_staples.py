"""Adagrad, Adadelta and PyTorch's learning-rate schedulers, each against the textbook formulas
written here in NumPy (float64, every update, graph and eager mode) and, where PyTorch is
installed, against ``torch.optim`` too; an optimiser of one's own; ReduceLROnPlateau changing
the rate of a compiled step without tracing it again. (``warmup_cosine`` and ``step_decay``:
tests/api/test_optim.py.)

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
T = torch.optim.lr_scheduler if torch is not None else None

MODES = ["graph", "eager"]
SHAPES = [(3, 2), (4,), ()]
STEPS = 7


# -- NumPy references: the parameters and the state after every update ---------------------------
def _adagrad(init, grads, lr=1e-2, lr_decay=0.0, weight_decay=0.0,
             initial_accumulator_value=0.0, eps=1e-10):
    """Duchi, Hazan & Singer: G += g²; p -= lr_t g / (√G + ε), lr_t = lr / (1 + (t-1) decay),
    g with weight decay wd p added (PyTorch's defaults)."""
    p, G = [v.copy() for v in init], [np.full(v.shape, initial_accumulator_value) for v in init]
    for t, gs in enumerate(grads, start=1):
        lr_t = lr / (1 + (t - 1) * lr_decay)
        for i, g in enumerate(gs):
            g = g + weight_decay * p[i]
            G[i] = G[i] + g ** 2
            p[i] = p[i] - lr_t * g / (np.sqrt(G[i]) + eps)
        yield [v.copy() for v in p], {"sum": [v.copy() for v in G]}


def _adadelta(init, grads, lr=1.0, rho=0.9, eps=1e-6, weight_decay=0.0):
    """Zeiler: E[g²] = ρ E[g²] + (1-ρ) g²; Δ = √(E[Δ²] + ε) / √(E[g²] + ε) g;
    E[Δ²] = ρ E[Δ²] + (1-ρ) Δ²; p -= lr Δ (PyTorch's defaults)."""
    p = [v.copy() for v in init]
    Eg, Ed = [np.zeros(v.shape) for v in init], [np.zeros(v.shape) for v in init]
    for gs in grads:
        for i, g in enumerate(gs):
            g = g + weight_decay * p[i]
            Eg[i] = rho * Eg[i] + (1 - rho) * g ** 2
            delta = np.sqrt(Ed[i] + eps) / np.sqrt(Eg[i] + eps) * g
            Ed[i] = rho * Ed[i] + (1 - rho) * delta ** 2
            p[i] = p[i] - lr * delta
        yield [v.copy() for v in p], {"square_avg": [v.copy() for v in Eg],
                                      "acc_delta": [v.copy() for v in Ed]}


def _rmsprop(init, grads, lr=1e-2, alpha=0.99, eps=1e-8, momentum=0.0, lr_at=None):
    """Tieleman & Hinton: E[g²] = α E[g²] + (1-α) g²; b = μ b + g / (√E[g²] + ε);
    p -= lr_t b (without momentum b is the scaled gradient). The rate multiplies the buffer,
    not what goes into it (PyTorch's algorithm and defaults)."""
    p = [v.copy() for v in init]
    sq, buf = [np.zeros(v.shape) for v in init], [np.zeros(v.shape) for v in init]
    for t, gs in enumerate(grads, start=1):
        lr_t = lr if lr_at is None else lr_at(t)
        for i, g in enumerate(gs):
            sq[i] = alpha * sq[i] + (1 - alpha) * g * g
            scaled = g / (np.sqrt(sq[i]) + eps)
            buf[i] = momentum * buf[i] + scaled if momentum else scaled
            p[i] = p[i] - lr_t * buf[i]
        slots = {"ms": [v.copy() for v in sq]}
        if momentum:
            slots["mom"] = [v.copy() for v in buf]
        yield [v.copy() for v in p], slots


def _sgd_step_lr(init, grads, lr, step_size, gamma):
    """p -= lr γ^⌊(t-1)/step_size⌋ g."""
    p = [v.copy() for v in init]
    for t, gs in enumerate(grads, start=1):
        p = [v - lr * gamma ** ((t - 1) // step_size) * g for v, g in zip(p, gs)]
        yield [v.copy() for v in p], {}


OPTIMIZERS = {  # name: (ours, torch's, the NumPy reference, {our slot: torch's state key})
    "adagrad": (lambda ps: rp.optim.Adagrad(ps, lr=0.1),
                lambda ps: torch.optim.Adagrad(ps, lr=0.1),
                lambda init, gs: _adagrad(init, gs, lr=0.1), {"sum": "sum"}),
    "adagrad-all": (
        lambda ps: rp.optim.Adagrad(ps, lr=0.05, lr_decay=0.1, weight_decay=0.2,
                                    initial_accumulator_value=0.3, eps=1e-6),
        lambda ps: torch.optim.Adagrad(ps, lr=0.05, lr_decay=0.1, weight_decay=0.2,
                                       initial_accumulator_value=0.3, eps=1e-6),
        lambda init, gs: _adagrad(init, gs, lr=0.05, lr_decay=0.1, weight_decay=0.2,
                                  initial_accumulator_value=0.3, eps=1e-6), {"sum": "sum"}),
    "adadelta": (lambda ps: rp.optim.Adadelta(ps),
                 lambda ps: torch.optim.Adadelta(ps), _adadelta,
                 {"square_avg": "square_avg", "acc_delta": "acc_delta"}),
    "adadelta-all": (lambda ps: rp.optim.Adadelta(ps, lr=0.5, rho=0.7, eps=1e-4,
                                                  weight_decay=0.1),
                     lambda ps: torch.optim.Adadelta(ps, lr=0.5, rho=0.7, eps=1e-4,
                                                     weight_decay=0.1),
                     lambda init, gs: _adadelta(init, gs, lr=0.5, rho=0.7, eps=1e-4,
                                                weight_decay=0.1),
                     {"square_avg": "square_avg", "acc_delta": "acc_delta"}),
    "sgd-steplr": (lambda ps: rp.optim.SGD(ps, lr=rp.optim.StepLR(0.1, 2, gamma=0.5)),
                   lambda ps: torch.optim.SGD(ps, lr=0.1),
                   lambda init, gs: _sgd_step_lr(init, gs, 0.1, 2, 0.5), {}),
    "sgd-defaults": (lambda ps: rp.optim.SGD(ps), lambda ps: torch.optim.SGD(ps),
                     lambda init, gs: _sgd_step_lr(init, gs, 1e-3, 1, 1.0), {}),
    "rmsprop-defaults": (lambda ps: rp.optim.RMSProp(ps), lambda ps: torch.optim.RMSprop(ps),
                         _rmsprop, {"ms": "square_avg"}),
    "rmsprop-momentum-steplr": (
        lambda ps: rp.optim.RMSProp(ps, lr=rp.optim.StepLR(0.1, 2, gamma=0.3), decay=0.9,
                                    momentum=0.9),
        lambda ps: torch.optim.RMSprop(ps, lr=0.1, alpha=0.9, momentum=0.9),
        lambda init, gs: _rmsprop(init, gs, alpha=0.9, momentum=0.9,
                                  lr_at=lambda t: 0.1 * 0.3 ** ((t - 1) // 2)),
        {"ms": "square_avg", "mom": "momentum_buffer"}),
}
SCHEDULERS = {"sgd-steplr": lambda opt: T.StepLR(opt, 2, gamma=0.5),
              "rmsprop-momentum-steplr": lambda opt: T.StepLR(opt, 2, gamma=0.3)}


def _data(dtype=np.float64):
    rng = np.random.default_rng(0)
    init = [rng.normal(size=s).astype(dtype) for s in SHAPES]
    grads = [[rng.normal(size=s).astype(dtype) for s in SHAPES] for _ in range(STEPS)]
    return init, grads


def _ours(name, mode):
    """Our optimiser over ``_data``: the parameters after every update, and its state."""
    init, grads = _data()
    params = [rp.Variable(v, name=f"p{i}") for i, v in enumerate(init)]
    opt = OPTIMIZERS[name][0](params)
    step = rp.function(lambda gs: opt.apply(gs) or rnp.zeros(()), mode=mode)
    after = []
    for gs in grads:
        step(gs)
        after.append([p.numpy() for p in params])
    if mode == "graph":
        assert step.trace_count == 1
    variables = opt.variables()
    slots = OPTIMIZERS[name][3]
    assert set(variables) == {"step"} | {f"{s}/{i}" for s in slots for i in range(len(SHAPES))}
    return after, {s: [variables[f"{s}/{i}"].numpy() for i in range(len(SHAPES))]
                   for s in slots}


def _close(got, want, what):
    for i, (g, w) in enumerate(zip(got, want, strict=True)):
        np.testing.assert_allclose(g, w, rtol=1e-12, atol=1e-15, err_msg=f"{what} p{i}")


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("name", list(OPTIMIZERS))
def test_optimizer_follows_the_textbook_formulas(name, mode):
    after, state = _ours(name, mode)
    init, grads = _data()
    reference = list(OPTIMIZERS[name][2](init, grads))
    assert len(reference) == STEPS
    for t, (got, (want, _)) in enumerate(zip(after, reference), start=1):
        _close(got, want, f"{name} after update {t} ({mode})")
    for slot, want in reference[-1][1].items():
        _close(state[slot], want, f"{name} slot {slot} ({mode})")


@needs_torch
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("name", list(OPTIMIZERS))
def test_optimizer_matches_torch(name, mode):
    after, state = _ours(name, mode)
    init, grads = _data()
    tparams = [torch.tensor(v, requires_grad=True) for v in init]
    topt = OPTIMIZERS[name][1](tparams)
    sched = SCHEDULERS[name](topt) if name in SCHEDULERS else None
    for t, gs in enumerate(grads, start=1):
        for p, g in zip(tparams, gs):
            p.grad = torch.tensor(g)
        topt.step()
        if sched is not None:
            sched.step()
        _close(after[t - 1], [p.detach().numpy() for p in tparams],
               f"{name} after update {t} ({mode})")
    for slot, key in OPTIMIZERS[name][3].items():
        _close(state[slot], [topt.state[p][key].numpy() for p in tparams], f"{name} {slot}")


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
SCHEDULES = {  # ours; torch's (on an SGD with lr=0.1); the closed form after n = t - 1 updates
    "step": (lambda: rp.optim.StepLR(0.1, 3, gamma=0.5), lambda o: T.StepLR(o, 3, gamma=0.5),
             lambda n: 0.1 * 0.5 ** (n // 3)),
    "multistep": (lambda: rp.optim.MultiStepLR(0.1, [2, 5, 5], gamma=0.3),
                  lambda o: T.MultiStepLR(o, [2, 5, 5], gamma=0.3),
                  lambda n: 0.1 * 0.3 ** sum(n >= m for m in (2, 5, 5))),  # (5 twice: γ²)
    "exponential": (lambda: rp.optim.ExponentialLR(0.1, 0.9), lambda o: T.ExponentialLR(o, 0.9),
                    lambda n: 0.1 * 0.9 ** n),
    "cosine": (lambda: rp.optim.CosineAnnealingLR(0.1, 6, eta_min=0.01),
               lambda o: T.CosineAnnealingLR(o, 6, eta_min=0.01),
               lambda n: 0.01 + (0.1 - 0.01) * (1 + math.cos(math.pi * n / 6)) / 2),
    "linear-warmup": (lambda: rp.optim.LinearLR(0.1, 0.25, 1.0, total_iters=4),
                      lambda o: T.LinearLR(o, 0.25, 1.0, total_iters=4),
                      lambda n: 0.1 * (0.25 + (1.0 - 0.25) * min(n, 4) / 4)),
    "linear-decay": (lambda: rp.optim.LinearLR(0.1, 1.0, 0.1, total_iters=5),
                     lambda o: T.LinearLR(o, 1.0, 0.1, total_iters=5),
                     lambda n: 0.1 * (1.0 + (0.1 - 1.0) * min(n, 5) / 5)),
}
UPDATES = 14


def _torch_rates(make, updates, base=0.1):
    opt = torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=base)
    sched, rates = make(opt), []
    for _ in range(updates):
        rates.append(opt.param_groups[0]["lr"])  # the rate this update uses
        opt.step()
        sched.step()
    return rates


def _check_schedule(name, mode, want):
    """``want[t - 1]``: the rate of update t, read from the schedule and seen in an SGD step."""
    s = SCHEDULES[name][0]()
    f = rp.function(lambda t: s(t), mode=mode)
    got = [float(f(np.int64(t))) for t in range(1, UPDATES + 1)]  # update t reads schedule(t)
    np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-15)
    # through an optimiser: update t used want[t - 1] (gradient 1: the step is the rate)
    w = rp.Variable(np.zeros(()), name="w")
    opt = rp.optim.SGD([w], lr=SCHEDULES[name][0]())
    step = rp.function(lambda: opt.apply([np.float64(1.0)]) or rnp.zeros(()), mode=mode)
    seen = []
    for _ in range(UPDATES):
        assert opt.learning_rate == pytest.approx(want[len(seen)], rel=1e-12)
        before = float(w.numpy())
        step()
        seen.append(before - float(w.numpy()))
    np.testing.assert_allclose(seen, want, rtol=1e-9)
    if mode == "graph":
        assert step.trace_count == 1


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("name", list(SCHEDULES))
def test_schedule_follows_its_closed_form(name, mode):
    _check_schedule(name, mode, [SCHEDULES[name][2](n) for n in range(UPDATES)])


def test_the_closed_forms_at_a_few_updates():
    """The references themselves, by hand (update t: n = t - 1 updates before it)."""
    at = {name: [SCHEDULES[name][2](n) for n in (0, 2, 3, 5, 6, 12)] for name in SCHEDULES}
    np.testing.assert_allclose(at["step"], [0.1, 0.1, 0.05, 0.05, 0.025, 0.00625])
    np.testing.assert_allclose(at["multistep"], [0.1, 0.03, 0.03, 0.0027, 0.0027, 0.0027])
    np.testing.assert_allclose(at["exponential"], [0.1, 0.081, 0.0729, 0.059049, 0.0531441,
                                                   0.1 * 0.9 ** 12])
    np.testing.assert_allclose(at["cosine"], [0.1, 0.0775, 0.055,
                                              0.01 + 0.045 * (1 - math.sqrt(3) / 2), 0.01, 0.1])
    np.testing.assert_allclose(at["linear-warmup"], [0.025, 0.0625, 0.08125, 0.1, 0.1, 0.1])
    np.testing.assert_allclose(at["linear-decay"], [0.1, 0.064, 0.046, 0.01, 0.01, 0.01])


@needs_torch
@pytest.mark.parametrize("name", list(SCHEDULES))
def test_schedule_matches_torch_scheduler(name):
    want = _torch_rates(SCHEDULES[name][1], UPDATES)
    np.testing.assert_allclose(want, [SCHEDULES[name][2](n) for n in range(UPDATES)],
                               rtol=1e-12, atol=1e-15)  # PyTorch's recursive form = ours
    _check_schedule(name, "graph", want)


def test_a_warmup_over_a_cosine_multiplies_them():
    s = rp.optim.LinearLR(rp.optim.CosineAnnealingLR(1.0, 10), 0.1, 1.0, total_iters=3)
    for t in range(1, 12):
        n = t - 1
        want = (0.1 + 0.9 * min(n, 3) / 3) * (1 + np.cos(np.pi * n / 10)) / 2
        assert float(s(rnp.asarray(t))) == pytest.approx(want, rel=1e-12)


PLATEAU = [dict(), dict(mode="max"), dict(mode="max", threshold=0.1),
           dict(threshold_mode="abs", threshold=0.05),
           dict(patience=1, cooldown=2, factor=0.5, min_lr=0.004), dict(patience=0, factor=0.2)]
METRICS = [1.0, 0.9, 0.95, 0.95, 0.91, 0.9, 0.9, 0.89, 0.9, 0.92, 0.93, 0.7, 0.8, 0.8, 0.8, 0.8,
           0.8, 0.8, 0.8, 0.8, 0.8, 0.8, 0.8, 0.8, 0.8]


def _plateau_rates(metrics, lr=0.1, mode="min", factor=0.1, patience=10, threshold=1e-4,
                   threshold_mode="rel", cooldown=0, min_lr=0.0, eps=1e-8):
    """The rule as PyTorch's documentation states it: a metric better than the best by more
    than the threshold (``rel``: below best·(1 - threshold), or above best·(1 + threshold) in
    ``max`` mode; ``abs``: best ∓ threshold) resets the count of bad evaluations; more than
    ``patience`` of them: lr ← max(lr·factor, min_lr) (unless that changes it by no more than
    eps), then ``cooldown`` evaluations are not counted."""
    best, bad, cooling, rates = math.inf if mode == "min" else -math.inf, 0, 0, []
    for m in metrics:
        if threshold_mode == "rel":
            better = m < best * (1 - threshold) if mode == "min" else m > best * (1 + threshold)
        else:
            better = m < best - threshold if mode == "min" else m > best + threshold
        if better:
            best, bad = m, 0
        else:
            bad += 1
        if cooling:
            cooling, bad = cooling - 1, 0
        if bad > patience:
            if lr - max(lr * factor, min_lr) > eps:
                lr = max(lr * factor, min_lr)
            cooling, bad = cooldown, 0
        rates.append(lr)
    return rates


def test_the_plateau_reference_by_hand():
    """Patience 2: the third bad evaluation in a row lowers the rate tenfold."""
    want = [0.1] * 4 + [1e-2] * 6 + [1e-3] * 4 + [1e-4] * 3 + [1e-5] * 3 + [1e-6] * 3 + [1e-7] * 2
    np.testing.assert_allclose(_plateau_rates(METRICS, patience=2), want, rtol=1e-12)
    assert _plateau_rates([3.0, 3.0, 3.0, 2.0], lr=1.0, patience=0, factor=0.5) == \
        [1.0, 0.5, 0.25, 0.25]
    assert _plateau_rates([1.0, 1.0, 1.0], lr=0.01, factor=0.5, patience=0, min_lr=0.008) == \
        [0.01, 0.008, 0.008]


@pytest.mark.parametrize("kwargs", PLATEAU, ids=str)
def test_reduce_on_plateau_follows_its_rule(kwargs):
    kw = {"patience": 2, **kwargs}
    plateau = rp.optim.ReduceLROnPlateau(0.1, **kw)
    want = _plateau_rates(METRICS, **kw)
    for metric, rate in zip(METRICS, want, strict=True):
        assert plateau.step(metric) == pytest.approx(rate, rel=1e-12)
        assert float(plateau(rnp.asarray(1))) == pytest.approx(rate, rel=1e-12)
    assert want[-1] < 0.1  # (the metrics reach a plateau in every case)


@needs_torch
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
