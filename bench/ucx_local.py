"""A one-machine job's MPI without UCX's network transports (issue 36) must not be slower.

    python bench/ucx_local.py [--rounds 4]

Alternates two-process jobs that ``import replicate`` (which sets ``UCX_TLS=^tcp,ib`` when every
rank is on this machine, ``runtime/job/exposure.py``) with the same jobs under ``UCX_TLS=all``
(the user's setting is kept: UCX's every transport, as before), each timing mpi4py's
``Allreduce`` of float32 buffers of 4 KiB, 256 KiB and 24 MiB (median of repeated calls, a
barrier before each). Prints the medians over rounds and their ratio (local / all).
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time

sys.path.insert(1, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # the checkout's
SIZES = (1024, 1 << 16, 6 << 20)  # float32 elements


def worker() -> None:
    import numpy as np

    from replicate.runtime.communication.comm import world  # (chooses UCX_TLS, starts MPI)

    comm = world().comm  # mpi4py's COMM_WORLD
    medians = []
    for n in SIZES:
        x, y = np.ones(n, np.float32), np.empty(n, np.float32)
        times = []
        for _ in range(15 if n > 1 << 20 else 200):
            comm.Barrier()
            t = time.perf_counter()
            comm.Allreduce(x, y)
            times.append(time.perf_counter() - t)
        medians.append(statistics.median(times))
    if comm.rank == 0:
        print(os.environ.get("UCX_TLS"), *medians, flush=True)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--worker", action="store_true")
    args = ap.parse_args()
    if args.worker:
        return worker()
    mpiexec = os.path.join(os.path.dirname(sys.executable), "mpiexec")
    results, chosen = {"local": [], "all": []}, None
    for _ in range(args.rounds):
        for kind in results:
            env = dict(os.environ)
            env.pop("UCX_TLS", None)
            if kind == "all":
                env["UCX_TLS"] = "all"
            out = subprocess.run([mpiexec, "-n", "2", sys.executable, __file__, "--worker"],
                                 env=env, capture_output=True, text=True, timeout=300, check=True)
            tls, *times = out.stdout.split()
            results[kind].append([float(t) for t in times])
            chosen = tls if kind == "local" else chosen
    print(f"load average {os.getloadavg()[0]:.1f}; UCX_TLS of the local jobs: {chosen}")
    print("| Allreduce of | local (ms) | all (ms) | local / all |\n|---|---|---|---|")
    for i, n in enumerate(SIZES):
        local = statistics.median(r[i] for r in results["local"]) * 1e3
        every = statistics.median(r[i] for r in results["all"]) * 1e3
        print(f"| {n * 4 // 1024} KiB | {local:.4f} | {every:.4f} | {local / every:.2f} |")


if __name__ == "__main__":
    main()
