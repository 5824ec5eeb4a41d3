"""Define-by-run vs define-and-run on a small-op-heavy step: an LSTM cell unrolled 20 steps.

Batch 32, input 64, hidden 128, a linear head on the last hidden state, softmax
cross-entropy, SGD; float32. About 15 small ops per time step forward (two matmuls, gate
slices, three sigmoids, two tanh, the state updates), so roughly 300 ops forward and twice as
many backward: per-op overhead dominates, which is what separates the modes.

Rows: replicate eager mode (ops run at once, a tape records them), replicate graph mode on each
backend (traced once, replayed), PyTorch eager for reference, ``jax.jit`` as the compiled
reference.

    python bench/eager_vs_graph.py [--quick]
"""

from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import _common as C  # noqa: E402

T, B, I, H, CLASSES, LR = 20, 32, 64, 128, 10, 0.05


def init(seed=0, steps=T):
    import numpy as np

    rng = np.random.default_rng(seed)

    def u(shape, fan):
        return rng.uniform(-1, 1, shape).astype(np.float32) / np.float32(np.sqrt(fan))
    params = [u((I, 4 * H), I), u((H, 4 * H), H), np.zeros(4 * H, np.float32),
              u((H, CLASSES), H), np.zeros(CLASSES, np.float32)]
    xs = rng.standard_normal((steps, B, I)).astype(np.float32)
    y = rng.integers(0, CLASSES, B).astype(np.int64)
    return params, xs, y


def replicate_step(params, mode, backend, steps):
    import numpy as np

    import replicate as rp
    import replicate.numpy as rnp

    vs = [rp.Variable(p.copy(), name=n) for p, n in zip(params, ("wx", "wh", "b", "wo", "bo"))]
    opt = rp.optim.SGD(vs, lr=LR)

    def step(xs, y):
        wx, wh, b, wo, bo = vs
        h = rnp.zeros((B, H), np.float32)
        c = rnp.zeros((B, H), np.float32)
        for t in range(steps):
            z = xs[t] @ wx + h @ wh + b
            i = rnp.sigmoid(z[:, :H])
            f = rnp.sigmoid(z[:, H:2 * H])
            g = rnp.tanh(z[:, 2 * H:3 * H])
            o = rnp.sigmoid(z[:, 3 * H:])
            c = f * c + i * g
            h = o * rnp.tanh(c)
        loss = rp.nn.softmax_cross_entropy(h @ wo + bo, y).mean()
        opt.apply(rp.grad(loss, vs))
        return loss

    return rp.function(step, mode=mode, backend=backend)


def torch_step(params, steps):
    import torch

    ps = [torch.tensor(p, requires_grad=True) for p in params]
    opt = torch.optim.SGD(ps, lr=LR)
    loss_fn = torch.nn.CrossEntropyLoss()

    def step(xs, y):
        wx, wh, b, wo, bo = ps
        opt.zero_grad(set_to_none=True)
        h = torch.zeros(B, H)
        c = torch.zeros(B, H)
        for t in range(steps):
            z = xs[t] @ wx + h @ wh + b
            i = torch.sigmoid(z[:, :H])
            f = torch.sigmoid(z[:, H:2 * H])
            g = torch.tanh(z[:, 2 * H:3 * H])
            o = torch.sigmoid(z[:, 3 * H:])
            c = f * c + i * g
            h = o * torch.tanh(c)
        loss = loss_fn(h @ wo + bo, y)
        loss.backward()
        opt.step()
        return loss
    return step


def jax_step(params, steps):
    import jax
    import jax.numpy as jnp

    def loss_fn(ps, xs, y):
        wx, wh, b, wo, bo = ps
        h = jnp.zeros((B, H), jnp.float32)
        c = jnp.zeros((B, H), jnp.float32)
        for t in range(steps):
            z = xs[t] @ wx + h @ wh + b
            i = jax.nn.sigmoid(z[:, :H])
            f = jax.nn.sigmoid(z[:, H:2 * H])
            g = jnp.tanh(z[:, 2 * H:3 * H])
            o = jax.nn.sigmoid(z[:, 3 * H:])
            c = f * c + i * g
            h = o * jnp.tanh(c)
        logp = jax.nn.log_softmax(h @ wo + bo)
        return -jnp.take_along_axis(logp, y[:, None], axis=1).mean()

    @jax.jit
    def step(ps, xs, y):
        loss, grads = jax.value_and_grad(loss_fn)(ps, xs, y)
        return [p - LR * g for p, g in zip(ps, grads)], loss
    return step


def worker(args):
    import numpy as np

    threads = C.worker_threads()
    steps = 5 if args.quick else T
    params, xs, y = init(steps=steps)
    builders = {"replicate eager (define-by-run)": lambda: (
        _call(replicate_step(params, "eager", "numpy", steps), xs, y), None)}
    for backend in ("numpy", "jax"):
        builders[f"replicate graph {backend} (define-and-run)"] = (
            C.backend_unavailable(backend)
            or (lambda b=backend: (_call(replicate_step(params, "graph", b, steps), xs, y),
                                   None)))

    def torch_build():
        import torch

        step = torch_step(params, steps)
        xt, yt = torch.from_numpy(xs), torch.from_numpy(y)
        return (lambda: step(xt, yt)), lambda loss: loss.detach().numpy()
    builders["PyTorch eager"] = torch_build

    def jax_build():
        import jax

        step = jax_step(params, steps)
        state = {"ps": [jax.numpy.asarray(p) for p in params]}
        xj, yj = jax.numpy.asarray(xs), jax.numpy.asarray(y)

        def call():
            state["ps"], loss = step(state["ps"], xj, yj)
            return loss
        return call, jax.block_until_ready
    builders["jax.jit"] = jax_build
    warmup, rounds = C.quick_counts(args.quick, 3, 15)
    rows = C.measure_many(builders, warmup=warmup, rounds=rounds,
                          extra_fn=lambda n, first: {"first_loss": float(np.asarray(first))})
    C.write_worker_json(args.json, {"threads": threads, "steps": steps,
                                    "rows": [r.as_dict() for r in rows]})


def _call(f, xs, y):
    return lambda: f(xs, y)


def report(results, command, quick):
    parts = [C.header(f"Define-by-run vs define-and-run: LSTM cell unrolled {T} steps, batch {B}",
                      command)]
    if quick:
        parts.append("(quick: 5 steps)\n")
    for threads, res in sorted(results.items()):
        rows = C.rows_from(res["rows"])
        by = {r.name: r for r in rows}
        eager = by["replicate eager (define-by-run)"].timing
        torch_t = by["PyTorch eager"].timing
        cells = [[r.name, r.timing.ms() if r.timing else "n/a",
                  f"{r.timing.min * 1e3:.2f}" if r.timing else "", C.ratio(r.timing, eager),
                  C.ratio(r.timing, torch_t),
                  f"{r.extra['first_loss']:.4f}" if r.extra else "", C.note(r)] for r in rows]
        parts.append(f"### {threads} thread(s)\n\n" + C.table(
            ["implementation", "median ms/step", "min ms", "vs replicate eager",
             "vs PyTorch eager", "first loss", "note"], cells) + "\n")
    text = "\n".join(parts)
    print(text)
    return text


def main(argv=None):
    return C.threads_main(argv, __file__, __doc__, worker, report)


if __name__ == "__main__":
    main()
