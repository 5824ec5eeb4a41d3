"""Time the per-step input exchange (figure in guides/failure-behaviour.md; not a test):
``mpiexec -n 2 python tests/runtime/programs/agree_timing.py [N] [STEPS]``.

1. the exchange alone, interleaved: the former ``allgather(int64[1])`` of the input counts
   against the tagged ``agree`` header (``int64[4]``) that also carries the schedule fingerprint;
2. a whole step of a tiny model (one 4-element all-reduce; graph mode with 2 replicas per
   process, eager mode with 1): median step time over STEPS steps (run it before and after a
   change to compare).
"""

from __future__ import annotations

import sys
import time

import numpy as np

import replicate as rp
import replicate.numpy as rnp
from replicate.runtime.communication.agree import STEP, agree
from replicate.runtime.communication.comm import world


def exchange_times(comm, n):
    old, new = [], []
    for _ in range(n):
        comm.allgather(np.zeros(1))  # line the ranks up
        t = time.perf_counter()
        comm.allgather(np.array([1], np.int64))
        old.append(time.perf_counter() - t)
        comm.allgather(np.zeros(1))
        t = time.perf_counter()
        agree(comm, STEP, 0, 1, 12345, describe=str)
        new.append(time.perf_counter() - t)
    return np.array(old), np.array(new)


def step_times(steps, mode):
    w = rp.Variable(np.ones(4), name="w")

    def input_fn(ctx):
        while True:
            yield np.full(4, ctx.replica_id + 1.0)

    def step_fn(x):
        loss = rnp.sum((x * w) ** 2)
        w.assign(w - 0.01 * rp.all_reduce(rp.grad(loss, w), "mean"))
        return {"loss": loss}

    stamps = []
    rep = rp.Replicator(input_fn, step_fn, mode=mode, replicas_per_rank=2 if mode == "graph" else 1)
    rep.run(20)  # compile, warm up
    rep.run(steps, callbacks=[lambda r, s, o: stamps.append(time.perf_counter())])
    return np.diff(stamps)


if __name__ == "__main__":
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 5000
    steps = int(sys.argv[2]) if len(sys.argv) > 2 else 3000
    comm = world()
    old, new = exchange_times(comm, n)
    times = {mode: step_times(steps, mode) for mode in ("graph", "eager")}
    if comm.rank == 0:
        print(f"per-step exchange on {comm.size} ranks, x{n}: allgather(int64[1]) median "
              f"{np.median(old) * 1e6:.1f} us (min {old.min() * 1e6:.1f}); agree(int64[4]) "
              f"median {np.median(new) * 1e6:.1f} us (min {new.min() * 1e6:.1f})")
        for mode, t in times.items():
            print(f"{mode}-mode step (4-element all-reduce) x{steps}: median "
                  f"{np.median(t) * 1e6:.1f} us (10th percentile "
                  f"{np.percentile(t, 10) * 1e6:.1f} us), {1 / np.median(t):.0f} steps/s")
