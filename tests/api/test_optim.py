"""Optimisers, gradient clipping and learning-rate schedules against NumPy references.

Every optimiser runs several steps in graph mode (one trace, replayed: its state must live in
variables) and in eager mode and must match a NumPy implementation written here; the optimiser's
state (``opt.variables()``) must match the reference's slots too.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

import replicate as rp
import replicate.numpy as rnp

MODES = ["graph", "eager"]
SHAPES = [(3, 2), (4,), ()]
STEPS = 6


# ================================================================================================
# NumPy references: each returns (new params, new state) from (params, grads, state, step t)
# ================================================================================================
class SGDRef:
    def __init__(self, lr, momentum=0.0, nesterov=False, weight_decay=0.0):
        self.lr, self.momentum, self.nesterov, self.wd = lr, momentum, nesterov, weight_decay

    def init(self, params):
        return {"velocity": [np.zeros_like(p) for p in params]} if self.momentum else {}

    def step(self, params, grads, state, t):
        lr = self.lr(t) if callable(self.lr) else self.lr
        out = []
        for i, (p, g) in enumerate(zip(params, grads)):
            g = g + self.wd * p
            if self.momentum:
                v = self.momentum * state["velocity"][i] + g
                state["velocity"][i] = v
                g = g + self.momentum * v if self.nesterov else v
            out.append(p - lr * g)
        return out


class AdamRef:
    def __init__(self, lr, b1=0.9, b2=0.999, eps=1e-8, weight_decay=0.0, decoupled=False):
        self.lr, self.b1, self.b2, self.eps = lr, b1, b2, eps
        self.wd, self.decoupled = weight_decay, decoupled

    def init(self, params):
        return {"m": [np.zeros_like(p) for p in params], "v": [np.zeros_like(p) for p in params]}

    def step(self, params, grads, state, t):
        lr = self.lr(t) if callable(self.lr) else self.lr
        out = []
        for i, (p, g) in enumerate(zip(params, grads)):
            if not self.decoupled:
                g = g + self.wd * p
            m = self.b1 * state["m"][i] + (1 - self.b1) * g
            v = self.b2 * state["v"][i] + (1 - self.b2) * g * g
            state["m"][i], state["v"][i] = m, v
            m_hat = m / (1 - self.b1 ** t)
            v_hat = v / (1 - self.b2 ** t)
            new = p - lr * m_hat / (np.sqrt(v_hat) + self.eps)
            if self.decoupled:
                new = new - lr * self.wd * p
            out.append(new)
        return out


class RMSPropRef:
    def __init__(self, lr, decay=0.99, eps=1e-8, momentum=0.0):
        self.lr, self.decay, self.eps, self.momentum = lr, decay, eps, momentum

    def init(self, params):
        state = {"ms": [np.zeros_like(p) for p in params]}
        if self.momentum:
            state["mom"] = [np.zeros_like(p) for p in params]
        return state

    def step(self, params, grads, state, t):
        out = []
        for i, (p, g) in enumerate(zip(params, grads)):
            ms = self.decay * state["ms"][i] + (1 - self.decay) * g * g
            state["ms"][i] = ms
            delta = g / (np.sqrt(ms) + self.eps)
            if self.momentum:
                delta = self.momentum * state["mom"][i] + delta
                state["mom"][i] = delta
            out.append(p - self.lr * delta)
        return out


OPTIMIZERS = {
    "sgd": (lambda ps: rp.optim.SGD(ps, lr=0.1), SGDRef(0.1)),
    "sgd-momentum": (lambda ps: rp.optim.SGD(ps, lr=0.1, momentum=0.9), SGDRef(0.1, 0.9)),
    "sgd-nesterov": (lambda ps: rp.optim.SGD(ps, lr=0.05, momentum=0.8, nesterov=True),
                     SGDRef(0.05, 0.8, nesterov=True)),
    "sgd-weight-decay": (lambda ps: rp.optim.SGD(ps, lr=0.1, weight_decay=0.01),
                         SGDRef(0.1, weight_decay=0.01)),
    "sgd-momentum-weight-decay": (
        lambda ps: rp.optim.SGD(ps, lr=0.1, momentum=0.5, nesterov=True, weight_decay=0.1),
        SGDRef(0.1, 0.5, nesterov=True, weight_decay=0.1)),
    "adam": (lambda ps: rp.optim.Adam(ps, lr=0.01), AdamRef(0.01)),
    "adam-betas": (lambda ps: rp.optim.Adam(ps, lr=0.02, b1=0.5, b2=0.9, eps=1e-6),
                   AdamRef(0.02, 0.5, 0.9, 1e-6)),
    "adam-l2": (lambda ps: rp.optim.Adam(ps, lr=0.01, weight_decay=0.1),
                AdamRef(0.01, weight_decay=0.1)),
    "adamw": (lambda ps: rp.optim.AdamW(ps, lr=0.01, weight_decay=0.1),
              AdamRef(0.01, weight_decay=0.1, decoupled=True)),
    "adamw-default-decay": (lambda ps: rp.optim.AdamW(ps, lr=0.01),
                            AdamRef(0.01, weight_decay=1e-2, decoupled=True)),
    "adam-decoupled-flag": (lambda ps: rp.optim.Adam(ps, lr=0.01, weight_decay=0.05,
                                                     decoupled_weight_decay=True),
                            AdamRef(0.01, weight_decay=0.05, decoupled=True)),
    "rmsprop": (lambda ps: rp.optim.RMSProp(ps, lr=0.01), RMSPropRef(0.01)),
    "rmsprop-momentum": (lambda ps: rp.optim.RMSProp(ps, lr=0.01, decay=0.8, momentum=0.9),
                         RMSPropRef(0.01, 0.8, momentum=0.9)),
    "adam-warmup-cosine": (
        lambda ps: rp.optim.Adam(ps, lr=rp.optim.warmup_cosine(0.05, 2, 5, final_lr=0.001)),
        AdamRef(lambda t: 0.001 + 0.5 * 0.049 * (1 + math.cos(math.pi * min(max(t - 2, 0) / 3,
                                                                             1)))
                if t >= 2 else 0.05 * t / 2)),
    "sgd-step-decay": (lambda ps: rp.optim.SGD(ps, lr=rp.optim.step_decay(0.1, [2, 4], 0.5)),
                       SGDRef(lambda t: 0.1 * 0.5 ** ((t >= 2) + (t >= 4)))),
}

# which reference slots correspond to which optimiser attribute
SLOT_NAMES = {"velocity": "velocity", "m": "m", "v": "v", "ms": "ms", "mom": "mom"}


def _initial(seed=0, dtype=np.float64):
    rng = np.random.default_rng(seed)
    return [rng.normal(size=s).astype(dtype) for s in SHAPES]


def _grads(seed=1, dtype=np.float64):
    rng = np.random.default_rng(seed)
    return [[rng.normal(size=s).astype(dtype) for s in SHAPES] for _ in range(STEPS)]


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("name", list(OPTIMIZERS))
def test_optimizer_matches_numpy(name, mode):
    make, ref = OPTIMIZERS[name]
    init = _initial()
    params = {f"p{i}": rp.Variable(v, name=f"p{i}") for i, v in enumerate(init)}
    opt = make(params)
    step = rp.function(lambda gs: opt.apply(gs) or rnp.zeros(()), mode=mode)

    want = [p.copy() for p in init]
    state = ref.init(want)
    for t, gs in enumerate(_grads(), start=1):
        step({f"p{i}": g for i, g in enumerate(gs)})
        want = ref.step(want, gs, state, t)
        for i, w in enumerate(want):
            got = params[f"p{i}"].numpy()
            assert got.dtype == np.float64 and got.shape == SHAPES[i]
            np.testing.assert_allclose(got, w, rtol=1e-12, atol=1e-14,
                                       err_msg=f"{name} p{i} after step {t} ({mode})")
    if mode == "graph":
        assert step.trace_count == 1  # state is threaded through variables, not retraced
    # the optimiser's state is in its variables, by name, and equals the reference's slots
    variables = opt.variables()
    assert int(variables["step"].numpy()) == STEPS
    expected_keys = {"step"} | {f"{slot}/{i}" for slot in state for i in range(len(SHAPES))}
    assert set(variables) == expected_keys
    for slot, values in state.items():
        for i, v in enumerate(values):
            np.testing.assert_allclose(variables[f"{SLOT_NAMES[slot]}/{i}"].numpy(), v,
                                       rtol=1e-12, atol=1e-14, err_msg=f"{name} {slot}/{i}")


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("name", ["sgd-momentum", "adamw", "rmsprop-momentum"])
def test_optimizer_float32_parameters(name, mode):
    """float32 parameters stay float32 (and match a float32-rounded reference closely)."""
    make, ref = OPTIMIZERS[name]
    init = _initial(dtype=np.float32)
    params = [rp.Variable(v) for v in init]
    opt = make(params)
    step = rp.function(lambda gs: opt.apply(gs) or rnp.zeros(()), mode=mode)
    want = [p.astype(np.float64) for p in init]
    state = ref.init(want)
    for t, gs in enumerate(_grads(dtype=np.float32), start=1):
        step(gs)
        want = ref.step(want, [g.astype(np.float64) for g in gs], state, t)
    for p, w in zip(params, want):
        assert p.dtype == np.float32
        np.testing.assert_allclose(p.numpy(), w, rtol=1e-4, atol=1e-5)
    for var in opt.variables().values():
        assert var.dtype in (np.float32, np.int64)


@pytest.mark.parametrize("mode", MODES)
def test_training_loop_with_autodiff(mode):
    """A regression trained with Adam on rp.grad gradients equals the NumPy loop with the
    analytic gradient."""
    rng = np.random.default_rng(3)
    x, y = rng.normal(size=(16, 3)), rng.normal(size=(16, 2))
    w0, b0 = rng.normal(size=(3, 2)), np.zeros(2)
    w, b = rp.Variable(w0, name="w"), rp.Variable(b0, name="b")
    opt = rp.optim.Adam({"w": w, "b": b}, lr=0.05)

    def step(x, y):
        loss = rnp.mean((x @ w + b - y) ** 2)
        opt.apply(rp.grad(loss, {"w": w, "b": b}))
        return loss

    f = rp.function(step, mode=mode)
    ref, params = AdamRef(0.05), [w0.copy(), b0.copy()]
    state = ref.init(params)
    for t in range(1, 6):
        loss = f(x, y)
        r = x @ params[0] + params[1] - y
        np.testing.assert_allclose(loss, np.mean(r ** 2), rtol=1e-12)
        grads = [x.T @ (2 * r / r.size), (2 * r / r.size).sum(0)]
        params = ref.step(params, [grads[0], grads[1]], state, t)
    np.testing.assert_allclose(w.numpy(), params[0], rtol=1e-10)
    np.testing.assert_allclose(b.numpy(), params[1], rtol=1e-10, atol=1e-14)


def test_optimizer_takes_a_module_and_checks_gradients():
    model = rp.nn.Linear(2, 2)
    opt = rp.optim.SGD(model, lr=0.1)
    assert len(opt.params) == 2
    with pytest.raises(rp.ReplicateError, match="gradients"):
        opt.apply([np.zeros((2, 2), np.float32)])
    with pytest.raises(rp.ReplicateError, match="shape"):
        opt.apply({"weight": np.zeros((2, 3), np.float32), "bias": np.zeros(2, np.float32)})
    with pytest.raises(rp.ReplicateError, match="nested differently"):  # (a list for a dict:
        opt.apply([np.zeros((2, 2), np.float32), np.zeros(2, np.float32)])  # by sorted keys)
    with pytest.raises(rp.ReplicateError, match="Variables"):
        rp.optim.SGD([np.zeros(2)])


# ================================================================================================
# Optimiser state lives in variables and in the traced graph
# ================================================================================================
def test_optimizer_state_is_traced_graph_state():
    w = rp.Variable(np.ones((2, 2)), name="w")
    b = rp.Variable(np.zeros(2), name="b")
    opt = rp.optim.Adam([w, b], lr=0.1)
    f = rp.function(lambda x: opt.apply(rp.grad(rnp.sum((x @ w + b) ** 2), [w, b])) or
                    rnp.zeros(()))
    x = np.ones((3, 2))
    graph = f.graph(x)
    slots = {id(v) for v in opt.variables().values()}
    traced = {id(v) for v in graph.meta["variables"]}
    assert slots <= traced, "optimiser slots and step counter must be graph inputs"
    assert slots <= {id(v) for v in graph.meta["updated"]}, "and graph outputs (written back)"
    names = graph.meta["input_names"]
    for var in opt.variables().values():
        assert var.name in names
    assert {"w.m", "w.v", "b.m", "b.v", "opt.step"} <= set(names)
    # the graph has one input per array argument and one per variable read
    assert len(graph.inputs) == 1 + len(traced)


def test_optimizer_state_in_the_replicated_graph():
    w = rp.Variable(np.ones(3), name="w")
    opt = rp.wrap_optimizer(rp.optim.SGD([w], lr=0.1, momentum=0.9))

    def input_fn(ctx):
        while True:
            yield np.full(3, ctx.replica_id + 1.0)

    def step_fn(x):
        opt.apply([x * w])
        return rnp.sum(w.read())

    rep = rp.Replicator(input_fn, step_fn, replicas_per_rank=2)
    rep.run(steps=3)
    graph = rep.compiled_graph()
    velocity = opt.variables()["velocity/0"]
    assert any(v is velocity for v in graph.meta["variables"])
    assert any(v is velocity for v in graph.meta["updated"])
    assert "w.velocity" in graph.meta["input_names"]
    # NumPy: mean gradient over the two replicas is 1.5 * w
    wv, v = np.ones(3), np.zeros(3)
    for _ in range(3):
        v = 0.9 * v + 1.5 * wv
        wv = wv - 0.1 * v
    np.testing.assert_allclose(w.numpy(), wv, rtol=1e-12)
    np.testing.assert_allclose(velocity.numpy(), v, rtol=1e-12)
    assert int(opt.variables()["step"].numpy()) == 3


# ================================================================================================
# Gradient clipping
# ================================================================================================
def _clip_ref(grads, max_norm):
    norm = np.sqrt(sum(float(np.sum(g * g)) for g in grads))
    scale = min(1.0, max_norm / (norm + 1e-12))
    return [g * scale for g in grads], norm


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("max_norm", [0.5, 2.0, 100.0])
def test_clip_by_global_norm(mode, max_norm):
    rng = np.random.default_rng(5)
    grads = {"a": rng.normal(size=(3, 2)), "b": [rng.normal(size=4), rng.normal(size=())]}
    flat = [grads["a"], grads["b"][0], grads["b"][1]]
    want, norm = _clip_ref(flat, max_norm)

    def f(g):
        return rp.optim.clip_by_global_norm(g, max_norm), rp.optim.global_norm(g)

    clipped, got_norm = rp.function(f, mode=mode)(grads)
    np.testing.assert_allclose(got_norm, norm, rtol=1e-12)
    got = [clipped["a"], clipped["b"][0], clipped["b"][1]]
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w, rtol=1e-12)
    new_norm = np.sqrt(sum(float(np.sum(np.square(g))) for g in got))
    assert new_norm <= max_norm * (1 + 1e-12)
    if max_norm > norm:
        for g, o in zip(got, flat):
            np.testing.assert_array_equal(g, o)


def test_clip_keeps_float32_and_zero_gradients():
    g = [np.zeros(3, np.float32), np.ones(2, np.float32) * 3]
    out = rp.function(lambda g: rp.optim.clip_by_global_norm(g, 1.0))(g)
    assert all(np.asarray(o).dtype == np.float32 for o in out)
    np.testing.assert_allclose(out[1], np.ones(2) / np.sqrt(2), rtol=1e-6)
    zero = rp.function(lambda g: rp.optim.clip_by_global_norm(g, 1.0))([np.zeros(3)])
    np.testing.assert_array_equal(zero[0], np.zeros(3))


@pytest.mark.parametrize("max_norm", [0.3, 50.0])
def test_wrap_optimizer_clips_the_global_gradient(max_norm):
    """With replicas, gradients are averaged first, then clipped by the norm of the average —
    the same on every replica, so one update."""
    k = 2
    rng = np.random.default_rng(7)
    grads = [[rng.normal(size=(2, 3)), rng.normal(size=3)] for _ in range(k)]
    w = rp.Variable(np.zeros((2, 3)), name="w")
    b = rp.Variable(np.zeros(3), name="b")
    opt = rp.wrap_optimizer(rp.optim.SGD([w, b], lr=1.0), max_grad_norm=max_norm)

    def input_fn(ctx):
        while True:
            yield grads[ctx.replica_id]

    def step_fn(g):
        opt.apply(g)
        return rp.optim.global_norm(g)

    rp.Replicator(input_fn, step_fn, replicas_per_rank=k).run(steps=1)
    mean = [(grads[0][i] + grads[1][i]) / 2 for i in range(2)]
    want, _ = _clip_ref(mean, max_norm)
    np.testing.assert_allclose(w.numpy(), -want[0], rtol=1e-12)
    np.testing.assert_allclose(b.numpy(), -want[1], rtol=1e-12)
    # the wrapper forwards attributes of the wrapped optimiser
    assert opt.variables()["step"].numpy() == 1 and opt.lr == 1.0


def test_clip_cross_replica_norm_sums_every_replicas_squares():
    k = 2
    rng = np.random.default_rng(8)
    grads = [rng.normal(size=4) * (r + 1) for r in range(k)]

    def input_fn(ctx):
        while True:
            yield grads[ctx.replica_id]

    def step_fn(g):
        return {"clipped": rp.optim.clip_by_global_norm(g, 1.0, cross_replica=True)}

    out = rp.Replicator(input_fn, step_fn, replicas_per_rank=k,
                        outputs="per_replica").run(steps=1)[0]["clipped"]
    norm = np.sqrt(sum(float(np.sum(g * g)) for g in grads))
    for r in range(k):
        np.testing.assert_allclose(out[r], grads[r] / norm, rtol=1e-12)


# ================================================================================================
# Learning-rate schedules
# ================================================================================================
def _warmup_cosine_ref(t, base, warmup, total, final):
    if t < warmup:
        return base * t / max(warmup, 1)
    progress = min(max((t - warmup) / max(total - warmup, 1), 0.0), 1.0)
    return final + 0.5 * (base - final) * (1 + math.cos(math.pi * progress))


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("base,warmup,total,final", [(1.0, 10, 110, 0.0), (3e-4, 5, 50, 1e-5),
                                                     (0.1, 0, 20, 0.01)])
def test_warmup_cosine(mode, base, warmup, total, final):
    schedule = rp.optim.warmup_cosine(base, warmup, total, final_lr=final)
    f = rp.function(schedule, mode=mode)
    for t in list(range(0, total + 5)) + [10 * total]:
        got = float(np.asarray(f(np.asarray(t, np.int64))))
        np.testing.assert_allclose(got, _warmup_cosine_ref(t, base, warmup, total, final),
                                   rtol=1e-12, atol=1e-15, err_msg=f"step {t}")
    # landmarks: 0 at step 0 (with warm-up), base at the end of warm-up, final at the end
    assert float(np.asarray(f(np.asarray(warmup, np.int64)))) == pytest.approx(base)
    assert float(np.asarray(f(np.asarray(total, np.int64)))) == pytest.approx(final, abs=1e-15)
    if mode == "graph":
        assert f.trace_count == 1


@pytest.mark.parametrize("mode", MODES)
def test_step_decay(mode):
    f = rp.function(rp.optim.step_decay(0.5, [3, 7, 10], factor=0.1), mode=mode)
    for t in range(0, 14):
        want = 0.5 * 0.1 ** sum(t >= b for b in (3, 7, 10))
        np.testing.assert_allclose(float(np.asarray(f(np.asarray(t, np.int64)))), want,
                                   rtol=1e-12)
    g = rp.function(rp.optim.step_decay(1.0, []), mode=mode)
    assert float(np.asarray(g(np.asarray(5, np.int64)))) == 1.0


def test_schedule_is_evaluated_at_the_step_count_from_one():
    seen = []
    w = rp.Variable(np.zeros(1), name="w")

    def lr(step):
        seen.append(step)
        return rnp.cast(step, np.float64)

    opt = rp.optim.SGD([w], lr=lr)
    for _ in range(3):
        opt.apply([np.ones(1)])  # eager: lr = 1, 2, 3
    np.testing.assert_allclose(w.numpy(), [-6.0])
    assert [int(s) for s in seen] == [1, 2, 3]


# ================================================================================================
# Two optimisers in one step (generator / discriminator), graph + replicas vs eager
# ================================================================================================
def _gan_models(seed=0):
    rng = np.random.default_rng(seed)
    gen = rp.nn.Sequential(rp.nn.Linear(3, 4, rng=rng, dtype=np.float64), rp.nn.tanh,
                           rp.nn.Linear(4, 2, rng=rng, dtype=np.float64))
    disc = rp.nn.Sequential(rp.nn.Linear(2, 4, rng=rng, dtype=np.float64), rp.nn.leaky_relu,
                            rp.nn.Linear(4, 1, rng=rng, dtype=np.float64))
    return gen, disc


def _gan_losses(gen, disc, real, z):
    bce = rp.nn.sigmoid_binary_cross_entropy
    fake = rnp.stop_gradient(gen(z))
    d_loss = bce(disc(real), 1.0).mean() + bce(disc(fake), 0.0).mean()
    return d_loss


def _gan_data(k, steps, B=5):
    rng = np.random.default_rng(11)
    return [[(rng.normal(size=(B, 2)) + 1.0, rng.normal(size=(B, 3)), rng.normal(size=(B, 3)))
             for _ in range(k)] for _ in range(steps)]


def test_two_optimizers_in_one_step_graph_replicas_match_eager():
    k, steps = 2, 3
    data = _gan_data(k, steps)
    bce = rp.nn.sigmoid_binary_cross_entropy

    # graph mode, 2 replicas in one process
    gen, disc = _gan_models()
    g_opt = rp.wrap_optimizer(rp.optim.Adam(gen.parameters(), lr=0.01, b1=0.5, b2=0.9))
    d_opt = rp.wrap_optimizer(rp.optim.SGD(disc.parameters(), lr=0.05, momentum=0.9))

    def input_fn(ctx):
        for step in data:
            yield step[ctx.replica_id]

    def step_fn(batch):
        real, z_d, z_g = batch
        d_loss = _gan_losses(gen, disc, real, z_d)
        d_opt.apply(rp.grad(d_loss, disc.parameters()))
        g_loss = bce(disc(gen(z_g)), 1.0).mean()  # uses the just-updated discriminator
        g_opt.apply(rp.grad(g_loss, gen.parameters()))
        return {"d_loss": d_loss, "g_loss": g_loss}

    rep = rp.Replicator(input_fn, step_fn, replicas_per_rank=k, outputs="per_replica")
    hist = rep.run(steps=steps)
    assert len(hist) == steps and rep.trace_count == 1

    # the same computation eagerly: per-replica gradients averaged by hand, then the updates
    gen2, disc2 = _gan_models()
    g_opt2 = rp.optim.Adam(gen2.parameters(), lr=0.01, b1=0.5, b2=0.9)
    d_opt2 = rp.optim.SGD(disc2.parameters(), lr=0.05, momentum=0.9)
    for s, step in enumerate(data):
        d_losses, d_grads = [], []
        for real, z_d, _ in step:
            loss = _gan_losses(gen2, disc2, rnp.asarray(real), rnp.asarray(z_d))
            d_losses.append(float(loss))
            d_grads.append(rp.grad(loss, disc2.parameters()))
        d_opt2.apply({n: sum(g[n] for g in d_grads) / k for n in d_grads[0]})
        g_losses, g_grads = [], []
        for _, _, z_g in step:
            loss = bce(disc2(gen2(rnp.asarray(z_g))), 1.0).mean()
            g_losses.append(float(loss))
            g_grads.append(rp.grad(loss, gen2.parameters()))
        g_opt2.apply({n: sum(g[n] for g in g_grads) / k for n in g_grads[0]})
        np.testing.assert_allclose(hist[s]["d_loss"], d_losses, rtol=1e-10)
        np.testing.assert_allclose(hist[s]["g_loss"], g_losses, rtol=1e-10)

    for (name, a), b in zip(gen.variables().items(), gen2.variables().values()):
        np.testing.assert_allclose(a.numpy(), b.numpy(), rtol=1e-9, atol=1e-12, err_msg=name)
    for (name, a), b in zip(disc.variables().items(), disc2.variables().values()):
        np.testing.assert_allclose(a.numpy(), b.numpy(), rtol=1e-9, atol=1e-12, err_msg=name)
    for opt_a, opt_b in ((g_opt, g_opt2), (d_opt, d_opt2)):
        va, vb = opt_a.variables(), opt_b.variables()
        assert set(va) == set(vb)
        for key in va:
            np.testing.assert_allclose(va[key].numpy(), vb[key].numpy(), rtol=1e-9, atol=1e-12,
                                       err_msg=key)
    # the two optimisers keep separate state and separate step counters
    assert int(g_opt.variables()["step"].numpy()) == steps
    assert int(d_opt.variables()["step"].numpy()) == steps
    assert g_opt.variables()["step"] is not d_opt.variables()["step"]


def test_learning_rate_reads_the_current_value_of_a_schedule():
    """``opt.learning_rate``: the rate the next update uses, on plain and wrapped optimisers."""
    w = rp.Variable(np.zeros(2))
    opt = rp.wrap_optimizer(rp.optim.SGD([w], lr=rp.optim.warmup_cosine(1.0, 10, 110)))
    assert opt.learning_rate == pytest.approx(0.1)
    for _ in range(9):
        opt.apply([np.ones(2)])
    assert opt.learning_rate == pytest.approx(1.0)
    assert rp.optim.Adam([w], lr=3e-4).learning_rate == 3e-4


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("name", list(OPTIMIZERS))
def test_eager_updates_equal_the_compiled_ones_bitwise(name, dtype, tmp_path):
    """Eager mode runs the built-in updates on NumPy arrays (``Optimizer.eager_numpy``): the
    parameters, slots and master weights after three steps are the graph step's to the bit,
    and the eager update runs few ops one by one (the profiler records each eager op): no
    tape, no per-op dispatch for the update itself."""
    make, _ = OPTIMIZERS[name]
    dt = rp.dtypes.bfloat16 if dtype == "bfloat16" else np.float32
    results = {}
    for mode in ("eager", "graph"):
        params = [rp.Variable(v.astype(dt)) for v in _initial()]
        opt = make(params)
        step = rp.function(lambda gs: opt.apply(gs) or rnp.zeros(()), mode=mode)
        path = str(tmp_path / f"{mode}.json")
        with rp.profile.recording(path):
            for gs in _grads(dtype=np.float32):
                step([g.astype(dt) for g in gs])
        if mode == "eager":  # (a schedule's own ops, the zeros returned: a few per step)
            ops = [e["name"] for e in rp.profile.load(path) if e.get("cat") == "compute"]
            assert len(ops) <= 20 * STEPS, (name, len(ops), ops[:30])
        results[mode] = {k: v.numpy() for k, v in opt.variables().items()}
        results[mode].update({f"param/{i}": p.numpy() for i, p in enumerate(params)})
    for key, want in results["graph"].items():
        got = results["eager"][key]
        assert got.dtype == want.dtype, key
        np.testing.assert_array_equal(np.atleast_1d(got).view(np.uint8),
                                      np.atleast_1d(want).view(np.uint8),
                                      err_msg=f"{name} {dtype} {key}")
