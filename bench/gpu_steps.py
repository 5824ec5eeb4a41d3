"""The MLP and conv training steps of ``step_time.py`` and the GPT steps of ``transformer.py`` on
one GPU: replicate's cupy backend (op by op, and replayed as a CUDA graph) vs ``jax.jit`` on the
GPU vs PyTorch eager and ``torch.compile`` on CUDA, plus what the cupy backend launches and
moves per step (kernels, host<->device bytes).
A GPT row's first loss is checked against the float64 NumPy reference, as in ``transformer.py``.

Needs CuPy and an NVIDIA GPU (it fails, it does not skip, when there is none); run by
``bench/gpu_check.sh``. Timings are medians of CUDA-synchronised calls.

    python bench/gpu_steps.py [--quick] [--kinds mlp,conv,gpt-small,gpt-large] [--no-compile]
"""

from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import _common as C  # noqa: E402
import step_time as S  # noqa: E402
import transformer as T  # noqa: E402

KINDS = ("mlp", "conv", "gpt-small", "gpt-large")
# the same step with CUDA-graph replay on (``rp.CompileOptions(cuda_graph=True)``, issue 31)
GRAPH_ROW = "replicate graph cupy, CUDA graph"


def gpt_builders(size, compile_rows):
    """The GPT step (``transformer.py``) on the GPU: the same parameters and batch in each row."""
    import cupy as cp
    import numpy as np

    cfg = T.SIZES[size]
    params, ids, targets = T.init(cfg)
    out = {}

    def rep(graph=False):
        f = T.replicate_step(cfg, params, "graph", "cupy", options={"cuda_graph": graph})
        exe = f.executable(ids, targets)
        if not graph:
            print(f"  gpt-{size}: cupy backend launches {len(exe.kernels)} kernels/library "
                  "calls per step", flush=True)
        calls = [0]

        def call():  # (not called ahead: the first loss is checked against the reference)
            loss = f(ids, targets)
            calls[0] += 1
            if graph and calls[0] == 2:  # the second call captured (or gave up): say which
                print(f"  gpt-{size}: CUDA graph: {getattr(exe.run, 'state', 'not asked')}",
                      flush=True)
            return loss
        return call, lambda loss: float(cp.asnumpy(cp.asarray(loss))
                                                              if isinstance(loss, cp.ndarray)
                                                              else np.asarray(loss))
    out["replicate graph cupy"] = rep
    out[GRAPH_ROW] = lambda: rep(True)

    def jax_gpu():
        import jax

        gpus = [d for d in jax.devices() if d.platform == "gpu"]
        if not gpus:
            raise RuntimeError("JAX sees no GPU (CPU-only jaxlib)")
        step, state = T.jax_step(cfg, params)
        box = {"s": jax.device_put(state, gpus[0])}
        ij, tj = jax.device_put(ids, gpus[0]), jax.device_put(targets, gpus[0])

        def call():
            box["s"], loss = step(box["s"], ij, tj)
            return loss
        return call, lambda loss: float(jax.block_until_ready(loss))
    out["jax.jit (GPU)"] = jax_gpu

    def torch_cuda(compiled=False):
        import torch

        step = T.torch_step(cfg, params, compiled)
        for cell in step.__closure__ or ():  # the model and optimiser the step closes over
            v = cell.cell_contents
            if isinstance(v, torch.nn.Module):
                v.cuda()
        it, tt = torch.from_numpy(ids).cuda(), torch.from_numpy(targets).cuda()
        return (lambda: step(it, tt)), lambda loss: float(loss.detach().cpu())
    out["PyTorch eager (CUDA)"] = torch_cuda
    if compile_rows:
        out["torch.compile (CUDA)"] = lambda: torch_cuda(True)
    return out, T.numpy_loss(params, ids, targets, cfg)


def builders(kind, quick):
    import cupy as cp
    import numpy as np

    if kind == "mlp":
        params, x, y = S.mlp_init(S.MLP_SIZES, S.MLP_BATCH)
    else:
        params, x, y = S.conv_init(S.CONV)
    sync_cp = lambda _=None: cp.cuda.get_current_stream().synchronize()  # noqa: E731
    out = {}

    def rep(graph=False):
        from replicate.backends.cupy_device import DEVICE

        f = S.replicate_step(kind, params, "graph", "cupy", options={"cuda_graph": graph})
        exe = f.executable(x, y)
        f(x, y)  # the first call copies the variables up, once
        if graph:
            f(x, y)  # the second captures the graph (and checks its first replay)
            print(f"  {kind}: CUDA graph: {getattr(exe.run, 'state', 'not asked')}")
            return (lambda: f(x, y)), sync_cp
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
    out[GRAPH_ROW] = lambda: rep(True)

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
    ap.add_argument("--kinds", default="mlp,conv,gpt-small,gpt-large",
                    help=f"comma-separated, of {', '.join(KINDS)}")
    ap.add_argument("--no-compile", action="store_true", help="leave out torch.compile")
    ap.add_argument("--calls", type=int, default=1,
                    help="steps back to back per timing (as a training loop runs them; 1: each "
                         "step alone between the other rows' steps)")
    args = ap.parse_args(argv)
    kinds = [k for k in args.kinds.split(",") if k]
    unknown = sorted(set(kinds) - set(KINDS))
    if unknown:
        ap.error(f"unknown kind(s) {unknown}: choose from {', '.join(KINDS)}")
    import cupy as cp

    if cp.cuda.runtime.getDeviceCount() < 1:
        raise SystemExit("gpu_steps: no CUDA device")
    print(C.header("GPU training steps (batch as step_time.py)", "python bench/gpu_steps.py"))
    warmup, rounds = C.quick_counts(args.quick, 3, 30)
    print(f"{args.calls} step(s) back to back per timing")
    for kind in kinds:
        check = None
        if kind.startswith("gpt-"):
            built, ref = gpt_builders(kind[4:], not args.no_compile)

            def check(name, first, ref=ref, kind=kind):
                ok = abs(first - ref) <= T.LOSS_TOL * abs(ref)
                print(f"  {kind}: {name}: first loss {first:.6f} (float64 reference "
                      f"{ref:.6f}){'' if ok else ' -- DIFFERS'}", flush=True)
                if not ok:
                    raise AssertionError(f"first loss {first:.6f} != reference {ref:.6f}")
        else:
            built = builders(kind, args.quick)
            if args.no_compile:
                built.pop("torch.compile (CUDA)")
        rows = C.measure_many(built, warmup=warmup, rounds=rounds, max_seconds=30,
                              calls=args.calls,
                              extra_fn=check)
        eager = next((r.timing for r in rows if r.name == "PyTorch eager (CUDA)"), None)
        for r in rows:
            t = r.timing
            ratio = f"{t.median / eager.median:.2f}x PyTorch eager" if t and eager else ""
            print(f"  {kind:9s} {r.name:32s} {t.ms() if t else 'n/a':>9} ms  {ratio}"
                  f"{'' if t else '  ' + str(r.note)}")


if __name__ == "__main__":
    main()
