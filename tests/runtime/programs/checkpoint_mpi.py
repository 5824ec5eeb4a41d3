"""Checkpoints under two processes, for tests/runtime/test_checkpoint.py:

    mpiexec -n 2 python tests/runtime/programs/checkpoint_mpi.py OUT

1. ten saves, half to one fixed name and half to a ``{step}`` pattern: right after each ``save``
   returns, every rank reads the file itself (``checkpoint.load``, not the broadcast of
   ``restore``) and checks it holds this save's step and values, not the previous one's nor
   the next one's (rank 1 reads late, so a rank 0 that ran ahead would overwrite last.npz);
2. a save whose folder cannot be made (its parent is a file) must raise a ``CheckpointError``
   naming the path on every rank, after which the ranks still save together.

Each rank writes what it saw to ``OUT.rank<r>.json`` (the files go next to OUT).
"""

import json
import os
import sys
import time

import numpy as np

import replicate as rp
from replicate.runtime.communication.comm import world
from replicate.runtime.variables import checkpoint


def main(out):
    comm = world()
    folder = os.path.dirname(os.path.abspath(out))
    w = rp.Variable(np.zeros(1 << 18), name="w")  # 2 MB: a write that takes a moment
    b = rp.Variable(np.zeros(3, np.int32), name="b")
    state = {"w": w, "b": b}
    seen = {"rank": comm.rank, "size": comm.size, "reads": [], "error": None}

    for step in range(10):
        w.assign(np.full(w.shape, float(step)))
        b.assign(np.arange(3, dtype=np.int32) + step)
        path = (os.path.join(folder, "last.npz") if step % 2 else
                os.path.join(folder, "ck-{step:03d}.npz").format(step=step))
        rp.checkpoint.save(path, state, step=step)
        if comm.rank == 1:  # a slow reader: rank 0 must not overwrite last.npz before it read
            time.sleep(0.2)
        arrays, info = checkpoint.load(path)  # this rank's own read, straight after save
        ok = (info["step"] == step and np.all(arrays["w"] == step)
              and arrays["b"].tolist() == list(range(step, step + 3)))
        seen["reads"].append([step, info["step"], bool(ok)])

    blocker = os.path.join(folder, "a-file")
    if comm.rank == 0:
        with open(blocker, "w") as f:
            f.write("not a folder")
    try:
        rp.checkpoint.save(os.path.join(blocker, "ck.npz"), state, step=10)
    except Exception as e:  # noqa: BLE001 - recorded for the test
        seen["error"] = {"type": type(e).__name__, "message": str(e),
                         "consistent": getattr(e, "consistent", False)}
    rp.checkpoint.save(os.path.join(folder, "after.npz"), state, step=11)  # still together
    seen["after"] = checkpoint.load(os.path.join(folder, "after.npz"))[1]["step"]

    with open(f"{out}.rank{comm.rank}.json", "w") as f:
        json.dump(seen, f)


if __name__ == "__main__":
    main(sys.argv[1])
