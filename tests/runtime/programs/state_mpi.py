"""Per-replica Variables, gradient accumulation and loss scaling across processes
(tests/runtime/test_state_per_replica.py, tests/api/test_mixed_precision.py).

    mpiexec -n 2 python state_mpi.py SCENARIO MODE K [ARGS]

Each rank writes one line per result: ``rank R <name> <json>``.
"""

import json
import os
import sys

import numpy as np

import replicate as rp
import replicate.numpy as rnp


def say(name, value):
    rank = rp.runtime.communication.comm.world().rank
    sys.stdout.write(f"rank {rank} {name} {json.dumps(value)}\n")


def data(rows=96, seed=0):
    rng = np.random.default_rng(seed)
    return rng.normal(size=(rows, 5)), rng.normal(size=(rows, 1))


def accumulation(mode, k, n, batch):
    """n steps of batch ``batch`` on every replica; the rows of one update are split over the
    steps and replicas in order (tests/runtime/test_state_per_replica.py rebuilds the big batch)."""
    X, Y = data()
    w = rp.Variable(np.linspace(-1, 1, 5).reshape(5, 1), name="w")
    b = rp.Variable(np.zeros(1), name="b")
    opt = rp.wrap_optimizer(rp.optim.Adam([w, b], lr=0.05), accumulate=n)

    def input_fn(ctx):
        R = ctx.num_replicas
        for step in range(10 ** 6):
            big, micro = divmod(step, n)
            lo = big * n * R * batch + (micro * R + ctx.replica_id) * batch
            if lo + batch > len(X):
                return
            yield X[lo:lo + batch], Y[lo:lo + batch]

    def step_fn(xy):
        x, y = xy
        loss, g = rp.value_and_grad(lambda: rnp.mean((x @ w + b - y) ** 2), wrt=[w, b])()
        opt.apply(g)
        return {"loss": loss}

    r = rp.Replicator(input_fn, step_fn, mode=mode, replicas_per_rank=k)
    r.run(2 * n)
    say("w", w.numpy().ravel().tolist())
    say("b", b.numpy().ravel().tolist())
    if mode == "graph":  # the accumulating step exchanges nothing but its outputs
        say("exchanges", sorted(len(s.schedule) for s in r.cache.values()))


def per_replica(mode, k, folder):
    """A per-replica step counter and running sum; checkpointed and restored per replica."""
    total = rp.Variable(np.zeros(2), name="total", per_replica=True)
    seen = rp.Variable(np.zeros((), np.int64), name="seen", per_replica=True)

    def input_fn(ctx):
        while True:
            yield np.full(2, float(ctx.replica_id + 1))

    def step_fn(x):
        total.assign(total + x)
        seen.assign(seen + 1)
        return {"mine": total.read().sum()}

    rep = rp.Replicator(input_fn, step_fn, mode=mode, replicas_per_rank=k,
                        outputs="per_replica")
    hist = rep.run(3)
    say("outputs", hist[-1]["mine"].tolist())
    say("total", total.numpy().tolist())
    path = os.path.join(folder, "ck.npz")
    rp.checkpoint.save(path, {"total": total, "seen": seen}, step=3)
    total.assign(np.zeros(2))
    seen.assign(np.zeros((), np.int64))
    rep.restore(path, {"total": total, "seen": seen})
    say("restored", total.numpy().tolist())
    say("seen", seen.numpy().tolist())
    if rp.runtime.communication.comm.world().rank == 0:
        say("file", np.load(path)["var/total"].tolist())


def overflow(mode, k):
    """float16 with dynamic loss scaling; one replica of rank 1 overflows at step 2: every
    replica of every rank skips that update and halves the scale."""
    w = rp.Variable(np.ones((3, 1), np.float16), name="w")
    opt = rp.wrap_optimizer(rp.optim.Adam([w], lr=1e-2), loss_scale="dynamic",
                            growth_interval=100)
    opt.scale_var.assign(np.float32(8.0))

    def input_fn(ctx):
        for step in range(4):
            big = step == 1 and ctx.replica_id == ctx.num_replicas - 1
            yield np.full((2, 3), 6e4 if big else 1.0, np.float16)

    def step_fn(x):
        loss = rnp.mean(rnp.cast(x @ w, np.float32) ** 2)
        opt.apply([rp.grad(opt.scale(loss), w)])
        return {"scale": opt.scale_var.read(), "updates": opt.optimizer.step.read()}

    hist = rp.Replicator(input_fn, step_fn, mode=mode, replicas_per_rank=k).run(4)
    say("scales", [float(h["scale"]) for h in hist])
    say("updates", [int(h["updates"]) for h in hist])
    say("w", w.numpy().ravel().astype(float).tolist())


def main():
    scenario, mode, k = sys.argv[1], sys.argv[2], int(sys.argv[3])
    if scenario == "accumulation":
        accumulation(mode, k, int(sys.argv[4]), int(sys.argv[5]))
    elif scenario == "per_replica":
        per_replica(mode, k, sys.argv[4])
    elif scenario == "overflow":
        overflow(mode, k)
    elif scenario == "bf16_allreduce":
        bf16_allreduce(mode, k)
    elif scenario == "stop_restore":
        stop_restore(mode, k, sys.argv[4])


def stop_restore(mode, k, folder):
    """Stopped early at step 5 (the ranks have drawn step 6's batches), restored to step 3's
    checkpoint: steps 4 and 5 again, on their own batches (not the pending step 6's)."""
    x = np.arange(40, dtype=np.float32)
    w = rp.Variable(np.zeros((), np.float32), name="w")

    def step_fn(b):
        w.assign(w + rp.all_reduce(b.sum(), "sum"))  # (w: the sum of the rows trained on)
        return {"x": b}
    rep = rp.Replicator(lambda ctx: rp.shard_batches(x, 1, ctx, epochs=1, shuffle=False),
                        step_fn, mode=mode, replicas_per_rank=k, outputs="per_replica")
    pattern = os.path.join(folder, "s-{step}.npz")
    rep.run(10, callbacks=[rp.callbacks.Checkpoint(pattern, {"w": w}, every=3),
                           lambda r, step, out: step == 5 and r.stop()])
    say("restored", rep.restore(pattern, {"w": w}))
    say("rows", [h["x"].ravel().tolist() for h in rep.run(2)])
    say("w", float(w.numpy()))


def bf16_allreduce(mode, k):
    """Replica r sends 1 (r = 0) or 2**-8: summed in float32 and rounded once to bfloat16."""
    out = {}

    def input_fn(ctx):
        while True:
            yield np.full(2, 1.0 if ctx.replica_id == 0 else 2.0 ** -8, rp.bfloat16)

    def step_fn(x):
        s = rp.all_reduce(x, "sum")
        out["dtype"] = str(s.dtype)
        return {"sum": s}

    hist = rp.Replicator(input_fn, step_fn, mode=mode, replicas_per_rank=k,
                         outputs="per_replica").run(1)
    say("sum", hist[0]["sum"][0].astype(float).tolist())
    say("dtype", out["dtype"])


if __name__ == "__main__":
    main()
