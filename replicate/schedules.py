"""Learning-rate schedules: ``schedule(step)`` functions that work on traced steps
(``rp.optim.warmup_cosine``, ``rp.optim.step_decay``)."""

from __future__ import annotations

import numpy as np

from . import numpy as rnp


def warmup_cosine(base_lr: float, warmup_steps: int, total_steps: int, final_lr: float = 0.0):
    """Linear warm-up to ``base_lr`` over ``warmup_steps``, then cosine decay to ``final_lr`` at
    ``total_steps``. Returns ``schedule(step)`` (works on traced steps).

    >>> import replicate.numpy as rnp
    >>> s = warmup_cosine(1.0, 10, 110)
    >>> [round(float(s(rnp.asarray(t))), 3) for t in (5, 10, 60, 110)]
    [0.5, 1.0, 0.5, 0.0]
    """

    def schedule(step):
        t = rnp.cast(step, np.float64)
        warm = base_lr * t / max(warmup_steps, 1)
        progress = rnp.clip((t - warmup_steps) / max(total_steps - warmup_steps, 1), 0.0, 1.0)
        cosine = final_lr + 0.5 * (base_lr - final_lr) * (1.0 + rnp.cos(np.pi * progress))
        return rnp.where(t < warmup_steps, warm, cosine)

    return schedule


def step_decay(base_lr: float, boundaries, factor: float = 0.1):
    """``base_lr`` times ``factor`` for every boundary the step has passed."""

    def schedule(step):
        t = rnp.cast(step, np.float64)
        lr = rnp.asarray(base_lr, np.float64)
        for b in boundaries:
            lr = rnp.where(t >= b, lr * factor, lr)
        return lr

    return schedule
