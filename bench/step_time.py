"""Step time: one SGD training step (forward, backward, update), replicate vs its peers.

Two models, float32, the same initial weights and the same batch for every implementation:

* MLP 784-1024-1024-10 (ReLU), batch 256, softmax cross-entropy, plain SGD;
* a small conv net: 3x32x32 input, conv 3->16 3x3 pad 1, ReLU, conv 16->32 3x3 stride 2 pad 1,
  ReLU, flatten, linear 8192->10; batch 32.

Rows: replicate graph mode on every backend (numpy, jax, cupy), replicate eager mode,
hand-written NumPy with manual backprop, ``jax.jit``, PyTorch eager (CPU) and ``torch.compile``.
Each backend or peer that cannot run here is a row with "n/a" and the reason.

    python bench/step_time.py            # 1 and 2 threads, a few minutes
    python bench/step_time.py --quick    # smoke run
"""

from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import _common as C  # noqa: E402

LR = 0.01
MLP_SIZES = (784, 1024, 1024, 10)
MLP_BATCH = 256
CONV = dict(batch=32, cin=3, hw=32, c1=16, c2=32, classes=10)
PEER = {  # replicate row -> (its natural peer, the target ratio)
    "replicate graph numpy": ("hand-written NumPy", 1.05),
    "replicate graph jax": ("jax.jit", 1.05),
    "replicate eager (numpy)": ("PyTorch eager", 1.3),
}


# -- data and initial weights (shared by every implementation) ------------------------------------
def mlp_init(sizes, batch, seed=0):
    import numpy as np

    rng = np.random.default_rng(seed)
    params = []
    for a, b in zip(sizes[:-1], sizes[1:]):
        lim = np.sqrt(6.0 / (a + b))
        params += [rng.uniform(-lim, lim, (a, b)).astype(np.float32), np.zeros(b, np.float32)]
    x = rng.standard_normal((batch, sizes[0])).astype(np.float32)
    y = rng.integers(0, sizes[-1], batch).astype(np.int64)
    return params, x, y


def conv_init(cfg, seed=0):
    import numpy as np

    rng = np.random.default_rng(seed)
    c0, c1, c2, hw = cfg["cin"], cfg["c1"], cfg["c2"], cfg["hw"]
    flat = c2 * (hw // 2) ** 2
    params = [
        (rng.standard_normal((c1, c0, 3, 3)) * np.sqrt(2.0 / (c0 * 9))).astype(np.float32),
        np.zeros(c1, np.float32),
        (rng.standard_normal((c2, c1, 3, 3)) * np.sqrt(2.0 / (c1 * 9))).astype(np.float32),
        np.zeros(c2, np.float32),
        (rng.uniform(-1, 1, (flat, cfg["classes"])) * np.sqrt(6.0 / (flat + 10))).astype(
            np.float32),
        np.zeros(cfg["classes"], np.float32),
    ]
    x = rng.standard_normal((cfg["batch"], c0, hw, hw)).astype(np.float32)
    y = rng.integers(0, cfg["classes"], cfg["batch"]).astype(np.int64)
    return params, x, y


# -- hand-written NumPy with manual backprop -------------------------------------------------------
def numpy_softmax_xent_grad(z, y):
    import numpy as np

    z = z - z.max(axis=1, keepdims=True)
    e = np.exp(z)
    p = e / e.sum(axis=1, keepdims=True)
    n = z.shape[0]
    loss = -np.log(p[np.arange(n), y]).mean()
    p[np.arange(n), y] -= 1.0
    p /= n
    return loss, p


def numpy_mlp_step(params, x, y):
    """Forward, manual backward, in-place SGD update; returns the loss."""
    import numpy as np

    w1, b1, w2, b2, w3, b3 = params
    h1 = x @ w1 + b1
    a1 = np.maximum(h1, 0)
    h2 = a1 @ w2 + b2
    a2 = np.maximum(h2, 0)
    z = a2 @ w3 + b3
    loss, dz = numpy_softmax_xent_grad(z, y)
    dw3, db3 = a2.T @ dz, dz.sum(0)
    da2 = dz @ w3.T
    da2 *= h2 > 0
    dw2, db2 = a1.T @ da2, da2.sum(0)
    da1 = da2 @ w2.T
    da1 *= h1 > 0
    dw1, db1 = x.T @ da1, da1.sum(0)
    for p, g in zip(params, (dw1, db1, dw2, db2, dw3, db3)):
        p -= np.float32(LR) * g
    return loss


def _im2col(xp, k, s, oh, ow):
    import numpy as np

    n, c = xp.shape[:2]
    cols = np.empty((n, c, k, k, oh, ow), xp.dtype)
    for i in range(k):
        for j in range(k):
            cols[:, :, i, j] = xp[:, :, i:i + s * oh:s, j:j + s * ow:s]
    return cols.reshape(n, c * k * k, oh * ow)


def _col2im(dcols, shape, k, s, oh, ow):
    import numpy as np

    n, c, hp, wp = shape
    dxp = np.zeros(shape, dcols.dtype)
    dcols = dcols.reshape(n, c, k, k, oh, ow)
    for i in range(k):
        for j in range(k):
            dxp[:, :, i:i + s * oh:s, j:j + s * ow:s] += dcols[:, :, i, j]
    return dxp


def numpy_conv_fwd(x, w, b, stride):
    import numpy as np

    xp = np.pad(x, ((0, 0), (0, 0), (1, 1), (1, 1)))
    oh = (xp.shape[2] - 3) // stride + 1
    ow = (xp.shape[3] - 3) // stride + 1
    cols = _im2col(xp, 3, stride, oh, ow)               # (N, C*9, P)
    out = w.reshape(w.shape[0], -1) @ cols              # (N, O, P)
    out += b[None, :, None]
    return out.reshape(x.shape[0], w.shape[0], oh, ow), (xp.shape, cols, oh, ow)


def numpy_conv_bwd(dout, w, cache, stride, need_dx=True):
    import numpy as np

    shape, cols, oh, ow = cache
    n, o = dout.shape[:2]
    d = dout.reshape(n, o, oh * ow)
    dw = np.tensordot(d, cols, axes=([0, 2], [0, 2])).reshape(w.shape)
    db = d.sum(axis=(0, 2))
    if not need_dx:
        return None, dw, db
    dcols = w.reshape(o, -1).T @ d                      # (N, C*9, P)
    dxp = _col2im(dcols, shape, 3, stride, oh, ow)
    return dxp[:, :, 1:-1, 1:-1], dw, db


def numpy_conv_step(params, x, y):
    import numpy as np

    w1, b1, w2, b2, w3, b3 = params
    h1, c1 = numpy_conv_fwd(x, w1, b1, 1)
    a1 = np.maximum(h1, 0)
    h2, c2 = numpy_conv_fwd(a1, w2, b2, 2)
    a2 = np.maximum(h2, 0)
    f = a2.reshape(a2.shape[0], -1)
    z = f @ w3 + b3
    loss, dz = numpy_softmax_xent_grad(z, y)
    dw3, db3 = f.T @ dz, dz.sum(0)
    da2 = (dz @ w3.T).reshape(a2.shape)
    da2 *= h2 > 0
    da1, dw2, db2 = numpy_conv_bwd(da2, w2, c2, 2)
    da1 *= h1 > 0
    _, dw1, db1 = numpy_conv_bwd(da1, w1, c1, 1, need_dx=False)
    for p, g in zip(params, (dw1, db1, dw2, db2, dw3, db3)):
        p -= np.float32(LR) * g
    return loss


# -- replicate ------------------------------------------------------------------------------------
def mlp_sizes(params):
    return [params[0].shape[0]] + [w.shape[1] for w in params[::2]]


def replicate_model(kind, params):
    import replicate as rp

    if kind == "mlp":
        sizes = mlp_sizes(params)
        layers = [rp.nn.Linear(a, b) for a, b in zip(sizes[:-1], sizes[1:])]
        model = rp.nn.Sequential(layers[0], rp.nn.relu, layers[1], rp.nn.relu, layers[2])
        vars_ = [v for lin in layers for v in (lin.weight, lin.bias)]
    else:
        c1 = rp.nn.Conv2d(CONV["cin"], CONV["c1"], 3, padding=1)
        c2 = rp.nn.Conv2d(CONV["c1"], CONV["c2"], 3, stride=2, padding=1)
        lin = rp.nn.Linear(params[4].shape[0], CONV["classes"])
        model = rp.nn.Sequential(c1, rp.nn.relu, c2, rp.nn.relu, rp.nn.Flatten(), lin)
        vars_ = [c1.weight, c1.bias, c2.weight, c2.bias, lin.weight, lin.bias]
    for v, p in zip(vars_, params):
        v.load(p.copy())
    return model


def replicate_step(kind, params, mode, backend, options=None):
    import replicate as rp

    model = replicate_model(kind, params)
    opt = rp.optim.SGD(model.parameters(), lr=LR)

    def step(x, y):
        loss = rp.nn.softmax_cross_entropy(model(x), y).mean()
        opt.apply(rp.grad(loss, model.parameters()))
        return loss

    return rp.function(step, mode=mode, backend=backend, options=options)


# -- JAX ------------------------------------------------------------------------------------------
def jax_step(kind, params):
    import jax
    import jax.numpy as jnp

    def forward(ps, x):
        if kind == "mlp":
            w1, b1, w2, b2, w3, b3 = ps
            h = jax.nn.relu(x @ w1 + b1)
            h = jax.nn.relu(h @ w2 + b2)
            return h @ w3 + b3
        w1, b1, w2, b2, w3, b3 = ps
        dn = ("NCHW", "OIHW", "NCHW")
        h = jax.lax.conv_general_dilated(x, w1, (1, 1), ((1, 1), (1, 1)), dimension_numbers=dn)
        h = jax.nn.relu(h + b1[None, :, None, None])
        h = jax.lax.conv_general_dilated(h, w2, (2, 2), ((1, 1), (1, 1)), dimension_numbers=dn)
        h = jax.nn.relu(h + b2[None, :, None, None])
        return h.reshape(h.shape[0], -1) @ w3 + b3

    def loss_fn(ps, x, y):
        logp = jax.nn.log_softmax(forward(ps, x))
        return -jnp.take_along_axis(logp, y[:, None], axis=1).mean()

    @jax.jit
    def step(ps, x, y):
        loss, grads = jax.value_and_grad(loss_fn)(ps, x, y)
        return [p - LR * g for p, g in zip(ps, grads)], loss

    return step, [jnp.asarray(p) for p in params]


# -- PyTorch --------------------------------------------------------------------------------------
def torch_model(kind, params):
    import torch

    if kind == "mlp":
        sizes = mlp_sizes(params)
        lins = [torch.nn.Linear(a, b) for a, b in zip(sizes[:-1], sizes[1:])]
        model = torch.nn.Sequential(lins[0], torch.nn.ReLU(), lins[1], torch.nn.ReLU(), lins[2])
        with torch.no_grad():
            for lin, (w, b) in zip(lins, zip(params[::2], params[1::2])):
                lin.weight.copy_(torch.from_numpy(w.T.copy()))
                lin.bias.copy_(torch.from_numpy(b))
        return model
    c1 = torch.nn.Conv2d(CONV["cin"], CONV["c1"], 3, padding=1)
    c2 = torch.nn.Conv2d(CONV["c1"], CONV["c2"], 3, stride=2, padding=1)
    lin = torch.nn.Linear(params[4].shape[0], CONV["classes"])
    with torch.no_grad():
        for mod, w, b in ((c1, params[0], params[1]), (c2, params[2], params[3])):
            mod.weight.copy_(torch.from_numpy(w))
            mod.bias.copy_(torch.from_numpy(b))
        lin.weight.copy_(torch.from_numpy(params[4].T.copy()))
        lin.bias.copy_(torch.from_numpy(params[5]))
    return torch.nn.Sequential(c1, torch.nn.ReLU(), c2, torch.nn.ReLU(), torch.nn.Flatten(), lin)


def torch_step(kind, params, compiled=False):
    import torch

    model = torch_model(kind, params)
    opt = torch.optim.SGD(model.parameters(), lr=LR)
    fwd = torch.compile(model) if compiled else model
    loss_fn = torch.nn.CrossEntropyLoss()

    def step(x, y):
        opt.zero_grad(set_to_none=True)
        loss = loss_fn(fwd(x), y)
        loss.backward()
        opt.step()
        return loss

    return step


# -- the worker -----------------------------------------------------------------------------------
def bench_model(kind, quick):
    import numpy as np

    builders, warmup, rounds = model_builders(kind, quick)
    return C.measure_many(builders, warmup=warmup, rounds=rounds, max_seconds=90,
                          extra_fn=lambda name, first: {"first_loss": float(np.asarray(first))})


def model_builders(kind, quick):
    """{row: build() -> (step, finish)} of model ``kind`` ("mlp", "conv"; "mlp-small": the MLP
    256-512-512-10 at batch 128), and the warm-up and round counts (also
    ``bench/step_time_cputime.py``'s rows)."""
    if kind == "mlp-small":  # (issue 29's eager MLP: 256-512-512-10, batch 128)
        kind = "mlp"
        params, x, y = mlp_init((256, 512, 512, 10), 128)
    elif kind == "mlp":
        sizes = (784, 128, 128, 10) if quick else MLP_SIZES
        params, x, y = mlp_init(sizes, 32 if quick else MLP_BATCH)
    else:
        params, x, y = conv_init(CONV)
    warmup, rounds = C.quick_counts(quick, 3, 15)
    builders = {}
    for backend in ("numpy", "jax", "cupy"):
        builders[f"replicate graph {backend}"] = C.backend_unavailable(backend) or (
            lambda b=backend: (_bind(replicate_step(kind, params, "graph", b), x, y), None))
    builders["replicate eager (numpy)"] = lambda: (
        _bind(replicate_step(kind, params, "eager", "numpy"), x, y), None)

    def hand():
        ps = [p.copy() for p in params]
        step = numpy_mlp_step if kind == "mlp" else numpy_conv_step
        return (lambda: step(ps, x, y)), None
    builders["hand-written NumPy"] = hand

    def jax_jit():
        import jax

        step, ps = jax_step(kind, params)
        state = {"ps": ps}
        xj, yj = jax.numpy.asarray(x), jax.numpy.asarray(y)

        def call():
            state["ps"], loss = step(state["ps"], xj, yj)
            return loss
        return call, jax.block_until_ready
    builders["jax.jit"] = jax_jit

    def torch_eager(compiled=False):
        import torch

        step = torch_step(kind, params, compiled)
        xt, yt = torch.from_numpy(x), torch.from_numpy(y)
        return (lambda: step(xt, yt)), lambda loss: loss.detach().numpy()
    builders["PyTorch eager"] = torch_eager
    builders["torch.compile"] = lambda: torch_eager(True)
    return builders, warmup, rounds


def _bind(fn, x, y):
    return lambda: fn(x, y)


def worker(args):
    C.worker_threads()
    out = {"threads": int(args.threads), "models": {}}
    for kind in ("mlp", "conv"):
        out["models"][kind] = [r.as_dict() for r in bench_model(kind, args.quick)]
    C.write_worker_json(args.json, out)


# -- the report -----------------------------------------------------------------------------------
TITLES = {"mlp": "MLP 784-1024-1024-10, batch 256, SGD step, float32",
          "conv": "small conv net (3x32x32, conv16, conv32/2, linear), batch 32, SGD step"}


def report(results, command, quick):
    parts = [C.header("Step time: replicate vs peers", command)]
    summary = {}
    for kind in ("mlp", "conv"):
        title = TITLES[kind] + (" (quick: smaller MLP, batch 32)" if quick and kind == "mlp"
                                else "")
        for threads, res in sorted(results.items()):
            rows = C.rows_from(res["models"][kind])
            by = {r.name: r for r in rows}
            cells = []
            for r in rows:
                peer, target = PEER.get(r.name, (None, None))
                prow = by.get(peer)
                rat = C.ratio(r.timing, prow.timing if prow else None) if peer else ""
                tgt = ""
                if peer:
                    ok = (r.timing and prow and prow.timing
                          and r.timing.median / prow.timing.median <= target)
                    tgt = f"≤ {target}x vs {peer}: " + (
                        "n/a" if not (r.timing and prow and prow.timing) else
                        ("met" if ok else "not met"))
                    summary[(kind, threads, r.name)] = (rat, tgt)
                loss = f"{r.extra['first_loss']:.4f}" if r.extra else ""
                cells.append([r.name, r.timing.ms() if r.timing else "n/a",
                              f"{r.timing.min * 1e3:.2f}" if r.timing else "", rat or "—",
                              tgt or "—", loss, C.note(r)])
            parts.append(f"### {title}; {threads} thread(s)\n\n" + C.table(
                ["implementation", "median ms/step", "min ms", "ratio vs peer",
                 "target", "first loss", "note"], cells) + "\n")
    text = "\n".join(parts)
    print(text)
    return text, summary


def main(argv=None):
    return C.threads_main(argv, __file__, __doc__, worker, report)


if __name__ == "__main__":
    main()
