"""``rp.ActorLearner`` across processes, for tests/runtime/test_actor_learner_mpi.py.

    mpiexec -n N python tests/runtime/programs/actor_learner_mpi.py SCENARIO [--token T]

``ok`` runs, one after the other in one job: actor processes (the last process acts with 2
threads, the others learn; graph mode, the learners' gradients averaged across them) twice;
every process learning with an actor thread of its own (eager mode); a crashed actor with
``on_actor_failure="continue"``; a slow actor. Each checks the lags, the publications and that
every process returns the same history, and rank 0 prints ``OK <case>``. The other scenarios
end the job: ``crash`` (an actor process's actor raises), ``crash-threads`` (an actor thread in
a learner process raises), ``learner-fails`` (a learner's step raises), ``stall`` (an actor
hangs; run with a short REPLICATE_COLLECTIVE_TIMEOUT).
"""

from __future__ import annotations

import argparse
import sys
import time
import zlib

import numpy as np

import replicate as rp

SCENARIOS = ("ok", "crash", "crash-threads", "learner-fails", "stall")


def say(text):
    """One line in one write (print writes the newline apart: the ranks' lines would mix)."""
    sys.stdout.write(text + "\n")
    sys.stdout.flush()


def counting(layout, mode="graph", publish_every=2, actors=2, fail=None, slow=False,
             policy="abort", fail_step=None):
    """A learner whose ``count`` Variable is its number of updates: the actors record the
    count they act with, so the lags can be checked exactly."""
    n = rp.process_count()
    count = rp.Variable(np.zeros((), np.int64), name="count")
    w = rp.Variable(np.zeros(3), name="w")
    opt = rp.wrap_optimizer(rp.optim.SGD([w], lr=0.1))  # (averaged over the learners)

    def actor_fn(ctx):
        for i in range(1, 10 ** 9):
            if fail is not None and ctx.actor_id == fail and i == 3:
                raise RuntimeError(f"injected failure in actor {ctx.actor_id}")  # MARK crash
            if scenario == "stall" and i == 2:
                time.sleep(1000)  # MARK actor-sleep
            if slow:
                time.sleep(0.02)
            yield {"x": np.full(3, ctx.actor_id + 1.0), "seen": count.numpy().copy()}

    def step_fn(traj, lag):
        if fail_step is not None and rp.process_index() == 0 and int(count) + 1 == fail_step:
            raise RuntimeError("injected learner failure")  # MARK learner
        loss = ((traj["x"] * w - 1.0) ** 2).mean()
        opt.apply([rp.grad(loss, w)])
        expected = count - traj["seen"]
        count.assign(count + 1)
        return {"lag": lag, "expected": expected, "seen": traj["seen"], "loss": loss}

    actor_ranks = [n - 1] if layout == "processes" else []
    return rp.ActorLearner(actor_fn, step_fn, params=[count, w], actors=actors,
                           actor_ranks=actor_ranks, batch_size=2, publish_every=publish_every,
                           mode=mode, outputs="per_replica", on_actor_failure=policy), count, w


def check(name, al, history, steps, publish_every):
    assert len(history) == steps, (name, len(history))
    for step, out in enumerate(history):
        lag, expected = np.asarray(out["lag"]), np.asarray(out["expected"])
        assert lag.dtype == np.int64 and (lag >= 0).all(), (name, step, lag)
        np.testing.assert_array_equal(lag, expected, err_msg=f"{name} step {step + 1}")
        seen = np.asarray(out["seen"])
        assert (seen % publish_every == 0).all(), (name, step, seen)  # only published versions
    digest = zlib.crc32(np.concatenate([np.asarray(h["loss"], np.float64).ravel()
                                        for h in history]).tobytes())
    everyone = rp.host.all_gather_object(digest)
    assert len(set(everyone)) == 1, (name, everyone)  # the same history on every process
    if rp.is_main_process():
        say(f"OK {name}")


def ok(only_processes=False):
    n = rp.process_count()
    al, count, w = counting("processes", publish_every=2)
    first = al.run(steps=6)
    check("processes", al, first, 6, 2)
    second = al.run(steps=4)  # the actors were stopped by the learners; they start again
    check("processes-second-run", al, second, 4, 2)
    assert int(count.numpy()) == 10 or not al.is_learner
    # the learners' update was averaged across the learners: one value (the actor's is its own)
    ws = rp.host.all_gather_object(w.numpy().tolist() if al.is_learner else None)
    learners = [x for x in ws if x is not None]
    assert len(learners) == n - 1 and all(x == learners[0] for x in learners), ws
    assert learners[0] != [0.0, 0.0, 0.0], ws  # (and the updates did happen)
    if rp.is_main_process():
        say(f"OK learners-agree ({n - 1} learner(s))")
    if only_processes:
        return

    al, _, _ = counting("threads", mode="eager", publish_every=1, actors=1)
    check("threads-eager", al, al.run(steps=5), 5, 1)

    # (slow: the learners' 12 steps outlast the failing actor's first 3 trajectories, whatever
    # the load)
    al, _, _ = counting("processes", publish_every=1, fail=1, policy="continue", slow=True)
    history = al.run(steps=12)
    check("continue", al, history, 12, 1)

    al, _, _ = counting("processes", publish_every=1, slow=True)
    check("slow", al, al.run(steps=4), 4, 1)


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("scenario", choices=SCENARIOS)
    ap.add_argument("--token", default="")
    ap.add_argument("--only-processes", action="store_true", help="ok: the first case only")
    args = ap.parse_args()
    scenario = args.scenario
    if scenario == "ok":
        ok(args.only_processes)
    elif scenario in ("crash", "stall"):
        al, _, _ = counting("processes", fail=1 if scenario == "crash" else None, actors=2)
        al.run(steps=50)
    elif scenario == "crash-threads":
        al, _, _ = counting("threads", fail=1, actors=1)
        al.run(steps=50)
    elif scenario == "learner-fails":
        al, _, _ = counting("processes", mode="eager", fail_step=3)
        al.run(steps=50)
    say(f"rank {rp.process_index()} finished")
