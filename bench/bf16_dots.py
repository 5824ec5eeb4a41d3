"""bfloat16 products on the JAX backend, one dot at a time: does XLA run each as a bf16 kernel?

The three products of the MLP's 1024x1024 layer at batch 256 (forward ``x @ w``, input gradient
``g @ w.T``, weight gradient ``x.T @ g``), each written with ``replicate.numpy`` as the gradient
rules write them, traced by ``rp.function(..., backend="jax")`` and run under ``jax.jit`` from
the backend's graph, three ways, interleaved:

* float32 operands;
* bf16 operands, each node lowered by its table rule alone (``jnp.matmul`` asking for a float32
  result): how the JAX backend lowered them before ``jax_impl._bf16_matmul``;
* bf16 operands, lowered by ``jax_impl.apply`` (the JAX backend as it is).

Each row also names the operand dtype of the dot in XLA's optimised HLO: ``f32`` where XLA
upcast a bf16 dot because its bf16 kernel does not take it (bench/RESULTS.md, "Mixed precision").

    python bench/bf16_dots.py --threads 1
    python bench/bf16_dots.py --quick        # smoke run (small shapes)
"""

from __future__ import annotations

import os
import re
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import _common as C  # noqa: E402

PRODUCTS = {  # name -> (function of the two operands, operand names)
    "forward x @ w": (lambda a, b: a @ b, ("x", "w")),
    "input gradient g @ w.T": (lambda a, b: a @ b.T, ("g", "w")),
    "weight gradient x.T @ g": (lambda a, b: a.T @ b, ("x", "g")),
}
WAYS = ("float32", "bf16, table rule alone (before)", "bf16, JAX backend")


def build(product, way, arrays):
    import jax
    import numpy as np

    import replicate as rp
    from replicate.backends.jax_impl import JAX, apply
    from replicate.graph import reference
    from replicate.graph.interpret import eval_graph

    fn, names = PRODUCTS[product]
    dtype = np.float32 if way == "float32" else rp.bfloat16
    args = [arrays[n].astype(dtype) for n in names]
    graph = rp.function(fn, backend="jax").executable(*args).graph
    rule = (lambda node, xs: reference.apply(JAX, node, xs)) if "before" in way else apply
    step = jax.jit(lambda *a: eval_graph(graph, a, rule))
    dev = [jax.device_put(a) for a in args]
    text = step.lower(*dev).compile().as_text()
    types = dict(re.findall(r"%([\w.\-]+) = (\w+)\[", text))
    dots = ["x".join(types[n] for n in re.findall(r"%([\w.\-]+)", ops))
            for ops in re.findall(r" dot\(([^)]*)\)", text)]
    return (lambda: step(*dev)), jax.block_until_ready, ", ".join(dots)


def worker(args):
    import numpy as np

    C.worker_threads()
    load = os.getloadavg()[0]
    m, k = (32, 64) if args.quick else (256, 1024)
    rng = np.random.default_rng(0)
    arrays = {"x": rng.standard_normal((m, k)).astype(np.float32),
              "w": rng.standard_normal((k, k)).astype(np.float32),
              "g": rng.standard_normal((m, k)).astype(np.float32)}
    warmup, rounds = C.quick_counts(args.quick, 3, 30)
    dots, builders = {}, {}
    for product in PRODUCTS:
        for way in WAYS:
            def make(p=product, w=way):
                fn, sync, dots[f"{p} | {w}"] = build(p, w, arrays)
                return fn, sync
            builders[f"{product} | {way}"] = make
    rows = C.measure_many(builders, warmup=warmup, rounds=rounds, max_seconds=60)
    C.write_worker_json(args.json, {"rows": [r.as_dict() for r in rows], "dots": dots,
                                    "load": f"load average {load:.2f} at the start"})


def report(results, command, quick):
    parts = [C.header("bf16 products on the JAX backend, one dot at a time", command)]
    for threads, res in sorted(results.items()):
        by = {r.name: r for r in C.rows_from(res["rows"])}
        cells = []
        for product in PRODUCTS:
            row = [product]
            for way in WAYS:
                r = by.get(f"{product} | {way}")
                t = r.timing if r else None
                dots = res["dots"].get(f"{product} | {way}", "")
                row.append(f"{t.median * 1e3:.2f} ms ({dots})" if t else f"n/a {C.note(r)}")
            cells.append(row)
        parts.append(f"### {threads} thread(s); {res.get('load', '')}\n\nmedian ms per call "
                     "(operand dtypes of the dot in XLA's optimised HLO)\n\n"
                     + C.table(["product"] + list(WAYS), cells) + "\n")
    text = "\n".join(parts)
    print(text)
    return text


def main(argv=None):
    return C.threads_main(argv, __file__, __doc__, worker, report)


if __name__ == "__main__":
    main()
