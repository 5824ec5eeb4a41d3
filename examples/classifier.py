"""Digits classifier: an MLP on scikit-learn's bundled 8x8 digits, data-parallel over replicas.

    python -m replicate.launch -n 2 examples/classifier.py            # 2 processes x 2 replicas
    python examples/classifier.py --mode eager --replicas-per-rank 1  # define-by-run
    python examples/classifier.py --precision bf16                     # mixed precision

Prints the held-out accuracy and writes a loss/accuracy plot (classifier.png).
"""

from __future__ import annotations

import argparse
import time

import numpy as np
from sklearn.datasets import load_digits
from sklearn.model_selection import train_test_split

import replicate as rp
import replicate.numpy as rnp


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mode", default="graph", choices=["graph", "eager"])
    ap.add_argument("--replicas-per-rank", type=int, default=2)
    ap.add_argument("--batch-size", type=int, default=32, help="per replica")
    ap.add_argument("--epochs", type=int, default=40)
    ap.add_argument("--steps", type=int, default=None, help="stop early after this many steps")
    ap.add_argument("--precision", default="fp32", choices=["fp32", "bf16", "fp16"],
                    help="bf16/fp16: matrix products under rp.autocast (float32 parameters); "
                         "fp16 also scales the loss dynamically")
    ap.add_argument("--plot", default="classifier.png")
    args = ap.parse_args(argv)
    k = 1 if args.mode == "eager" else args.replicas_per_rank

    digits = load_digits()
    x = (digits.data / 16.0).astype(np.float32)
    y = digits.target.astype(np.int64)
    x_train, x_test, y_train, y_test = train_test_split(x, y, test_size=0.25, random_state=0,
                                                        stratify=y)

    rp.nn.init.default_rng(0)
    model = rp.nn.Sequential(rp.nn.Linear(64, 256), rp.nn.relu, rp.nn.Linear(256, 128),
                             rp.nn.relu, rp.nn.Linear(128, 10))
    low = {"fp32": None, "bf16": "bfloat16", "fp16": "float16"}[args.precision]
    opt = rp.wrap_optimizer(rp.optim.Adam(model.parameters(), lr=2e-3),
                            loss_scale="dynamic" if args.precision == "fp16" else None)

    def input_fn(ctx):
        return rp.shard_batches((x_train, y_train), args.batch_size, ctx, seed=1,
                                epochs=args.epochs)

    def step_fn(batch):
        xb, yb = batch
        with rp.autocast(low):  # (None: off)
            logits = model(xb)
            loss = rp.nn.softmax_cross_entropy(logits, yb).mean()  # float32 either way
        opt.apply(rp.grad(opt.scale(loss), model.parameters()))  # (scale: fp16 only)
        accuracy = rnp.mean(rnp.argmax(logits, axis=-1) == yb)
        return {"loss": loss, "accuracy": accuracy}

    def predict_fn(xs):
        with rp.autocast(low):
            return rnp.argmax(model(xs), axis=-1)

    rep = rp.Replicator(input_fn, step_fn, mode=args.mode, replicas_per_rank=k)
    start = time.perf_counter()
    history = rep.run(steps=args.steps)
    elapsed = time.perf_counter() - start

    predict = rp.function(predict_fn)
    test_acc = float(np.mean(predict(x_test) == y_test))
    if rp.is_main_process():
        print(f"replicas: {rep.num_replicas} ({rep.num_ranks} processes x {k}), mode {args.mode}; "
              f"{len(history)} steps in {elapsed:.1f}s")
        print(f"final train loss {float(history[-1]['loss']):.4f}"
              + (f" (precision {args.precision}, loss scale {opt.loss_scale:g})"
                 if args.precision == "fp16" else f" (precision {args.precision})"))
        print(f"held-out accuracy: {test_acc:.4f}")
        _plot(history, test_acc, args.plot)
    return test_acc, history


def _plot(history, test_acc, path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 3.5))
    ax.plot([float(h["loss"]) for h in history], label="train loss (replica mean)")
    ax.plot([float(h["accuracy"]) for h in history], label="train accuracy")
    ax.axhline(test_acc, ls="--", c="gray", label=f"held-out accuracy {test_acc:.3f}")
    ax.set_xlabel("step")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)


if __name__ == "__main__":
    main()
