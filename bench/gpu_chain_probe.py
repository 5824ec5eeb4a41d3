"""What bounds the 8-op elementwise chain of ``bench/fusion.py`` on a GPU (issue 31: target 80 % of
copy bandwidth; the cupy backend made 43 % on an H200, jax.jit 55 %): the device time of hand
kernels on the same 16 M float32, from CUDA events, 20 launches back to back.

    python3 bench/gpu_chain_probe.py

Rows: the copy (``cupy.copyto``); an identity ``ElementwiseKernel`` (CuPy's indexing, one float
per thread); the chain as an ``ElementwiseKernel`` with CUDA's precise ``tanhf``/``expf``; the
chain as a raw kernel, grid-stride, ``float4`` loads and stores, precise and with fast
intrinsics (``__expf``, ``__fdividef``; flush-to-zero); a raw ``float4`` copy; the cupy
backend's own fused kernel (``rp.function``, host call included), and its raw kernel launched
alone (its device time without the call's host path).
"""

from __future__ import annotations

import cupy as cp

N = 16 * 2**20
CHAIN = "tanhf(v * 1.7f + 0.3f) * (1.0f / (1.0f + expf(-v))) - expf(-0.5f * v)"
FAST = ("(1.0f - 2.0f * __fdividef(1.0f, __expf(2.0f * (v * 1.7f + 0.3f)) + 1.0f)) * "
        "__fdividef(1.0f, 1.0f + __expf(-v)) - __expf(-0.5f * v)")
RAW = r"""
extern "C" __global__ void k(const float4* __restrict__ x, float4* __restrict__ y, long long n4) {
  for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n4;
       i += (long long)gridDim.x * blockDim.x) {
    float4 a = x[i], b;
    float v;
    v = a.x; b.x = EXPR; v = a.y; b.y = EXPR; v = a.z; b.z = EXPR; v = a.w; b.w = EXPR;
    y[i] = b;
  }
}
"""


def timed(fn, reps=20):
    for _ in range(3):
        fn()
    start, stop = cp.cuda.Event(), cp.cuda.Event()
    start.record()
    for _ in range(reps):
        fn()
    stop.record()
    stop.synchronize()
    return cp.cuda.get_elapsed_time(start, stop) / reps * 1e3  # µs


def main() -> None:
    x = cp.random.standard_normal(N, dtype=cp.float32)
    y = cp.empty_like(x)
    copy = timed(lambda: cp.copyto(y, x))
    rows = [("copy (cupy.copyto)", copy)]
    ident = cp.ElementwiseKernel("float32 x", "float32 y", "y = x", "probe_ident")
    rows.append(("identity ElementwiseKernel", timed(lambda: ident(x, y))))
    chain = cp.ElementwiseKernel("float32 v", "float32 y", f"y = {CHAIN}", "probe_chain")
    rows.append(("chain ElementwiseKernel, precise", timed(lambda: chain(x, y))))
    sms = cp.cuda.Device().attributes["MultiProcessorCount"]
    grid, block = (sms * 8,), (256,)
    for name, expr in (("copy", "v"), ("chain", CHAIN), ("chain, fast intrinsics", FAST)):
        kern = cp.RawKernel(RAW.replace("EXPR", expr), "k",
                            options=("--use_fast_math",) if "fast" in name else ())
        rows.append((f"raw float4 {name}",
                     timed(lambda kern=kern: kern(grid, block, (x, y, cp.int64(N // 4))))))
    ref = cp.tanh(x * 1.7 + 0.3) * (1 / (1 + cp.exp(-x))) - cp.exp(-0.5 * x)
    kern = cp.RawKernel(RAW.replace("EXPR", FAST), "k", options=("--use_fast_math",))
    kern(grid, block, (x, y, cp.int64(N // 4)))
    fast_err = float(cp.abs(y - ref).max())
    try:
        from fusion import chain_rnp

        import replicate as rp
        f = rp.function(chain_rnp, backend="cupy")
        rows.append(("replicate cupy (rp.function)", timed(lambda: f(x))))
        print(f"replicate's chain: max |error| {float(cp.abs(f(x) - ref).max()):.2e} against "
              "CuPy's precise chain")
        # the backend's raw kernel of the chain launched alone: its device time, no host path
        import numpy as np

        from replicate.backends import cuda_raw, cupy_backend
        raws = [v for v in cupy_backend._KERNELS.values() if isinstance(v, tuple)]
        if raws:
            kern, _ = raws[-1]
            how = ((cuda_raw.FULL,),)
            blocks, threads = cuda_raw.grid(N)
            sizes = tuple(cuda_raw.args(how, N, np))
            rows.append(("replicate's raw kernel alone", timed(
                lambda: kern(blocks, threads, (x, y, *sizes)))))
    except Exception as e:  # noqa: BLE001 - the probe's other rows still say something
        print("replicate row failed:", type(e).__name__, e)
    for name, us in rows:
        print(f"{name:36s} {us:8.1f} us  {100 * copy / us:5.1f} % of the copy")
    print(f"fast intrinsics: max |error| {fast_err:.2e} against CuPy's precise chain")


if __name__ == "__main__":
    import os
    import sys
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    main()
