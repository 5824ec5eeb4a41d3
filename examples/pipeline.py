"""Pipeline model parallelism: a deep MLP split over 2 logical devices (2 processes), GPipe-style.

    python -m replicate.launch -n 2 examples/pipeline.py
    python -m replicate.launch -n 2 examples/pipeline.py --micro-batches 1 4 --batch-size 256

The first half of the layers runs on logical device 0 (process 0), the second half and the loss
on device 1 (process 1); activations go forward and their gradients back as point-to-point
messages, each device updates its own layers (and holds only them and their optimiser state
between steps: the Variables' memory is split, and no update is sent). With M micro-batches a
step runs the forward pass of every micro-batch, then every backward pass, then one update, so a
device waits at the start and at the end of the pipeline: the GPipe bubble, (m-1)/(M+m-1) of
the step for m devices. For each M this prints the step time and the measured bubble — the
share of the step each process spent waiting to receive a value — beside the formula, and the
one-device step time on the same batch (process 0 alone, for the speed-up); for the last M, what
each process holds between steps and sends per step.
"""

from __future__ import annotations

import argparse
import time

import numpy as np

import replicate as rp
from replicate.runtime.communication import p2p
from replicate.runtime.communication.comm import SelfComm


def build(width: int, depth: int):
    """Two stages of ``depth // 2`` layers each: 64 -> width ... width -> 10."""
    rp.nn.init.default_rng(0)
    sizes = [64] + [width] * (depth - 1) + [10]
    layers = []
    for i, (a, b) in enumerate(zip(sizes[:-1], sizes[1:])):
        layers.append(rp.nn.Linear(a, b))
        if i < depth - 1:
            layers.append(rp.nn.tanh)
    half = len(layers) // 2 + (len(layers) // 2) % 2  # (a layer and its activation together)
    return rp.nn.Sequential(*layers[:half]), rp.nn.Sequential(*layers[half:])


def make_step(stages, params, opt, devices: int):
    first, second = stages

    def step_fn(batch):
        x, y = batch
        with rp.logical_device(0):
            h = first(x)
        with rp.logical_device(devices - 1):  # (1 with two devices; 0 on one device)
            loss = rp.nn.softmax_cross_entropy(second(h), y).mean()
        opt.apply(rp.grad(loss, params))  # each gradient on its layer's device
        return {"loss": loss}

    return step_fn


def timed(rep, steps: int, warmup: int):
    """Seconds per step, the share of it spent waiting in receives, the last loss, and (this
    process) the bytes sent per step and the bytes of Variables held between two steps."""
    rep.run(warmup)
    held = [0]

    def measure(rep, step, outputs):  # (a Variable living on the other device: not held here)
        held[0] = sum(v.value.nbytes for v in rep.variables() if v.released is None)

    waited, sent, t0 = p2p.WAITED[0], p2p.SENT[0], time.perf_counter()
    hist = rep.run(steps, callbacks=[measure])
    seconds = (time.perf_counter() - t0) / steps
    return (seconds, (p2p.WAITED[0] - waited) / steps / seconds, float(hist[-1]["loss"]),
            (p2p.SENT[0] - sent) / steps, held[0])


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--width", type=int, default=512)
    ap.add_argument("--depth", type=int, default=8, help="linear layers, split in two halves")
    ap.add_argument("--batch-size", type=int, default=1024)
    ap.add_argument("--micro-batches", type=int, nargs="+", default=[1, 2, 4, 8])
    ap.add_argument("--steps", type=int, default=10, help="timed steps per setting")
    ap.add_argument("--warmup", type=int, default=3)
    args = ap.parse_args(argv)
    if rp.process_count() != 2:
        raise SystemExit("run with 2 processes: python -m replicate.launch -n 2 "
                         "examples/pipeline.py")

    rng = np.random.default_rng(0)  # 10 classes of a random linear teacher on 64 features
    x = rng.normal(size=(4096, 64)).astype(np.float32)
    y = np.argmax(x @ rng.normal(size=(64, 10)), axis=1)
    stages = build(args.width, args.depth)
    params = [*stages[0].parameters().values(), *stages[1].parameters().values()]
    opt = rp.wrap_optimizer(rp.optim.SGD(params, lr=0.05, momentum=0.9))

    def input_fn(ctx):
        return rp.shard_batches((x, y), args.batch_size, ctx, seed=1, epochs=None)

    rows = []
    for micro in args.micro_batches:
        rep = rp.Replicator(input_fn, make_step(stages, params, opt, 2), logical_devices=2,
                            micro_batches=micro)
        seconds, waiting, loss, sent, held = timed(rep, args.steps, args.warmup)
        everyone = rp.host.all_gather(np.array([seconds, waiting, sent, held]))  # (both)
        rows.append((micro, everyone[:, 0].max(), everyone[:, 1], loss))
        if micro == args.micro_batches[-1] and rp.is_main_process():
            print(rep.compiled_graph().meta.pipeline)
            total = sum(v.value.nbytes for v in rep.variables())  # (after run: all here)
            print(f"Variables held between steps: {everyone[0, 3] / 2**20:.2f} MiB (process 0), "
                  f"{everyone[1, 3] / 2**20:.2f} MiB (process 1) of {total / 2**20:.2f} MiB; "
                  f"sent per step: {everyone[0, 2] / 2**10:.0f} KiB (process 0), "
                  f"{everyone[1, 2] / 2**10:.0f} KiB (process 1)")

    one = np.zeros(1)  # one device, the same model and batch, on process 0 alone
    if rp.is_main_process():
        single = rp.Replicator(input_fn, make_step(stages, params, opt, 1), comm=SelfComm())
        one[0] = timed(single, args.steps, args.warmup)[0]
    one = rp.host.broadcast(one)[0]

    if rp.is_main_process():
        print(f"MLP 64-{args.width}x{args.depth - 1}-10 ({args.depth} layers, half on each "
              f"device), batch {args.batch_size}, float32, 2 logical devices on 2 processes; "
              f"one device: {one * 1e3:.1f} ms/step")
        print("micro-batches  ms/step  speed-up  bubble dev0  dev1  mean  GPipe (m-1)/(M+m-1)"
              "  loss")
        for micro, seconds, waiting, loss in rows:
            print(f"{micro:13d}  {seconds * 1e3:7.1f}  {one / seconds:7.2f}x  {waiting[0]:11.2f}"
                  f"  {waiting[1]:4.2f}  {waiting.mean():4.2f}  {1 / (micro + 1):19.2f}"
                  f"  {loss:.3f}")
    return rows


if __name__ == "__main__":
    main()
