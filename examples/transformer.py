"""Character-level GPT trained on text that ships with Python (the standard library's own source
files: nothing downloaded), data-parallel over replicas.

    python -m replicate.launch -n 2 examples/transformer.py            # 2 processes x 2 replicas
    python examples/transformer.py --replicas-per-rank 1                # one process, one replica
    python examples/transformer.py --mode eager --replicas-per-rank 1   # define-by-run

The model is GPT-2's shape, small: token and position embeddings, ``--layers`` pre-LayerNorm
blocks of causal self-attention (``rp.nn.MultiheadAttention``, ``is_causal=True``) and a GELU MLP
of width 4d, a final LayerNorm and a linear head to the characters; every layer with the library's
default initialisation (PyTorch's), so the first loss is near ln(vocabulary). AdamW with a linear
warm-up and a cosine decay (``rp.optim.LinearLR`` around ``rp.optim.CosineAnnealingLR``). Each
replica draws its windows of the training text with a generator seeded by (seed, step, replica):
R replicas of batch B see what one replica of batch R*B sees. The held-out loss (the last tenth of
the text) is measured with ``Replicator.evaluate`` before and after training; a sample is
generated greedily from the trained model. The PyTorch twin (bench/examples_vs_torch.py) is this
model in ``torch.nn`` with the same initial weights and windows.

Prints the first and last training loss, the held-out loss and a sample; plots the loss
(transformer.png).
"""

from __future__ import annotations

import argparse
import json
import os
import sysconfig
import time

import numpy as np

import replicate as rp
import replicate.numpy as rnp

SOURCES = ("textwrap.py", "string.py", "heapq.py", "bisect.py", "fnmatch.py", "colorsys.py",
           "shlex.py", "sched.py", "this.py", "keyword.py", "glob.py", "graphlib.py")


def corpus():
    """(text, vocabulary): the standard library files of ``SOURCES`` (those present), tabs as
    four spaces, characters outside printable ASCII dropped; vocabulary the sorted characters."""
    parts = []
    for name in SOURCES:
        path = os.path.join(sysconfig.get_paths()["stdlib"], name)
        if os.path.exists(path):
            with open(path, encoding="utf-8") as f:
                parts.append(f.read().replace("\t", "    "))
    text = "".join(c for c in "\n".join(parts) if c == "\n" or " " <= c <= "~")
    return text, sorted(set(text))


class Block(rp.nn.Module):
    def __init__(self, d, heads, rng):
        super().__init__()
        self.ln1, self.ln2 = rp.nn.LayerNorm(d), rp.nn.LayerNorm(d)
        self.attn = rp.nn.MultiheadAttention(d, heads, rng=rng)
        self.fc = rp.nn.Linear(d, 4 * d, rng=rng)
        self.proj = rp.nn.Linear(4 * d, d, rng=rng)

    def forward(self, x):
        x = x + self.attn(self.ln1(x), is_causal=True)[0]
        return x + self.proj(rp.nn.gelu(self.fc(self.ln2(x))))


class GPT(rp.nn.Module):
    def __init__(self, vocab, d=64, layers=2, heads=4, context=64, seed=0):
        super().__init__()
        rng = np.random.default_rng(seed)
        self.wte = rp.nn.Embedding(vocab, d, rng=rng)
        self.wpe = rp.nn.Embedding(context, d, rng=rng)
        self.blocks = rp.nn.ModuleList([Block(d, heads, rng) for _ in range(layers)])
        self.ln_f = rp.nn.LayerNorm(d)
        self.head = rp.nn.Linear(d, vocab, rng=rng)

    def forward(self, ids):
        x = self.wte(ids) + self.wpe(rnp.arange(ids.shape[-1]))
        for block in self.blocks:
            x = block(x)
        return self.head(self.ln_f(x))


def windows(data, context, batch, seed, step, replica):
    """(inputs, targets): ``batch`` windows of ``data`` (int64 ids) drawn for (step, replica)."""
    start = np.random.default_rng([seed, step, replica]).integers(0, len(data) - context, batch)
    idx = start[:, None] + np.arange(context + 1)
    return data[idx[:, :-1]], data[idx[:, 1:]]


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mode", default="graph", choices=["graph", "eager"])
    ap.add_argument("--replicas-per-rank", type=int, default=2)
    ap.add_argument("--batch-size", type=int, default=16, help="sequences per replica")
    ap.add_argument("--context", type=int, default=64)
    ap.add_argument("--d", type=int, default=64, help="model width")
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--steps", type=int, default=400)
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--warmup", type=int, default=20)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--plot", default="transformer.png")
    ap.add_argument("--log", default=None, help="write the results as JSON here")
    args = ap.parse_args(argv)
    k = 1 if args.mode == "eager" else args.replicas_per_rank

    text, vocab = corpus()
    codes = np.frombuffer(text.encode("ascii"), np.uint8)
    ids = np.searchsorted(np.frombuffer("".join(vocab).encode("ascii"), np.uint8), codes)
    cut = len(ids) * 9 // 10
    train, held_out = ids[:cut], ids[cut:]
    T = args.context
    val = (held_out[:(len(held_out) - 1) // T * T].reshape(-1, T),
           held_out[1:(len(held_out) - 1) // T * T + 1].reshape(-1, T))

    model = GPT(len(vocab), args.d, args.layers, args.heads, T, args.seed)
    lr = rp.optim.LinearLR(rp.optim.CosineAnnealingLR(args.lr, args.steps), 1.0 / args.warmup,
                           1.0, args.warmup)
    opt = rp.wrap_optimizer(rp.optim.AdamW(model.parameters(), lr=lr), max_grad_norm=1.0)

    def input_fn(ctx):
        step = ctx.start_step
        while True:
            yield windows(train, T, args.batch_size, args.seed, step, ctx.replica_id)
            step += 1

    def train_step(batch):
        x, y = batch
        loss = rp.nn.softmax_cross_entropy(model(x), y).mean()
        opt.apply(rp.grad(loss, model.parameters()))
        return {"loss": loss}

    def eval_step(batch):
        (x, y), mask = batch
        per_window = rp.nn.softmax_cross_entropy(model(x), y).mean(-1)
        return {"loss": rnp.sum(per_window * mask), "count": rnp.sum(mask)}

    trainer = rp.Replicator(input_fn, train_step, mode=args.mode, replicas_per_rank=k)

    def held_out_loss():
        t = trainer.evaluate(val, eval_step, batch_size=args.batch_size)
        return float(t["loss"] / t["count"])

    before = held_out_loss()
    start = time.perf_counter()
    history = trainer.run(steps=args.steps)
    elapsed = time.perf_counter() - start
    after = held_out_loss()
    losses = [float(h["loss"]) for h in history]
    if rp.is_main_process():
        sample = generate(model, held_out[:T], 120)
        print(f"replicas: {trainer.num_replicas} ({trainer.num_ranks} processes x {k}), mode "
              f"{args.mode}; {len(text)} characters, vocabulary {len(vocab)} "
              f"(ln {len(vocab)} = {np.log(len(vocab)):.3f}); {len(history)} steps in "
              f"{elapsed:.1f}s")
        print(f"first train loss {losses[0]:.4f}, last {losses[-1]:.4f}")
        print(f"held-out loss {before:.4f} -> {after:.4f}")
        print("sample (greedy, after the held-out text's first window):\n"
              + "".join(vocab[i] for i in sample))
        if args.log:
            with open(args.log, "w") as f:
                json.dump({"example": "transformer", "elapsed": elapsed, "losses": losses,
                           "held_out": [before, after], "vocab": len(vocab)}, f)
        _plot(losses, after, args.plot)
    return losses, before, after


def generate(model, prompt, n):
    """The ids of ``n`` characters after ``prompt`` (a full context of ids), each the most
    likely one (greedy; one shape, so one trace)."""
    forward = rp.function(lambda x: rnp.argmax(model(x)[:, -1], axis=-1))
    ids = list(prompt)
    for _ in range(n):
        ids.append(int(forward(np.array([ids[-len(prompt):]], np.int64))[0]))
    return ids[len(prompt):]


def _plot(losses, held_out, path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 3.5))
    ax.plot(losses, lw=0.7, label="train loss (replica mean)")
    ax.axhline(held_out, ls="--", c="gray", label=f"held-out loss {held_out:.3f}")
    ax.set_xlabel("step")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)


if __name__ == "__main__":
    main()
