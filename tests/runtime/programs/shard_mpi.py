"""Sharded optimiser state against the unsharded step, for tests/runtime/test_shard_state.py:

    mpiexec -n N python shard_mpi.py oracle OUT.json     # every configuration, both ways
    mpiexec -n N python shard_mpi.py save DIR            # a sharded run's checkpoint
    mpiexec -n M python shard_mpi.py restore DIR OUT.json
    mpiexec -n 2 python shard_mpi.py desync OUT.json       # check_sync: broken slices caught

``save`` also writes an asynchronous checkpoint (``Checkpoint(asynchronous=True)``: the
sharded state gathered on the writer's thread) that must equal the synchronous one.
``oracle``: each configuration trains the same model from the same start twice, with
``wrap_optimizer(..., shard=False)`` and ``shard=True``, and records the largest difference of
the parameters and of the whole optimiser state (each process's slices gathered), and how much
optimiser state each process held. ``save``: a sharded and an unsharded run, each writing a
checkpoint. ``restore``: the sharded checkpoint restored on M processes (sharded: resliced for
M; and unsharded), saved again at once, and both trained on.
"""

import json
import os
import sys

import numpy as np

import replicate as rp
import replicate.numpy as rnp
from replicate.runtime.communication import transport
from replicate.runtime.communication.comm import world
from replicate.runtime.variables import checkpoint

X = np.random.default_rng(0).normal(size=(96, 5))
Y = (X[:, 0] + 0.5 * X[:, 1] > 0).astype(np.int64) + (X[:, 2] > 1).astype(np.int64)


def make_params(dtype="float64"):
    rng = np.random.default_rng(1)
    shapes = {"w1": (5, 7), "b1": (7,), "w2": (7, 3), "s": (1,)}  # (s: one element)
    return {k: rp.Variable((rng.normal(size=s) * 0.5 + (k == "s")).astype(np.float32)
                           if dtype != "float64" else rng.normal(size=s) * 0.5 + (k == "s"),
                           dtype=dtype, name=k) for k, s in shapes.items()}


def loss_fn(p, x, y):
    h = rnp.tanh(x @ p["w1"] + p["b1"])
    logits = rnp.cast(h @ p["w2"], "float32" if p["w2"].dtype != np.float64 else "float64")
    logits = logits * rnp.cast(p["s"], logits.dtype)
    logp = logits - rnp.logsumexp(logits, axis=-1, keepdims=True)
    return -rnp.take_along_axis(logp, rnp.expand_dims(y, -1), axis=-1).mean()


CONFIGS = {
    "adamw": dict(opt="adamw"),
    "adamw-clip": dict(opt="adamw", wrap=dict(max_grad_norm=0.05)),
    "adamw-clip-k2": dict(opt="adamw", k=2, wrap=dict(max_grad_norm=0.05)),
    "adamw-accumulate-k2": dict(opt="adamw", k=2, wrap=dict(accumulate=2, max_grad_norm=0.05)),
    "adam-dynamic-scale": dict(opt="adam", wrap=dict(loss_scale="dynamic")),
    "sgd-momentum-check-finite": dict(opt="sgd", k=2, check_finite=True),
    "bf16-autocast-master": dict(opt="adamw", dtype="bfloat16", autocast=True),
    "bf16-autocast-master-clip-k2": dict(opt="adamw", k=2, dtype="bfloat16", autocast=True,
                                         wrap=dict(max_grad_norm=0.05)),
    # bucketing (above: the default 25 MB buckets, overlapped — every gradient in one
    # reduce-scatter, every parameter in one all-gather): one exchange per tensor, buckets of
    # about two tensors, blocking, and buckets travelling in bfloat16
    "adamw-clip-k2-unbucketed": dict(opt="adamw", k=2, wrap=dict(max_grad_norm=0.05),
                                     options=dict(bucket_bytes=0)),
    "adamw-small-buckets": dict(opt="adamw", options=dict(bucket_bytes=300)),
    "adamw-clip-small-buckets-blocking": dict(opt="adamw", wrap=dict(max_grad_norm=0.05),
                                              options=dict(bucket_bytes=300, overlap=False)),
    "adamw-compressed": dict(opt="adamw", k=2, options=dict(compress="bfloat16")),
    # the JAX backend (the same rewrite lowered to XLA, which fuses the update differently)
    "jax-adamw-clip-k2": dict(opt="adamw", k=2, wrap=dict(max_grad_norm=0.05), backend="jax"),
    "jax-bf16-autocast-master": dict(opt="adamw", dtype="bfloat16", autocast=True,
                                     backend="jax"),
}
EXCHANGES = {"reduce_scatter": 0}  # this process's reduce-scatters (counted: bucketing)


def _counted(fn):
    def reduce_scatter(*args):
        EXCHANGES["reduce_scatter"] += 1
        return fn(*args)
    return reduce_scatter


transport.reduce_scatter = _counted(transport.reduce_scatter)


def make_optimizer(cfg, params, shard):
    kind = cfg["opt"]
    base = (rp.optim.AdamW(params, lr=0.05, weight_decay=0.1) if kind == "adamw" else
            rp.optim.Adam(params, lr=0.05) if kind == "adam" else
            rp.optim.SGD(params, lr=0.3, momentum=0.5))
    return rp.wrap_optimizer(base, shard=shard, **cfg.get("wrap", {}))


def train(cfg, shard, steps=6, callbacks=None, start=None):
    params = make_params(cfg.get("dtype", "float64"))
    opt = make_optimizer(cfg, params, shard)
    if start is not None:
        start(params, opt)

    def input_fn(ctx):
        return rp.shard_batches((X, Y), 8, ctx, seed=3, epochs=None)

    def step_fn(b):
        bx, by = b
        if cfg.get("autocast"):
            with rp.autocast("bfloat16"):
                loss = loss_fn(params, bx, by)
        else:
            loss = loss_fn(params, bx, by)
        opt.apply(rp.grad(opt.scale(loss), params))
        return {"loss": loss}

    rep = rp.Replicator(input_fn, step_fn, replicas_per_rank=cfg.get("k", 1),
                        check_finite=cfg.get("check_finite", False),
                        options=cfg.get("options"), backend=cfg.get("backend", "numpy"))
    rep.run(steps=steps, callbacks=callbacks(params, opt) if callbacks else ())
    return params, opt


def whole_state(params, opt) -> dict:
    """Parameters and optimiser state as whole float64 arrays (slices gathered)."""
    out = {f"p/{k}": v.numpy() for k, v in params.items()}
    comm = world()
    for name, var in opt.variables().items():
        value = var.value
        if var.shard is not None:
            value = var.shard.whole(comm.allgather_obj(value))
        out[f"opt/{name}"] = np.asarray(value)
    return {k: np.asarray(v, np.float64) for k, v in out.items()}


def state_bytes(opt) -> int:
    return int(sum(v.value.nbytes for k, v in opt.variables().items()
                   if "/" in k and not k.startswith("accumulated")))


def oracle(out):
    results = {}
    for name, cfg in CONFIGS.items():
        plain_params, plain_opt = train(cfg, False)
        plain = whole_state(plain_params, plain_opt)
        EXCHANGES["reduce_scatter"] = 0
        params, opt = train(cfg, True)
        reduce_scatters = EXCHANGES["reduce_scatter"]
        sharded = whole_state(params, opt)
        held = {kind: int(sum(v.value.nbytes for k, v in opt.variables().items()
                              if k.startswith(("master/", "accumulated/")) == (kind != "state")
                              and k.startswith("master/") == (kind == "master_weights")))
                for kind in ("state", "master_weights")}
        diff = {k: float(np.max(np.abs(plain[k] - sharded[k]))) for k in plain}
        results[name] = {"diff": diff, "max": max(diff.values()),
                         "bitwise": all(np.array_equal(plain[k], sharded[k]) for k in plain),
                         "moved": float(np.max(np.abs(plain["p/w1"] - make_params(
                             cfg.get("dtype", "float64"))["w1"].numpy().astype(np.float64)))),
                         "sharded_vars": len(opt.sharded()),
                         "reduce_scatters": reduce_scatters,
                         "report": rp.memory_report(opt), "held": held,
                         "plain_report": rp.memory_report(plain_opt),
                         "state_bytes": state_bytes(opt),
                         "plain_state_bytes": state_bytes(make_optimizer(
                             cfg, make_params(cfg.get("dtype", "float64")), False))}
    if world().rank == 0:
        with open(out, "w") as f:
            json.dump({"size": world().size, "results": results}, f)


CK = CONFIGS["adamw-clip"]


def save(folder):
    def background(params, opt):  # an asynchronous checkpoint of the same state
        return [rp.callbacks.Checkpoint(os.path.join(folder, "background-{step}.npz"),
                                        {"p": params, "o": opt.variables()}, every=3,
                                        asynchronous=True)]

    params, opt = train(CK, True, steps=3, callbacks=background)
    rp.checkpoint.save(os.path.join(folder, "sharded.npz"), {"p": params, "o": opt.variables()},
                       step=3)
    params, opt = train(CK, False, steps=3)
    rp.checkpoint.save(os.path.join(folder, "plain.npz"), {"p": params, "o": opt.variables()},
                       step=3)


def restore(folder, out):
    path = os.path.join(folder, "sharded.npz")

    def start(params, opt):
        rp.checkpoint.restore(path, {"p": params, "o": opt.variables()})

    final, again = {}, {}
    for shard in (True, False):
        params, opt = train(CK, shard, steps=0, start=start)
        copy = os.path.join(folder, f"again-{world().size}-{shard}.npz")
        rp.checkpoint.save(copy, {"p": params, "o": opt.variables()}, step=3)
        again[shard] = copy
        final[shard] = whole_state(*train(CK, shard, steps=4, start=start))
    if world().rank == 0:
        saved = checkpoint.load(path)[0]
        same = {str(s): all(np.array_equal(saved[k], v)
                            for k, v in checkpoint.load(again[s])[0].items())
                for s in again}
        plain = checkpoint.load(os.path.join(folder, "plain.npz"))[0]
        saved_vs_plain = max(float(np.max(np.abs(saved[k] - plain[k]))) for k in saved)
        background = checkpoint.load(os.path.join(folder, "background-3.npz"))[0]
        background_equal = sorted(background) == sorted(saved) and all(
            np.array_equal(background[k], saved[k]) for k in saved)
        diff = max(float(np.max(np.abs(final[True][k] - final[False][k]))) for k in final[True])
        with open(out, "w") as f:
            json.dump({"size": world().size, "resaved_equal": same, "trained_diff": diff,
                       "saved_vs_plain": saved_vs_plain, "keys": sorted(saved),
                       "background_equal": background_equal}, f)


def desync(out):
    """check_sync with sharded state: a slice broken on purpose on process 1 after the last
    step (its padding, its layout, or a parameter's copy), caught at the end of ``run``."""
    def broken(kind):
        def callbacks(params, opt):
            def brk(rep, step, outputs):
                if step != 3 or world().rank != 1:
                    return
                if kind == "padding":  # (b1: 7 elements, process 1 holds 3 and 1 of padding)
                    opt.m[0].value[-1] = 1.0
                elif kind == "layout":  # process 0's slice, held by process 1
                    var = opt.v[1]
                    lay = type(var.shard)(var.shard.shape, var.shard.n, 0)
                    var.value, var.shard = lay.part(np.ones(var.shape)), lay
                elif kind == "parameter":
                    params["w2"].assign(params["w2"].numpy() + 1e-9)
            return [brk]
        return callbacks

    caught = {}
    for kind in ("none", "padding", "layout", "parameter"):
        try:
            train(CK, True, steps=3, callbacks=broken(kind))
            caught[kind] = None
        except rp.DivergenceError as e:
            caught[kind] = str(e)
    if world().rank == 0:
        with open(out, "w") as f:
            json.dump({"size": world().size, "caught": caught}, f)


if __name__ == "__main__":
    {"oracle": oracle, "save": save, "restore": restore, "desync": desync}[sys.argv[1]](
        *sys.argv[2:])
