"""Transformer step: one AdamW training step of a small character-level GPT, replicate vs peers.

The model (GPT-2 style): token + position embedding, ``layers`` pre-LayerNorm blocks of
``heads``-head causal self-attention and a GELU (tanh) MLP of width 4d, a final LayerNorm and an
untied linear head to the vocabulary; softmax cross-entropy (next character), AdamW
(lr 1e-3, betas 0.9/0.999, eps 1e-8, weight decay 0.1 on every parameter), float32.

* small: d=64, 2 layers, 4 heads, context 64, vocabulary 95, batch 16 sequences;
* large: d=256, 4 layers, 4 heads, context 128, the same otherwise.

Rows: replicate graph mode on the NumPy and the JAX backend, replicate eager mode, against
PyTorch eager, a hand-written ``jax.jit`` of the same model and AdamW, and ``torch.compile``
(its compile limited to ``BENCH_COMPILE_TIMEOUT`` seconds, default 300; a failure or a timeout
makes the row n/a with the reason). The initial parameters are drawn once with NumPy and loaded
into every implementation; every row's first loss is checked against a float64 NumPy forward
pass before anything is timed (a row that disagrees becomes n/a). Rows are interleaved round by
round (bench/_common.py ``measure_many``), each worker 1 thread pinned to one core.

    python bench/transformer.py --size both       # the table
    python bench/transformer.py --quick            # smoke run (small size, few rounds)
    python bench/transformer.py --profile          # where the small graph-NumPy step's time goes
    python bench/transformer.py --remat --size both  # rp.remat per block against none (issue 33)

``--remat``: the replicate rows only, each with every block under ``rp.remat`` and without, with
the NumPy backend's planned bytes (``graph.meta.memory_plan``).
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import time
from collections import defaultdict

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import _common as C  # noqa: E402

SIZES = {
    "small": dict(d=64, layers=2, heads=4, ctx=64, vocab=95, batch=16),
    "large": dict(d=256, layers=4, heads=4, ctx=128, vocab=95, batch=16),
}
LR, BETAS, EPS, WD = 1e-3, (0.9, 0.999), 1e-8, 0.1
NEG = -1e9  # the masked (future) attention scores of the peers (replicate: is_causal, -inf)
REF = "PyTorch eager"
LOSS_TOL = 2e-4  # relative, float32 vs the float64 reference


# -- parameters and data (drawn once, with NumPy) --------------------------------------------------
def linear_names(cfg):
    """Names of the (in, out) matrices of linear layers (PyTorch stores them transposed)."""
    names = ["head.weight"]
    for i in range(cfg["layers"]):
        names += [f"h{i}.attn.weight", f"h{i}.proj.weight", f"h{i}.fc.weight",
                  f"h{i}.fc2.weight"]
    return set(names)


def init(cfg, seed=0):
    """{name: float32 array} (replicate's layouts: linear weights (in, out)), ids, targets."""
    import numpy as np

    rng = np.random.default_rng(seed)
    d, v, t = cfg["d"], cfg["vocab"], cfg["ctx"]
    normal = lambda *s, std=0.02: (rng.standard_normal(s) * std).astype(np.float32)  # noqa: E731
    zeros = lambda *s: np.zeros(s, np.float32)  # noqa: E731
    ones = lambda *s: np.ones(s, np.float32)  # noqa: E731
    p = {"wte.weight": normal(v, d), "wpe.weight": normal(t, d)}
    proj_std = 0.02 / np.sqrt(2 * cfg["layers"])
    for i in range(cfg["layers"]):
        p.update({
            f"h{i}.ln1.weight": ones(d), f"h{i}.ln1.bias": zeros(d),
            f"h{i}.attn.weight": normal(d, 3 * d), f"h{i}.attn.bias": zeros(3 * d),
            f"h{i}.proj.weight": normal(d, d, std=proj_std), f"h{i}.proj.bias": zeros(d),
            f"h{i}.ln2.weight": ones(d), f"h{i}.ln2.bias": zeros(d),
            f"h{i}.fc.weight": normal(d, 4 * d), f"h{i}.fc.bias": zeros(4 * d),
            f"h{i}.fc2.weight": normal(4 * d, d, std=proj_std), f"h{i}.fc2.bias": zeros(d),
        })
    p.update({"lnf.weight": ones(d), "lnf.bias": zeros(d),
              "head.weight": normal(d, v), "head.bias": zeros(v)})
    seq = rng.integers(0, v, (cfg["batch"], t + 1))
    return p, seq[:, :-1].astype(np.int64), seq[:, 1:].astype(np.int64)


def numpy_loss(p, ids, targets, cfg):
    """The reference first loss: the forward pass in float64 NumPy."""
    import numpy as np

    p = {k: v.astype(np.float64) for k, v in p.items()}
    b, t = ids.shape
    d, nh = cfg["d"], cfg["heads"]

    def ln(x, pre):
        mu = x.mean(-1, keepdims=True)
        var = x.var(-1, keepdims=True)
        return (x - mu) / np.sqrt(var + 1e-5) * p[pre + ".weight"] + p[pre + ".bias"]

    def lin(x, pre):
        return x @ p[pre + ".weight"] + p[pre + ".bias"]

    x = p["wte.weight"][ids] + p["wpe.weight"][:t]
    causal = np.tril(np.ones((t, t), bool))
    for i in range(cfg["layers"]):
        q, k, v = np.split(lin(ln(x, f"h{i}.ln1"), f"h{i}.attn"), 3, axis=-1)
        q, k, v = (a.reshape(b, t, nh, d // nh).transpose(0, 2, 1, 3) for a in (q, k, v))
        s = np.where(causal, q @ k.transpose(0, 1, 3, 2) / np.sqrt(d // nh), NEG)
        s = np.exp(s - s.max(-1, keepdims=True))
        y = (s / s.sum(-1, keepdims=True)) @ v
        x = x + lin(y.transpose(0, 2, 1, 3).reshape(b, t, d), f"h{i}.proj")
        h = lin(ln(x, f"h{i}.ln2"), f"h{i}.fc")
        h = 0.5 * h * (1 + np.tanh(np.sqrt(2 / np.pi) * (h + 0.044715 * h ** 3)))
        x = x + lin(h, f"h{i}.fc2")
    z = lin(ln(x, "lnf"), "head")
    z = z - z.max(-1, keepdims=True)
    logp = z - np.log(np.exp(z).sum(-1, keepdims=True))
    return float(-np.take_along_axis(logp, targets[..., None], -1).mean())


# -- replicate ------------------------------------------------------------------------------------
def replicate_model(cfg, remat=False):
    """The GPT as rp.nn modules, attention by ``rp.nn.scaled_dot_product_attention`` (the
    ``attention_weights`` primitive and one matmul); ``remat``: each block under ``rp.remat``
    (its activations computed again in the backward pass)."""
    import replicate as rp
    import replicate.numpy as rnp

    d, nh, t = cfg["d"], cfg["heads"], cfg["ctx"]

    class CausalSelfAttention(rp.nn.Module):
        def __init__(self):
            super().__init__()
            self.attn = rp.nn.Linear(d, 3 * d)
            self.proj = rp.nn.Linear(d, d)

        def forward(self, x):
            b, n, _ = x.shape
            qkv = rnp.transpose(rnp.reshape(self.attn(x), (b, n, 3, nh, d // nh)),
                                (2, 0, 3, 1, 4))                        # (3, B, H, T, hd)
            q, k, v = qkv[0], qkv[1], qkv[2]
            y = rp.nn.scaled_dot_product_attention(q, k, v, is_causal=True)  # (B, H, T, hd)
            return self.proj(rnp.reshape(rnp.transpose(y, (0, 2, 1, 3)), (b, n, d)))

    class Block(rp.nn.Module):
        def __init__(self):
            super().__init__()
            self.ln1 = rp.nn.LayerNorm(d)
            self.attn_ = CausalSelfAttention()
            self.ln2 = rp.nn.LayerNorm(d)
            self.fc = rp.nn.Linear(d, 4 * d)
            self.fc2 = rp.nn.Linear(4 * d, d)

        def forward(self, x):
            x = x + self.attn_(self.ln1(x))
            return x + self.fc2(rp.nn.gelu(self.fc(self.ln2(x))))

    class GPT(rp.nn.Module):
        def __init__(self):
            super().__init__()
            self.wte = rp.nn.Embedding(cfg["vocab"], d)
            self.wpe = rp.nn.Embedding(t, d)
            for i in range(cfg["layers"]):  # no ModuleList: numbered attributes
                setattr(self, f"h{i}", Block())
            self.lnf = rp.nn.LayerNorm(d)
            self.head = rp.nn.Linear(d, cfg["vocab"])

        def forward(self, ids):
            x = self.wte(ids) + self.wpe(rnp.arange(ids.shape[1]))
            for i in range(cfg["layers"]):
                block = getattr(self, f"h{i}")
                x = (rp.remat(block) if remat else block)(x)
            return self.head(self.lnf(x))

    return GPT()


def _rp_name(name):
    return name.replace(".attn.", ".attn_.attn.").replace(".proj.", ".attn_.proj.")


def replicate_step(cfg, params, mode, backend, remat=False, options=None):
    import replicate as rp

    model = replicate_model(cfg, remat)
    mine = model.parameters()
    assert set(mine) == {_rp_name(n) for n in params}, sorted(mine)
    for name, value in params.items():
        mine[_rp_name(name)].load(value.copy())
    opt = rp.optim.AdamW(mine, lr=LR, b1=BETAS[0], b2=BETAS[1], eps=EPS, weight_decay=WD)

    def step(ids, targets):
        loss = rp.nn.softmax_cross_entropy(model(ids), targets).mean()
        opt.apply(rp.grad(loss, model.parameters()))
        return loss

    return rp.function(step, mode=mode, backend=backend, options=options)


# -- JAX, by hand ---------------------------------------------------------------------------------
def jax_step(cfg, params):
    import jax
    import jax.numpy as jnp

    d, nh = cfg["d"], cfg["heads"]

    def ln(p, x, pre):
        mu = x.mean(-1, keepdims=True)
        var = ((x - mu) ** 2).mean(-1, keepdims=True)
        return (x - mu) * jax.lax.rsqrt(var + 1e-5) * p[pre + ".weight"] + p[pre + ".bias"]

    def lin(p, x, pre):
        return x @ p[pre + ".weight"] + p[pre + ".bias"]

    def loss_fn(p, ids, targets):
        b, t = ids.shape
        x = p["wte.weight"][ids] + p["wpe.weight"][:t]
        causal = jnp.tril(jnp.ones((t, t), bool))
        for i in range(cfg["layers"]):
            q, k, v = jnp.split(lin(p, ln(p, x, f"h{i}.ln1"), f"h{i}.attn"), 3, axis=-1)
            q, k, v = (a.reshape(b, t, nh, d // nh).transpose(0, 2, 1, 3) for a in (q, k, v))
            s = jnp.where(causal, q @ k.transpose(0, 1, 3, 2) / (d // nh) ** 0.5, NEG)
            y = jax.nn.softmax(s, axis=-1) @ v
            x = x + lin(p, y.transpose(0, 2, 1, 3).reshape(b, t, d), f"h{i}.proj")
            h = jax.nn.gelu(lin(p, ln(p, x, f"h{i}.ln2"), f"h{i}.fc"), approximate=True)
            x = x + lin(p, h, f"h{i}.fc2")
        logp = jax.nn.log_softmax(lin(p, ln(p, x, "lnf"), "head"))
        return -jnp.take_along_axis(logp, targets[..., None], -1).mean()

    @jax.jit
    def step(state, ids, targets):
        p, m, v, t = state
        loss, g = jax.value_and_grad(loss_fn)(p, ids, targets)
        t = t + 1
        m = jax.tree.map(lambda m, g: BETAS[0] * m + (1 - BETAS[0]) * g, m, g)
        v = jax.tree.map(lambda v, g: BETAS[1] * v + (1 - BETAS[1]) * g * g, v, g)
        c1, c2 = 1 - BETAS[0] ** t, 1 - BETAS[1] ** t

        def upd(p, m, v):
            return p * (1 - LR * WD) - LR * (m / c1) / (jnp.sqrt(v / c2) + EPS)
        return (jax.tree.map(upd, p, m, v), m, v, t), loss

    p = {k: jnp.asarray(x) for k, x in params.items()}
    zeros = {k: jnp.zeros_like(x) for k, x in p.items()}
    return step, (p, zeros, dict(zeros), jnp.zeros((), jnp.float32))


# -- PyTorch --------------------------------------------------------------------------------------
def torch_model(cfg, params):
    import torch
    import torch.nn as nn
    import torch.nn.functional as F

    d, nh, t = cfg["d"], cfg["heads"], cfg["ctx"]

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
            self.attn, self.proj = nn.Linear(d, 3 * d), nn.Linear(d, d)
            self.fc, self.fc2 = nn.Linear(d, 4 * d), nn.Linear(4 * d, d)
            self.register_buffer("causal", torch.tril(torch.ones(t, t, dtype=torch.bool)))

        def forward(self, x):
            b, n, _ = x.shape
            q, k, v = self.attn(self.ln1(x)).split(d, dim=-1)
            q, k, v = (a.view(b, n, nh, d // nh).transpose(1, 2) for a in (q, k, v))
            s = (q @ k.transpose(-2, -1)) * (1.0 / (d // nh) ** 0.5)
            s = s.masked_fill(~self.causal[:n, :n], NEG)
            y = (F.softmax(s, dim=-1) @ v).transpose(1, 2).reshape(b, n, d)
            x = x + self.proj(y)
            return x + self.fc2(F.gelu(self.fc(self.ln2(x)), approximate="tanh"))

    class GPT(nn.Module):
        def __init__(self):
            super().__init__()
            self.wte, self.wpe = nn.Embedding(cfg["vocab"], d), nn.Embedding(t, d)
            for i in range(cfg["layers"]):
                setattr(self, f"h{i}", Block())
            self.lnf, self.head = nn.LayerNorm(d), nn.Linear(d, cfg["vocab"])

        def forward(self, ids):
            x = self.wte(ids) + self.wpe(torch.arange(ids.shape[1], device=ids.device))
            for i in range(cfg["layers"]):
                x = getattr(self, f"h{i}")(x)
            return self.head(self.lnf(x))

    model = GPT()
    lins = linear_names(cfg)
    named = dict(model.named_parameters())
    assert set(named) == set(params), sorted(named)
    with torch.no_grad():
        for name, value in params.items():
            named[name].copy_(torch.from_numpy(value.T.copy() if name in lins else value))
    return model


def torch_step(cfg, params, compiled=False):
    import torch
    import torch.nn.functional as F

    model = torch_model(cfg, params)
    opt = torch.optim.AdamW(model.parameters(), lr=LR, betas=BETAS, eps=EPS, weight_decay=WD)
    fwd = torch.compile(model) if compiled else model

    def step(ids, targets):
        opt.zero_grad(set_to_none=True)
        logits = fwd(ids)
        loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))
        loss.backward()
        opt.step()
        return loss

    def reset():
        """Back to the initial parameters and a fresh optimiser state (after compiling)."""
        lins = linear_names(cfg)
        named = dict(model.named_parameters())
        with torch.no_grad():
            for name, value in params.items():
                named[name].copy_(torch.from_numpy(value.T.copy() if name in lins else value))
        opt.state.clear()

    step.reset = reset
    return step


class _Timeout(Exception):
    pass


def _with_timeout(seconds, fn):
    """Call ``fn()``; raise ``_Timeout`` after ``seconds`` (SIGALRM, main thread only)."""
    def on_alarm(signum, frame):
        raise _Timeout(f"compile took over {seconds} s, stopped")
    old = signal.signal(signal.SIGALRM, on_alarm)
    signal.alarm(seconds)
    try:
        return fn()
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)


# -- the worker -----------------------------------------------------------------------------------
def remat_builders(cfg, params, ids, targets, planned):
    """The replicate rows without and with ``rp.remat`` per block; ``planned``: row name -> the
    NumPy backend's planned bytes, filled as the graph rows are built."""
    out = {}
    for mode, backend in (("graph", "numpy"), ("graph", "jax"), ("eager", "numpy")):
        for remat in (False, True):
            name = (f"replicate graph {backend}" if mode == "graph" else "replicate eager "
                    "(numpy)") + (", rp.remat per block" if remat else "")

            def build(mode=mode, backend=backend, remat=remat, name=name):
                f = replicate_step(cfg, params, mode, backend, remat)
                if mode == "graph" and backend == "numpy":  # compiled now, not run
                    planned[name] = f.executable(ids, targets).graph.meta.memory_plan.nbytes
                return lambda: f(ids, targets), None
            out[name] = (C.backend_unavailable(backend) if mode == "graph" else None) or build
    # what one block's activations take in the plain plan: the same GPT with a block fewer
    fewer = dict(cfg, layers=cfg["layers"] - 1)
    kept = {n: v for n, v in params.items() if not n.startswith(f"h{fewer['layers']}.")}
    f = replicate_step(fewer, kept, "graph", "numpy")
    planned["a block fewer"] = f.executable(ids, targets).graph.meta.memory_plan.nbytes
    return out


def builders(cfg, params, ids, targets):
    out = {}
    bind = lambda f: (lambda: f(ids, targets))  # noqa: E731
    for backend in ("numpy", "jax"):
        out[f"replicate graph {backend}"] = C.backend_unavailable(backend) or (
            lambda b=backend: (bind(replicate_step(cfg, params, "graph", b)), None))
    out["replicate eager (numpy)"] = lambda: (
        bind(replicate_step(cfg, params, "eager", "numpy")), None)

    def torch_row(compiled=False):
        import torch

        step = torch_step(cfg, params, compiled)
        it, tt = torch.from_numpy(ids), torch.from_numpy(targets)
        fn = lambda: step(it, tt)  # noqa: E731
        if compiled:  # compile now (the first call), within the time limit
            t0 = time.perf_counter()
            _with_timeout(int(os.environ.get("BENCH_COMPILE_TIMEOUT", "300")), fn)
            step.reset()  # so that the row's first loss is the initial parameters' loss
            print(f"[bench] torch.compile: first step {time.perf_counter() - t0:.1f} s",
                  file=sys.stderr, flush=True)
        return fn, lambda loss: loss.detach().numpy()

    out[REF] = torch_row

    def jax_row():
        import jax

        step, state = jax_step(cfg, params)
        box = {"s": state}
        ij, tj = jax.numpy.asarray(ids), jax.numpy.asarray(targets)

        def call():
            box["s"], loss = step(box["s"], ij, tj)
            return loss
        return call, jax.block_until_ready
    out["jax.jit (by hand)"] = jax_row
    out["torch.compile"] = lambda: torch_row(True)
    return out


def bench_size(size, quick, remat=False):
    import numpy as np

    cfg = SIZES[size]
    params, ids, targets = init(cfg)
    ref = numpy_loss(params, ids, targets, cfg)
    print(f"[bench] {size}: reference first loss (float64 NumPy) {ref:.6f}", file=sys.stderr,
          flush=True)

    def check(name, first):
        loss = float(np.asarray(first))
        print(f"[bench] {size}: {name:26s} first loss {loss:.6f}", file=sys.stderr, flush=True)
        if not abs(loss - ref) <= LOSS_TOL * abs(ref):
            raise AssertionError(f"first loss {loss:.6f} differs from the reference {ref:.6f}")
        return {"first_loss": loss, "planned": planned.get(name)}

    warmup, rounds = (1, 3) if quick else (3, 20 if size == "small" else 10)
    planned = {}
    rows = C.measure_many(remat_builders(cfg, params, ids, targets, planned) if remat else
                          builders(cfg, params, ids, targets), warmup=warmup, rounds=rounds,
                          max_seconds=30 if quick else (150 if size == "small" else 300),
                          extra_fn=check)
    return {"reference_loss": ref, "rows": [r.as_dict() for r in rows],
            "planned_block_fewer": planned.get("a block fewer")}


def worker(args):
    C.worker_threads()
    if args.profile:
        return C.write_worker_json(args.json, profile(args.quick))
    sizes = ["small", "large"] if args.size == "both" else [args.size]
    C.write_worker_json(args.json, {s: bench_size(s, args.quick, args.remat) for s in sizes})


# -- where the small graph-NumPy step's time goes --------------------------------------------------
def profile(quick, size="small"):
    """Where the compiled NumPy-backend step's time goes, by the library's own profiler
    (``rp.profile.recording``): each kernel's time per step, grouped by kernel name, the share
    of the step its kernels cover, the profiled step against the plain one, and cProfile's top
    functions by own time."""
    import cProfile
    import io
    import pstats
    import statistics
    import tempfile

    import replicate as rp

    cfg = SIZES[size]
    params, ids, targets = init(cfg)
    f = replicate_step(cfg, params, "graph", "numpy")
    n_steps = 5 if quick else 50
    for _ in range(3):
        f(ids, targets)
    ts = []
    for _ in range(n_steps):
        t0 = time.perf_counter()
        f(ids, targets)
        ts.append(time.perf_counter() - t0)
    path = os.path.join(tempfile.mkdtemp(), "gpt.json")
    with rp.profile.recording(path):
        for _ in range(n_steps):
            f(ids, targets)
    events = rp.profile.load(path)
    steps = [e for e in events if e["cat"] == "step"]
    kernels = [e for e in events if e["cat"] != "step"]
    spent, count = defaultdict(float), defaultdict(int)
    for e in kernels:
        spent[e["name"][:70]] += e["dur"] / 1e3 / n_steps
        count[e["name"][:70]] += 1
    step_ms = statistics.median(e["dur"] for e in steps) / 1e3
    covered = sum(e["dur"] for e in kernels) / sum(e["dur"] for e in steps)

    prof = cProfile.Profile()
    prof.enable()
    for _ in range(n_steps):
        f(ids, targets)
    prof.disable()
    buf = io.StringIO()
    pstats.Stats(prof, stream=buf).sort_stats("tottime").print_stats(12)
    exe = f.executable(ids, targets)
    return {"size": size, "step_ms": statistics.median(ts) * 1e3, "timed_step_ms": step_ms,
            "covered": covered, "nodes": len(kernels) // n_steps, "kernels": len(exe.kernels),
            "per": {k: [v, count[k] // n_steps, []] for k, v in spent.items()},
            "cprofile": buf.getvalue()}


def report_profile(res, command):
    r = next(iter(res.values()))
    total = sum(v[0] for v in r["per"].values())
    lines = [f"### Where the {r['size']} GPT's graph-mode NumPy step goes (1 thread)\n",
             f"`{command}`: step {r['step_ms']:.2f} ms plain, {r['timed_step_ms']:.2f} ms "
             f"profiled (`rp.profile`: {r['nodes']} events a step, {r['kernels']} kernels; "
             f"they add up to {total:.2f} ms, {r['covered']:.1%} of the profiled step)\n"]
    top = sorted(r["per"].items(), key=lambda kv: -kv[1][0])[:12]
    cells = [[k, f"{ms:.3f}", f"{100 * ms / total:.1f} %", n] for k, (ms, n, _) in top]
    lines.append(C.table(["kernel (fused: the ops inside)", "ms/step", "share", "calls/step"],
                         cells))
    text = "\n".join(lines)
    print(text)
    print("\ncProfile, top functions by own time:\n" + r["cprofile"])
    return text


# -- the report -----------------------------------------------------------------------------------
TITLE = {"small": "small GPT (d=64, 2 layers, 4 heads, context 64, vocab 95, batch 16)",
         "large": "large GPT (d=256, 4 layers, 4 heads, context 128, vocab 95, batch 16)"}


def report_remat(results, command):
    parts = [C.header("Transformer step with rp.remat per block (issue 33)", command)]
    for threads, res in sorted(results.items()):
        for size, r in res.items():
            rows = C.rows_from(r["rows"])
            by = {x.name: x for x in rows}
            cells, planned = [], {x.name: (x.extra or {}).get("planned") for x in rows}
            for x in rows:
                plain = by.get(x.name.replace(", rp.remat per block", ""))
                mib = (x.extra or {}).get("planned")
                cells.append([x.name, f"{mib / 2**20:.1f}" if mib else "—",
                              x.timing.ms() if x.timing else "n/a",
                              f"{x.timing.min * 1e3:.2f}" if x.timing else "", x.timing.n if
                              x.timing else "", C.ratio(x.timing, plain.timing) if plain is not x
                              else "—", f"{x.extra['first_loss']:.6f}" if x.extra else "",
                              C.note(x)])
            plain, remat = (planned.get("replicate graph numpy" + s) for s in
                            ("", ", rp.remat per block"))
            block = plain - r["planned_block_fewer"] if plain else None
            saved = (f"rp.remat saves {(plain - remat) / 2**20:.1f} MiB of the plan: "
                     f"{(plain - remat) / block:.2f} blocks' worth (a block's activations in the "
                     f"plain plan, {block / 2**20:.1f} MiB: the planned bytes less those of the "
                     "same GPT with a block fewer)\n\n") if plain and remat and block else ""
            parts.append(
                f"### {TITLE[size]}, AdamW step, float32; {threads} thread(s)\n\n" + saved +
                C.table(["implementation", "planned MiB (NumPy plan)", "median ms/step",
                         "min ms", "rounds", "vs without remat", "first loss", "note"], cells)
                + "\n")
    text = "\n".join(parts)
    print(text)
    return text


def report(results, command):
    parts = [C.header("Transformer step (issue 29)", command)]
    for threads, res in sorted(results.items()):
        for size, r in res.items():
            rows = C.rows_from(r["rows"])
            by = {x.name: x for x in rows}
            torch_t = by[REF].timing
            jit_t = by["jax.jit (by hand)"].timing
            cells = []
            for x in rows:
                vs_jit = C.ratio(x.timing, jit_t) if x.name == "replicate graph jax" else "—"
                loss = f"{x.extra['first_loss']:.6f}" if x.extra else ""
                cells.append([x.name, x.timing.ms() if x.timing else "n/a",
                              f"{x.timing.min * 1e3:.2f}" if x.timing else "",
                              x.timing.n if x.timing else "", C.ratio(x.timing, torch_t),
                              vs_jit, loss, C.note(x)])
            parts.append(
                f"### {TITLE[size]}, AdamW step, float32; {threads} thread(s)\n\n"
                f"first loss, float64 NumPy reference: {r['reference_loss']:.6f} (every row "
                f"checked within {LOSS_TOL:g} relative before timing)\n\n" + C.table(
                    ["implementation", "median ms/step", "min ms", "rounds", "vs PyTorch eager",
                     "vs jax.jit", "first loss", "note"], cells) + "\n")
    text = "\n".join(parts)
    print(text)
    return text


def main(argv=None):
    ap = C.common_args(argparse.ArgumentParser(description=__doc__.splitlines()[0]))
    ap.set_defaults(threads="1")
    ap.add_argument("--size", default="both", choices=("small", "large", "both"))
    ap.add_argument("--profile", action="store_true",
                    help="where the small GPT's graph-mode NumPy step spends its time")
    ap.add_argument("--remat", action="store_true",
                    help="the replicate rows with rp.remat per block and without")
    args = ap.parse_args(argv)
    if args.worker:
        return worker(args)
    if args.quick and "--size" not in (argv if argv is not None else sys.argv[1:]):
        args.size = "small"
    threads = [int(t) for t in args.threads.split(",")]
    extra = (["--quick"] if args.quick else []) + (["--remat"] if args.remat else []) + (
        ["--profile"] if args.profile else ["--size", args.size])
    results = C.run_workers(os.path.abspath(__file__), threads, extra)
    command = "python bench/transformer.py" + "".join(f" {a}" for a in extra) + (
        f" --threads {args.threads}" if args.threads != "1" else "")
    if args.profile:
        return report_profile(results, command)
    text = (report_remat if args.remat else report)(results, command)
    if not args.quick:
        C.save_json("transformer_remat" if args.remat else "transformer",
                    {"machine": C.machine(), "results": results, "markdown": text})
    return text


if __name__ == "__main__":
    main()
