"""Whole training steps that several suites run: (a) an MLP SGD step, (b) a small conv net step
with pooling, (c) a WGAN-GP critic step whose loss contains a gradient (so its parameter gradient
is a gradient of a gradient); each a ``make_*_step(params)`` with its initial values
(``*_INIT``) and batches (``*_BATCHES``), drawn from one seeded generator in this order.

``tests/graph/test_modes.py`` checks them graph against eager and against NumPy; the parity suites
run them on every backend (``test_backend_parity.py``) and count their kernels
(``test_cupy_kernels.py``).
"""

from __future__ import annotations

import numpy as np

import replicate as rp
import replicate.numpy as rnp


def variables(values: dict) -> dict:
    return {k: rp.Variable(v.copy(), name=k) for k, v in values.items()}


def snapshot(params: dict) -> dict:
    return {k: v.numpy().copy() for k, v in params.items()}


def sgd(params, grads, lr):
    for k, p in params.items():
        p.assign(p - lr * grads[k])


# -- (a) MLP -----------------------------------------------------------------------------------
RNG = np.random.default_rng(0)
MLP_INIT = {"w1": RNG.standard_normal((4, 8)) * 0.5, "b1": RNG.standard_normal(8) * 0.1,
            "w2": RNG.standard_normal((8, 3)) * 0.5, "b2": np.zeros(3)}
MLP_BATCHES = [(RNG.standard_normal((6, 4)), RNG.integers(0, 3, 6)) for _ in range(3)]


def mlp_loss(p, x, y):
    h = rnp.tanh(x @ p["w1"] + p["b1"])
    logits = h @ p["w2"] + p["b2"]
    return rnp.mean(rnp.logsumexp(logits, axis=1) - rnp.sum(logits * rnp.one_hot(y, 3), axis=1))


def make_mlp_step(params):
    def step(x, y):
        loss = mlp_loss(params, x, y)
        grads = rp.grad(loss, params)
        sgd(params, grads, 0.1)
        return {"loss": loss, "grads": grads}

    return step


# -- (b) a small conv net with pooling ----------------------------------------------------------
CNN_INIT = {"k1": RNG.standard_normal((3, 1, 3, 3)) * 0.5, "k2": RNG.standard_normal((4, 3, 3, 3)),
            "w": RNG.standard_normal((4, 2)) * 0.5, "b": np.zeros(2)}
CNN_BATCHES = [(RNG.standard_normal((2, 1, 8, 8)), RNG.integers(0, 2, 2)) for _ in range(2)]


def make_cnn_step(params):
    def step(x, y):
        h = rnp.maximum(rnp.conv2d(x, params["k1"], padding=1), 0.0)  # (2, 3, 8, 8)
        h = rnp.max_pool2d(h, 2)  # (2, 3, 4, 4)
        h = rnp.tanh(rnp.conv2d(h, params["k2"], stride=1))  # (2, 4, 2, 2)
        h = rnp.reshape(rnp.avg_pool2d(h, 2), (2, 4))
        logits = h @ params["w"] + params["b"]
        loss = rnp.mean(rnp.logsumexp(logits, axis=1)
                        - rnp.take_along_axis(logits, rnp.expand_dims(y, 1), 1)[:, 0])
        grads = rp.grad(loss, params)
        sgd(params, grads, 0.5)
        return loss, grads

    return step


# -- (c) WGAN-GP: a gradient penalty, so the parameter gradient is a gradient of a gradient ------
GP_INIT = {"w1": RNG.standard_normal((3, 5)), "b1": RNG.standard_normal(5) * 0.1,
           "w2": RNG.standard_normal(5), "c": np.zeros(())}
GP_BATCHES = [(RNG.standard_normal((4, 3)), RNG.standard_normal((4, 3)) + 1.0,
               RNG.uniform(size=(4, 1))) for _ in range(2)]
LAMBDA = 10.0


def critic(p, x):
    return rnp.tanh(x @ p["w1"] + p["b1"]) @ p["w2"] + p["c"]


def gp_loss(p, real, fake, eps):
    x_hat = eps * real + (1.0 - eps) * fake
    g = rp.grad(rnp.sum(critic(p, x_hat)), x_hat)  # per-sample d critic / d x_hat
    norm = rnp.sqrt(rnp.sum(g * g, axis=1))
    penalty = rnp.mean((norm - 1.0) ** 2)
    return rnp.mean(critic(p, fake)) - rnp.mean(critic(p, real)) + LAMBDA * penalty


def make_gp_step(params):
    def step(real, fake, eps):
        loss = gp_loss(params, real, fake, eps)
        grads = rp.grad(loss, params)
        sgd(params, grads, 0.01)
        return loss, grads

    return step
