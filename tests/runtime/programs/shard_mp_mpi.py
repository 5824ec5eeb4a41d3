"""Sharded optimiser state with model parallelism, for tests/runtime/test_shard_state.py:

    mpiexec -n 4 python shard_mp_mpi.py oracle OUT.json     # m=2: 2 replica groups of 2 devices
    mpiexec -n 4 python shard_mp_mpi.py save DIR            # a sharded run's checkpoint
    mpiexec -n 2 python shard_mp_mpi.py restore DIR OUT.json

A 4-layer MLP (layer l on logical device l % 2, a bias on device 0, a one-element scale on
device 1: a slice of padding only on the second process of its group) trains with
``logical_devices=2`` twice from the same start, ``wrap_optimizer(..., shard=False)`` and
``shard=True``; each device's state is sharded over the processes that hold that device
(``device{d}.of2``). ``oracle`` records the largest difference of the parameters and of the
whole optimiser state (slices gathered), and what each process held in a callback mid-run
(its device's slices only). ``save``: a sharded and an unsharded run's checkpoints.
``restore``: the sharded checkpoint restored on 2 processes (``logical_devices=2``: one
process per device, the state whole again; and ``logical_devices=1``: sharded over both),
sharded and unsharded, trained on.
"""

import json
import os
import sys

import numpy as np

import replicate as rp
import replicate.numpy as rnp
from replicate.runtime.communication.comm import world
from replicate.runtime.variables import checkpoint
from replicate.sharding import whole_values

WIDTHS = [5, 7, 6, 7, 3]
X = np.random.default_rng(0).normal(size=(96, WIDTHS[0]))
Y = X[:, :WIDTHS[-1]] ** 2

CONFIGS = {
    "sgd-momentum": dict(opt="sgd"),
    "sgd-momentum-k2": dict(opt="sgd", k=2),
    "adamw-clip": dict(opt="adamw", wrap=dict(max_grad_norm=0.5)),
    "adamw-clip-k2": dict(opt="adamw", k=2, wrap=dict(max_grad_norm=0.5)),
    "adamw-clip-unbucketed": dict(opt="adamw", wrap=dict(max_grad_norm=0.5),
                                  options=dict(bucket_bytes=0)),
    "adamw-clip-micro2": dict(opt="adamw", micro=2, wrap=dict(max_grad_norm=0.5)),
    "adam-dynamic-scale-check-finite": dict(opt="adam", wrap=dict(loss_scale="dynamic"),
                                            check_finite=True),
    "jax-adamw-clip-k2": dict(opt="adamw", k=2, wrap=dict(max_grad_norm=0.5), backend="jax"),
}


def make_params(m):
    rng = np.random.default_rng(1)
    params = {f"w{i}": rp.Variable(rng.normal(size=(a, b)) * 0.4, name=f"w{i}")
              for i, (a, b) in enumerate(zip(WIDTHS[:-1], WIDTHS[1:]))}
    params["bias"] = rp.Variable(np.zeros(WIDTHS[1]), name="bias")
    params["s"] = rp.Variable(np.ones(1), name="s")
    return params


def make_optimizer(cfg, params, shard):
    ps = list(params.values())
    base = (rp.optim.AdamW(ps, lr=0.05, weight_decay=0.1) if cfg["opt"] == "adamw" else
            rp.optim.Adam(ps, lr=0.05) if cfg["opt"] == "adam" else
            rp.optim.SGD(ps, lr=0.1, momentum=0.5))
    return rp.wrap_optimizer(base, shard=shard, **cfg.get("wrap", {}))


def train(cfg, shard, steps=4, m=2, start=None, callbacks=()):
    params = make_params(m)
    opt = make_optimizer(cfg, params, shard)
    if start is not None:
        start(params, opt)
    micro = cfg.get("micro", 1)

    def input_fn(ctx):
        return rp.shard_batches((X, Y), 6 * micro, ctx, seed=3, epochs=None)

    def step_fn(b):
        h, target = b
        for i in range(4):
            with rp.logical_device(i % m):
                h = h @ params[f"w{i}"]
                if i == 0:
                    h = h + params["bias"]
                if i == 1:
                    h = h * params["s"]
                if i < 3:
                    h = rnp.tanh(h)
        loss = ((h - target) ** 2).mean()
        opt.apply(rp.grad(opt.scale(loss), list(params.values())))
        return {"loss": loss}

    rep = rp.Replicator(input_fn, step_fn, logical_devices=m, micro_batches=micro,
                        replicas_per_rank=cfg.get("k", 1), options=cfg.get("options"),
                        check_finite=cfg.get("check_finite", False),
                        backend=cfg.get("backend", "numpy"))
    rep.run(steps, callbacks=[cb(params, opt) for cb in callbacks])
    return params, opt, rep


def whole_state(params, opt) -> dict:
    """Parameters and optimiser state as whole arrays (every process holds every Variable after
    ``run``; the slices gathered over the world)."""
    state = opt.variables()
    wholes = whole_values(world(), state)
    out = {f"p/{k}": v.numpy() for k, v in params.items()}
    out.update({f"opt/{k}": wholes.get(k, v.value) for k, v in state.items()})
    return {k: np.asarray(v, np.float64) for k, v in out.items()}


def held_mid_run(seen):
    """A callback recording, at step 2, memory_report's optimizer_state and the bytes of the
    optimiser state this process holds a value of (its device's: the others are released)."""
    def make(params, opt):
        def callback(rep, step, outputs):
            if step == 2:
                mine = [v for k, v in opt.variables().items() if v.released is None
                        and not k.startswith(("master/", "accumulated/"))]
                seen.update(report=rp.memory_report(opt)["optimizer_state"],
                            held=int(sum(v.value.nbytes for v in mine)), count=len(mine),
                            sharded=sum(v.shard is not None for v in mine))
        return callback
    return make


def oracle(out):
    results = {}
    for name, cfg in CONFIGS.items():
        plain_seen, seen = {}, {}
        plain = whole_state(*train(cfg, False, callbacks=[held_mid_run(plain_seen)])[:2])
        params, opt, rep = train(cfg, True, callbacks=[held_mid_run(seen)])
        sharded = whole_state(params, opt)
        graph = rep.executable().graph
        diff = {k: float(np.max(np.abs(plain[k] - sharded[k]))) for k in plain}
        results[name] = {
            "diff": diff, "max": max(diff.values()),
            "bitwise": all(np.array_equal(plain[k], sharded[k]) for k in plain),
            "moved": float(np.max(np.abs(plain["p/w0"] - make_params(2)["w0"].numpy()))),
            "comms": sorted({str(n.attrs.get("comm")) for n in graph.nodes if n.prim in (
                "mpi_reduce_scatter", "mpi_allgather", "comm_start")}),
            "reduce_scatters": sum(n.prim == "mpi_reduce_scatter" or n.prim == "comm_start"
                                   and n.attrs.get("collective") == "reduce_scatter"
                                   for n in graph.nodes),
            "seen": seen, "plain_seen": plain_seen, "device": rep.layout.device,
            "group": rep.layout.group}
    rows = world().allgather_obj(results)
    if world().rank == 0:
        with open(out, "w") as f:
            json.dump({"size": world().size, "results": rows}, f)


CK = CONFIGS["adamw-clip"]


def save(folder):
    for shard in (True, False):
        params, opt, _ = train(CK, shard, steps=3)
        rp.checkpoint.save(os.path.join(folder, f"{'sharded' if shard else 'plain'}.npz"),
                           {"p": params, "o": opt.variables()}, step=3)


def restore(folder, out):
    path = os.path.join(folder, "sharded.npz")

    def start(params, opt):
        rp.checkpoint.restore(path, {"p": params, "o": opt.variables()})

    final, again = {}, {}
    for m in (2, 1):
        for shard in (True, False):
            params, opt, _ = train(CK, shard, steps=0, m=m, start=start)
            copy = os.path.join(folder, f"again-{m}-{shard}.npz")
            rp.checkpoint.save(copy, {"p": params, "o": opt.variables()}, step=3)
            again[m, shard] = copy
            final[m, shard] = whole_state(*train(CK, shard, steps=3, m=m, start=start)[:2])
    if world().rank == 0:
        saved = checkpoint.load(path)[0]
        plain = checkpoint.load(os.path.join(folder, "plain.npz"))[0]
        same = {f"{m}-{s}": all(np.array_equal(saved[k], v)
                                for k, v in checkpoint.load(c)[0].items())
                for (m, s), c in again.items()}
        trained = {f"{m}": max(float(np.max(np.abs(final[m, True][k] - final[m, False][k])))
                               for k in final[m, True]) for m in (2, 1)}
        with open(out, "w") as f:
            json.dump({"size": world().size, "resaved_equal": same, "trained_diff": trained,
                       "saved_vs_plain": max(float(np.max(np.abs(saved[k] - plain[k])))
                                             for k in saved),
                       "keys": sorted(saved)}, f)


if __name__ == "__main__":
    {"oracle": oracle, "save": save, "restore": restore}[sys.argv[1]](*sys.argv[2:])
