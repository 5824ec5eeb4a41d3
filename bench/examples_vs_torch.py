"""The three first examples against their PyTorch twins, in the same run: examples/transformer.py,
mnist.py and ppo.py at their defaults under ``python -m replicate.launch -n 2`` (2 processes x 2
replicas), each twin (bench/examples_torch.py) in one process (1 thread by default) from the same
initial weights, data and order. Prints the final loss / accuracy / return and the training time
of each, and writes the table into bench/RESULTS.md (between its markers).

    python bench/examples_vs_torch.py            # the table (about 4 minutes on 2 cores)
    python bench/examples_vs_torch.py --quick    # smoke run: a few steps each, RESULTS.md untouched

Training time: the examples' own timer around ``Replicator.run`` (rank 0; for mnist the loop of
epochs with their test passes), and the same span of the twin's loop; start-up, data loading and
compilation outside it are in the "process" column (the whole command, launcher included).
The twin runs on 1 thread (``--twin-threads``): on a 2-core machine shared with other jobs, torch's
2 intra-op threads were 13x slower than 1 on these small tensors (10 GPT steps: 16.7 s against
1.3 s, load average 5.9), so 2 threads would flatter replicate.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import _common as C  # noqa: E402
import numpy as np  # noqa: E402

ROOT = os.path.dirname(C.HERE)
REPLICAS = 4  # the examples' defaults: 2 processes x 2 replicas
BEGIN, END = "<!-- examples_vs_torch: begin -->", "<!-- examples_vs_torch: end -->"
QUICK = {"transformer": (["--steps", "20"], dict(steps=20)),
         "mnist": (["--epochs", "2"], dict(epochs=2)),
         "ppo": (["--rollouts", "3"], dict(rollouts=3))}


def ours(name, extra, tmp):
    """The example under the launcher: (its --log JSON, the command's wall seconds)."""
    log = os.path.join(tmp, f"{name}.json")
    cmd = [sys.executable, "-m", "replicate.launch", "-n", "2",
           os.path.join(ROOT, "examples", f"{name}.py"), "--log", log,
           "--plot", os.path.join(tmp, f"{name}.png"), *extra]
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    t0 = time.perf_counter()
    done = subprocess.run(cmd, cwd=tmp, env=env, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    if done.returncode:
        raise SystemExit(f"{' '.join(cmd)} failed:\n{done.stdout}\n{done.stderr}")
    print(done.stdout, flush=True)
    with open(log) as f:
        return json.load(f), wall


def twin(name, kwargs, threads):
    import examples_torch as T
    import torch

    torch.set_num_threads(threads)
    t0 = time.perf_counter()
    result = getattr(T, name)(REPLICAS, **kwargs)
    return result, time.perf_counter() - t0


def cells(name, r):
    """(first loss, final train loss, result) of a run's JSON."""
    if name == "transformer":
        return (f"{r['losses'][0]:.3f}", f"{np.mean(r['losses'][-20:]):.3f} (mean of last 20)",
                f"held-out loss {r['held_out'][0]:.3f} → {r['held_out'][1]:.3f}")
    if name == "mnist":
        return (f"{r['losses'][0]:.3f}", f"{np.mean(r['losses'][-21:]):.3f} (last epoch's mean)",
                f"test accuracy {100 * r['tests'][-1][1]:.1f} %, test loss {r['tests'][-1][0]:.4f}")
    ret = r["returns"]
    return ("–", "–", f"mean return of the last 20 episodes {np.mean(ret[-20:]):.1f} "
                    f"({len(ret)} episodes)")


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--only", nargs="*", default=["transformer", "mnist", "ppo"])
    ap.add_argument("--twin-threads", type=int, default=1)
    args = ap.parse_args(argv)
    rows, notes = [], []
    with tempfile.TemporaryDirectory() as tmp:
        for name in args.only:
            extra, kwargs = QUICK[name] if args.quick else ([], {})
            C.record_load()
            mine, wall = ours(name, extra, tmp)
            C.record_load()
            theirs, twall = twin(name, kwargs, args.twin_threads)
            ratio = mine["elapsed"] / theirs["elapsed"]
            rows.append([name, "replicate, 2 processes x 2 replicas (graph, NumPy)",
                         *cells(name, mine), f"{mine['elapsed']:.1f}", f"{wall:.1f}",
                         f"{ratio:.2f}×"])
            rows.append([name, f"PyTorch twin, 1 process, {args.twin_threads} thread(s)",
                         *cells(name, theirs),
                         f"{theirs['elapsed']:.1f}", f"{twall:.1f}", "1"])
            if name == "transformer":
                notes.append(f"transformer: vocabulary {mine['vocab']} (ln = "
                             f"{np.log(mine['vocab']):.3f}); the first loss of the same GPT "
                             "with PyTorch's own default initialisation (torch.manual_seed(0)) "
                             f"is {theirs['own_init_first_loss']:.3f}")
    columns = ["example", "run", "first loss", "final train loss", "result", "training (s)",
               "process (s)", "time vs twin"]
    text = (C.header("First examples vs their PyTorch twins (issue 37)",
                     "python bench/examples_vs_torch.py" + (" --quick" if args.quick else ""))
            + "\n" + C.table(columns, rows) + "\n\n" + "".join(f"- {n}\n" for n in notes))
    print(text)
    if not args.quick:
        write_results(text)


def write_results(text):
    path = os.path.join(C.HERE, "RESULTS.md")
    with open(path) as f:
        old = f.read()
    block = f"{BEGIN}\n{text}{END}"
    if BEGIN in old:
        new = old[:old.index(BEGIN)] + block + old[old.index(END) + len(END):]
    else:
        new = old.rstrip("\n") + "\n\n" + block + "\n"
    with open(path, "w") as f:
        f.write(new)


if __name__ == "__main__":
    main()
