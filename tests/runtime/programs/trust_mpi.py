"""The trust cases of tests/api/test_trust.py that need several processes (and their
asynchronous-checkpoint twins, ``CASE_async``, for tests/runtime/test_checkpoint_async.py).

    mpiexec -n 2 python tests/runtime/programs/trust_mpi.py CASE MODE OUT_DIR

Each rank writes OUT_DIR/rank<r>.json: {"error": [class, message] or null, ...case values}.
"""

from __future__ import annotations

import json
import os
import sys

import numpy as np

import replicate as rp
import replicate.numpy as rnp

TRUE_W = np.array([1.0, -2.0, 0.5], np.float32)


def batches_of(replica_id):
    """Replica r's batches: a fixed stream per global replica id (the test recomputes them)."""
    rng = np.random.default_rng(100 + replica_id)
    while True:
        x = rng.normal(size=(8, 3)).astype(np.float32)
        yield x, x @ TRUE_W


def regression_batches(ctx):
    return batches_of(ctx.replica_id)


def accumulate(mode):
    """Gradient accumulation with rp.cond: apply every 4th step (the newcomer's program)."""
    w = rp.Variable(np.zeros(3, np.float32), name="w")
    acc = rp.Variable(np.zeros(3, np.float32), name="acc")
    t = rp.Variable(np.zeros((), np.int64), name="t")

    def step_fn(batch):
        x, y = batch
        loss = ((x @ w - y) ** 2).mean()
        acc.assign(acc + rp.all_reduce(rp.grad(loss, w), "mean"))
        t.assign(t + 1)

        def apply():
            w.assign(w - 0.05 * acc)
            acc.assign(rnp.zeros_like(acc.read()))
            return rnp.asarray(1.0)

        applied = rp.cond((t // 4) * 4 == t, apply, lambda: rnp.asarray(0.0))
        return {"loss": loss, "applied": applied}

    rep = rp.Replicator(regression_batches, step_fn, mode=mode)
    hist = rep.run(12)
    return {"w": w.numpy().tolist(), "applied": [float(h["applied"]) for h in hist]}


def eval_after_compile(mode):
    net = rp.nn.Sequential(rp.nn.Linear(3, 16), rp.nn.Dropout(0.5))

    def step_fn(batch):
        x, _ = batch
        return {"zeros": rnp.sum(net(x) == 0.0)}

    rep = rp.Replicator(regression_batches, step_fn, mode=mode)
    train = [float(h["zeros"]) for h in rep.run(2)]
    net.eval()
    evaluation = [float(h["zeros"]) for h in rep.run(2)]
    return {"train": train, "eval": evaluation, "trace_count": rep.trace_count}


def drift(mode, branch=False, checkpoint_dir=None, asynchronous=False):
    """Training without rp.wrap_optimizer: each rank would update w from its own gradients
    (``asynchronous``: the checkpoints written in the background)."""
    w = rp.Variable(np.zeros(3, np.float32), name="w")
    opt = rp.optim.SGD([w], lr=0.1)

    def step_fn(batch):
        x, y = batch
        loss = ((x @ w - y) ** 2).mean()
        g = rp.all_reduce(rp.grad(loss, w), "mean")
        if branch and rp.replica_id() == 1:  # a rank-dependent Python branch: unseen by tracing
            g = g * 2.0
        opt.apply([g])  # MARK drift
        return {"loss": loss}

    def step_no_reduce(batch):
        x, y = batch
        loss = ((x @ w - y) ** 2).mean()
        opt.apply([rp.grad(loss, w)])  # MARK drift-local
        return {"loss": loss}

    rep = rp.Replicator(regression_batches, step_fn if branch else step_no_reduce, mode=mode)
    callbacks = []
    if checkpoint_dir:
        pattern = os.path.join(checkpoint_dir, "ckpt-{step}.npz")
        callbacks.append(rp.callbacks.Checkpoint(pattern, {"w": w}, every=2,
                                                 asynchronous=asynchronous))
    try:
        rep.run(3, callbacks=callbacks)
    finally:
        if checkpoint_dir:
            files = sorted(f for f in os.listdir(checkpoint_dir) if not f.endswith(".lock"))
            print("files:", files, flush=True)
    return {"w": w.numpy().tolist()}


def local_variable(mode):
    """A per-process statistic kept on purpose: local=True, never refused or compared."""
    seen = rp.Variable(np.zeros(3, np.float32), name="seen", local=True)
    w = rp.Variable(np.zeros(3, np.float32), name="w")
    opt = rp.wrap_optimizer(rp.optim.SGD([w], lr=0.1))

    def step_fn(batch):
        x, y = batch
        seen.assign(seen + x.sum(0))
        loss = ((x @ w - y) ** 2).mean()
        opt.apply([rp.grad(loss, w)])
        return {"loss": loss}

    rp.Replicator(regression_batches, step_fn, mode=mode).run(3)
    return {"seen": seen.numpy().tolist(), "w": w.numpy().tolist()}


def int_mean(mode):
    def step_fn(batch):
        x, _ = batch
        return {"m": rp.all_reduce(rnp.cast(x[0], np.int32), "mean")}  # MARK int-mean

    rp.Replicator(regression_batches, step_fn, mode=mode).run(1)
    return {}


def nan_gradient_program(mode, k=1):
    """A finite loss with a NaN gradient at step 4 (sqrt at 0): (replicator, w, optimiser)."""
    w = rp.Variable(np.ones(3, np.float32), name="w")
    opt = rp.wrap_optimizer(rp.optim.SGD([w], lr=0.01))

    def input_fn(ctx):
        for i in range(6):
            yield np.zeros(3, np.float32) if i == 3 else np.full(3, 1.0 + i, np.float32)

    def step_fn(x):
        loss = rnp.sqrt(rnp.abs(rnp.sum(w * x)))
        opt.apply([rp.grad(loss, w)])  # MARK nan-update
        return {"loss": loss}

    rep = rp.Replicator(input_fn, step_fn, mode=mode, replicas_per_rank=k, check_finite=True)
    return rep, w, opt


def nan_update(mode, out_dir, asynchronous=False):
    """The NaN-gradient program, checkpointed every step (``asynchronous``: in the
    background)."""
    rep, w, _ = nan_gradient_program(mode)
    pattern = os.path.join(out_dir, "ckpt-{step}.npz")
    error = None
    try:
        rep.run(callbacks=[rp.callbacks.Checkpoint(pattern, {"w": w}, every=1,
                                                   asynchronous=asynchronous)])
    except rp.ReplicateError as e:
        error = [type(e).__name__, str(e)]
    return {"error": error, "w": w.numpy().tolist(), "step": rep.step,
            "files": sorted(f for f in os.listdir(out_dir) if not f.endswith(".lock"))}


CASES = {"accumulate": accumulate, "eval_after_compile": eval_after_compile,
         "drift": drift, "drift_branch": lambda mode: drift(mode, branch=True),
         "local_variable": local_variable, "int_mean": int_mean}


if __name__ == "__main__":
    case, mode, out_dir = sys.argv[1:4]
    from replicate.runtime.communication.comm import world

    rank = world().rank
    result, error = {}, None
    try:
        ckpt_dir = os.path.join(out_dir, "ckpt")
        os.makedirs(ckpt_dir, exist_ok=True)
        background = case.endswith("_async")  # (nan_update_async, drift_checkpoint_async)
        if case.startswith("nan_update"):
            result = nan_update(mode, ckpt_dir, asynchronous=background)
        elif case.startswith("drift_checkpoint"):
            result = drift(mode, branch=True, checkpoint_dir=ckpt_dir, asynchronous=background)
        else:
            result = CASES[case](mode)
    except rp.ReplicateError as e:
        error = [type(e).__name__, str(e)]
    with open(os.path.join(out_dir, f"rank{rank}.json"), "w") as f:
        json.dump({"error": error, **result}, f)  # nan_update reports its own error
