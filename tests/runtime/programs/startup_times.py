"""How long each failure of tests/runtime/programs/startup_mpi.py takes to end the job: a table for
docs/guides/failure-behaviour.md (seconds from the command's start to its exit, and exit code).

    python tests/runtime/programs/startup_times.py [--repeat 3]

Every case runs under the launcher (``python -m replicate.launch -n N``) and under a plain
``mpiexec -n N python -m replicate``, with 2 and 3 processes; the median of ``--repeat`` runs is
printed. The time includes starting Python and importing NumPy and replicate on every rank
(the ``ok`` row: a healthy 6-step job).
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(HERE)))
MPIEXEC = os.path.join(os.path.dirname(sys.executable), "mpiexec")
CASES = ["ok", "raise-before-import", "raise-after-import", "raise-after-mpi4py", "missing-file",
         "argparse-error", "sys-exit-0", "os-exit-0", "c-exit-0", "config-replicas_per_rank",
         "restore-one-rank", "index"]


def once(case, n, launcher, data):
    extra = ["--data", data] if case in ("missing-file", "restore-one-rank") else []
    args = ["startup_mpi.py", case, *extra]
    if launcher:
        cmd = [sys.executable, "-m", "replicate.launch", "-n", str(n), *args]
    else:
        cmd = [MPIEXEC, "-n", str(n), sys.executable, "-m", "replicate", *args]
    env = dict(os.environ, PYTHONPATH=ROOT, OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1")
    t0 = time.monotonic()
    proc = subprocess.run(cmd, cwd=HERE, env=env, capture_output=True, timeout=120)
    return time.monotonic() - t0, proc.returncode


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeat", type=int, default=3)
    opts = ap.parse_args()
    styles = [(True, 2), (True, 3), (False, 2), (False, 3)]
    names = [f"{'launcher' if launcher else 'mpiexec -m replicate'} -n {n}"
             for launcher, n in styles]
    print("| case | " + " | ".join(names) + " |")
    print("|---|" + "---|" * len(styles))
    with tempfile.TemporaryDirectory() as folder:
        data = os.path.join(folder, "data.npy")
        np.save(data, np.arange(4.0))
        for case in CASES:
            cells = []
            for launcher, n in styles:
                runs = [once(case, n, launcher, data) for _ in range(opts.repeat)]
                codes = sorted({code for _, code in runs})
                cells.append(f"{statistics.median(t for t, _ in runs):.2f} s (exit "
                             f"{'/'.join(map(str, codes))})")
            print(f"| `{case}` | " + " | ".join(cells) + " |", flush=True)


if __name__ == "__main__":
    main()
