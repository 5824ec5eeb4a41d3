"""Time ``world().allreduce`` of a large and of a tiny buffer (for the watchdog's before/after
figure; not a test): ``mpiexec -n 2 python
tests/runtime/programs/faults_allreduce_timing.py [MB] [N]``."""

from __future__ import annotations

import sys
import time

import numpy as np

from replicate.runtime.communication.comm import world


def timed(comm, x, repeats):
    comm.allreduce(x, "sum")  # warm-up
    times = []
    for _ in range(repeats):
        comm.allgather(np.zeros(1))  # line the ranks up
        t = time.perf_counter()
        out = comm.allreduce(x, "sum")
        times.append(time.perf_counter() - t)
    assert out.reshape(-1)[0] == comm.size * (comm.size + 1) / 2
    return np.array(times)


if __name__ == "__main__":
    mb = float(sys.argv[1]) if len(sys.argv) > 1 else 100.0
    repeats = int(sys.argv[2]) if len(sys.argv) > 2 else 10
    comm = world()
    big = np.full(int(mb * 2**20) // 4, comm.rank + 1.0, np.float32)
    t = timed(comm, big, repeats)
    small = timed(comm, np.full(2, comm.rank + 1.0, np.float32), 2000)
    if comm.rank == 0:
        print(f"allreduce {mb:g} MB x{repeats} on {comm.size} ranks: median "
              f"{np.median(t) * 1e3:.1f} ms, min {t.min() * 1e3:.1f} ms, "
              f"{big.nbytes / np.median(t) / 1e9:.2f} GB/s; 8-byte allreduce: median "
              f"{np.median(small) * 1e6:.1f} us, min {small.min() * 1e6:.1f} us")
