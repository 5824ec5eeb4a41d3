"""Run every benchmark one after the other; collect their tables and wall times.

    python bench/run_all.py            # about 20 minutes on a 2-core machine
    python bench/run_all.py --quick    # smoke run of every script (about 3 minutes)

Writes ``bench/results/latest.md`` (each script's tables and how long it took); the
scale-out model runs last, as it reads the others' results.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
SCRIPTS = ["step_time.py", "conv.py", "eager_profile.py", "allreduce.py", "weak_scaling.py",
           "fusion.py", "compile_time.py", "eager_vs_graph.py", "mixed_precision.py",
           "scaleout_model.py", "conv_gan.py", "prefetch.py"]


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--only", default="", help="comma-separated script names")
    args = ap.parse_args(argv)
    scripts = [s for s in SCRIPTS if not args.only or s in args.only.split(",")]
    parts, failed = [], []
    for script in scripts:
        cmd = [sys.executable, os.path.join(HERE, script)] + (["--quick"] if args.quick else [])
        t0 = time.perf_counter()
        proc = subprocess.run(cmd)
        dt = time.perf_counter() - t0
        print(f"[bench] {script}: exit {proc.returncode}, {dt:.0f} s", file=sys.stderr,
              flush=True)
        if proc.returncode != 0:
            failed.append(script)
        name = script[:-3]
        path = os.path.join(HERE, "results", f"{name}.json")
        if not args.quick and os.path.exists(path):
            with open(path) as f:
                md = json.load(f).get("markdown", "")
            parts.append(f"{md}\n_{script} took {dt:.0f} s._\n")
    if not args.quick:
        with open(os.path.join(HERE, "results", "latest.md"), "w") as f:
            f.write("\n".join(parts))
    if failed:
        raise SystemExit(f"failed: {', '.join(failed)}")


if __name__ == "__main__":
    main()
