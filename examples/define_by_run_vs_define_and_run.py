"""The same step function run define-by-run (eager) and define-and-run (graph).

A stochastic-depth residual network (Huang et al. 2016; the example from the Chainer slides):
each residual block is skipped at random during training. The step uses ``rp.cond``:

* eager mode evaluates the random draw at once and runs a Python ``if`` — a skipped block costs
  nothing, and you can print, branch and step through it in a debugger;
* graph mode traces both branches once and selects with a traced random choice — no retracing, the
  graph is compiled once and replayed, but both branches are computed every step.

    python examples/define_by_run_vs_define_and_run.py

Prints the time per step of each mode and writes a plot of both loss curves.
"""

from __future__ import annotations

import argparse
import time

import numpy as np
from sklearn.datasets import load_digits

import replicate as rp
import replicate.numpy as rnp


def _small_init(shape, rng=None, dtype=np.float32):
    # residual branches start small (not exactly zero: all-zero weights make the first steps
    # crawl through subnormal floating-point numbers on the CPU)
    return rp.nn.init.glorot_uniform(shape, rng=rng, dtype=dtype) * 0.1


class StochasticDepthNet(rp.nn.Module):
    def __init__(self, width=128, blocks=8, survival_last=0.5, seed=0):
        super().__init__()
        rng = np.random.default_rng(seed)
        self.stem = rp.nn.Linear(64, width, rng=rng)
        self.blocks = []
        for i in range(blocks):
            block = rp.nn.Sequential(rp.nn.Linear(width, width, rng=rng), rp.nn.relu,
                                     rp.nn.Linear(width, width, rng=rng,
                                                  init_fn=_small_init))  # near-identity at start
            setattr(self, f"block{i}", block)
            self.blocks.append(block)
        self.head = rp.nn.Linear(width, 10, rng=rng)
        # linearly decaying survival probability, as in the paper
        self.survival = [1.0 - (i + 1) / blocks * (1.0 - survival_last) for i in range(blocks)]
        self.rng = rnp.random.Generator(seed=seed + 1, name="depth.rng")
        self.register_buffer("rng_state", self.rng.state)

    def forward(self, x):
        h = rp.nn.relu(self.stem(x))
        for block, p in zip(self.blocks, self.survival):
            keep = self.rng.uniform() < p
            # eager: a Python `if` on the draw; graph: a traced select of both branches
            h = rp.cond(keep, lambda h=h, block=block: h + block(h), lambda h=h: h)
        return self.head(h)


def run(mode, steps, x, y, batch):
    model = StochasticDepthNet()
    opt = rp.optim.SGD(model.parameters(), lr=0.02, momentum=0.9)

    def input_fn(ctx):
        return rp.shard_batches((x, y), batch, ctx, seed=0, epochs=None)

    def step_fn(b):
        xb, yb = b
        loss = rp.nn.softmax_cross_entropy(model(xb), yb).mean()
        opt.apply(rp.grad(loss, model.parameters()))
        return {"loss": loss}

    rep = rp.Replicator(input_fn, step_fn, mode=mode)
    rep.run(steps=3)  # warm-up (and, in graph mode, the one trace)
    start = time.perf_counter()
    history = rep.run(steps=steps)
    per_step = (time.perf_counter() - start) / steps
    return per_step, [float(h["loss"]) for h in history], rep.trace_count


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=100)
    ap.add_argument("--batch-size", type=int, default=64)
    ap.add_argument("--plot", default="define_by_run_vs_define_and_run.png")
    args = ap.parse_args(argv)
    digits = load_digits()
    x, y = (digits.data / 16.0).astype(np.float32), digits.target.astype(np.int64)

    results = {mode: run(mode, args.steps, x, y, args.batch_size) for mode in ("eager", "graph")}
    print(f"{'mode':<8}{'ms/step':>10}{'first loss':>12}{'last loss':>11}{'traces':>8}")
    for mode, (t, losses, traces) in results.items():
        print(f"{mode:<8}{t * 1e3:>10.2f}{losses[0]:>12.4f}{losses[-1]:>11.4f}{traces:>8}")
    ratio = results["eager"][0] / results["graph"][0]
    print(f"eager / graph time per step: {ratio:.2f}x")

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 3.5))
    for mode, (t, losses, _) in results.items():
        ax.plot(losses, label=f"{mode} ({t * 1e3:.1f} ms/step)")
    ax.set_xlabel("step")
    ax.set_ylabel("loss")
    ax.legend()
    fig.tight_layout()
    fig.savefig(args.plot, dpi=100)
    return results


if __name__ == "__main__":
    main()
