"""PyTorch's official MNIST example, ported: its conv net, Adadelta and StepLR(gamma=0.7), on
scikit-learn's bundled 8x8 digits (no download), data-parallel over replicas.

    python -m replicate.launch -n 2 examples/mnist.py             # 2 processes x 2 replicas
    python examples/mnist.py --replicas-per-rank 1                 # one process, one replica
    python examples/mnist.py --mode eager --replicas-per-rank 1    # define-by-run

The net is pytorch/examples' mnist/main.py with its sizes kept: conv 3x3 (32), conv 3x3 (64),
max-pool 2, dropout 0.25, linear (128), dropout 0.5, linear (10), log-softmax and the NLL loss;
Adadelta (lr 1.0) with the rate times 0.7 after every epoch, a global batch of 64, 14 epochs and
a test pass after each (``Replicator.evaluate``: every test image counted once over all replicas).
On 8x8 images the two 3x3 convolutions leave 4x4, the pool 2x2, so the first linear layer takes
64 * 2 * 2 = 256 features (9216 on 28x28). The PyTorch twin (bench/examples_vs_torch.py) is this
net in ``torch.nn`` with the same initial weights and batches.

Prints each epoch's test loss and accuracy as the PyTorch example does; plots them (mnist.png).
"""

from __future__ import annotations

import argparse
import json
import time

import numpy as np
from sklearn.datasets import load_digits
from sklearn.model_selection import train_test_split

import replicate as rp
import replicate.numpy as rnp


class Net(rp.nn.Module):
    """pytorch/examples' MNIST net, its first linear layer sized for 8x8 inputs."""

    def __init__(self, rng, side=8):
        super().__init__()
        self.conv1 = rp.nn.Conv2d(1, 32, 3, 1, rng=rng)
        self.conv2 = rp.nn.Conv2d(32, 64, 3, 1, rng=rng)
        self.dropout1 = rp.nn.Dropout(0.25)
        self.dropout2 = rp.nn.Dropout(0.5)
        self.fc1 = rp.nn.Linear(64 * ((side - 4) // 2) ** 2, 128, rng=rng)
        self.fc2 = rp.nn.Linear(128, 10, rng=rng)

    def forward(self, x):
        x = rp.nn.relu(self.conv1(x))
        x = rp.nn.relu(self.conv2(x))
        x = rnp.max_pool2d(x, 2)
        x = self.dropout1(x)
        x = rp.nn.flatten(x, 1)
        x = rp.nn.relu(self.fc1(x))
        x = self.dropout2(x)
        return rp.nn.log_softmax(self.fc2(x))


def digits(seed=0):
    """(x_train, y_train, x_test, y_test): 8x8 digits as (N, 1, 8, 8) float32, standardised with
    the training set's mean and deviation (the example's Normalize((0.1307,), (0.3081,)))."""
    d = load_digits()
    x = (d.data / 16.0).astype(np.float32).reshape(-1, 1, 8, 8)
    x_train, x_test, y_train, y_test = train_test_split(
        x, d.target.astype(np.int64), test_size=0.25, random_state=seed, stratify=d.target)
    mean, std = x_train.mean(), x_train.std()
    return (x_train - mean) / std, y_train, (x_test - mean) / std, y_test


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mode", default="graph", choices=["graph", "eager"])
    ap.add_argument("--replicas-per-rank", type=int, default=2)
    ap.add_argument("--batch-size", type=int, default=64, help="global (over all replicas)")
    ap.add_argument("--test-batch-size", type=int, default=1000, help="global")
    ap.add_argument("--epochs", type=int, default=14)
    ap.add_argument("--lr", type=float, default=1.0)
    ap.add_argument("--gamma", type=float, default=0.7, help="learning rate step gamma")
    ap.add_argument("--steps", type=int, default=None, help="stop after this many steps")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--plot", default="mnist.png")
    ap.add_argument("--log", default=None, help="write the results as JSON here")
    args = ap.parse_args(argv)
    k = 1 if args.mode == "eager" else args.replicas_per_rank

    x_train, y_train, x_test, y_test = digits()
    rnp.random.seed(args.seed)  # the dropout layers' streams: seeded before they are built
    model = Net(np.random.default_rng(args.seed))
    replicas = rp.process_count() * k
    if args.batch_size % replicas or args.test_batch_size % replicas:
        raise SystemExit(f"--batch-size and --test-batch-size must divide over {replicas} replicas")
    per_epoch = rp.data.steps_per_epoch(len(x_train), args.batch_size // replicas, replicas)
    opt = rp.wrap_optimizer(rp.optim.Adadelta(
        model.parameters(), lr=rp.optim.StepLR(args.lr, step_size=per_epoch, gamma=args.gamma)))

    def input_fn(ctx):
        return rp.shard_batches((x_train, y_train), args.batch_size // replicas, ctx,
                                seed=args.seed, epochs=args.epochs)

    def train_step(batch):
        x, y = batch
        loss = rp.nn.nll_loss(model(x), y, "mean")
        opt.apply(rp.grad(loss, model.parameters()))
        return {"loss": loss}

    def test_step(batch):
        (x, y), mask = batch
        out = model(x)
        correct = rnp.cast(rnp.argmax(out, axis=1) == y, np.float32)
        return {"loss": rnp.sum(rp.nn.nll_loss(out, y) * mask), "correct": rnp.sum(correct * mask),
                "count": rnp.sum(mask)}

    trainer = rp.Replicator(input_fn, train_step, mode=args.mode, replicas_per_rank=k)
    total = per_epoch * args.epochs if args.steps is None else min(args.steps,
                                                                   per_epoch * args.epochs)
    history, tests, start = [], [], time.perf_counter()
    while len(history) < total:
        history += trainer.run(steps=min(per_epoch, total - len(history)))
        t = trainer.evaluate((x_test, y_test), test_step,
                             batch_size=args.test_batch_size // replicas, model=model)
        tests.append((float(t["loss"] / t["count"]), float(t["correct"] / t["count"])))
        if rp.is_main_process():
            print(f"Test set (epoch {len(tests)}): Average loss: {tests[-1][0]:.4f}, Accuracy: "
                  f"{t['correct']:.0f}/{t['count']:.0f} ({100 * tests[-1][1]:.1f}%)")
    elapsed = time.perf_counter() - start
    losses = [float(h["loss"]) for h in history]
    if rp.is_main_process():
        print(f"replicas: {trainer.num_replicas} ({trainer.num_ranks} processes x {k}), mode "
              f"{args.mode}; {len(history)} steps ({per_epoch} per epoch) in {elapsed:.1f}s")
        print(f"final train loss {losses[-1]:.4f}; test accuracy {tests[-1][1]:.4f}")
        if args.log:
            with open(args.log, "w") as f:
                json.dump({"example": "mnist", "elapsed": elapsed, "losses": losses,
                           "tests": tests}, f)
        _plot(losses, tests, per_epoch, args.plot)
    return losses, tests


def _plot(losses, tests, per_epoch, path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 3.5))
    ax.plot(losses, lw=0.7, label="train loss (replica mean)")
    at = [per_epoch * (i + 1) for i in range(len(tests))]
    ax.plot(at, [t[0] for t in tests], "o-", label="test loss")
    ax.plot(at, [t[1] for t in tests], "s-", label="test accuracy")
    ax.set_xlabel("step")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)


if __name__ == "__main__":
    main()
