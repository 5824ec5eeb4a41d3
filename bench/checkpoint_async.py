"""Asynchronous checkpoints: how long a save blocks training, against the synchronous save.

State: 200 MB of float64 Variables (a model's parameters and Adam state, say) beside a training
step (an MLP on 1024-wide layers, Adam, one process; the step's BLAS on one thread, the process
on both cores, so the writer's thread has one). A checkpoint every ``--every`` steps (default 5:
the interval a write needs to finish before the next save, as a real run spaces its
checkpoints), 15 steps in a run; ``rp.callbacks.Checkpoint(..., asynchronous=False)`` then
``True``, each the same run; rows alternate ``--rounds`` times. Blocked time: the time the
callback holds the step loop (the synchronous save: the whole write; the asynchronous one:
waiting for the previous write, if still in flight, and copying the state), the first save
apart from the later ones (its own target: it used to map the copy's 200 MB of fresh memory on
the step's thread; the buffers are now allocated and touched on a thread when the callback is
made). Page faults: the minor faults the first save took on the step's thread (``getrusage``).
Run time: the whole ``run`` (the last write included: ``run`` waits for it).

    python bench/checkpoint_async.py
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ[_var] = "1"  # the step's BLAS on one thread (set before NumPy starts it)

import _common as C  # noqa: E402

STATE_MB = 200
RUSAGE_THREAD = getattr(resource, "RUSAGE_THREAD", resource.RUSAGE_SELF)  # (Linux: this thread)


class Timed:
    """A callback's blocked time per call."""

    def __init__(self, cb):
        self.cb, self.times, self.faults = cb, [], []

    def __call__(self, rep, step, outputs):
        f0 = resource.getrusage(RUSAGE_THREAD).ru_minflt
        t0 = time.perf_counter()
        self.cb(rep, step, outputs)
        if step % self.cb.every == 0:
            self.times.append(time.perf_counter() - t0)
            self.faults.append(resource.getrusage(RUSAGE_THREAD).ru_minflt - f0)

    def wait(self):
        self.cb.wait()


def one_run(asynchronous: bool, folder: str, steps: int, mb: int, every: int):
    import numpy as np

    import replicate as rp
    import replicate.numpy as rnp

    rng = np.random.default_rng(0)
    held = [rp.Variable(rng.standard_normal(mb * 2**20 // 8 // 4), name=f"held{i}")
            for i in range(4)]  # the 200 MB the checkpoint writes
    ws = [rp.Variable(rng.standard_normal((1024, 1024)) / 32, name=f"w{i}") for i in range(3)]
    opt = rp.wrap_optimizer(rp.optim.Adam(ws, lr=1e-3))
    x = rng.standard_normal((512, 1024))

    def input_fn(ctx):
        while True:
            yield x

    def step_fn(xb):
        h = xb
        for w in ws:
            h = rnp.tanh(h @ w)
        loss = rnp.mean(h * h)
        opt.apply(rp.grad(loss, ws))
        return {"loss": loss}

    rep = rp.Replicator(input_fn, step_fn)
    rep.run(steps=2)  # compiled, warm
    ck = Timed(rp.callbacks.Checkpoint(os.path.join(folder, "ck-{step}.npz"),
                                       {"held": held, "w": ws, "opt": opt.variables()},
                                       every=every, keep=2, asynchronous=asynchronous))
    t0 = time.perf_counter()
    rep.run(steps=steps, callbacks=[ck])
    return ck.times, ck.faults[0], time.perf_counter() - t0


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=15)
    ap.add_argument("--every", type=int, default=5)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--mb", type=int, default=STATE_MB)
    args = ap.parse_args(argv)
    load = os.getloadavg()[0]
    rows = {a: {"blocked": [], "first": [], "first_faults": [], "run": []} for a in (False, True)}
    for _ in range(args.rounds):
        for asynchronous in (False, True):
            with tempfile.TemporaryDirectory() as folder:
                times, faults, total = one_run(asynchronous, folder, args.steps, args.mb,
                                               args.every)
            row = rows[asynchronous]
            row["first"].append(times[0])
            row["first_faults"].append(faults)
            row["blocked"].extend(times[1:])
            row["run"].append(total)
    med = {a: {k: statistics.median(v) for k, v in r.items()} for a, r in rows.items()}
    m = C.machine()
    print(f"{m['cpu']}, {m['cores']} cores, Python {m['python']}, {m['date']}; load (1-min "
          f"average) before: {load:.1f}, after: {os.getloadavg()[0]:.1f}; {args.mb} MB of "
          f"state, a save every {args.every} steps, {args.steps} steps, {args.rounds} rounds\n")
    print("| save | blocked per save after the first, median (ms) | first save, median (ms) "
          f"| first save's page faults | run of {args.steps} steps (s) |")
    print("|---|---|---|---|---|")
    for a, name in ((False, "synchronous"), (True, "asynchronous")):
        print(f"| {name} | {med[a]['blocked'] * 1e3:.0f} | {med[a]['first'] * 1e3:.0f} | "
              f"{med[a]['first_faults']:.0f} | {med[a]['run']:.2f} |")
    for key, what in (("blocked", "later saves"), ("first", "first save")):
        ratio = med[True][key] / med[False][key]
        print(f"\nblocked time, asynchronous / synchronous, {what}: {ratio:.2f}× (target ≤ 0.2×)",
              end="")
    print()
    os.makedirs(C.RESULTS_DIR, exist_ok=True)
    with open(os.path.join(C.RESULTS_DIR, "checkpoint_async.json"), "w") as f:
        json.dump({"load_before": load, "args": vars(args), "rows": {str(k): v for k, v in
                                                                      rows.items()}}, f, indent=1)


if __name__ == "__main__":
    main()
