"""``bench/step_time.py``'s rows (MLP, small conv net) timed by the process's CPU time,
interleaved, 1 thread pinned by the caller: for a machine that other jobs load, where wall time
measures the other jobs. Not the quiet-machine table (RESULTS.md says which is which); XLA's own
threads count as this process's CPU time. Ratios: eager against PyTorch eager, the JAX backend
against ``jax.jit``, graph NumPy against the hand-written NumPy step.

    OMP_NUM_THREADS=1 taskset -c 1 python bench/step_time_cputime.py mlp 20
    OMP_NUM_THREADS=1 taskset -c 1 python bench/step_time_cputime.py conv 20 "eager,PyTorch"
    OMP_NUM_THREADS=1 taskset -c 1 python bench/step_time_cputime.py mlp-small 60 "eager,PyTorch"
"""

from __future__ import annotations

import os
import statistics
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

PEERS = {"replicate eager (numpy)": "PyTorch eager", "replicate graph jax": "jax.jit",
         "replicate graph numpy": "hand-written NumPy"}


def main(argv):
    import _common as C
    import step_time as S
    import torch

    torch.set_num_threads(1)
    kind, rounds = argv[0], int(argv[1])
    want = argv[2].split(",") if len(argv) > 2 else None
    builders, _, _ = S.model_builders(kind, quick=False)
    times = C.cpu_times(builders, rounds, want, skip=("torch.compile", "replicate graph cupy"),
                        warmup=3)
    med = {name: statistics.median(ts) for name, ts in times.items()}
    print(f"{kind}, CPU ms per step over {rounds} interleaved rounds, load "
          f"{os.getloadavg()[0]:.1f}")
    for name, ts in times.items():
        peer = PEERS.get(name)
        ratio = f"{med[name] / med[peer]:.2f}x {peer}" if peer in med else "-"
        print(f"| {name} | {min(ts) * 1e3:.2f} | {med[name] * 1e3:.2f} | {ratio} |")


if __name__ == "__main__":
    main(sys.argv[1:])
