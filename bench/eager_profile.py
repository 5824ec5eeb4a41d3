"""Where an eager (define-by-run) training step spends its time, beside PyTorch eager's.

replicate: a timer around every NumPy reference row the step runs (the ops' own work), grouped
into convolution forward, convolution backward (``conv2d_input_grad`` + ``conv2d_weight_grad``),
pooling (``avg_pool2d``'s one-channel convolutions), matmul, and elementwise ops and reductions;
the rest of the step is Python: the op namespace, shape rules, the tape, the backward walk and
the optimiser. PyTorch: ``torch.profiler``'s self CPU time of every aten op, grouped alike; the
rest is its Python, autograd engine and dispatcher. The step times (and the rest) come from
unprofiled steps, interleaved; the groups from profiled ones (the profilers add a little).

Models: bench/conv.py's conv net (``--model conv``, the default) or step_time.py's small conv
net (``--model step_time``), float32, SGD.

    python bench/eager_profile.py --threads 1
    python bench/eager_profile.py --threads 1 --model step_time
"""

from __future__ import annotations

import os
import statistics
import sys
import time
from collections import defaultdict

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import _common as C  # noqa: E402

GROUPS = ["convolution forward", "convolution backward", "pooling", "matmul",
          "elementwise and reductions"]


def _ours_group(prim, args) -> str:
    if prim.startswith("conv2d"):
        w = args[1] if prim != "conv2d_weight_grad" else None
        channels = (args[0].shape[1], args[1].shape[1]) if w is None else w.shape[:2]
        if tuple(channels) == (1, 1):
            return "pooling"
        return "convolution forward" if prim == "conv2d" else "convolution backward"
    return "matmul" if prim in ("matmul", "einsum") else "elementwise and reductions"


def _torch_group(name) -> str:
    if "pool" in name:
        return "pooling"
    if "conv" in name:
        return "convolution backward" if "backward" in name else "convolution forward"
    if name.split("::")[-1] in ("mm", "addmm", "bmm", "matmul", "linear"):
        return "matmul"
    return "elementwise and reductions"


def profile_ours(fn, steps):
    """ms per step of each group's rows over ``steps`` calls of ``fn``, and of each primitive."""
    from replicate.graph import core

    spent, per_prim = defaultdict(float), defaultdict(float)
    original = dict(core.IMPL)

    def timed(prim, row):
        def run(*args, **attrs):
            t0 = time.perf_counter()
            out = row(*args, **attrs)
            dt = time.perf_counter() - t0
            spent[_ours_group(prim, args)] += dt
            per_prim[prim] += dt
            return out
        return run

    for prim, row in original.items():
        core.IMPL[prim] = timed(prim, row)
    try:
        for _ in range(steps):
            fn()
    finally:
        core.IMPL.update(original)
    return ({k: v * 1e3 / steps for k, v in spent.items()},
            {k: v * 1e3 / steps for k, v in per_prim.items()})


def profile_torch(fn, steps):
    import torch

    spent = defaultdict(float)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        for _ in range(steps):
            fn()
    for ev in prof.key_averages():
        spent[_torch_group(ev.key)] += ev.self_cpu_time_total / 1e3  # us -> ms
    return {k: v / steps for k, v in spent.items()}


def build(model):
    import torch

    if model == "conv":
        import conv as M

        params, x, y = M.init(M.CFG)
        ours = M.replicate_step(params, "eager", "numpy")
        theirs = M.torch_step(params)
    else:
        import step_time as M

        params, x, y = M.conv_init(M.CONV)
        ours = M.replicate_step("conv", params, "eager", "numpy")
        theirs = M.torch_step("conv", params)
    xt, yt = torch.from_numpy(x), torch.from_numpy(y)
    return (lambda: ours(x, y)), (lambda: theirs(xt, yt))


def worker(args):
    C.worker_threads()
    model = os.environ.get("BENCH_PROFILE_MODEL", "conv")
    ours, theirs = build(model)
    steps = 3 if args.quick else 20
    for _ in range(3):
        ours(), theirs()
    times = {"ours": [], "torch": []}
    for _ in range(steps):  # unprofiled, interleaved
        for name, fn in (("ours", ours), ("torch", theirs)):
            t0 = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - t0)
    groups, prims = profile_ours(ours, steps)
    C.write_worker_json(args.json, {
        "model": model, "ours_step": statistics.median(times["ours"]) * 1e3,
        "torch_step": statistics.median(times["torch"]) * 1e3, "ours": groups, "prims": prims,
        "torch": profile_torch(theirs, steps)})


def report(results, command, quick=False):
    model = next(iter(results.values()))["model"]
    if model != "conv":
        command += f" --model {model}"
    parts = [C.header("Where an eager step's time goes: replicate vs PyTorch eager", command)]
    for threads, r in sorted(results.items()):
        cells = []
        for g in GROUPS:
            cells.append([g, f"{r['ours'].get(g, 0):.2f}", f"{r['torch'].get(g, 0):.2f}"])
        rest_ours = r["ours_step"] - sum(r["ours"].values())
        rest_torch = r["torch_step"] - sum(r["torch"].values())
        cells.append(["rest: Python (op namespace, shape rules, tape, backward walk, optimiser)"
                      " / PyTorch's Python, autograd and dispatcher", f"{rest_ours:.2f}",
                      f"{rest_torch:.2f}"])
        cells.append(["**step (median, unprofiled)**", f"**{r['ours_step']:.2f}**",
                      f"**{r['torch_step']:.2f}** ({r['ours_step'] / r['torch_step']:.2f}x)"])
        top = sorted(r["prims"].items(), key=lambda kv: -kv[1])[:8]
        parts.append(f"### model: {r['model']}; {threads} thread(s); ms per step\n\n" + C.table(
            ["where", "replicate eager", "PyTorch eager"], cells) + "\n\nreplicate's rows by "
            "primitive: " + ", ".join(f"{k} {v:.2f}" for k, v in top) + "\n")
    text = "\n".join(parts)
    print(text)
    return text


def main(argv=None):
    argv = list(sys.argv[1:] if argv is None else argv)
    if "--model" in argv:  # passed to the worker through the environment
        i = argv.index("--model")
        os.environ["BENCH_PROFILE_MODEL"] = argv[i + 1]
        del argv[i:i + 2]
    return C.threads_main(argv, __file__, __doc__, worker, report)


if __name__ == "__main__":
    main()
