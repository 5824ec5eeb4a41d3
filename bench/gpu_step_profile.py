"""Where a cupy-backend training step's time goes on the host (a third GPU run's question: the
MLP step of ``bench/gpu_steps.py`` took 2.2x PyTorch eager on an H200 with 41 kernels and
library calls per step).

Prints the step's calls (``exe.kernels``), the median wall time per step with and without a
device synchronisation after each (near-equal: the host is the bottleneck), and cProfile's
top functions by own time over ``--steps`` steps.

    python bench/gpu_step_profile.py [--kind mlp|conv|gpt-small|gpt-large] [--steps 50]
        [--sort tottime,cumulative] [--top 25]
"""

from __future__ import annotations

import argparse
import cProfile
import os
import pstats
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import step_time as S  # noqa: E402


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--kind", default="mlp", choices=("mlp", "conv", "gpt-small", "gpt-large"))
    ap.add_argument("--sort", default="tottime", help="pstats order (tottime, cumulative)")
    ap.add_argument("--top", type=int, default=25)
    ap.add_argument("--steps", type=int, default=50)
    args = ap.parse_args(argv)
    import cupy as cp

    if args.kind.startswith("gpt-"):
        import transformer as T

        cfg = T.SIZES[args.kind[4:]]
        params, x, y = T.init(cfg)
        f = T.replicate_step(cfg, params, "graph", "cupy")
    else:
        params, x, y = (S.mlp_init(S.MLP_SIZES, S.MLP_BATCH) if args.kind == "mlp"
                        else S.conv_init(S.CONV))
        f = S.replicate_step(args.kind, params, "graph", "cupy")
    exe = f.executable(x, y)
    print(f"{args.kind}: {len(exe.kernels)} calls per step: {exe.kernels}")
    sync = cp.cuda.get_current_stream().synchronize
    for _ in range(5):
        f(x, y)
    sync()
    for label, after in (("no sync", lambda: None), ("sync after each", sync)):
        times = []
        for _ in range(args.steps):
            t0 = time.perf_counter()
            f(x, y)
            after()
            times.append(time.perf_counter() - t0)
        sync()
        print(f"  {label:16s} median {statistics.median(times) * 1e3:.3f} ms per step")
    profile = cProfile.Profile()
    profile.enable()
    for _ in range(args.steps):
        f(x, y)
    sync()
    profile.disable()
    stats = pstats.Stats(profile)
    for order in args.sort.split(","):
        stats.sort_stats(order).print_stats(args.top)


if __name__ == "__main__":
    main()
