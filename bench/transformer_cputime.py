"""The transformer step's rows (``bench/transformer.py``'s builders) timed by the process's CPU
time, interleaved, 1 thread pinned by the caller: for a machine that other jobs load, where wall
time measures the other jobs. It is not the quiet-machine table (RESULTS.md says which is which);
XLA's own threads count as this process's CPU time.

    OMP_NUM_THREADS=1 taskset -c 1 python bench/transformer_cputime.py large 5
    OMP_NUM_THREADS=1 taskset -c 1 python bench/transformer_cputime.py small 15 "eager,PyTorch"
"""

from __future__ import annotations

import os
import statistics
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))


def main(argv):
    import _common as C
    import torch
    import transformer as T

    torch.set_num_threads(1)
    size, rounds = argv[0], int(argv[1])
    want = argv[2].split(",") if len(argv) > 2 else None
    cfg = T.SIZES[size]
    params, ids, targets = T.init(cfg)
    times = C.cpu_times(T.builders(cfg, params, ids, targets), rounds, want,
                        skip=("torch.compile",), warmup=2)
    ref = statistics.median(times[T.REF]) if T.REF in times else None
    print(f"{size} GPT, CPU ms per step over {rounds} interleaved rounds, load "
          f"{os.getloadavg()[0]:.1f}")
    for name, ts in times.items():
        med = statistics.median(ts)
        ratio = f"{med / ref:.2f}x" if ref else "-"
        print(f"| {name} | {min(ts) * 1e3:.1f} | {med * 1e3:.1f} | {ratio} |")


if __name__ == "__main__":
    main(sys.argv[1:])
