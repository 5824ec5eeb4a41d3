"""Mixed precision: the MLP training step in float32 and under bfloat16 autocast, vs peers.

The model, initial weights and batch of ``bench/step_time.py`` (MLP 784-1024-1024-10, ReLU,
batch 256, softmax cross-entropy, plain SGD, lr 0.01; ``mlp_init`` imported from there). Each
implementation is timed in float32 and with its own bfloat16 autocast, all rows interleaved in
one worker process per thread count:

* replicate graph mode (``rp.function``), NumPy and JAX backends: the step body runs inside
  ``rp.autocast("bfloat16")`` (matmul inputs cast to bf16; losses, reductions and the float32
  parameters stay float32);
* ``jax.jit`` written by hand: the matmul inputs cast to bf16, float32 elsewhere (the same
  casts as replicate's autocast, the product in bf16), and once more with the products asked
  for in float32 (``preferred_element_type``: the form XLA's CPU backend runs as a bf16 kernel;
  its fp32 column is the plain ``jax.jit`` row). Their gradient products are JAX's autodiff's,
  which XLA upcasts to float32 dots (a transposed operand); replicate's JAX backend writes
  those in the kernel's form too (``jax_impl._bf16_matmul``);
* PyTorch eager with ``torch.autocast("cpu", dtype=torch.bfloat16)``.

Targets (issue 15): replicate's JAX backend in bf16 no slower than in float32, and within 1.2x
of PyTorch's bf16 step. Every row is also trained ``LOSS_STEPS`` steps from the same start before
timing; the bf16 losses must agree with float32 to ``LOSS_RTOL`` (relative), so every row trains
the same model.

    python bench/mixed_precision.py                # 1 and 2 threads, about 2 minutes
    python bench/mixed_precision.py --threads 1
    python bench/mixed_precision.py --quick        # smoke run (small MLP, batch 32)
"""

from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import _common as C  # noqa: E402
from step_time import LR, MLP_BATCH, MLP_SIZES, mlp_init, replicate_model, torch_model  # noqa: E402

LOSS_STEPS = 5     # steps trained (from the shared start) before timing, for the loss check
LOSS_RTOL = 1e-2   # bf16 loss vs the same implementation's float32 loss, relative
PRECISIONS = ("fp32", "bf16")
JAX_F32_OUT = "jax.jit bf16, f32-result dots"
IMPLS = {  # table row -> (its fp32 row, its bf16 row)
    "replicate graph numpy": ("replicate graph numpy fp32", "replicate graph numpy bf16"),
    "replicate graph jax": ("replicate graph jax fp32", "replicate graph jax bf16"),
    "jax.jit": ("jax.jit fp32", "jax.jit bf16"),
    "jax.jit, bf16 dots with f32 results": ("jax.jit fp32", JAX_F32_OUT),
    "PyTorch eager": ("PyTorch eager fp32", "PyTorch eager bf16"),
}
TARGETS = {  # (label, numerator row, denominator row, at most)
    "jax_bf16_vs_fp32": ("replicate JAX bf16 / replicate JAX fp32",
                         "replicate graph jax bf16", "replicate graph jax fp32", 1.0),
    "jax_bf16_vs_torch_bf16": ("replicate JAX bf16 / PyTorch bf16",
                               "replicate graph jax bf16", "PyTorch eager bf16", 1.2),
    "jax_bf16_vs_jit_bf16": ("replicate JAX bf16 / jax.jit bf16 (no target; the same casts)",
                             "replicate graph jax bf16", "jax.jit bf16", None),
}


# -- the implementations: each build() -> (call() -> loss, sync) --------------------------------
def replicate_build(params, x, y, backend, bf16):
    import replicate as rp

    model = replicate_model("mlp", params)
    opt = rp.optim.SGD(model.parameters(), lr=LR)

    def step(x, y):
        with rp.autocast("bfloat16" if bf16 else None):
            loss = rp.nn.softmax_cross_entropy(model(x), y).mean()
        opt.apply(rp.grad(loss, model.parameters()))
        return loss

    fn = rp.function(step, mode="graph", backend=backend)

    def param_dtypes():
        return sorted({str(v.numpy().dtype) for v in model.parameters().values()})
    return (lambda: fn(x, y)), None, param_dtypes


def jax_build(params, x, y, bf16, f32_out=False):
    """``bf16``: matmul inputs cast to bf16 and the product in bf16 (what ``a @ w`` gives, and
    what replicate's autocast asks for); with ``f32_out`` the product is asked for in float32
    (``preferred_element_type``), the form XLA's CPU backend runs as a bf16 kernel (the forward
    products: autodiff's gradient products read transposed operands, which XLA upcasts)."""
    import jax
    import jax.numpy as jnp

    def mm(a, w):
        if bf16 and f32_out:
            return jax.lax.dot(a.astype(jnp.bfloat16), w.astype(jnp.bfloat16),
                               preferred_element_type=jnp.float32)
        if bf16:
            return a.astype(jnp.bfloat16) @ w.astype(jnp.bfloat16)
        return a @ w

    def loss_fn(ps, x, y):
        w1, b1, w2, b2, w3, b3 = ps
        h = jax.nn.relu(mm(x, w1) + b1)        # bf16 + f32 bias -> f32
        h = jax.nn.relu(mm(h, w2) + b2)
        z = mm(h, w3) + b3
        logp = jax.nn.log_softmax(z.astype(jnp.float32))
        return -jnp.take_along_axis(logp, y[:, None], axis=1).mean()

    @jax.jit
    def step(ps, x, y):
        loss, grads = jax.value_and_grad(loss_fn)(ps, x, y)
        return [p - LR * g for p, g in zip(ps, grads)], loss

    state = {"ps": [jnp.asarray(p) for p in params]}
    xj, yj = jnp.asarray(x), jnp.asarray(y)

    def call():
        state["ps"], loss = step(state["ps"], xj, yj)
        return loss
    return call, jax.block_until_ready, lambda: sorted({str(p.dtype) for p in state["ps"]})


def torch_build(params, x, y, bf16):
    import torch

    model = torch_model("mlp", params)
    opt = torch.optim.SGD(model.parameters(), lr=LR)
    loss_fn = torch.nn.CrossEntropyLoss()
    xt, yt = torch.from_numpy(x), torch.from_numpy(y)

    def call():
        opt.zero_grad(set_to_none=True)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
            loss = loss_fn(model(xt), yt)
        loss.backward()
        opt.step()
        return loss
    return (call, lambda loss: loss.detach().numpy(),
            lambda: sorted({str(p.dtype).replace("torch.", "") for p in model.parameters()}))


def builders_for(params, x, y):
    """{row name: build() -> (fn, sync)}; each build first trains ``LOSS_STEPS`` steps and keeps
    their losses (and the dtypes of the parameters and of the loss) in ``checks[row name]``."""
    checks = {}

    def wrap(name, make):
        def build():
            import numpy as np

            fn, sync, param_dtypes = make()
            losses, loss_dtype = [], None
            for _ in range(LOSS_STEPS):
                r = fn()
                r = sync(r) if sync else r
                losses.append(float(np.asarray(r)))
                loss_dtype = str(np.asarray(r).dtype)
            checks[name] = {"losses": losses, "loss_dtype": loss_dtype,
                            "param_dtypes": param_dtypes()}
            return fn, sync
        return build

    out = {}
    for backend in ("numpy", "jax"):
        why = C.backend_unavailable(backend)
        for prec in PRECISIONS:
            name = f"replicate graph {backend} {prec}"
            out[name] = why or wrap(name, lambda b=backend, p=prec: replicate_build(
                params, x, y, b, p == "bf16"))
    for prec in PRECISIONS:
        out[f"jax.jit {prec}"] = wrap(f"jax.jit {prec}",
                                      lambda p=prec: jax_build(params, x, y, p == "bf16"))
    out[JAX_F32_OUT] = wrap(JAX_F32_OUT, lambda: jax_build(params, x, y, True, f32_out=True))
    for prec in PRECISIONS:
        out[f"PyTorch eager {prec}"] = wrap(
            f"PyTorch eager {prec}", lambda p=prec: torch_build(params, x, y, p == "bf16"))
    return out, checks


# -- the worker -----------------------------------------------------------------------------------
def worker(args):
    C.worker_threads()
    sizes = (784, 128, 128, 10) if args.quick else MLP_SIZES
    params, x, y = mlp_init(sizes, 32 if args.quick else MLP_BATCH)
    warmup, rounds = C.quick_counts(args.quick, 3, 20)
    builders, checks = builders_for(params, x, y)
    before = _cpu_sample()
    rows = C.measure_many(builders, warmup=warmup, rounds=rounds, max_seconds=120,
                          extra_fn=lambda name, first: checks.get(name))
    C.write_worker_json(args.json, {"threads": int(args.threads),
                                    "rows": [r.as_dict() for r in rows],
                                    "others_busy": _others_busy(before, _cpu_sample())})


def _cpu_sample():
    """(all cores' busy and total seconds from /proc/stat, this process's CPU seconds)."""
    import resource

    try:
        with open("/proc/stat") as f:
            v = [int(t) for t in f.readline().split()[1:]]
    except (OSError, ValueError):
        return None
    hz = os.sysconf("SC_CLK_TCK")
    idle = v[3] + (v[4] if len(v) > 4 else 0)
    ru = resource.getrusage(resource.RUSAGE_SELF)
    return (sum(v) - idle) / hz, sum(v) / hz, ru.ru_utime + ru.ru_stime


def _others_busy(a, b):
    """Fraction of all cores that other processes kept busy between two samples (the
    build, warm-up and timed rounds): the load ``record_load`` cannot see once timing starts."""
    if a is None or b is None or b[1] <= a[1]:
        return None
    return max(0.0, ((b[0] - a[0]) - (b[2] - a[2])) / (b[1] - a[1]))


# -- the report -----------------------------------------------------------------------------------
def _ms(t):
    return f"{t.median * 1e3:.2f} ({t.min * 1e3:.2f})" if t else "n/a"


def _rel(a, b):
    """The largest relative difference between two loss curves."""
    return max(abs(p - q) / abs(p) for p, q in zip(a, b))


def loss_check(by):
    """Per implementation: its fp32 and bf16 losses over the first ``LOSS_STEPS`` steps, the
    largest relative difference of the bf16 curve from its own fp32 curve and from the reference
    (the first fp32 row: replicate's NumPy backend), and the dtypes after training."""
    ref = next((r for r in by.values() if r.name.endswith("fp32") and r.extra), None)
    cells, ok_all = [], ref is not None
    for impl, (fname, bname) in IMPLS.items():
        f, b = by.get(fname), by.get(bname)
        if not (f and b and f.extra and b.extra and ref):
            cells.append([impl, "n/a", "n/a", "n/a", "n/a", "n/a", ""])
            ok_all = False
            continue
        lf, lb, lr = f.extra["losses"], b.extra["losses"], ref.extra["losses"]
        own, vs_ref = _rel(lf, lb), _rel(lr, lb)
        ok = max(own, vs_ref, _rel(lr, lf)) <= LOSS_RTOL
        ok_all &= ok
        dtypes = (f"loss {b.extra['loss_dtype']}, params "
                  f"{'/'.join(b.extra['param_dtypes'])}")
        cells.append([impl, f"{lf[0]:.4f} → {lf[-1]:.4f}", f"{lb[0]:.4f} → {lb[-1]:.4f}",
                      f"{own:.1e}", f"{vs_ref:.1e}", "ok" if ok else "DIFFERS", dtypes])
    ref_name = ref.name if ref else "n/a"
    return C.table(["implementation", f"fp32 loss, step 1 → {LOSS_STEPS}",
                    f"bf16 loss, step 1 → {LOSS_STEPS}", "bf16 vs its fp32 (max rel.)",
                    f"bf16 vs {ref_name}", f"≤ {LOSS_RTOL:g}",
                    "bf16 row: dtypes after training"], cells), ok_all


def report(results, command, quick):
    title = ("MLP 784-1024-1024-10, batch 256, SGD step" if not quick
             else "MLP 784-128-128-10, batch 32 (quick)")
    parts = [C.header("Mixed precision (bf16 autocast)", command)]
    summary = {}
    for threads, res in sorted(results.items()):
        rows = C.rows_from(res["rows"])
        busy = res.get("others_busy")
        during = ("" if busy is None else
                  f"Other jobs kept {busy * 100:.0f} % of the machine's cores busy while this "
                  "worker ran.\n\n")
        by = {r.name: r for r in rows}
        cells = []
        for impl, (fname, bname) in IMPLS.items():
            f, b = by.get(fname), by.get(bname)
            ft, bt = f.timing if f else None, b.timing if b else None
            notes = "; ".join(f"{p}: {C.note(r)}" for p, r in (("fp32", f), ("bf16", b))
                              if r and C.note(r))
            cells.append([impl, _ms(ft), _ms(bt), C.ratio(bt, ft), notes])
        lines = []
        for key, (label, num, den, limit) in TARGETS.items():
            n, d = by.get(num), by.get(den)
            val = (n.timing.median / d.timing.median
                   if n and d and n.timing and d.timing else None)
            verdict = ("—" if limit is None else
                       C.verdict(val, val is not None and val <= limit))
            summary[(threads, key)] = (val, verdict)
            shown = f"{val:.2f}x" if val is not None else "n/a"
            lines.append(f"| {label} | {shown} | {'—' if limit is None else f'≤ {limit}x'} "
                         f"| {verdict} |")
        losses, ok = loss_check(by)
        parts.append(
            f"### {title}; {threads} thread(s)\n\n" + during
            + C.table(["implementation", "fp32 ms/step median (min)",
                       "bf16 ms/step median (min)", "bf16/fp32", "note"], cells)
            + "\n\n| ratio (medians) | measured | target | verdict |\n|---|---|---|---|\n"
            + "\n".join(lines)
            + f"\n\nLoss check ({LOSS_STEPS} steps from the shared start, before timing): "
            + ("every bf16 row agrees with its fp32 row" if ok else "SOME ROWS DISAGREE")
            + "\n\n" + losses + "\n")
    text = "\n".join(parts)
    print(text)
    return text, summary


def main(argv=None):
    return C.threads_main(argv, __file__, __doc__, worker, report)


if __name__ == "__main__":
    main()
