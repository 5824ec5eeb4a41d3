"""Elementwise fusion: an 8-op chain on 16 M float32, replicate's backends vs NumPy and JAX.

    y = tanh(x * 1.7 + 0.3) * sigmoid(x) - exp(-0.5 * x)

(mul, add, tanh, logistic, mul, mul, exp, sub). The least memory traffic is one read of ``x`` and
one write of ``y`` (2 x 64 MiB); the "effective GB/s" column is that over the time, so a fully
fused kernel approaches the machine's memory bandwidth and op-by-op evaluation falls short of it.

CPU rows: replicate graph mode on each backend (and NumPy with the fusion pass disabled, to show
what the pass buys), replicate eager mode, NumPy op by op (as one writes it:
``1 / (1 + np.exp(-x))`` for the sigmoid), NumPy with preallocated ``out=`` buffers, ``jax.jit``.

GPU section (only where CuPy and a CUDA device exist; otherwise it says why it was skipped):
replicate's cupy backend vs ``jax.jit`` on the GPU vs ``cupy.fuse`` vs CuPy op by op vs a
device-to-device copy of the same bytes (the bandwidth bound).

    python bench/fusion.py            # 1 and 2 threads
    python bench/fusion.py --quick
"""

from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import _common as C  # noqa: E402

N = 16 * 2**20


def chain_rnp(x):
    import replicate.numpy as rnp

    return rnp.tanh(x * 1.7 + 0.3) * rnp.sigmoid(x) - rnp.exp(-0.5 * x)


def chain_numpy(x):
    import numpy as np

    return np.tanh(x * np.float32(1.7) + np.float32(0.3)) * (1 / (1 + np.exp(-x))) \
        - np.exp(np.float32(-0.5) * x)


def numpy_out(x):
    """Hand-tuned NumPy: two preallocated buffers, every op in place."""
    import numpy as np

    a, b = np.empty_like(x), np.empty_like(x)

    def run():
        np.multiply(x, np.float32(1.7), out=a)
        np.add(a, np.float32(0.3), out=a)
        np.tanh(a, out=a)
        np.negative(x, out=b)
        np.exp(b, out=b)
        np.add(b, np.float32(1), out=b)
        np.divide(a, b, out=a)           # tanh(...) * sigmoid(x)
        np.multiply(x, np.float32(-0.5), out=b)
        np.exp(b, out=b)
        np.subtract(a, b, out=a)
        return a
    return run


def cpu_builders(x, quick):
    import numpy as np

    import replicate as rp

    builders = {}
    for backend in ("numpy", "jax"):
        reason = C.backend_unavailable(backend)
        builders[f"replicate graph {backend}"] = reason or (
            lambda b=backend: (_call(rp.function(chain_rnp, backend=b), x), None))
    builders["replicate graph numpy, fusion pass off"] = lambda: (_call(rp.function(
        chain_rnp, backend="numpy", options=rp.CompileOptions(disable={"fusion"})), x), None)
    builders["replicate eager (numpy)"] = lambda: (_call(rp.function(chain_rnp, mode="eager"),
                                                         x), None)
    builders["NumPy op by op"] = lambda: (lambda: chain_numpy(x), None)
    builders["NumPy, out= buffers"] = lambda: (numpy_out(x), None)

    def jax_jit():
        import jax

        f = jax.jit(lambda v: jax.numpy.tanh(v * 1.7 + 0.3) * jax.nn.sigmoid(v)
                    - jax.numpy.exp(-0.5 * v))
        xj = jax.device_put(x, jax.devices("cpu")[0])
        return (lambda: f(xj)), jax.block_until_ready
    builders["jax.jit"] = jax_jit

    def jax_jit_numpy():  # what replicate's API does: NumPy array in, NumPy array out
        import jax

        f = jax.jit(lambda v: jax.numpy.tanh(v * 1.7 + 0.3) * jax.nn.sigmoid(v)
                    - jax.numpy.exp(-0.5 * v))
        return (lambda: np.asarray(f(x))), None
    builders["jax.jit, NumPy array in and out"] = jax_jit_numpy
    _ = np
    return builders


def _call(f, x):
    return lambda: f(x)


def worker(args):
    import numpy as np

    threads = C.worker_threads()
    n = 2**20 if args.quick else N
    x = np.random.default_rng(0).standard_normal(n).astype(np.float32)
    ref = chain_numpy(x.astype(np.float64))
    warmup, rounds = C.quick_counts(args.quick, 3, 15)

    def check(name, out):
        err = float(np.max(np.abs(np.asarray(out, np.float64) - ref)))
        return {"max_abs_err": err}
    rows = C.measure_many(cpu_builders(x, args.quick), warmup=warmup, rounds=rounds,
                          extra_fn=check)
    out = {"threads": threads, "n": n, "rows": [r.as_dict() for r in rows]}
    if threads == max(int(t) for t in args.all_threads.split(",")):
        out["gpu"] = gpu_section(n, args.quick)
    C.write_worker_json(args.json, out)


# -- GPU ------------------------------------------------------------------------------------------
def gpu_section(n, quick):
    """{"skipped": reason} or {"rows": [...]} (times from CUDA events)."""
    try:
        import cupy as cp
    except ImportError as e:
        return {"skipped": f"CuPy is not installed ({e}); pip install 'replicate[cuda12]' on a "
                           "machine with an NVIDIA GPU"}
    try:
        if cp.cuda.runtime.getDeviceCount() < 1:
            return {"skipped": "CuPy is installed but there is no CUDA device"}
    except Exception as e:  # noqa: BLE001
        return {"skipped": f"no usable CUDA device: {C._reason(e)}"}
    x = cp.random.standard_normal(n, dtype=cp.float32)
    y = cp.empty_like(x)

    def sync(_=None):
        cp.cuda.get_current_stream().synchronize()

    builders = {}
    reason = C.backend_unavailable("cupy")

    def rep_cupy():
        import replicate as rp

        f = rp.function(chain_rnp, backend="cupy")
        return (lambda: f(x)), sync
    builders["replicate graph cupy"] = reason or rep_cupy

    def jax_gpu():
        import jax

        gpus = [d for d in jax.devices() if d.platform == "gpu"]
        if not gpus:
            raise RuntimeError("JAX sees no GPU (CPU-only jaxlib)")
        f = jax.jit(lambda v: jax.numpy.tanh(v * 1.7 + 0.3) * jax.nn.sigmoid(v)
                    - jax.numpy.exp(-0.5 * v))
        xj = jax.device_put(cp.asnumpy(x), gpus[0])
        return (lambda: f(xj)), jax.block_until_ready
    builders["jax.jit (GPU)"] = jax_gpu

    @cp.fuse()
    def fused(v):
        return cp.tanh(v * 1.7 + 0.3) * (1 / (1 + cp.exp(-v))) - cp.exp(-0.5 * v)
    builders["cupy.fuse"] = lambda: ((lambda: fused(x)), sync)
    builders["CuPy op by op"] = lambda: ((lambda: cp.tanh(x * 1.7 + 0.3) * (1 / (1 + cp.exp(-x)))
                                         - cp.exp(-0.5 * x)), sync)
    builders["device-to-device copy (bound)"] = lambda: ((lambda: cp.copyto(y, x)), sync)
    warmup, rounds = C.quick_counts(quick, 5, 50)
    rows = C.measure_many(builders, warmup=warmup, rounds=rounds, calls=10)
    return {"device": cp.cuda.runtime.getDeviceProperties(0)["name"].decode(),
            "rows": [r.as_dict() for r in rows]}


# -- report ---------------------------------------------------------------------------------------
def _gbs(nbytes, t):
    return f"{nbytes / t.median / 1e9:.1f}" if t else ""


def report(results, command, quick):
    parts = [C.header("Elementwise fusion: 8-op chain on 16 M float32", command)]
    summary = {}
    for threads, res in sorted(results.items()):
        rows = C.rows_from(res["rows"])
        by = {r.name: r for r in rows}
        nbytes = 2 * res["n"] * 4
        jit, npo = by["jax.jit"].timing, by["NumPy op by op"].timing
        cells = []
        for r in rows:
            t = r.timing
            err = f"{r.extra['max_abs_err']:.1e}" if r.extra else ""
            cells.append([r.name, t.ms() if t else "n/a", f"{t.min * 1e3:.2f}" if t else "",
                          _gbs(nbytes, t), C.ratio(t, npo), C.ratio(t, jit), err, C.note(r)])
        parts.append(f"### CPU, {threads} thread(s), {res['n']:,} float32"
                     f"{' (quick)' if quick else ''}\n\n" + C.table(
                         ["implementation", "median ms", "min ms", "effective GB/s",
                          "vs NumPy op by op", "vs jax.jit", "max abs err", "note"], cells))
        rj = by["replicate graph jax"].timing
        if rj and jit:
            q = rj.median / jit.median
            summary[threads] = q
            line = (f"\nTarget JAX backend ≤ 1.05x jax.jit: {q:.2f}x — "
                    f"{'met' if q <= 1.05 else 'not met'}")
            jn = by.get("jax.jit, NumPy array in and out")
            if jn is not None and jn.timing:
                line += (f" (against jax.jit with NumPy arrays in and out, as replicate's API "
                         f"takes and returns them: {rj.median / jn.timing.median:.2f}x)")
            parts.append(line + "\n")
        else:
            parts.append("\nTarget JAX backend ≤ 1.05x jax.jit: n/a "
                         f"({by['replicate graph jax'].note})\n")
    gpu = next((r["gpu"] for r in results.values() if "gpu" in r), None)
    parts.append("### GPU\n")
    if gpu is None or "skipped" in gpu:
        parts.append(f"Skipped: {gpu['skipped'] if gpu else 'not run'}.\n")
    else:
        rows = C.rows_from(gpu["rows"])
        by = {r.name: r for r in rows}
        n = next(iter(results.values()))["n"]
        nbytes = 2 * n * 4
        copy = by["device-to-device copy (bound)"].timing
        jit = by["jax.jit (GPU)"].timing
        cells = [[r.name, f"{r.timing.median * 1e6:.1f}" if r.timing else "n/a",
                  _gbs(nbytes, r.timing),
                  f"{copy.median / r.timing.median * 100:.0f} %" if r.timing and copy else "",
                  C.ratio(r.timing, jit), r.note] for r in rows]
        parts.append(f"{gpu['device']}\n\n" + C.table(
            ["implementation", "median µs", "effective GB/s", "of copy bandwidth",
             "vs jax.jit", "note"], cells))
        rc = by["replicate graph cupy"].timing
        if rc and copy:
            frac = copy.median / rc.median
            parts.append(f"\nTargets: cupy backend ≥ 80 % of copy bandwidth: {frac * 100:.0f} % — "
                         f"{'met' if frac >= 0.8 else 'not met'}; no slower than jax.jit: "
                         + ("n/a" if not jit else
                            f"{rc.median / jit.median:.2f}x — "
                            f"{'met' if rc.median <= jit.median else 'not met'}") + "\n")
        else:
            parts.append("\nTargets (cupy backend): n/a "
                         f"({by['replicate graph cupy'].note})\n")
    text = "\n".join(parts)
    print(text)
    return text, summary


def main(argv=None):
    ap = C.common_args(argparse.ArgumentParser(description=__doc__.splitlines()[0]))
    ap.add_argument("--all-threads", default="1,2", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.worker:
        return worker(args)
    threads = [int(t) for t in args.threads.split(",")]
    extra = (["--quick"] if args.quick else []) + ["--all-threads", args.threads]
    results = C.run_workers(os.path.abspath(__file__), threads, extra)
    command = "python bench/fusion.py" + (" --quick" if args.quick else "")
    text, _ = report(results, command, args.quick)
    if not args.quick:
        C.save_json("fusion", {"machine": C.machine(), "results": results, "markdown": text})


if __name__ == "__main__":
    main()
