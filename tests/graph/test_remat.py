"""``rp.remat`` (issue 33, rematerialisation): gradients equal to the plain step's (bitwise on
NumPy, eager and graph; close on JAX), grad-of-grad, Variables read and written inside the region,
``Replicator`` steps; the memory plan holds less by at least the activations computed again, and
CSE does not merge the recomputation back into the forward."""

from __future__ import annotations

import gc
import importlib
import weakref

import numpy as np
import pytest

import replicate as rp
import replicate.numpy as rnp

remat_module = importlib.import_module("replicate.remat")  # (rp.remat is the function)

D = 8


class Block(rp.nn.Module):
    def __init__(self, dropout=0.0, norm="layer"):
        super().__init__()
        self.norm = rp.nn.LayerNorm(D) if norm == "layer" else rp.nn.BatchNorm(D)
        self.fc, self.fc2 = rp.nn.Linear(D, 4 * D), rp.nn.Linear(4 * D, D)
        self.drop = rp.nn.Dropout(dropout, seed=7)

    def forward(self, x):  # (one Dropout twice: its key is read, written, read again)
        return x + self.drop(self.fc2(self.drop(rp.nn.gelu(self.fc(self.norm(x))))))


class Net(rp.nn.Module):
    """Three residual blocks and a head; ``remat``: each block under ``rp.remat``."""

    def __init__(self, remat, **block):
        super().__init__()
        self.blocks = rp.nn.ModuleList([Block(**block) for _ in range(3)])
        self.head = rp.nn.Linear(D, 1)
        self.remat = remat
        rng = np.random.default_rng(0)  # the same parameters with and without remat
        for _, var in sorted(self.parameters().items()):
            var.load(rng.standard_normal(var.shape) * 0.3)

    def forward(self, x):
        for block in self.blocks:
            x = (rp.remat(block) if self.remat else block)(x)
        return self.head(x)


def data(n=6):
    rng = np.random.default_rng(1)
    return rng.standard_normal((n, D)), rng.standard_normal((n, 1))


def train(remat, mode="graph", backend="numpy", steps=2, **block):
    """Two Adam steps: each step's loss and gradients, and the parameters after them."""
    net = Net(remat, **block)
    opt = rp.optim.Adam(net.parameters(), lr=1e-2)

    def step(x, y):
        loss = rnp.mean((net(x) - y) ** 2)
        grads = rp.grad(loss, net.parameters())
        opt.apply(grads)
        return loss, grads

    f = rp.function(step, mode=mode, backend=backend)
    x, y = data()
    outs = [f(x, y) for _ in range(steps)]
    state = {k: v.numpy() for k, v in {**net.parameters(), **net.buffers()}.items()}
    return [(np.asarray(loss), {k: np.asarray(g) for k, g in grads.items()})
            for loss, grads in outs], state


def assert_same(a, b, exact=True):
    check = (lambda u, v: np.testing.assert_array_equal(u, v)) if exact else (
        lambda u, v: np.testing.assert_allclose(u, v, rtol=1e-6, atol=1e-9))
    (outs_a, state_a), (outs_b, state_b) = a, b
    for (loss_a, grads_a), (loss_b, grads_b) in zip(outs_a, outs_b):
        check(loss_a, loss_b)
        for k in grads_a:
            check(grads_a[k], grads_b[k])
    for k in state_a:
        check(state_a[k], state_b[k])


@pytest.mark.parametrize("mode,backend", [("eager", "numpy"), ("graph", "numpy"),
                                          ("graph", "jax")])
@pytest.mark.parametrize("block", [{}, {"dropout": 0.25}, {"norm": "batch"}],
                         ids=["plain", "dropout", "batchnorm"])
def test_gradients_equal_the_plain_step(mode, backend, block):
    """Bitwise on NumPy, eager and graph. Dropout: the recomputation draws the forward's mask
    (the key Variable read again gives what it gave); BatchNorm: its running statistics are
    updated once (the recomputation's assigns are not made)."""
    if backend == "jax":
        pytest.importorskip("jax")
    assert_same(train(True, mode, backend, **block), train(False, mode, backend, **block),
                exact=backend == "numpy")


def test_a_decorated_method_and_several_outputs():
    class Twice(rp.nn.Module):
        def __init__(self):
            super().__init__()
            self.w = rp.Variable(np.linspace(-1.0, 1.0, D), name="w")

        @rp.remat
        def forward(self, x, scale=2.0):
            h = rnp.tanh(x * self.w)
            return {"a": h * scale, "b": rnp.sin(h)}

    m = Twice()

    def step(x):
        out = m(x)
        loss = rnp.sum(out["a"] * out["b"]) + rnp.sum(out["b"])
        return rp.grad(loss, [m.w, x])

    x = data()[0]
    with_remat = rp.function(step)(x)
    plain = Twice.forward.__wrapped__
    Twice.forward = plain  # the same module, without rp.remat
    for got, want in zip(with_remat, rp.function(step)(x)):
        np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("mode", ["eager", "graph"])
def test_grad_of_grad(mode):
    def f(x, c):
        return rnp.sum(rnp.tanh(x * c) ** 3)

    def second(x, c):
        x = rnp.asarray(x)
        g = rp.grad(rp.remat(f)(x, c), x)
        want = rp.grad(f(x, c), x)
        return rp.grad(rnp.sum(g * g), x), rp.grad(rnp.sum(want * want), x)

    x, c = np.linspace(-1.0, 1.5, 5), np.float64(0.7)
    got, want = (second if mode == "eager" else rp.function(second))(x, c)
    np.testing.assert_array_equal(np.asarray(got), np.asarray(want))


def test_a_closed_over_value_gets_its_gradient():
    """A value made outside and used inside without being an argument is an input of the
    region too: its gradient flows."""
    def step(x):
        scale = rnp.exp(x[0])                      # made outside, from x
        block = rp.remat(lambda h: rnp.sin(h * scale) * scale)
        return rp.grad(rnp.sum(block(x)), x), rp.grad(rnp.sum(rnp.sin(x * scale) * scale), x)

    got, want = rp.function(step)(np.linspace(0.1, 1.0, 4))
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("mode", ["eager", "graph"])
def test_the_recomputation_runs_under_the_forwards_autocast(mode):
    """The gradient is taken outside ``autocast``: the recomputation still casts as the
    forward did."""
    w = rp.Variable(np.linspace(-1.0, 1.0, D * D).reshape(D, D).astype(np.float32), name="w")

    def f(x):
        return rnp.tanh(x @ w) @ w

    def step(x):
        with rp.autocast("bfloat16"):
            y, want = rp.remat(f)(x), f(x)
        return rp.grad(rnp.sum(y * y), w), rp.grad(rnp.sum(want * want), w)

    x = data()[0].astype(np.float32)
    got, want = rp.function(step, mode=mode)(x)
    assert got.dtype == np.float32
    np.testing.assert_array_equal(got, want)


def test_replicator_steps():
    def run(remat):
        net = Net(remat)
        opt = rp.wrap_optimizer(rp.optim.SGD(net.parameters(), lr=0.1))

        def input_fn(ctx):
            x, y = data(12)
            while True:
                yield x[ctx.replica_id::2], y[ctx.replica_id::2]

        def step_fn(batch):
            x, y = batch
            loss = rnp.mean((net(x) - y) ** 2)
            opt.apply(rp.grad(loss, net.parameters()))
            return {"loss": loss}

        rp.Replicator(input_fn, step_fn, replicas_per_rank=2).run(2)
        return {k: v.numpy() for k, v in net.parameters().items()}

    a, b = run(True), run(False)
    for k in a:
        np.testing.assert_array_equal(a[k], b[k])


# -- memory: the plan, and the eager tape --------------------------------------------------------
L, N, W = 12, 32, 64  # layers of a deep tanh MLP, batch, width (float64)


def mlp_step(seg: int, upto: int, copies=True):
    """The MLP's gradient step with ``rp.remat`` over segments of ``seg`` layers up to layer
    ``upto`` (the rest plain): (the NumPy backend's planned bytes, matmuls, gradients)."""
    rng = np.random.default_rng(0)
    ws = [rp.Variable(rng.standard_normal((W, W)) / np.sqrt(W)) for _ in range(L)]

    def layers(h, lo, hi):
        for i in range(lo, hi):
            h = rnp.tanh(h @ ws[i])
        return h

    def step(x):
        h = x
        for lo in range(0, upto, seg):
            h = rp.remat(layers)(h, lo, lo + seg)
        h = layers(h, upto, L)
        return rp.grad(rnp.sum(h * h), ws)

    f, x = rp.function(step), rng.standard_normal((N, W))
    graph = f.executable(x).graph
    return (graph.meta.memory_plan.nbytes,
            sum(n.prim == "matmul" for n in graph.nodes), f(x))


def test_the_memory_plan_holds_less_by_the_activations_recomputed():
    """Inside a segment of s layers the plain step keeps s - 1 hidden activations for the
    backward pass (the segment's output is kept either way); with remat the plan holds none of
    them. Segments ahead of a plain tail are computed again once the tail's activations are
    freed: the plan falls by all of them. Every layer in segments: one segment's values (its
    hidden activations and its output again) are held while it is recomputed."""
    activation = N * W * 8
    plain, plain_matmuls, plain_grads = mlp_step(3, 0)
    for seg, upto in [(3, 9), (3, 12), (4, 12), (2, 12)]:
        planned, matmuls, grads = mlp_step(seg, upto)
        recomputed = (upto // seg) * (seg - 1) * activation
        held_again = 0 if upto < L else seg * activation
        assert plain - planned >= recomputed - held_again, (seg, upto, plain, planned)
        assert matmuls == plain_matmuls + upto  # the recomputation, not merged back by CSE
        for g, want in zip(grads, plain_grads):
            np.testing.assert_array_equal(g, want)


def test_without_the_copies_cse_would_merge_the_recomputation_back(monkeypatch):
    """What the ``remat_barrier`` copies are for: recomputed from the forward's own inputs,
    every recomputed op equals a forward one, CSE merges them, and the plan is the plain one."""
    plain, plain_matmuls, _ = mlp_step(3, 0)
    monkeypatch.setattr(remat_module, "_copy", lambda x, after: x)
    planned, matmuls, _ = mlp_step(3, 9)
    assert (planned, matmuls) == (plain, plain_matmuls)


def test_eager_mode_keeps_no_intermediate():
    """On the eager tape the result holds the region's inputs, not what ``fn`` made inside; the
    gradient computes them again."""
    made = []

    def fn(x):
        h = rnp.tanh(x) * 3.0
        made.append(weakref.ref(h))
        return rnp.sin(h)

    x = rnp.asarray(np.linspace(0.0, 1.0, 5))
    y_plain, y_remat = fn(x), rp.remat(fn)(x)
    gc.collect()
    assert made[0]() is not None and made[1]() is None
    np.testing.assert_array_equal(rp.grad(rnp.sum(y_remat), x), rp.grad(rnp.sum(y_plain), x))


def test_errors():
    with pytest.raises(rp.ReplicateError, match="needs a function"):
        rp.remat(3)
    sizes = [2, 1]

    def changing(x):  # Python state that changes between the run and the recomputation
        return rnp.tanh(x[:sizes.pop(0)])

    x = rnp.asarray([1.0, 2.0, 3.0])
    y = rp.remat(changing)(x)
    with pytest.raises(rp.ReplicateError, match="other outputs"):
        rp.grad(rnp.sum(y), x)
