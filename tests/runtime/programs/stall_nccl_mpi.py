"""A rank that never joins an NCCL collective, for tests/runtime/test_faults_mpi.py: the cupy
backend on the CuPy stand-in with one (stand-in) GPU per rank, so its all-reduces go over the
stand-in's NCCL; rank 1 stalls before it enters its NCCL all-reduce at step 3. The watchdog of rank
0 must name the collective, its step and rank 1's line, and end the job.

    mpiexec -n 2 python tests/runtime/programs/stall_nccl_mpi.py
"""

from __future__ import annotations

import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(os.path.dirname(HERE)))  # tests/: conftest installs the stand-in
os.environ["REPLICATE_STANDIN_DEVICES"] = "2"
os.environ["REPLICATE_TRANSPORT"] = "nccl"

import numpy as np  # noqa: E402

import conftest  # noqa: E402, F401
import replicate as rp  # noqa: E402
import replicate.numpy as rnp  # noqa: E402
from replicate.runtime.communication import device_collectives  # noqa: E402
from replicate.runtime.job import watchdog  # noqa: E402

rank = rp.process_index()
if rank == 1:
    _watched = device_collectives.NcclTransport._watched

    def watched(self, op, x, run):
        if watchdog.TRACKER.step == 3:
            time.sleep(1000)  # MARK nccl-sleep
        return _watched(self, op, x, run)
    device_collectives.NcclTransport._watched = watched

w = rp.Variable(np.ones(4), name="w")


def input_fn(ctx):
    while True:
        yield np.full(4, ctx.replica_id + 1.0)


def step_fn(x):
    loss = rnp.sum((x * w) ** 2)
    w.assign(w - 0.01 * rp.all_reduce(rp.grad(loss, w), "sum"))  # MARK nccl-collective
    return {"loss": loss}


rep = rp.Replicator(input_fn, step_fn, backend="cupy", collective_timeout=2)
rep.run(5, callbacks=[lambda r, s, o: print(f"rank {rank} step {s}", flush=True)])
print(f"rank {rank} finished", flush=True)
