"""Input prefetch on a data-bound step: step rate with and without ``prefetch``, against the
ideal ``max(input time, step time)``.

The step: an MLP 2352-512-10 SGD step on batch 128 (graph mode, NumPy backend, one BLAS
thread). The input, two kinds, each tuned to take about as long as the step (the case where
running them in sequence costs most, 2x):

* ``augment``: random crops, flips and normalisation of uint8 images in NumPy (compute that
  releases the GIL inside NumPy's loops);
* ``io``: a wait per batch standing for a file or network read (``time.sleep``), then a copy.

Rows: input alone, step alone (batches from a list), ``prefetch=0`` (input then step, in
sequence) and ``prefetch=2`` (the default: input on a background thread); the fraction of the
ideal rate is ``max(input, step) / measured``. The issue's target: >= 0.9 with prefetch.

    python bench/prefetch.py [--steps 60] [--repeats 3] [--quick]
"""

from __future__ import annotations

import os

for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")

import argparse  # noqa: E402
import itertools  # noqa: E402
import statistics  # noqa: E402
import time  # noqa: E402

import numpy as np  # noqa: E402

import replicate as rp  # noqa: E402
import replicate.numpy as rnp  # noqa: E402

B, C, S, CROP, HIDDEN, CLASSES = 128, 3, 32, 28, 512, 10
FEATURES = C * CROP * CROP


def make_images(n=2048, seed=0):
    rng = np.random.default_rng(seed)
    return rng.integers(0, 256, (n, C, S, S), dtype=np.uint8), rng.integers(0, CLASSES, n)


def augment_batches(images, labels, work, seed=0, sleep=0.0):
    """Yield augmented batches forever; ``work``: passes of the normalisation (to tune the
    cost), ``sleep``: seconds of simulated reading per batch."""
    rng = np.random.default_rng(seed)
    mean, std = np.float32(127.5), np.float32(64.0)
    while True:
        idx = rng.integers(0, len(images), B)
        if sleep:
            time.sleep(sleep)
        x = images[idx]
        dy, dx = rng.integers(0, S - CROP + 1, 2)
        x = x[:, :, dy:dy + CROP, dx:dx + CROP]
        if rng.random() < 0.5:
            x = x[..., ::-1]
        out = x.astype(np.float32)
        for _ in range(work):
            out = (out - mean) / std
            out = np.tanh(out) * std + mean
        yield out.reshape(B, FEATURES), labels[idx]


def model():
    rng = np.random.default_rng(1)
    w1 = rp.Variable((rng.standard_normal((FEATURES, HIDDEN)) / np.sqrt(FEATURES))
                     .astype(np.float32), name="w1")
    w2 = rp.Variable((rng.standard_normal((HIDDEN, CLASSES)) / np.sqrt(HIDDEN))
                     .astype(np.float32), name="w2")
    opt = rp.optim.SGD([w1, w2], lr=0.01)

    def step_fn(batch):
        x, y = batch
        logits = rnp.maximum(x @ w1, 0.0) @ w2
        loss = rp.nn.softmax_cross_entropy(logits, y).mean()
        opt.apply(rp.all_reduce(rp.grad(loss, [w1, w2]), "mean"))
        return {"loss": loss}
    return step_fn


def per_step(input_fn, step_fn, steps, prefetch):
    rep = rp.Replicator(input_fn, step_fn, prefetch=prefetch, check_sync=False)
    rep.run(3)  # compile, warm up, fill the queue
    t0 = time.perf_counter()
    rep.run(steps)
    return (time.perf_counter() - t0) / steps


def input_time(gen, steps):
    next(gen)
    t0 = time.perf_counter()
    for _ in range(steps):
        next(gen)
    return (time.perf_counter() - t0) / steps


def tune(images, labels, target, sleep_mode):
    """The ``work`` (or sleep) that makes one batch take about ``target`` seconds."""
    if sleep_mode:
        base = input_time(augment_batches(images, labels, 0), 10)
        return 0, max(target - base, 0.0)
    one = input_time(augment_batches(images, labels, 1), 10)
    zero = input_time(augment_batches(images, labels, 0), 10)
    return max(1, round((target - zero) / max(one - zero, 1e-6))), 0.0


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--quick", action="store_true", help="a smoke run (10 steps, 1 repeat)")
    args = ap.parse_args(argv)
    if args.quick:
        args.steps, args.repeats = 10, 1
    images, labels = make_images()
    step_fn = model()
    fixed = list(itertools.islice(augment_batches(images, labels, 0), 8))
    t_step = statistics.median(
        per_step(lambda ctx: itertools.cycle(fixed), step_fn, args.steps, 0)
        for _ in range(args.repeats))
    print(f"machine: {os.cpu_count()} cores; step alone {t_step * 1e3:.2f} ms "
          f"(MLP {FEATURES}-{HIDDEN}-{CLASSES}, batch {B}, graph mode, NumPy backend)\n")
    print("| input | input alone ms | step alone ms | prefetch=0 ms/step | prefetch=2 ms/step "
          "| ideal ms | fraction of ideal rate, prefetch=0 | prefetch=2 | target (>= 0.9) |")
    print("|---|---|---|---|---|---|---|---|---|")
    for kind in ("augment", "io"):
        work, sleep = tune(images, labels, t_step, kind == "io")
        t_in = statistics.median(
            input_time(augment_batches(images, labels, work, sleep=sleep), args.steps)
            for _ in range(args.repeats))
        timed = {}
        for depth in (0, 2):
            timed[depth] = statistics.median(
                per_step(lambda ctx: augment_batches(images, labels, work, sleep=sleep),
                         step_fn, args.steps, depth) for _ in range(args.repeats))
        ideal = max(t_in, t_step)
        frac = {d: ideal / t for d, t in timed.items()}
        print(f"| {kind} | {t_in * 1e3:.2f} | {t_step * 1e3:.2f} | {timed[0] * 1e3:.2f} | "
              f"{timed[2] * 1e3:.2f} | {ideal * 1e3:.2f} | {frac[0]:.2f} | {frac[2]:.2f} | "
              f"{'met' if frac[2] >= 0.9 else 'NOT met'} |")


if __name__ == "__main__":
    main()
