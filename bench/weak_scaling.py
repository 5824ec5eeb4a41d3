"""Weak scaling, 1 vs 2 processes (1 thread each), per-replica batch fixed: replicate vs DDP.

Model: the MLP 784-1024-1024-10 of ``step_time.py``, softmax cross-entropy, SGD, float32, batch
256 per replica, gradients averaged over all replicas every step (``rp.wrap_optimizer`` /
``DistributedDataParallel`` with gloo). Each process is one replica. Efficiency at 2 processes
is ``samples/s (2 processes) / (2 x samples/s (1 process))``. Two reference rows in the same
run: the step in hand-written NumPy with one mpi4py ``Allreduce`` of the packed gradients (the
raw-MPI peer), and the same without any communication — two processes that share nothing but
the machine (its memory bandwidth and caches), the ceiling this machine allows.

    python bench/weak_scaling.py            # runs mpiexec -n 1 and -n 2 itself, 3 pairs a row
    python bench/weak_scaling.py --quick

Each process is pinned to its own core (XLA's CPU runtime otherwise spreads over every core
whatever its thread flags say, which makes a "1 process" baseline use two).

Timing: warm-up steps, then rounds of ``--steps`` steps, a barrier before and after each round,
the slowest rank's time; median over rounds. Each row runs on 1 process, then on 2, ``--pairs``
times in a row (default 3): the efficiency is the median of the pairs' efficiencies (each pair
measured back to back shares the machine's background load, which drifts over minutes), the
ms/step columns the medians of the runs.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import statistics
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import _common as C  # noqa: E402
from _workers import ddp_mlp, replicate_mlp, timed_rounds  # noqa: E402
from step_time import (  # noqa: E402
    LR,
    MLP_SIZES,
    mlp_init,
    numpy_softmax_xent_grad,
)

BATCH = 256


def hand_runner(comm, params, x, y, communicate):
    """The same step in hand-written NumPy (``step_time.numpy_mlp_step``'s maths); with
    ``communicate``, the gradients packed into one buffer and averaged by one mpi4py
    ``Allreduce`` before the update (what a careful hand-written data-parallel program does);
    without, no communication at all: the ceiling this machine allows two processes."""
    import numpy as np
    from mpi4py import MPI

    params = [p.copy() for p in params]
    flat = np.empty(sum(p.size for p in params), np.float32)
    size = comm.Get_size()

    def step():
        w1, b1, w2, b2, w3, b3 = params
        h1 = x @ w1 + b1
        a1 = np.maximum(h1, 0)
        h2 = a1 @ w2 + b2
        a2 = np.maximum(h2, 0)
        loss, dz = numpy_softmax_xent_grad(a2 @ w3 + b3, y)
        da2 = dz @ w3.T
        da2 *= h2 > 0
        da1 = da2 @ w2.T
        da1 *= h1 > 0
        grads = (x.T @ da1, da1.sum(0), a1.T @ da2, da2.sum(0), a2.T @ dz, dz.sum(0))
        if communicate:
            offset = 0
            for g in grads:
                flat[offset:offset + g.size] = g.reshape(-1)
                offset += g.size
            comm.Allreduce(MPI.IN_PLACE, flat, op=MPI.SUM)
            np.multiply(flat, np.float32(1.0 / size), out=flat)
            offset, grads = 0, []
            for p in params:
                grads.append(flat[offset:offset + p.size].reshape(p.shape))
                offset += p.size
        for p, g in zip(params, grads):
            p -= np.float32(LR) * g
        return loss

    def run(steps):
        for _ in range(steps):
            loss = step()
        return float(loss)
    return run


ROWS = ("replicate graph numpy", "replicate graph jax", "replicate eager (numpy)",
        "PyTorch DDP (gloo)", "hand NumPy + mpi4py Allreduce", "hand NumPy, no communication")
CEILING = "hand NumPy, no communication"


def worker(args):
    """One row, one process count (a failing row must not take the others with it: the
    Replicator aborts the whole MPI job on an error)."""
    from mpi4py import MPI

    comm = MPI.COMM_WORLD
    rank = comm.Get_rank()
    C.pin_cpus(1, first=rank)  # XLA's CPU runtime uses every core it may, whatever its flags say
    C.set_torch_threads(1)
    sizes = (784, 128, 128, 10) if args.quick else MLP_SIZES
    params, _, _ = mlp_init(sizes, 1, seed=0)        # the same weights on every rank
    _, x, y = mlp_init(sizes, BATCH, seed=100 + rank)  # each replica its own batch
    steps = 3 if args.quick else args.steps
    rounds = 2 if args.quick else args.rounds
    if args.row == "PyTorch DDP (gloo)":
        run = ddp_mlp(comm, params, x, y)
    elif args.row.startswith("hand NumPy"):
        run = hand_runner(comm, params, x, y, communicate=args.row != CEILING)
    else:
        mode = "eager" if "eager" in args.row else "graph"
        run = replicate_mlp(params, x, y, mode=mode,
                            backend=args.row.split()[-1].strip("()"))[0]
    run(3)  # warm-up (and the one trace)
    times = timed_rounds(comm, run, steps, rounds)
    if rank == 0:
        timing = C.Timing(statistics.median(times), min(times), max(times), len(times))
        C.write_worker_json(args.json, {"name": args.row, "timing": timing, "note": ""})
    try:
        import torch.distributed as dist

        if dist.is_initialized():
            dist.destroy_process_group()
    except ImportError:
        pass


def launch(args):
    """Each row's 1- and 2-process runs, ``--pairs`` times back to back (1, 2, 1, 2, ...): the
    machine's background load drifts over minutes, and a pair measured together shares it."""
    results = {1: [], 2: []}
    os.makedirs(C.RESULTS_DIR, exist_ok=True)
    for row in ROWS:
        reason = None
        if row.startswith("replicate graph"):
            reason = C.backend_unavailable(row.split()[-1])
        if reason:
            for procs in (1, 2):
                results[procs].append({"name": row, "timing": None, "note": reason})
            continue
        runs = {1: [], 2: []}
        for _ in range(1 if args.quick else args.pairs):
            for procs in (1, 2):
                runs[procs].append(run_one(args, row, procs))
        for procs in (1, 2):
            results[procs].append(combine(row, runs[procs]))
    return {p: {"procs": p, "batch": BATCH, "rows": rows} for p, rows in results.items()}


def combine(row, runs):
    """One row from its runs: the median of their medians (and each run's median, in order)."""
    failed = [r for r in runs if r["timing"] is None]
    if failed:
        return failed[0]
    timings = [C.timing_from(r["timing"]) for r in runs]
    timing = C.Timing(statistics.median(t.median for t in timings), min(t.min for t in timings),
                      max(t.max for t in timings), sum(t.n for t in timings))
    return {"name": row, "timing": dataclasses.asdict(timing), "note": "",
            "runs": [t.median for t in timings]}


def run_one(args, row, procs):
    C.record_load()
    path = os.path.join(C.RESULTS_DIR, f".worker-weak-{procs}.json")
    cmd = [sys.executable, "-m", "replicate.launch", "-n", str(procs),
           os.path.abspath(__file__), "--worker", "--json", path, "--row", row,
           "--steps", str(args.steps), "--rounds", str(args.rounds)]
    if args.quick:
        cmd.append("--quick")
    t0 = time.perf_counter()
    try:
        proc = subprocess.run(cmd, env=C.thread_env(1), capture_output=True, text=True,
                              timeout=args.timeout)
    except subprocess.TimeoutExpired:
        return {"name": row, "timing": None, "note": f"timed out after {args.timeout} s"}
    print(f"[bench] weak_scaling.py: {row}, {procs} process(es): {time.perf_counter() - t0:.0f} s"
          f"{'' if proc.returncode == 0 else ' (failed)'}", file=sys.stderr, flush=True)
    if proc.returncode != 0 or not os.path.exists(path):
        return {"name": row, "timing": None, "note": C.failure_reason(proc.stdout + proc.stderr)}
    with open(path) as f:
        out = json.load(f)
    os.remove(path)
    return out


def report(results, command, quick):
    one = {d["name"]: d for d in results[1]["rows"]}
    two = {d["name"]: d for d in results[2]["rows"]}
    batch = results[1]["batch"]
    cells, eff = [], {}
    for name in one:
        t1 = C.timing_from(one[name]["timing"])
        t2 = C.timing_from(two.get(name, {}).get("timing"))
        note = one[name]["note"] or two.get(name, {}).get("note", "")
        if t1 is None or t2 is None:
            cells.append([name, "n/a", "n/a", "n/a", "n/a", "n/a", "n/a", "", note])
            continue
        s1, s2 = batch / t1.median, 2 * batch / t2.median
        # efficiency: the median over the back-to-back pairs of runs (one pair: the ratio)
        pairs = [a / b for a, b in zip(one[name].get("runs") or [t1.median],
                                       two[name].get("runs") or [t2.median])]
        eff[name] = statistics.median(pairs)
        cells.append([name, f"{t1.median * 1e3:.1f}", f"{t2.median * 1e3:.1f}", f"{s1:,.0f}",
                      f"{s2:,.0f}", f"{s2 / s1:.2f}x", f"{eff[name] * 100:.1f} %",
                      " / ".join(f"{p * 100:.0f}" for p in pairs), note])
    title = ("Weak scaling: 1 vs 2 processes x 1 thread, MLP 784-1024-1024-10, batch 256 per "
             "replica" + (" (quick: smaller MLP)" if quick else ""))
    text = [C.header(title, command),
            C.table(["implementation", "ms/step, 1 proc", "ms/step, 2 procs",
                     "samples/s, 1 proc", "samples/s, 2 procs", "speed-up", "efficiency",
                     "per pair, %", "note"], cells), ""]
    ddp = eff.get("PyTorch DDP (gloo)")
    lines = []
    ceiling = eff.get(CEILING)
    if ceiling is not None:
        lines.append(f"the ceiling on this machine (two processes that never communicate) is "
                     f"{ceiling * 100:.0f} %")
    for name, e in eff.items():  # issue 17: NumPy >= 90 %, JAX >= 85 %, ahead of DDP
        if not name.startswith("replicate"):
            continue
        target = None if "eager" in name else 0.85 if "jax" in name else 0.90
        ok = target is not None and round(e, 3) >= target
        ahead = ddp is not None and e > ddp
        goal = "no target" if target is None else \
            f"≥ {target * 100:.0f} %: {'met' if ok else 'not met'}"
        lines.append(f"{name}: {e * 100:.1f} % — {goal}; ahead of DDP "
                     f"({'n/a' if ddp is None else f'{ddp * 100:.1f} %'}): "
                     f"{'yes' if ahead else 'no'}")
    text.append("Targets: " + "; ".join(lines) + "\n")
    out = "\n".join(text)
    print(out)
    return out, eff


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="smoke run")
    ap.add_argument("--steps", type=int, default=10, help="steps per timed round")
    ap.add_argument("--rounds", type=int, default=5, help="timed rounds per row")
    ap.add_argument("--pairs", type=int, default=3,
                    help="back-to-back 1- and 2-process runs per row (efficiency: their median)")
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--json", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--row", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--timeout", type=int, default=300, help="seconds per row and process count")
    args = ap.parse_args(argv)
    if args.worker:
        return worker(args)
    results = launch(args)
    command = "python bench/weak_scaling.py" + (" --quick" if args.quick else "") + (
        f" --pairs {args.pairs}" if args.pairs != 3 and not args.quick else "")
    text, eff = report(results, command, args.quick)
    if not args.quick:
        C.save_json("weak_scaling", {"machine": C.machine(), "results": results,
                                     "efficiency": eff, "markdown": text})


if __name__ == "__main__":
    main()
