"""The process API and early stopping across processes (tests/runtime/test_process_api.py).

    mpiexec -n N python host_mpi.py SCENARIO [MODE]

Each rank writes ``rank R <name> <json>`` lines.
"""

import json
import sys

import numpy as np

import replicate as rp


def say(name, value):
    sys.stdout.write(f"rank {rp.process_index()} {name} {json.dumps(value)}\n")


def host():
    p, n = rp.process_index(), rp.process_count()
    say("count", [p, n, rp.is_main_process()])
    say("sum", rp.host.all_reduce(np.array([p, 1.0]), "sum").tolist())
    say("mean", rp.host.all_reduce(np.array([p, 1.0]), "mean").tolist())
    say("max", int(rp.host.all_reduce(np.int64(p * 10), "max")))
    say("gather", rp.host.all_gather(np.array([p, p * p])).tolist())
    say("bcast", rp.host.broadcast(np.full(2, float(p)), root=n - 1).tolist())
    rp.barrier()
    try:
        rp.all_reduce(np.ones(2), "sum")  # the replica collective outside a step
    except rp.ReplicaContextError as e:
        say("outside", str(e).splitlines()[0])


def mismatch():
    """Rank 0 calls barrier, the others all_reduce: every rank names both calls."""
    try:
        if rp.process_index() == 0:
            rp.barrier()
        else:
            rp.host.all_reduce(np.ones(3), "sum")
    except rp.CollectiveMismatchError as e:
        say("mismatch", "barrier" in str(e) and "all_reduce(f64[3]" in str(e))


def early_stop(mode):
    """Only rank 0 asks to stop after step 3: every rank stops there; a second run continues
    with the very next batches."""
    seen = []

    def input_fn(ctx):
        for i in range(100):
            yield np.full(2, float(i))

    def step_fn(x):
        return {"x": rp.all_reduce(x, "mean")}

    def stopper(rep, step, outputs):
        seen.append(float(outputs["x"][0]))
        if step == 3 and rp.process_index() == 0:
            rep.stop()

    rep = rp.Replicator(input_fn, step_fn, mode=mode)
    hist = rep.run(10, callbacks=[stopper])
    say("first", [len(hist), rep.step])
    hist = rep.run(2)
    say("second", [float(h["x"][0]) for h in hist])
    say("seen", seen)


if __name__ == "__main__":
    scenario = sys.argv[1]
    if scenario == "host":
        host()
    elif scenario == "mismatch":
        mismatch()
    elif scenario == "early_stop":
        early_stop(sys.argv[2])
