"""A step that fails to compile on rank 1 only, for tests/api/test_error_types.py: every rank must
raise the failing rank's error class, rank 0 naming rank 1.

    mpiexec -n 2 python tests/runtime/programs/compile_error_mpi.py SCENARIO OUT

SCENARIO: ``mismatch`` (rank 1's two local replicas call different collectives: a
``CollectiveMismatchError``) or ``dtype`` (rank 1 negates a bool: a ``DTypeError``). Each rank
writes ``{"type", "message", "consistent"}`` of what it caught to ``OUT.rank<r>.json``.
"""

import json
import sys

import numpy as np

import replicate as rp
import replicate.numpy as rnp
from replicate.runtime.communication.comm import world


def input_fn(ctx):
    while True:
        yield np.full(4, float(ctx.replica_id))


def make_step(scenario, rank):
    traced = {"calls": 0}

    def step_fn(x):
        traced["calls"] += 1
        if rank == 1 and scenario == "mismatch" and traced["calls"] == 2:  # local replica 1
            y = rp.all_gather(x, 0, tiled=True)[:4]
        else:
            y = rp.all_reduce(x, "sum")
        if rank == 1 and scenario == "dtype":
            y = y + rnp.cast(-(x > 0), x.dtype)  # neg of a bool
        return {"y": rnp.sum(y)}

    return step_fn


def main(scenario, out):
    rank = world().rank
    caught = None
    try:
        rp.Replicator(input_fn, make_step(scenario, rank), replicas_per_rank=2).run(2)
    except rp.ReplicateError as e:
        caught = {"type": type(e).__name__, "message": str(e),
                  "consistent": bool(getattr(e, "consistent", False))}
    with open(f"{out}.rank{rank}.json", "w") as f:
        json.dump(caught, f)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
