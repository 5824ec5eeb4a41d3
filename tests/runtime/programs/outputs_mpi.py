"""A step's outputs on 2 processes, gathered per step (a callback reads them) and deferred
(nothing reads them before run returns: one exchange for up to LIMIT steps); prints OK.

    mpiexec -n 2 python tests/runtime/programs/outputs_mpi.py
"""

from __future__ import annotations

import numpy as np

import replicate as rp
from replicate.runtime.loop import outputs as outputs_module

STEPS, K = 20, 2


def make(outputs):
    w = rp.Variable(np.float64(1.0), name="w")

    def input_fn(ctx):
        for step in range(1000):
            yield np.full(3, 100.0 * ctx.replica_id + step)

    def step_fn(x):
        loss = (w * x).sum()
        w.assign(w - 1e-4 * rp.all_reduce(rp.grad(loss, w), "mean"))
        return {"loss": loss, "first": x[0].astype(np.int64), "w": w}
    return rp.Replicator(input_fn, step_fn, replicas_per_rank=K, outputs=outputs)


if __name__ == "__main__":
    outputs_module.LIMIT = 7  # a flush after steps 7 and 14, the rest at the end of run
    flushes = []
    _flush = outputs_module.Deferred.flush

    def counting(self, history):
        flushes.append(len(self.waiting))
        return _flush(self, history)
    outputs_module.Deferred.flush = counting
    R = K * rp.process_count()
    for outputs in ("per_replica", "mean"):
        seen = []
        per_step = make(outputs).run(STEPS, callbacks=[lambda rep, s, out: seen.append(out)])
        deferred_rep = make(outputs)
        deferred = deferred_rep.run(STEPS - 5) + deferred_rep.run(5)  # two runs: both flushed
        assert len(per_step) == len(deferred) == len(seen) == STEPS
        for step, (a, b, c) in enumerate(zip(per_step, deferred, seen)):
            for key in a:
                assert np.array_equal(a[key], b[key]) and np.array_equal(a[key], c[key]), \
                    (outputs, step, key, a[key], b[key])
                assert np.asarray(b[key]).dtype == np.asarray(a[key]).dtype
            first = 100.0 * np.arange(R) + step  # replica r's batch at this step
            want = first if outputs == "per_replica" else first.mean()
            assert np.array_equal(b["first"], want.astype(np.int64) if outputs == "per_replica"
                                  else want), (outputs, step, b["first"], want)
    # deferred on several processes only (alone, the outputs are not exchanged at all)
    assert flushes == ([7, 7, 1, 5] * 2 if rp.process_count() > 1 else []), flushes

    # a newcomer's C habit: one batch buffer refilled in place, no prefetch copy, and the batch
    # itself returned as an output: each step's output is that step's batch, not the last one
    def refilled(ctx):
        buffer = np.zeros(2)
        for step in range(STEPS):
            buffer[:] = step
            yield buffer

    for callbacks in ([], [lambda rep, s, out: None]):
        got = rp.Replicator(refilled, lambda x: {"x": x * 1.0, "same": x}, prefetch=0,
                            outputs="per_replica").run(callbacks=callbacks)
        assert [float(h["same"][0, 0]) for h in got] == list(range(STEPS)), got
    # a scalar's all_reduce and all_gather: the same shapes and values in both modes (eager's
    # exchange once made a 0-d value 1-d: a loss came back (P, 1) per replica, not (P,))
    def scalars(x):
        s = (x * 2.0).sum()
        return {"mean": rp.all_reduce(s, "mean"), "max": rp.all_reduce(s, "max"),
                "all": rp.all_gather(s)}

    def ones(ctx):
        while True:
            yield np.full(2, ctx.replica_id + 1.0)

    P = rp.process_count()
    got = {mode: rp.Replicator(ones, scalars, mode=mode, outputs="per_replica").run(2)
           for mode in ("graph", "eager")}
    for a, b in zip(got["graph"], got["eager"]):
        assert a["mean"].shape == b["mean"].shape == (P,), (a, b)
        assert a["all"].shape == b["all"].shape == (P, P), (a, b)
        for key in a:
            assert np.array_equal(a[key], b[key]), (key, a[key], b[key])
    print("OK", rp.process_index())
