"""Soak: many steps of a small model; report the resident memory (RSS) over time and the
compiled-step cache. For tests/runtime/test_soak.py; runs in one process or under ``mpiexec -n 2``.

    python tests/runtime/programs/faults_soak.py --steps 10000 [--mode graph|eager] [--k K]
        [--sample N] [--ckpt DIR] [--one-run] [--leak BYTES]

The steps run as ``run(N)`` calls of ``--sample`` steps each, and after each call every rank
records its RSS, the number of compiled signatures (``len(rep.cache)``) and of traces. The
history a call returns is dropped before the next, as a training loop that logs and moves on
would: ``run`` returns one entry per step (a few hundred bytes with one scalar output), which is
the caller's data, not the library's memory. ``--one-run`` instead runs all steps in one
``run(steps)`` call, keeping its whole history, and samples from a callback. ``--leak BYTES``
keeps BYTES more per step (to check that the test catches a leak; not used by the tests).

Prints one JSON line (rank 0): steps, seconds, steps_per_s, samples (the step after which each
sample was taken), rss (MiB, one list per rank), cache and traces (per sample, rank 0), loss
(first and last step).
"""

from __future__ import annotations

import argparse
import json
import os
import time

import numpy as np

import replicate as rp


def rss_mib() -> float:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return float("nan")


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=1000)
    ap.add_argument("--mode", default="graph")
    ap.add_argument("--k", type=int, default=2, help="replicas per process (graph mode)")
    ap.add_argument("--sample", type=int, default=50, help="steps between RSS samples")
    ap.add_argument("--ckpt", default=None, help="folder for a checkpoint every 100 steps")
    ap.add_argument("--one-run", action="store_true", help="one run(steps), history kept")
    ap.add_argument("--leak", type=int, default=0, help="bytes to keep per step (self-check)")
    a = ap.parse_args(argv)
    rng = np.random.default_rng(0)
    X = rng.normal(size=(512, 8)).astype(np.float32)
    Y = (X[:, :4].sum(1) > 0).astype(np.int64)
    model = rp.nn.Sequential(rp.nn.Linear(8, 32, rng=rng), rp.nn.relu, rp.nn.Dropout(0.1),
                             rp.nn.Linear(32, 2, rng=rng))
    opt = rp.wrap_optimizer(rp.optim.Adam(model.parameters(), lr=1e-3), max_grad_norm=1.0)

    def input_fn(ctx):
        return rp.shard_batches((X, Y), batch_size=16, ctx=ctx, epochs=None)

    def step_fn(batch):
        x, y = batch
        loss = rp.nn.softmax_cross_entropy(model(x), y).mean()
        opt.apply(rp.grad(loss, model.parameters()))
        return {"loss": loss}

    k = a.k if a.mode == "graph" else 1
    rep = rp.Replicator(input_fn, step_fn, mode=a.mode, replicas_per_rank=k, check_finite=True)
    steps_at, rss, cache, traces, leaked = [], [], [], [], []

    def sample(r, step, outputs=None):
        steps_at.append(step)
        rss.append(round(rss_mib(), 3))
        cache.append(len(r.cache))
        traces.append(r.trace_count)

    callbacks = []
    if a.leak:
        callbacks.append(lambda r, s, o: leaked.append(bytearray(a.leak)))
    if a.ckpt:
        state = {"model": model.variables(), "opt": opt.variables()}
        callbacks.append(rp.callbacks.Checkpoint(os.path.join(a.ckpt, "ck-{step}.npz"), state,
                                                 every=100, keep=2))
    t0 = time.perf_counter()
    if a.one_run:
        hist = rep.run(a.steps, callbacks=callbacks + [rp.callbacks.Every(a.sample, sample)])
        first, last = hist[0], hist[-1]
    else:
        first = None
        while rep.step < a.steps:
            hist = rep.run(min(a.sample, a.steps - rep.step), callbacks=callbacks)
            first = first or hist[0]
            last = hist[-1]
            sample(rep, rep.step)
    seconds = time.perf_counter() - t0
    every_rss = rep.comm.allgather_obj(rss)
    if rep.rank == 0:
        print(json.dumps({"steps": rep.step, "seconds": round(seconds, 2),
                          "steps_per_s": round(rep.step / seconds, 1), "samples": steps_at,
                          "rss": every_rss, "cache": cache, "traces": traces,
                          "loss": [float(first["loss"]), float(last["loss"])]}),
              flush=True)


if __name__ == "__main__":
    main()
