"""Compile time and retraces: a 20-layer MLP step, 4 replicas in one process.

Step: 20 Linear layers of width 256 (ReLU between), batch 32 per replica, softmax
cross-entropy, SGD with the gradients averaged over the replicas (``rp.wrap_optimizer``) — so
the step has 40 all-reduces to rewrite (and, with bucketing, to pack).

Phases, timed by calling the pipeline's stages one after the other (each its median over a few
repeats; the stages are replicate internals, so a stage that moved shows as n/a):

* trace: ``step_fn`` traced once per local replica into one graph (``trace_replicas``);
* rewrite: the placeholder rewrite, CSE of the replicas' identical updates, DCE
  (the rest of ``compile_replicated``);
* passes: the backend's optimisation passes (``replicate.compiler.optimize``), pass by pass;
* lowering: ``backend.lower`` (for JAX, tracing and XLA compilation happen on the first call:
  see the first-step row).

End to end: the first ``Replicator.run(steps=1)`` (trace + compile + first step) minus a
steady-state step. Retraces: ``Replicator.trace_count`` and ``rp.function``'s ``trace_count``
over 100 steady steps with fresh batches of the same shapes (must stay 1, i.e. 0 retraces).

    python bench/compile_time.py [--quick]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import _common as C  # noqa: E402

LAYERS, WIDTH, BATCH, K = 20, 256, 32, 4


def build(seed=0, layers=LAYERS, width=WIDTH):
    import numpy as np

    import replicate as rp

    rng = np.random.default_rng(seed)
    mods = []
    for i in range(layers):
        mods.append(rp.nn.Linear(width, 10 if i == layers - 1 else width, rng=rng))
        if i < layers - 1:
            mods.append(rp.nn.relu)
    model = rp.nn.Sequential(*mods)
    opt = rp.wrap_optimizer(rp.optim.SGD(model.parameters(), lr=0.01))

    def step_fn(batch):
        x, y = batch
        loss = rp.nn.softmax_cross_entropy(model(x), y).mean()
        opt.apply(rp.grad(loss, model.parameters()))
        return {"loss": loss}

    def input_fn(ctx):
        r = np.random.default_rng(ctx.replica_id)
        while True:
            yield (r.standard_normal((BATCH, width)).astype(np.float32),
                   r.integers(0, 10, BATCH).astype(np.int64))

    return model, step_fn, input_fn


def _median_time(fn, repeats):
    ts, out = [], None
    for _ in range(repeats):
        t0 = time.perf_counter()
        out = fn()
        ts.append(time.perf_counter() - t0)
    return statistics.median(ts), out


def phases(backend_name, repeats, layers, width):
    """{phase: seconds} for one backend, and graph sizes."""
    import replicate as rp
    from replicate.backends import get_backend
    from replicate.compiler import CompileOptions, backend_passes
    from replicate.compiler import step_graph as compile_replicated
    from replicate.graph.passes import StepContext
    from replicate.step import trace_step as trace_replicas

    _, step_fn, input_fn = build(layers=layers, width=width)
    contexts = [rp.ReplicaContext(r, K, 0, 1, r, K) for r in range(K)]
    batches = [next(iter(input_fn(ctx))) for ctx in contexts]
    backend = get_backend(backend_name)
    options = CompileOptions()
    out, sizes = {}, {}
    t_trace, traced = _median_time(lambda: trace_replicas(step_fn, batches, contexts), repeats)
    t_full, graph = _median_time(lambda: compile_replicated(step_fn, batches, contexts, 1, 0),
                                 repeats)
    out["trace"] = t_trace
    out["rewrite + cse + dce"] = max(t_full - t_trace, 0.0)
    sizes["traced nodes"] = len(traced.nodes)
    sizes["after rewrite"] = len(graph.nodes)
    g = graph
    ctx = StepContext(options=options, backend=backend)
    for run_pass in backend_passes(backend, options):
        t, g2 = _median_time(lambda run_pass=run_pass, g=g: run_pass.run(g, ctx), repeats)
        out[f"pass {run_pass.name}"] = t
        g = g2
    sizes["after passes"] = len(g.nodes)
    t_lower, lowered = _median_time(lambda: backend.lower(g), repeats)
    out["lowering"] = t_lower
    kernels = getattr(lowered, "kernels", None)
    if kernels is not None:
        sizes["kernels"] = len(kernels)
    return out, sizes


def end_to_end(backend_name, steps, layers, width):
    import replicate as rp

    _, step_fn, input_fn = build(layers=layers, width=width)
    rep = rp.Replicator(input_fn, step_fn, replicas_per_rank=K, backend=backend_name)
    t0 = time.perf_counter()
    rep.run(steps=1)
    first = time.perf_counter() - t0
    rep.run(steps=3)
    ts = []
    for _ in range(steps):
        t0 = time.perf_counter()
        rep.run(steps=1)
        ts.append(time.perf_counter() - t0)
    steady = statistics.median(ts)
    return {"first step": first, "steady step": steady, "compile (first - steady)":
            first - steady, "replicator traces": rep.trace_count,
            "retraces over steady steps": rep.trace_count - 1, "steady steps": steps + 3}


def function_retraces(backend_name, steps, width):
    import numpy as np

    import replicate as rp

    model, _, _ = build(layers=4, width=width)
    opt = rp.optim.SGD(model.parameters(), lr=0.01)

    def step(x, y):
        loss = rp.nn.softmax_cross_entropy(model(x), y).mean()
        opt.apply(rp.grad(loss, model.parameters()))
        return loss

    f = rp.function(step, backend=backend_name)
    rng = np.random.default_rng(0)
    for _ in range(steps + 1):
        f(rng.standard_normal((BATCH, width)).astype(np.float32),
          rng.integers(0, 10, BATCH).astype(np.int64))
    return f.trace_count


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="smoke run")
    args = ap.parse_args(argv)
    layers, width = (LAYERS, 64) if args.quick else (LAYERS, WIDTH)
    steps = 10 if args.quick else 100
    repeats = 1 if args.quick else 5
    results = {}
    C.record_load()
    for backend in ("numpy", "jax"):
        reason = C.backend_unavailable(backend)
        if reason:
            results[backend] = {"n/a": reason}
            continue
        res = {}
        try:
            res["phases"], res["sizes"] = phases(backend, repeats, layers, width)
        except Exception as e:  # noqa: BLE001 - internals moved
            res["phases_error"] = C._reason(e)
        res["e2e"] = end_to_end(backend, steps, layers, width)
        res["function_traces"] = function_retraces(backend, steps, width)
        results[backend] = res
    command = "python bench/compile_time.py" + (" --quick" if args.quick else "")
    text = report(results, command, args.quick, steps)
    if not args.quick:
        C.save_json("compile_time", {"machine": C.machine(), "results": results,
                                     "markdown": text})


def report(results, command, quick, steps):
    parts = [C.header(f"Compile time: {LAYERS}-layer MLP step, {K} replicas per process",
                      command)]
    if quick:
        parts.append("(quick: width 64, 10 steady steps)\n")
    backends = list(results)
    names = []
    for res in results.values():
        for k in res.get("phases", {}):
            if k not in names:
                names.append(k)
    cells = []
    for k in names:
        cells.append([k] + [f"{results[b]['phases'][k] * 1e3:.1f}" if "phases" in results[b]
                            and k in results[b]["phases"] else "n/a" for b in backends])
    totals = {b: sum(results[b]["phases"].values()) for b in backends if "phases" in results[b]}
    cells.append(["**trace + rewrite + passes + lowering**"]
                 + [f"**{totals[b] * 1e3:.1f}**" if b in totals else "n/a" for b in backends])
    for key in ("first step", "steady step", "compile (first - steady)"):
        cells.append([f"end to end: {key}"] + [
            f"{results[b]['e2e'][key] * 1e3:.1f}" if "e2e" in results[b] else "n/a"
            for b in backends])
    parts.append(C.table(["phase (ms)"] + [f"backend {b}" for b in backends], cells))
    cells = []
    for key in ("traced nodes", "after rewrite", "after passes", "kernels"):
        cells.append([key] + [str(results[b].get("sizes", {}).get(key, "n/a"))
                              for b in backends])
    cells.append(["Replicator retraces over steady steps"] + [
        str(results[b]["e2e"]["retraces over steady steps"]) if "e2e" in results[b] else "n/a"
        for b in backends])
    cells.append([f"rp.function trace_count after {steps + 1} calls"] + [
        str(results[b].get("function_traces", "n/a")) for b in backends])
    parts.append("\n" + C.table(["graph"] + [f"backend {b}" for b in backends], cells))
    notes = [f"backend {b}: n/a — {r['n/a']}" for b, r in results.items() if "n/a" in r]
    notes += [f"backend {b}: phase timing n/a — {r['phases_error']}" for b, r in results.items()
              if "phases_error" in r]
    lines = []
    for b in backends:
        r = results[b]
        if "e2e" not in r:
            continue
        c = totals.get(b, r["e2e"]["compile (first - steady)"])
        e2e = r["e2e"]["compile (first - steady)"]
        ok = max(c, e2e) < 1.0
        lines.append(f"backend {b}: compile {c:.2f} s (stages) / {e2e:.2f} s (end to end) "
                     f"< 1 s — {'met' if ok else 'not met'}; retraces "
                     f"{r['e2e']['retraces over steady steps']} (Replicator), "
                     f"{r['function_traces'] - 1} (rp.function) — "
                     f"{'met' if r['e2e']['retraces over steady steps'] == 0 and r['function_traces'] == 1 else 'not met'}")  # noqa: E501
    parts.append("\nTargets: " + "; ".join(lines) + "\n")
    if notes:
        parts.append("Notes: " + "; ".join(notes) + "\n")
    text = "\n".join(parts)
    print(text)
    return text


if __name__ == "__main__":
    main()
