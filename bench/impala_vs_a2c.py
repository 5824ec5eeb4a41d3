"""Environment steps per second and return against wall time: the synchronous A2C example
(examples/rl.py) against the asynchronous IMPALA example (examples/impala.py), in the same run
on this machine, each with its defaults and the same budget, 320 000 environment steps (A2C:
2000 updates of 160 transitions; IMPALA: 2000 of 160, trained to the end: ``--target 0``):

* ``a2c``: 2 processes x 2 replicas, each replica stepping its own 8 environments in lock-step
  with the updates (``prefetch=0``);
* ``impala 1+1 processes``: 1 learner process + 1 actor process (1 actor thread);
* ``impala 1+1 processes, 2 actor threads``: the same with 2 actor threads in the actor process;
* ``impala 2 x (learner + actor thread)``: every process learns (gradients averaged) and runs
  one actor thread beside its learner; an update takes a trajectory from each, so 1000 updates
  make the same 320 000 environment steps;
* ``impala 1 process: learner + actor thread`` (and ``+ 2 actor threads``): one process.

    python bench/impala_vs_a2c.py [--repeat N] [--plot bench/impala_vs_a2c.png]

Prints a table (medians over the repeats; "first >= 475": when the mean return of the last 20
episodes first reached the target, "stays": from when it stayed there to the end) and plots the
20-episode mean return against wall time of the last repeat of each configuration.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
EXAMPLES = os.path.join(os.path.dirname(HERE), "examples")
CONFIGS = {  # name: (processes, example, its arguments)
    "a2c (2 processes x 2 replicas)": (2, "rl.py", []),
    "impala 1+1 processes": (2, "impala.py", ["--layout", "processes", "--actors", "1"]),
    "impala 1+1 processes, 2 actor threads": (2, "impala.py", ["--layout", "processes",
                                                               "--actors", "2"]),
    "impala 2 x (learner + actor thread)": (2, "impala.py", ["--layout", "threads",
                                                             "--actors", "1", "--updates",
                                                             "1000"]),
    "impala 1 process: learner + actor thread": (1, "impala.py", ["--actors", "1"]),
    "impala 1 process: learner + 2 actor threads": (1, "impala.py", ["--actors", "2"]),
}


def run(n, script, args, workdir):
    log = os.path.join(workdir, "log.json")
    if script == "impala.py":
        args = [*args, "--target", "0"]
    cmd = [sys.executable, "-m", "replicate.launch", "-n", str(n), os.path.join(EXAMPLES, script),
           *args, "--log", log, "--plot", os.path.join(workdir, "plot.png")]
    out = subprocess.run(cmd, capture_output=True, text=True, cwd=workdir, timeout=1800)
    if out.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed:\n{out.stdout}\n{out.stderr}")
    with open(log) as f:
        return json.load(f)


def solved_at(episodes, target=475.0):
    """Wall times at which the 20-episode mean return first reached ``target`` and from which
    it stayed there (None: never)."""
    t = np.array([e[0] for e in episodes])
    ret = np.array([e[1] for e in episodes])
    if len(ret) < 20:
        return None, None
    window = np.convolve(ret, np.ones(20) / 20, "valid")
    above, below = np.flatnonzero(window >= target), np.flatnonzero(window < target)
    first = float(t[above[0] + 19]) if len(above) else None
    stays = 0 if len(below) == 0 else below[-1] + 1
    return first, (float(t[stays + 19]) if stays < len(window) else None)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=1)
    ap.add_argument("--plot", default=os.path.join(HERE, "impala_vs_a2c.png"))
    ap.add_argument("--json", default=None, help="also write the results here")
    args = ap.parse_args(argv)
    results, curves = {}, {}
    for _ in range(args.repeat):  # the configurations alternate, so load changes hit all
        for name, (n, script, extra) in CONFIGS.items():
            with tempfile.TemporaryDirectory() as workdir:
                log = run(n, script, extra, workdir)
            episodes = sorted(map(tuple, log["episodes"]))
            ret = [r for _, r in episodes]
            first, stays = solved_at(episodes)
            results.setdefault(name, []).append({
                "rate": log["env_steps"] / log["elapsed"], "elapsed": log["elapsed"],
                "first": first, "stays": stays, "last20": float(np.mean(ret[-20:]))})
            curves[name] = episodes
            print(f"  {name}: {results[name][-1]}", flush=True)
    print("\n| configuration | env steps/s | 320 000 steps in | first >= 475 at | stays >= 475 "
          "from | last 20 episodes at the end |")
    print("|---|---|---|---|---|---|")
    for name, rows in results.items():
        cells = []
        for key in ("first", "stays"):
            hit = [r[key] for r in rows if r[key] is not None]
            cells.append((f"{statistics.median(hit):.1f} s" if hit else "never")
                         + f" ({len(hit)}/{len(rows)} runs)")
        print(f"| {name} | {statistics.median(r['rate'] for r in rows):,.0f} | "
              f"{statistics.median(r['elapsed'] for r in rows):.1f} s | {cells[0]} | "
              f"{cells[1]} | " + ", ".join(f"{r['last20']:.0f}" for r in rows) + " |")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)
    _plot(curves, args.plot)
    print(f"\nplot: {args.plot}")


def _plot(curves, path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    for name, episodes in curves.items():
        t = np.array([e[0] for e in episodes])
        ret = np.array([e[1] for e in episodes])
        if len(ret) >= 20:
            ax.plot(t[19:], np.convolve(ret, np.ones(20) / 20, "valid"), label=name, lw=1.2)
    ax.axhline(475, color="grey", lw=0.8, ls="--")
    ax.set_xlabel("wall time (s)")
    ax.set_ylabel("return, mean of the last 20 episodes")
    ax.set_title("CartPole-v1, 2-core AMD EPYC VM, no GPU")
    ax.legend(fontsize=8, loc="lower right")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


if __name__ == "__main__":
    main()
