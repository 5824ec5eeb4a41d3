"""What the cross-rank variable fingerprint (``Replicator(check_sync=...)``) costs.

    mpiexec -n 2 python bench/sync_check.py [--steps 400] [--model soak|mlp]

``soak`` is the MLP of tests/runtime/programs/faults_soak.py (8-32-2, Adam, batch 16, 2 replicas per
process, graph mode); ``mlp`` the 784-1024-1024-10 MLP of bench/step_time.py (batch 64). For
each: the step time with ``check_sync=False``, the time of one comparison (``verify_sync``:
a fingerprint per variable and one ``allgather`` of the fingerprints), and what that is per step at
the default setting (once per ``run`` call and once per checkpoint: with ``run(50)`` calls and a
checkpoint every 100 steps, as the soak program does) and with ``check_sync=1`` (every step).
Rank 0 prints the table.
"""

from __future__ import annotations

import argparse
import time

import numpy as np

import replicate as rp


def build(model):
    rng = np.random.default_rng(0)
    if model == "soak":
        X = rng.normal(size=(512, 8)).astype(np.float32)
        Y = (X[:, :4].sum(1) > 0).astype(np.int64)
        net = rp.nn.Sequential(rp.nn.Linear(8, 32, rng=rng), rp.nn.relu, rp.nn.Dropout(0.1),
                               rp.nn.Linear(32, 2, rng=rng))
        batch, k = 16, 2
    else:
        X = rng.normal(size=(1024, 784)).astype(np.float32)
        Y = rng.integers(0, 10, size=1024).astype(np.int64)
        net = rp.nn.Sequential(rp.nn.Linear(784, 1024, rng=rng), rp.nn.relu,
                               rp.nn.Linear(1024, 1024, rng=rng), rp.nn.relu,
                               rp.nn.Linear(1024, 10, rng=rng))
        batch, k = 64, 1
    opt = rp.wrap_optimizer(rp.optim.Adam(net.parameters(), lr=1e-3))

    def input_fn(ctx):
        return rp.shard_batches((X, Y), batch_size=batch, ctx=ctx, epochs=None)

    def step_fn(b):
        x, y = b
        loss = rp.nn.functional.softmax_cross_entropy(net(x), y).mean()
        opt.apply(rp.grad(loss, net.parameters()))
        return {"loss": loss}

    return rp.Replicator(input_fn, step_fn, replicas_per_rank=k, check_sync=False), net, opt


def median_time(fn, repeats):
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return float(np.median(times))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=400)
    ap.add_argument("--model", default="soak", choices=["soak", "mlp"])
    a = ap.parse_args()
    rep, net, opt = build(a.model)
    rep.run(20)  # compile, warm up
    chunk = 50
    step_s = median_time(lambda: rep.run(chunk), max(a.steps // chunk, 3)) / chunk
    verify_s = median_time(rep.verify_sync, 50)
    nbytes = sum(v.value.nbytes for v in rep.variables())
    if rep.rank == 0:
        per_run = verify_s / chunk
        per_ckpt = verify_s / 100
        rows = [
            ("step (check_sync=False)", step_s * 1e3, 1.0),
            ("one comparison (verify_sync)", verify_s * 1e3, verify_s / step_s),
            (f"default, per step (run({chunk}) calls + ckpt/100)", (per_run + per_ckpt) * 1e3,
             (per_run + per_ckpt) / step_s),
            ("check_sync=1, per step", verify_s * 1e3, verify_s / step_s),
        ]
        print(f"model {a.model}: {len(rep.variables())} variables, {nbytes / 2**20:.2f} MiB, "
              f"{rep.num_ranks} processes x {rep.k} replicas")
        print(f"{'what':48s} {'ms':>9s} {'of a step':>10s}")
        for name, ms, ratio in rows:
            print(f"{name:48s} {ms:9.4f} {ratio * 100:9.2f}%")


if __name__ == "__main__":
    main()
