"""Training programs shared by the in-process tests and the `mpiexec -n 2` tests.

Run as a script under MPI:
python tests/runtime/programs/oracle.py OUT.npz --k 2 --mode graph --opt adam
"""

from __future__ import annotations

import argparse

import numpy as np

import replicate as rp
import replicate.numpy as rnp

N_FEATURES, N_HIDDEN, N_CLASSES = 5, 7, 3


def dataset(n=480, seed=0):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, N_FEATURES))
    y = (x[:, 0] + 0.5 * x[:, 1] > 0).astype(np.int64) + (x[:, 2] > 1).astype(np.int64)
    return x, y


def make_params(seed=1):
    rng = np.random.default_rng(seed)
    return {"w1": rp.Variable(rng.normal(size=(N_FEATURES, N_HIDDEN)) * 0.5, name="w1"),
            "b1": rp.Variable(np.zeros(N_HIDDEN), name="b1"),
            "w2": rp.Variable(rng.normal(size=(N_HIDDEN, N_CLASSES)) * 0.5, name="w2")}


def loss_fn(params, x, y):
    h = rnp.tanh(x @ params["w1"] + params["b1"])
    logits = h @ params["w2"]
    logp = logits - rnp.logsumexp(logits, axis=-1, keepdims=True)
    return -rnp.take_along_axis(logp, rnp.expand_dims(y, -1), axis=-1).mean()


def train(k=1, mode="graph", opt="sgd", steps=10, batch=8, replicas=None, comm=None,
          options=None):
    """Train with k replicas per process; return (final params as numpy, per-step losses)."""
    params = make_params()
    base = rp.optim.SGD(params, lr=0.3, momentum=0.5) if opt == "sgd" else \
        rp.optim.Adam(params, lr=0.05)
    optimizer = rp.wrap_optimizer(base)
    x, y = dataset()

    def input_fn(ctx):
        return rp.shard_batches((x, y), batch, ctx, seed=3, epochs=None)

    def step_fn(b):
        bx, by = b
        loss = loss_fn(params, bx, by)
        optimizer.apply(rp.grad(loss, params))
        return {"loss": loss}

    rep = rp.Replicator(input_fn, step_fn, mode=mode, replicas_per_rank=k, comm=comm,
                        options=options)
    hist = rep.run(steps=steps)
    return {k_: v.numpy().copy() for k_, v in params.items()}, [float(h["loss"]) for h in hist]


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--k", type=int, default=1)
    ap.add_argument("--mode", default="graph")
    ap.add_argument("--opt", default="sgd")
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--options", default=None, help="compile options as JSON")
    a = ap.parse_args()
    import json

    params, losses = train(a.k, a.mode, a.opt, a.steps,
                           options=json.loads(a.options) if a.options else None)
    from replicate.runtime.communication.comm import world

    if world().rank == 0:
        np.savez(a.out, losses=np.array(losses), **params)
    else:  # every rank must hold the same parameters
        np.savez(a.out + f".rank{world().rank}.npz", losses=np.array(losses), **params)
