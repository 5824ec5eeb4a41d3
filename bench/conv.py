"""Conv net step: one SGD training step of a small conv net, replicate vs its peers (issue 17).

The model, float32, the same initial weights and batch for every implementation: 1x28x28 input,
conv 1->16 3x3 pad 1, ReLU, conv 16->32 3x3 pad 1, ReLU, 2x2 average pooling, flatten, linear
6272->10, softmax cross-entropy, plain SGD; batch 64.

Rows: replicate graph mode on the NumPy and JAX backends (and CuPy where there is a GPU),
replicate eager mode, hand-written NumPy (the algorithm of the NumPy rows: im2col through a
strided view, one batched GEMM, col2im by strided adds; the forward's im2col kept for the weight
gradient), ``jax.jit`` of the same model in plain JAX, PyTorch eager and ``torch.compile``. A peer
that cannot run here is a row with "n/a" and the reason. Each replicate row is compared with its
natural peer; every row with PyTorch eager.

    python bench/conv.py --threads 1    # about a minute
    python bench/conv.py --quick        # smoke run
"""

from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import _common as C  # noqa: E402
from step_time import _bind  # noqa: E402
from step_time import conv_init as init  # noqa: E402 - the same initialisation

LR = 0.01
CFG = dict(batch=64, cin=1, hw=28, c1=16, c2=32, classes=10)
PEER = {"replicate graph numpy": "hand-written NumPy", "replicate graph jax": "jax.jit",
        "replicate graph cupy": "PyTorch eager", "replicate eager (numpy)": "PyTorch eager"}


# -- hand-written NumPy: im2col + GEMM, col2im, manual backprop -----------------------------------
def _im2col(x):
    """(N, C*9, H*W) of a 3x3, pad 1, stride 1 convolution's windows."""
    import numpy as np

    n, c, h, w = x.shape
    xp = np.zeros((n, c, h + 2, w + 2), x.dtype)
    xp[:, :, 1:-1, 1:-1] = x
    sn, sc, sh, sw = xp.strides
    view = np.lib.stride_tricks.as_strided(xp, (n, c, 3, 3, h, w), (sn, sc, sh, sw, sh, sw))
    return np.ascontiguousarray(view).reshape(n, c * 9, h * w)


def _conv_fwd(x, w, b):
    import numpy as np

    n, _, h, wd = x.shape
    cols = _im2col(x)
    out = np.matmul(w.reshape(w.shape[0], -1), cols)
    out += b[None, :, None]
    return out.reshape(n, w.shape[0], h, wd), cols


def _conv_bwd(dout, w, cols, need_dx=True):
    import numpy as np

    n, o, h, wd = dout.shape
    d = dout.reshape(n, o, h * wd)
    dw = np.matmul(d, cols.transpose(0, 2, 1)).sum(0).reshape(w.shape)
    db = d.sum(axis=(0, 2))
    if not need_dx:
        return None, dw, db
    c = w.shape[1]
    dcols = np.matmul(w.reshape(o, -1).T, d).reshape(n, c, 3, 3, h, wd)
    dxp = np.zeros((n, c, h + 2, wd + 2), dout.dtype)
    for i in range(3):
        for j in range(3):
            dxp[:, :, i:i + h, j:j + wd] += dcols[:, :, i, j]
    return dxp[:, :, 1:-1, 1:-1], dw, db


def numpy_step(params, x, y):
    import numpy as np

    w1, b1, w2, b2, w3, b3 = params
    h1, cols1 = _conv_fwd(x, w1, b1)
    a1 = np.maximum(h1, 0)
    h2, cols2 = _conv_fwd(a1, w2, b2)
    a2 = np.maximum(h2, 0)
    n, c, hh, ww = a2.shape
    pooled = a2.reshape(n, c, hh // 2, 2, ww // 2, 2).mean(axis=(3, 5))
    f = pooled.reshape(n, -1)
    z = f @ w3 + b3
    z = z - z.max(axis=1, keepdims=True)
    e = np.exp(z)
    p = e / e.sum(axis=1, keepdims=True)
    loss = -np.log(p[np.arange(n), y]).mean()
    p[np.arange(n), y] -= 1.0
    dz = p / n
    dw3, db3 = f.T @ dz, dz.sum(0)
    dpool = (dz @ w3.T).reshape(pooled.shape) * np.float32(0.25)
    da2 = np.broadcast_to(dpool[:, :, :, None, :, None], (n, c, hh // 2, 2, ww // 2, 2))
    da2 = da2.reshape(a2.shape) * (h2 > 0)
    da1, dw2, db2 = _conv_bwd(da2, w2, cols2)
    da1 *= h1 > 0
    _, dw1, db1 = _conv_bwd(da1, w1, cols1, need_dx=False)
    for q, g in zip(params, (dw1, db1, dw2, db2, dw3, db3)):
        q -= np.float32(LR) * g
    return loss


# -- replicate ------------------------------------------------------------------------------------
def replicate_step(params, mode, backend):
    import replicate as rp
    import replicate.numpy as rnp

    c1 = rp.nn.Conv2d(CFG["cin"], CFG["c1"], 3, padding=1)
    c2 = rp.nn.Conv2d(CFG["c1"], CFG["c2"], 3, padding=1)
    lin = rp.nn.Linear(params[4].shape[0], CFG["classes"])
    for v, p in zip([c1.weight, c1.bias, c2.weight, c2.bias, lin.weight, lin.bias], params):
        v.load(p.copy())
    model = rp.nn.Sequential(c1, rp.nn.relu, c2, rp.nn.relu, lambda h: rnp.avg_pool2d(h, 2),
                             rp.nn.Flatten(), lin)
    opt = rp.optim.SGD(model.parameters(), lr=LR)

    def step(x, y):
        loss = rp.nn.softmax_cross_entropy(model(x), y).mean()
        opt.apply(rp.grad(loss, model.parameters()))
        return loss

    return rp.function(step, mode=mode, backend=backend)


# -- JAX ------------------------------------------------------------------------------------------
def jax_step(params):
    import jax
    import jax.numpy as jnp

    dn = ("NCHW", "OIHW", "NCHW")

    def forward(ps, x):
        w1, b1, w2, b2, w3, b3 = ps
        h = jax.lax.conv_general_dilated(x, w1, (1, 1), ((1, 1), (1, 1)), dimension_numbers=dn)
        h = jax.nn.relu(h + b1[None, :, None, None])
        h = jax.lax.conv_general_dilated(h, w2, (1, 1), ((1, 1), (1, 1)), dimension_numbers=dn)
        h = jax.nn.relu(h + b2[None, :, None, None])
        n, c, hh, ww = h.shape
        h = h.reshape(n, c, hh // 2, 2, ww // 2, 2).mean(axis=(3, 5))
        return h.reshape(n, -1) @ w3 + b3

    def loss_fn(ps, x, y):
        logp = jax.nn.log_softmax(forward(ps, x))
        return -jnp.take_along_axis(logp, y[:, None], axis=1).mean()

    @jax.jit
    def step(ps, x, y):
        loss, grads = jax.value_and_grad(loss_fn)(ps, x, y)
        return [p - LR * g for p, g in zip(ps, grads)], loss

    return step, [jnp.asarray(p) for p in params]


# -- PyTorch --------------------------------------------------------------------------------------
def torch_step(params, compiled=False):
    import torch

    c1 = torch.nn.Conv2d(CFG["cin"], CFG["c1"], 3, padding=1)
    c2 = torch.nn.Conv2d(CFG["c1"], CFG["c2"], 3, padding=1)
    lin = torch.nn.Linear(params[4].shape[0], CFG["classes"])
    with torch.no_grad():
        for mod, w, b in ((c1, params[0], params[1]), (c2, params[2], params[3])):
            mod.weight.copy_(torch.from_numpy(w))
            mod.bias.copy_(torch.from_numpy(b))
        lin.weight.copy_(torch.from_numpy(params[4].T.copy()))
        lin.bias.copy_(torch.from_numpy(params[5]))
    model = torch.nn.Sequential(c1, torch.nn.ReLU(), c2, torch.nn.ReLU(), torch.nn.AvgPool2d(2),
                                torch.nn.Flatten(), lin)
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
def bench(quick):
    import numpy as np

    params, x, y = init(CFG)
    warmup, rounds = C.quick_counts(quick, 3, 20)
    builders = {}
    for backend in ("numpy", "jax", "cupy"):
        builders[f"replicate graph {backend}"] = C.backend_unavailable(backend) or (
            lambda b=backend: (_bind(replicate_step(params, "graph", b), x, y), None))
    builders["replicate eager (numpy)"] = lambda: (
        _bind(replicate_step(params, "eager", "numpy"), x, y), None)

    def hand():
        ps = [p.copy() for p in params]
        return (lambda: numpy_step(ps, x, y)), None
    builders["hand-written NumPy"] = hand

    def jax_jit():
        import jax

        step, ps = jax_step(params)
        state = {"ps": ps}
        xj, yj = jax.numpy.asarray(x), jax.numpy.asarray(y)

        def call():
            state["ps"], loss = step(state["ps"], xj, yj)
            return loss
        return call, jax.block_until_ready
    builders["jax.jit"] = jax_jit

    def torch_eager(compiled=False):
        import torch

        step = torch_step(params, compiled)
        xt, yt = torch.from_numpy(x), torch.from_numpy(y)
        return (lambda: step(xt, yt)), lambda loss: loss.detach().numpy()
    builders["PyTorch eager"] = torch_eager
    builders["torch.compile"] = lambda: torch_eager(True)
    return C.measure_many(builders, warmup=warmup, rounds=rounds, max_seconds=120,
                          extra_fn=lambda name, first: {"first_loss": float(np.asarray(first))})


def worker(args):
    C.worker_threads()
    rows = [r.as_dict() for r in bench(args.quick)]
    C.write_worker_json(args.json, {"threads": int(args.threads), "rows": rows})


# -- the report -----------------------------------------------------------------------------------
TITLE = ("conv net (1x28x28, conv16 3x3, conv32 3x3, avg-pool 2, linear), batch 64, SGD step, "
         "float32")


def report(results, command, quick=False):
    parts = [C.header("Conv net step: replicate vs peers", command)]
    for threads, res in sorted(results.items()):
        rows = C.rows_from(res["rows"])
        by = {r.name: r for r in rows}
        torch_row = by.get("PyTorch eager")
        cells = []
        for r in rows:
            peer = by.get(PEER.get(r.name, ""))
            cells.append([
                r.name, r.timing.ms() if r.timing else "n/a",
                f"{r.timing.min * 1e3:.2f}" if r.timing else "",
                f"{C.ratio(r.timing, peer.timing)} vs {peer.name}" if peer else "—",
                C.ratio(r.timing, torch_row.timing if torch_row else None),
                f"{r.extra['first_loss']:.5f}" if r.extra else "", C.note(r)])
        parts.append(f"### {TITLE}; {threads} thread(s)\n\n" + C.table(
            ["implementation", "median ms/step", "min ms", "ratio vs peer", "vs PyTorch eager",
             "first loss", "note"], cells) + "\n")
    text = "\n".join(parts)
    print(text)
    return text


def main(argv=None):
    return C.threads_main(argv, __file__, __doc__, worker, report)


if __name__ == "__main__":
    main()
