"""Fault injection for tests/runtime/test_faults_mpi.py: one rank crashes, is killed, stalls, leaves
early or calls a different collective; the job must end (non-zero, within a bounded time, a clear
report naming the rank, the collective and the step), never hang.

    mpiexec -n 2 python tests/runtime/programs/faults_mpi.py SCENARIO [--mode graph|eager]
        [--rank R] [--at STEP] [--k K] [--steps N] [--token T]

Each rank prints ``rank R pid P`` once and ``rank R step S`` after every step, so a test can
kill a rank from outside at a known step.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import threading
import time

import numpy as np

import replicate as rp
import replicate.numpy as rnp
from replicate.runtime.communication.comm import world

SCENARIOS = ("ok", "raise", "kill-self", "stall-step", "stall-input", "stall-thread",
             "exit-early", "mismatch-later", "nan", "shape-change", "shape-change-ok", "duplicate")


def make(a, rank):
    w = rp.Variable(np.ones(4), name="w")
    bad = rank == a.rank

    def input_fn(ctx):
        step = ctx.start_step
        while True:
            step += 1
            if a.scenario == "stall-input" and bad and step == a.at:
                time.sleep(1000)  # MARK input-sleep
            if a.scenario.startswith("shape-change") and bad and step >= a.at:
                yield np.full((2, 4), ctx.replica_id + 1.0)  # MARK new-shape
                continue
            yield np.full(4, ctx.replica_id + 1.0)

    def step_fn(x):
        step = rep.step + 1
        if a.mode == "eager" and bad and step == a.at:
            if a.scenario == "raise":
                raise RuntimeError(f"injected failure on rank {rank} at step {step}")
            if a.scenario == "kill-self":
                os.kill(os.getpid(), signal.SIGKILL)
            if a.scenario == "stall-step":
                time.sleep(1000)  # MARK step-sleep
        loss = rnp.sum((x * w) ** 2)
        g = rp.all_reduce(rp.grad(loss, w), "mean")  # MARK first-collective
        if a.scenario == "mismatch-later" and bad:
            extra = rp.all_reduce(rnp.ones(3) * loss, "sum")  # MARK divergent
        else:
            extra = rp.all_reduce(rnp.ones(2) * loss, "sum")  # MARK common
        if a.scenario == "duplicate" and bad and (a.mode == "graph" or step == a.at):
            # the same call as the one every rank makes, made once more on one rank only
            extra = rp.all_reduce(rnp.ones(2) * loss, "sum")  # MARK duplicate
        if a.scenario == "shape-change":
            loss = loss + rp.all_reduce(x, "sum").sum()  # MARK batch-shaped
        if a.scenario == "nan" and (a.mode == "eager" and step == a.at or a.mode == "graph"):
            loss = loss * rnp.log(x - x.max())  # MARK nan-source
        w.assign(w - 0.01 * g)
        return {"loss": loss, "extra": extra.sum()}

    def callback(r, step, outputs):
        print(f"rank {rank} step {step}", flush=True)
        if a.mode == "graph" and bad and step == a.at:
            if a.scenario == "raise":
                raise RuntimeError(f"injected failure on rank {rank} after step {step}")
            if a.scenario == "kill-self":
                os.kill(os.getpid(), signal.SIGKILL)
        if a.scenario == "exit-early" and bad and step == a.at:
            print(f"rank {rank} leaves early", flush=True)
            sys.exit(0)

    rep = rp.Replicator(input_fn, step_fn, mode=a.mode, replicas_per_rank=a.k,
                        check_finite=a.scenario == "nan", collective_timeout=a.timeout)
    return rep, callback, w


def stall_thread(rank, a):
    """A communication thread (like the gradient-bucketing one) on a duplicate communicator:
    rank ``a.rank`` never joins its all-reduce."""
    comm = world().dup()
    if rank != a.rank:
        thread = threading.Thread(target=lambda: comm.allreduce(np.ones(50_000), "sum"),
                                  name="comm-thread")
        thread.start()
        thread.join()
    else:
        time.sleep(1000)  # MARK thread-sleep


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("scenario", choices=SCENARIOS)
    ap.add_argument("--mode", default="graph")
    ap.add_argument("--rank", type=int, default=1, help="the rank that misbehaves")
    ap.add_argument("--at", type=int, default=3, help="the step at which it does")
    ap.add_argument("--k", type=int, default=1)
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--sleep", type=float, default=0.0, help="seconds per step (kill tests)")
    ap.add_argument("--timeout", type=float, default=None, help="Replicator(collective_timeout)")
    ap.add_argument("--token", default="", help="a marker for finding orphans")
    a = ap.parse_args()
    rank = world().rank
    print(f"rank {rank} pid {os.getpid()}", flush=True)
    if a.scenario == "stall-thread":
        stall_thread(rank, a)
        return
    rep, callback, w = make(a, rank)
    callbacks = [callback]
    if a.sleep:
        callbacks.append(lambda r, s, o: time.sleep(a.sleep))
    history = rep.run(a.steps, callbacks=callbacks)
    print(f"rank {rank} finished {len(history)} steps", flush=True)


if __name__ == "__main__":
    main()
