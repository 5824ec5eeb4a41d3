"""The MLP and conv training steps of ``step_time.py`` on one GPU: replicate's cupy backend vs
``jax.jit`` on the GPU vs PyTorch eager and ``torch.compile`` on CUDA, plus what the cupy backend
launches and moves per step (kernels, host<->device bytes).

Needs CuPy and an NVIDIA GPU (it fails, it does not skip, when there is none); run by
``bench/gpu_check.sh``. Timings are medians of CUDA-synchronised calls.

    python bench/gpu_steps.py [--quick]
"""

from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import _common as C  # noqa: E402
import step_time as S  # noqa: E402


def builders(kind, quick):
    import cupy as cp
    import numpy as np

    if kind == "mlp":
        params, x, y = S.mlp_init(S.MLP_SIZES, S.MLP_BATCH)
    else:
        params, x, y = S.conv_init(S.CONV)
    sync_cp = lambda _=None: cp.cuda.get_current_stream().synchronize()  # noqa: E731
    out = {}

    def rep():
        from replicate.backends.cupy_device import DEVICE

        f = S.replicate_step(kind, params, "graph", "cupy")
        exe = f.executable(x, y)
        f(x, y)  # the first call copies the variables up, once
        before = dict(DEVICE.transfers)
        f(x, y)
        up, down = (DEVICE.transfers[k] - before[k] for k in ("to_device", "to_host"))
        state = sum(v.size * v.dtype.itemsize for v in exe.graph.inputs[2:])
        print(f"  {kind}: cupy backend launches {len(exe.kernels)} kernels/library calls per "
              f"step; host->device {up} B (the batch: {x.nbytes + np.asarray(y).nbytes} B), "
              f"device->host {down} B per step; the state ({state / 1e6:.2f} MB) stays on "
              "the GPU")
        return (lambda: f(x, y)), sync_cp
    out["replicate graph cupy"] = rep

    def jax_gpu():
        import jax

        gpus = [d for d in jax.devices() if d.platform == "gpu"]
        if not gpus:
            raise RuntimeError("JAX sees no GPU (CPU-only jaxlib)")
        step, ps = S.jax_step(kind, params)
        state = {"ps": [jax.device_put(p, gpus[0]) for p in ps]}
        xj, yj = jax.device_put(x, gpus[0]), jax.device_put(y, gpus[0])

        def call():
            state["ps"], loss = step(state["ps"], xj, yj)
            return loss
        return call, jax.block_until_ready
    out["jax.jit (GPU)"] = jax_gpu

    def torch_cuda(compiled=False):
        import torch

        model_step = S.torch_step(kind, params, compiled)
        # move the model the step closes over to the GPU
        for cell in model_step.__closure__ or ():
            v = cell.cell_contents
            if isinstance(v, torch.nn.Module):
                v.cuda()
        xt, yt = torch.from_numpy(x).cuda(), torch.from_numpy(np.asarray(y)).cuda()
        return (lambda: model_step(xt, yt)), lambda _: torch.cuda.synchronize()
    out["PyTorch eager (CUDA)"] = torch_cuda
    out["torch.compile (CUDA)"] = lambda: torch_cuda(True)
    return out


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true")
    args = ap.parse_args(argv)
    import cupy as cp

    if cp.cuda.runtime.getDeviceCount() < 1:
        raise SystemExit("gpu_steps: no CUDA device")
    print(C.header("GPU training steps (batch as step_time.py)", "python bench/gpu_steps.py"))
    warmup, rounds = C.quick_counts(args.quick, 3, 30)
    for kind in ("mlp", "conv"):
        rows = C.measure_many(builders(kind, args.quick), warmup=warmup, rounds=rounds,
                              max_seconds=30)
        eager = next((r.timing for r in rows if r.name == "PyTorch eager (CUDA)"), None)
        for r in rows:
            t = r.timing
            ratio = f"{t.median / eager.median:.2f}x PyTorch eager" if t and eager else ""
            print(f"  {kind:5s} {r.name:24s} {t.ms() if t else 'n/a':>9} ms  {ratio}"
                  f"{'' if t else '  ' + str(r.note)}")


if __name__ == "__main__":
    main()
