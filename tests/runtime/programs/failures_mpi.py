"""Programs that go wrong on one rank, for tests/runtime/test_mpi.py: each must end the whole job
with a nonzero exit and a clear message, never hang.

    mpiexec -n 2 python tests/runtime/programs/failures_mpi.py SCENARIO [--mode graph|eager] [--k K]
"""

from __future__ import annotations

import argparse
import sys

import numpy as np

import replicate as rp
import replicate.numpy as rnp
from replicate.runtime.communication.comm import world
from replicate.runtime.job.mpi_shm import mapped


def scenario(name, rank, mode):
    """(input_fn, step_fn) that misbehave on rank 1."""

    def input_fn(ctx):
        for i in range(5 if name == "runs-out" and rank == 1 else 10):
            if name == "input-raises" and rank == 1 and i == 3:
                raise RuntimeError("input failed on rank 1")
            yield np.full(4 + (name == "mismatch-shape" and rank == 1), float(ctx.replica_id))

    counter = {"calls": 0}
    summed = rp.function(lambda x: rp.all_reduce(x, "sum"))  # MARK function-all-reduce

    def step_fn(x):
        counter["calls"] += 1
        if name == "function-shape":  # (an eager step: rank 1's operand is longer)
            return {"y": summed(rnp.concatenate([x, x[:rank]])).sum()}
        if name == "mismatch-kind" and rank == 1:
            y = rp.all_gather(x, 0, tiled=True)[:4]  # MARK rank1-gather
        else:
            y = rp.all_reduce(x, "sum")  # MARK all-reduce
        # eager: the third step fails; graph: step_fn runs once (tracing), and fails there
        fail_at = 3 if mode == "eager" else 1
        if name == "step-raises" and rank == 1 and counter["calls"] == fail_at:
            raise RuntimeError("step failed on rank 1")
        return {"y": y.sum()}

    return input_fn, step_fn


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("scenario")
    ap.add_argument("--mode", default="graph")
    ap.add_argument("--k", type=int, default=1)
    a = ap.parse_args()
    rank = world().rank
    print(f"rank {rank} mpich-shm-mapped: {' '.join(mapped())}", flush=True)  # (for the tests)
    if a.scenario == "raises-outside":  # not inside the Replicator: plain Python code fails
        if rank == 1:
            raise ValueError("rank 1 failed outside the Replicator")
        world().allgather(np.ones(3))  # rank 0 would wait here forever
        sys.exit(0)
    input_fn, step_fn = scenario(a.scenario, rank, a.mode)
    history = rp.Replicator(input_fn, step_fn, mode=a.mode, replicas_per_rank=a.k).run(10)
    print(f"rank {rank} finished {len(history)} steps: "
          f"{[float(h['y']) for h in history]}", flush=True)
