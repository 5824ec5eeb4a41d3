"""Every collective, forward and gradient, run under MPI; results saved for
tests/runtime/test_mpi.py.

    mpiexec -n 2 python tests/runtime/programs/collectives_mpi.py OUT.npz --k 2 [--mode eager]

Rank 0 writes OUT.npz, rank r > 0 writes OUT.npz.rank<r>.npz; keys "<case>.y" and "<case>.g" hold
the (R, ...) per-replica results (identical on every rank).
"""

from __future__ import annotations

import argparse

import collective_cases as cc
import numpy as np

from replicate.runtime.communication.comm import world

if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--k", type=int, default=1)
    ap.add_argument("--mode", default="graph")
    a = ap.parse_args()
    comm = world()
    R = a.k * comm.size
    results = {}
    for name, kind, attrs in cc.cases(R):
        X, C = cc.make_data(kind, attrs, R)
        Y, G, rep = cc.run_case(kind, attrs, X, C, k=a.k, mode=a.mode)
        results[f"{name}.y"], results[f"{name}.g"] = Y, G
        if a.mode == "graph":
            results[f"{name}.trace_count"] = np.array(rep.trace_count)
    np.savez(a.out if comm.rank == 0 else f"{a.out}.rank{comm.rank}.npz", **results)
