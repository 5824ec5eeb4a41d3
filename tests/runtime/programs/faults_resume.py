"""Train, checkpointing every few steps; resume from the newest intact checkpoint when asked. For
tests/runtime/test_faults_mpi.py (kill -9 mid-training, restart, compare bitwise with an
uninterrupted run) and tests/runtime/test_faults.py (one process).

    mpiexec -n 2 python tests/runtime/programs/faults_resume.py OUT --steps N [--ckpt PATTERN]
        [--resume] [--sleep S] [--mode graph|eager] [--k K | --num-replicas R]
        [--auto] [--kill-at S --victim R] [--raise-at S]

``--auto``: resume from the newest checkpoint if there is one (a job restarted by
``replicate.launch --max-restarts``); ``--kill-at S``: on the first attempt (``REPLICATE_RESTART``
0) rank ``--victim`` kills itself with SIGKILL after step S; ``--raise-at S``: rank ``--victim``
raises at step S on every attempt (a bug, not a fault). Used by tests/runtime/test_restart.py.

Rank 0 writes OUT, rank r > 0 writes OUT.rank<r>.npz: every variable, the step and the losses.
Each rank prints ``rank R pid P`` once and ``rank R step S`` after every step.
"""

from __future__ import annotations

import argparse
import os
import signal
import time

import numpy as np

import replicate as rp


def say(text):
    """One line in one write (the ranks share the pipe; print writes the end apart)."""
    os.write(1, (text + "\n").encode())


def make(mode="graph", k=1, num_replicas=None):
    rng = np.random.default_rng(0)
    X = rng.normal(size=(256, 6))
    Y = (X[:, :3].sum(1) > 0).astype(np.int64)
    model = rp.nn.Sequential(rp.nn.Linear(6, 16, rng=rng, dtype=np.float64), rp.nn.relu,
                             rp.nn.Dropout(0.2, seed=3), rp.nn.Linear(16, 2, rng=rng,
                                                                      dtype=np.float64))
    opt = rp.wrap_optimizer(rp.optim.Adam(model.parameters(), lr=0.01))

    def input_fn(ctx):
        return rp.shard_batches((X, Y), batch_size=8, ctx=ctx, seed=1, epochs=None)

    def step_fn(batch):
        x, y = batch
        loss = rp.nn.softmax_cross_entropy(model(x), y).mean()
        opt.apply(rp.grad(loss, model.parameters()))
        return {"loss": loss}

    rep = rp.Replicator(input_fn, step_fn, mode=mode, **(
        {"num_replicas": num_replicas} if num_replicas else {"replicas_per_rank": k}))
    state = {"model": model.variables(), "opt": opt.variables()}
    return rep, state


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--steps", type=int, default=30, help="total steps, counting resumed ones")
    ap.add_argument("--ckpt", default=None, help="checkpoint pattern with {step}")
    ap.add_argument("--every", type=int, default=3)
    ap.add_argument("--resume", action="store_true")
    ap.add_argument("--sleep", type=float, default=0.0)
    ap.add_argument("--mode", default="graph")
    ap.add_argument("--k", type=int, default=1)
    ap.add_argument("--token", default="", help="a marker for finding orphans")
    ap.add_argument("--num-replicas", type=int, default=None)
    ap.add_argument("--auto", action="store_true")
    ap.add_argument("--kill-at", type=int, default=None)
    ap.add_argument("--raise-at", type=int, default=None)
    ap.add_argument("--victim", type=int, default=1)
    a = ap.parse_args(argv)
    rep, state = make(a.mode, a.k, a.num_replicas)
    attempt = os.environ.get("REPLICATE_RESTART", "")
    say(f"rank {rep.rank} pid {os.getpid()} attempt {attempt}")
    if a.resume or a.auto:
        rep.restore(a.ckpt, state, missing_ok=a.auto)
        say(f"rank {rep.rank} resumed at step {rep.step}")

    def progress(r, step, outputs):
        say(f"rank {r.rank} step {step}")
        if a.sleep:
            time.sleep(a.sleep)
        if r.rank == a.victim and step == a.kill_at and attempt in ("", "0"):
            os.kill(os.getpid(), signal.SIGKILL)
        if r.rank == a.victim and step == a.raise_at:
            raise ValueError(f"boom at step {step}")

    callbacks = [progress]
    if a.ckpt:
        callbacks.insert(0, rp.callbacks.Checkpoint(a.ckpt, state, every=a.every, keep=3))
    hist = rep.run(a.steps - rep.step, callbacks=callbacks)
    arrays = {name: var.value for name, var in rp.checkpoint.named_variables(state).items()}
    out = a.out if rep.rank == 0 else f"{a.out}.rank{rep.rank}.npz"
    np.savez(out, _step=np.array(rep.step), _losses=np.array([h["loss"] for h in hist]), **arrays)
    say(f"rank {rep.rank} finished at step {rep.step}")


if __name__ == "__main__":
    main()
