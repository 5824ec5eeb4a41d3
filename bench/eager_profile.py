"""Where an eager (define-by-run) training step spends its time, beside PyTorch eager's.

replicate: a timer around every NumPy reference row the step runs (the ops' own work), grouped
into convolution forward, convolution backward (``conv2d_input_grad`` + ``conv2d_weight_grad``),
pooling (``avg_pool2d``'s one-channel convolutions), matmul, and elementwise ops and reductions;
the rest of the step is Python: the op namespace, shape rules, the tape, the backward walk and
the optimiser. PyTorch: ``torch.profiler``'s self CPU time of every aten op, grouped alike; the
rest is its Python, autograd engine and dispatcher. The step times (and the rest) come from
unprofiled steps, interleaved in one process as in bench/conv.py; the groups from profiled ones
(the profilers add a little). Each step is also timed in a process of its own, and the page
faults of a step counted: in one process the framework whose transient memory the allocator
cannot place in memory it already holds pays for fresh pages every step.

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


def build(model, which=("ours", "torch")):
    """{name: step()} for replicate eager ("ours") and PyTorch eager ("torch")."""
    if model == "conv":
        import conv as M

        params, x, y = M.init(M.CFG)
        make = {"ours": lambda: M.replicate_step(params, "eager", "numpy"),
                "torch": lambda: M.torch_step(params)}
    else:
        import step_time as M

        params, x, y = M.conv_init(M.CONV)
        make = {"ours": lambda: M.replicate_step("conv", params, "eager", "numpy"),
                "torch": lambda: M.torch_step("conv", params)}
    steps = {}
    for name in which:
        fn = make[name]()
        if name == "torch":
            import torch

            xt, yt = torch.from_numpy(x), torch.from_numpy(y)
            steps[name] = lambda fn=fn: fn(xt, yt)
        else:
            steps[name] = lambda fn=fn: fn(x, y)
    return steps


def _faults() -> int:
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt


def timed_steps(steps: dict, count: int) -> dict:
    """Interleaved unprofiled calls: {name: (median ms, page faults per call)}."""
    for fn in steps.values():
        for _ in range(3):
            fn()
    times, faults = {n: [] for n in steps}, dict.fromkeys(steps, 0)
    for _ in range(count):
        for name, fn in steps.items():
            f0, t0 = _faults(), time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - t0)
            faults[name] += _faults() - f0
    return {n: (statistics.median(times[n]) * 1e3, faults[n] / count) for n in steps}


def alone(model, which, count):
    """The step of ``which`` in a process of its own (this worker's threads and cores)."""
    import json
    import subprocess

    out = subprocess.run([sys.executable, __file__, "--alone", model, which, str(count)],
                         capture_output=True, text=True, check=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def worker(args):
    C.worker_threads()
    model = os.environ.get("BENCH_PROFILE_MODEL", "conv")
    count = 3 if args.quick else 20
    own = {name: alone(model, name, count) for name in ("ours", "torch")}
    steps = build(model)
    shared = timed_steps(steps, count)
    groups, prims = profile_ours(steps["ours"], count)
    C.write_worker_json(args.json, {
        "model": model, "shared": shared, "own": own, "ours": groups, "prims": prims,
        "torch": profile_torch(steps["torch"], count)})


def report(results, command, quick=False):
    model = next(iter(results.values()))["model"]
    if model != "conv":
        command += f" --model {model}"
    parts = [C.header("Where an eager step's time goes: replicate vs PyTorch eager", command)]
    for threads, r in sorted(results.items()):
        (ours_ms, ours_pf), (torch_ms, torch_pf) = r["shared"]["ours"], r["shared"]["torch"]
        cells = []
        for g in GROUPS:
            cells.append([g, f"{r['ours'].get(g, 0):.2f}", f"{r['torch'].get(g, 0):.2f}"])
        cells.append(["rest: Python (op namespace, shape rules, tape, backward walk, optimiser)"
                      " / PyTorch's Python, autograd and dispatcher",
                      f"{ours_ms - sum(r['ours'].values()):.2f}",
                      f"{torch_ms - sum(r['torch'].values()):.2f}"])
        cells.append(["**step, both in one process (as bench/conv.py), median**",
                      f"**{ours_ms:.2f}** ({ours_pf:.0f} page faults)",
                      f"**{torch_ms:.2f}** ({torch_pf:.0f} page faults); "
                      f"{ours_ms / torch_ms:.2f}x"])
        (o_ms, o_pf), (t_ms, t_pf) = r["own"]["ours"], r["own"]["torch"]
        cells.append(["step, each in a process of its own, median", f"{o_ms:.2f} ({o_pf:.0f} "
                      "page faults)", f"{t_ms:.2f} ({t_pf:.0f} page faults); "
                      f"{o_ms / t_ms:.2f}x"])
        top = sorted(r["prims"].items(), key=lambda kv: -kv[1])[:8]
        parts.append(f"### model: {r['model']}; {threads} thread(s); ms per step\n\n" + C.table(
            ["where", "replicate eager", "PyTorch eager"], cells) + "\n\nreplicate's rows by "
            "primitive: " + ", ".join(f"{k} {v:.2f}" for k, v in top) + "\n")
    text = "\n".join(parts)
    print(text)
    return text


def main(argv=None):
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["--alone"]:  # a step measured in a process of its own (see ``alone``)
        import json

        model, which, count = argv[1], argv[2], int(argv[3])
        print(json.dumps(timed_steps(build(model, (which,)), count)[which]))
        return None
    if "--model" in argv:  # passed to the worker through the environment
        i = argv.index("--model")
        os.environ["BENCH_PROFILE_MODEL"] = argv[i + 1]
        del argv[i:i + 2]
    return C.threads_main(argv, __file__, __doc__, worker, report)


if __name__ == "__main__":
    main()
