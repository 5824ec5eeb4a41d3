"""rp.custom_vjp in a Replicator step across processes (tests/graph/test_custom_vjp.py).

    mpiexec -n 2 python custom_vjp_mpi.py MODE K
"""

import sys

import numpy as np

import replicate as rp
import replicate.numpy as rnp


@rp.custom_vjp
def clip_gradient(x):
    return x


clip_gradient.defvjp(lambda x: (x, None), lambda res, g: (rnp.clip(g, -1.0, 1.0),))


def main():
    mode, k = sys.argv[1], int(sys.argv[2])
    w = rp.Variable(np.array([1.0, 1.0]), name="w")

    def input_fn(ctx):
        while True:
            yield np.array([0.5, 4.0]) * (ctx.replica_id + 1)  # slopes; clipped above 1

    def step_fn(x):
        loss = rnp.sum(clip_gradient(w) * x)
        g = rp.all_reduce(rp.grad(loss, w), "mean")
        w.assign(w - g)
        return {"g": g}

    hist = rp.Replicator(input_fn, step_fn, mode=mode, replicas_per_rank=k).run(1)
    rank = rp.runtime.communication.comm.world().rank
    sys.stdout.write(f"rank {rank} g {hist[0]['g'].tolist()} w {w.numpy().tolist()}\n")


if __name__ == "__main__":
    main()
