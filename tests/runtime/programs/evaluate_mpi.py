"""``Replicator.evaluate`` across processes (tests/runtime/test_evaluate.py).

    mpiexec -n 2 python evaluate_mpi.py MODE K

Each rank prints ``rank R totals <json>`` for two evaluations with a training run between them,
and ``rank R traces <n>``: how often the evaluation step was traced.
"""

import json
import sys

import numpy as np

import replicate as rp
import replicate.numpy as rnp

mode, k = sys.argv[1], int(sys.argv[2])
rank = rp.process_index()
rng = np.random.default_rng(0)
X, Y = rng.normal(size=(103, 4)), rng.integers(0, 3, size=103)
w = rp.Variable(rng.normal(size=(4, 3)), name="w")
opt = rp.wrap_optimizer(rp.optim.SGD([w], lr=0.1))


def train_step(batch):
    x, y = batch
    loss = rp.nn.softmax_cross_entropy(x @ w, y).mean()
    opt.apply([rp.grad(loss, w)])
    return {"loss": loss}


def eval_step(batch):
    (x, y), mask = batch
    return {"count": rnp.sum(mask), "row_sum": rnp.sum(rnp.sum(x, axis=1) * mask),
            "correct": rnp.sum((rnp.argmax(x @ w, axis=-1) == y) * mask)}


rep = rp.Replicator(lambda ctx: rp.shard_batches((X, Y), 8, ctx, epochs=None), train_step,
                    mode=mode, replicas_per_rank=k)
for _ in range(2):
    totals = rep.evaluate((X, Y), eval_step, batch_size=5)
    want = float(np.sum(np.argmax(X @ w.numpy(), axis=-1) == Y))
    sys.stdout.write(f"rank {rank} totals {json.dumps({k: float(v) for k, v in totals.items()})}"
                     f" want {want}\n")
    rep.run(3)
sys.stdout.write(f"rank {rank} traces {rep._evaluators[eval_step][0].trace_count}\n")
