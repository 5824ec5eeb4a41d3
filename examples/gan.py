"""A GAN on a 2-D mixture of 8 Gaussians on a ring, data-parallel over replicas.

Generator and discriminator are trained in the same step with two optimisers; the generator uses
cross-replica BatchNorm (batch statistics all-reduced over every replica in the middle of the
step). ``--variant wgan-gp`` trains a WGAN-GP critic whose gradient penalty differentiates a
gradient (grad-of-grad, traced in graph mode).

    python -m replicate.launch -n 2 examples/gan.py                   # 2 processes x 2 replicas
    python -m replicate.launch -n 2 examples/gan.py --variant wgan-gp

Reports the modes covered (a mode counts when >= 1 % of 10 000 samples fall within 3 sigma of it)
and the share of samples within 3 sigma of some mode; plots real vs generated samples (gan.png).
The ring has radius 2 and sigma 0.02 (as in VEEGAN / PacGAN), so "within 3 sigma" means within
0.06 of a mode centre.

What makes the plain (non-saturating) GAN cover the ring instead of collapsing onto 2 modes:
the discriminator judges 4 samples at once (PacGAN, Lin et al. 2018: ``--pac``), a global batch
of 1024 (256 per replica), a 4-dimensional noise and a generator with 3 hidden layers, and Adam
(lr 2e-3, betas 0.5/0.9) decaying linearly to 0 over 6000 steps, which sharpens the modes at the
end. With these defaults, 2 processes x 2 replicas: 8/8 modes and 94.0 % of the samples within
3 sigma (seeds 1 and 2, measured before: 91.1 % and 90.4 %), about a minute of training on 2
cores; shorter schedules keep 8/8 with fewer samples on the modes (``--steps 4000``: 86.9 % with
seed 1; 3000: 81.0 % and 85.5 % with seeds 0 and 1; 2000: 66.6 %). WGAN-GP with the same
recipe: 8/8 modes, 82.5 % (seed 1: 82.3 %); with ``--gen-norm layer`` 6/8, 29 %.
Samples are drawn in eval mode (BatchNorm with its running statistics).
"""

from __future__ import annotations

import argparse
import time

import numpy as np

import replicate as rp
import replicate.numpy as rnp

RADIUS, SIGMA = 2.0, 0.02
MODES = np.array([[RADIUS * np.cos(a), RADIUS * np.sin(a)]
                  for a in np.linspace(0, 2 * np.pi, 8, endpoint=False)], np.float32)


def sample_real(rng, n):
    return (MODES[rng.integers(0, 8, n)] + rng.normal(0, SIGMA, (n, 2))).astype(np.float32)


def mode_metrics(samples):
    """(modes covered, share of samples within 3 sigma of some mode)."""
    d = np.linalg.norm(samples[:, None, :] - MODES[None], axis=-1)  # (n, 8)
    near = d < 3 * SIGMA
    covered = int((near.sum(0) >= 0.01 * len(samples)).sum())
    return covered, float(near.any(1).mean())


def build(noise=4, pac=1, hidden_layers=3, gen_norm="batch", seed=0):
    """Generator: ``hidden_layers`` x (Linear 128, norm, ReLU), Linear 2, the norm cross-replica
    BatchNorm (or LayerNorm). Discriminator / critic (no normalisation, as WGAN-GP requires):
    2 x (Linear 128, leaky ReLU), Linear 1, on ``pac`` samples at once."""
    rng = np.random.default_rng(seed)
    norm = (lambda n: rp.nn.BatchNorm(n, cross_replica=True)) if gen_norm == "batch" else \
        (lambda n: rp.nn.LayerNorm(n))
    layers, width = [], noise
    for _ in range(hidden_layers):
        layers += [rp.nn.Linear(width, 128, rng=rng), norm(128), rp.nn.relu]
        width = 128
    gen = rp.nn.Sequential(*layers, rp.nn.Linear(width, 2, rng=rng))
    disc = rp.nn.Sequential(rp.nn.Linear(2 * pac, 128, rng=rng), rp.nn.leaky_relu,
                            rp.nn.Linear(128, 128, rng=rng), rp.nn.leaky_relu,
                            rp.nn.Linear(128, 1, rng=rng))
    return gen, disc


def make_step(variant, gen, disc, lr, pac=1):
    g_opt = rp.wrap_optimizer(rp.optim.Adam(gen.parameters(), lr=lr, b1=0.5, b2=0.9))
    d_opt = rp.wrap_optimizer(rp.optim.Adam(disc.parameters(), lr=lr, b1=0.5, b2=0.9))
    bce = rp.nn.sigmoid_binary_cross_entropy

    def packed(x):  # PacGAN: the discriminator judges `pac` samples of one kind at once
        return rnp.reshape(x, (x.shape[0] // pac, 2 * pac))

    def gan_step(batch):
        real, z_d, z_g, _ = batch
        fake = rnp.stop_gradient(gen(z_d))
        d_loss = bce(disc(packed(real)), 1.0).mean() + bce(disc(packed(fake)), 0.0).mean()
        d_opt.apply(rp.grad(d_loss, disc.parameters()))
        g_loss = bce(disc(packed(gen(z_g))), 1.0).mean()  # non-saturating generator loss
        g_opt.apply(rp.grad(g_loss, gen.parameters()))
        return {"d_loss": d_loss, "g_loss": g_loss}

    def wgan_gp_step(batch):
        real, z_d, z_g, eps = batch
        fake = rnp.stop_gradient(gen(z_d))
        x_hat = packed(eps * real + (1.0 - eps) * fake)
        critic_grad = rp.grad(disc(x_hat).sum(), x_hat)              # d critic / d x_hat
        norm = rnp.sqrt(rnp.sum(critic_grad * critic_grad, axis=-1) + 1e-12)
        penalty = ((norm - 1.0) ** 2).mean()
        d_loss = disc(packed(fake)).mean() - disc(packed(real)).mean() + 10.0 * penalty
        d_opt.apply(rp.grad(d_loss, disc.parameters()))               # grad of a grad
        g_loss = -disc(packed(gen(z_g))).mean()
        g_opt.apply(rp.grad(g_loss, gen.parameters()))
        return {"d_loss": d_loss, "g_loss": g_loss, "penalty": penalty}

    return gan_step if variant == "gan" else wgan_gp_step


def linear_decay(base_lr, steps, decay=1.0):
    """``base_lr`` decaying linearly to ``base_lr * (1 - decay)`` at step ``steps``."""

    def schedule(step):  # the optimiser's step counts from 1
        frac = rnp.minimum(rnp.cast(step - 1, np.float32) / float(max(steps, 1)), 1.0)
        return base_lr * (1.0 - decay * frac)

    return schedule


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--variant", default="gan", choices=["gan", "wgan-gp"])
    ap.add_argument("--mode", default="graph", choices=["graph", "eager"])
    ap.add_argument("--replicas-per-rank", type=int, default=2)
    ap.add_argument("--batch-size", type=int, default=256, help="per replica")
    ap.add_argument("--steps", type=int, default=6000)
    ap.add_argument("--lr", type=float, default=2e-3)
    ap.add_argument("--lr-decay", type=float, default=1.0,
                    help="the learning rate decays linearly to lr * (1 - lr_decay) at the end")
    ap.add_argument("--pac", type=int, default=4,
                    help="samples the discriminator judges together (PacGAN); 1 = plain")
    ap.add_argument("--noise-dim", type=int, default=4)
    ap.add_argument("--gen-layers", type=int, default=3, help="hidden layers of the generator")
    ap.add_argument("--gen-norm", default="batch", choices=["batch", "layer"],
                    help="generator normalisation: cross-replica BatchNorm or LayerNorm")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--plot", default="gan.png")
    args = ap.parse_args(argv)
    k = 1 if args.mode == "eager" else args.replicas_per_rank
    if args.batch_size % args.pac:
        ap.error("--batch-size must be a multiple of --pac")

    gen, disc = build(args.noise_dim, args.pac, args.gen_layers, args.gen_norm, seed=args.seed)
    lr = linear_decay(args.lr, args.steps, args.lr_decay) if args.lr_decay else args.lr
    step_fn = make_step(args.variant, gen, disc, lr, args.pac)

    def input_fn(ctx):
        rng = np.random.default_rng([7 + args.seed, ctx.replica_id])
        b = args.batch_size
        while True:
            yield (sample_real(rng, b), rng.normal(size=(b, args.noise_dim)).astype(np.float32),
                   rng.normal(size=(b, args.noise_dim)).astype(np.float32),
                   rng.uniform(size=(b, 1)).astype(np.float32))

    rep = rp.Replicator(input_fn, step_fn, mode=args.mode, replicas_per_rank=k)
    start = time.perf_counter()
    history = rep.run(steps=args.steps)
    elapsed = time.perf_counter() - start

    gen.eval()
    z = np.random.default_rng(123).normal(size=(10_000, args.noise_dim)).astype(np.float32)
    samples = np.asarray(rp.function(gen)(z))
    covered, quality = mode_metrics(samples)
    if rp.is_main_process():
        print(f"{args.variant}: {rep.num_replicas} replicas, {len(history)} steps in "
              f"{elapsed:.1f}s; final d_loss {float(history[-1]['d_loss']):.3f}")
        print(f"modes covered: {covered}/8; samples within 3 sigma of a mode: {quality:.1%}")
        _plot(samples, args.plot, f"{args.variant}: {covered}/8 modes, {quality:.0%} within 3σ")
    return covered, quality, history


def _plot(samples, path, title):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    real = sample_real(np.random.default_rng(0), 2000)
    fig, ax = plt.subplots(figsize=(4.5, 4.5))
    ax.scatter(real[:, 0], real[:, 1], s=2, alpha=0.4, label="real")
    ax.scatter(samples[:2000, 0], samples[:2000, 1], s=2, alpha=0.4, label="generated")
    ax.set_title(title)
    ax.set_aspect("equal")
    ax.legend(markerscale=4)
    fig.tight_layout()
    fig.savefig(path, dpi=100)


if __name__ == "__main__":
    main()
