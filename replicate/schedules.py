"""Learning-rate schedules: ``schedule(step)`` functions that work on traced steps
(``rp.optim.warmup_cosine``, ``rp.optim.step_decay``)."""

from __future__ import annotations

import numpy as np

from . import numpy as rnp
from .errors import HabitError, ReplicateError
from .state import Variable


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


# -- PyTorch's scheduler objects, as schedules ---------------------------------------------------
# A schedule is read by the optimiser at update t (1 at the first update); PyTorch's schedulers
# count the updates before it (``last_epoch`` when ``scheduler.step()`` follows every
# ``opt.step()``): n = t - 1. ``lr`` may be a number or another schedule, which the factor
# multiplies (a warm-up over a cosine: ``LinearLR(CosineAnnealingLR(0.1, 1000), 0.01, 1.0, 50)``).

class Schedule:
    """A learning rate as a function of the update count, ``lr=Schedule(...)``: traced once,
    no call per step (``opt.learning_rate`` reads the rate the next update uses)."""

    def __init__(self, lr):
        self.lr = lr

    def __call__(self, step):
        n = rnp.cast(step, np.float64) - 1.0
        base = self.lr(step) if callable(self.lr) else self.lr
        return base * self._factor(n)

    def _factor(self, n):
        raise NotImplementedError

    def step(self, *args):
        raise HabitError(
            f"{type(self).__name__}.step(): a schedule is a function of the optimiser's update "
            "count, read at every update (opt.apply): there is nothing to call. "
            "ReduceLROnPlateau.step(metric) is the one scheduler fed from outside.")


class StepLR(Schedule):
    """``lr * gamma ** (n // step_size)`` (``torch.optim.lr_scheduler.StepLR``)."""

    def __init__(self, lr, step_size: int, gamma: float = 0.1):
        super().__init__(lr)
        if isinstance(step_size, bool) or not isinstance(step_size, int) or step_size < 1:
            raise ReplicateError(f"step_size must be an int >= 1, got {step_size!r}")
        self.step_size, self.gamma = step_size, gamma

    def _factor(self, n):
        return rnp.power(self.gamma, rnp.floor(n / self.step_size))


class MultiStepLR(Schedule):
    """``lr * gamma ** (milestones passed by n)`` (``MultiStepLR``)."""

    def __init__(self, lr, milestones, gamma: float = 0.1):
        super().__init__(lr)
        self.milestones, self.gamma = sorted(int(m) for m in milestones), gamma

    def _factor(self, n):
        passed = rnp.zeros((), np.float64)
        for m in self.milestones:
            passed = passed + rnp.cast(n >= m, np.float64)
        return rnp.power(self.gamma, passed)


class ExponentialLR(Schedule):
    """``lr * gamma ** n`` (``ExponentialLR``)."""

    def __init__(self, lr, gamma: float):
        super().__init__(lr)
        self.gamma = gamma

    def _factor(self, n):
        return rnp.power(self.gamma, n)


class CosineAnnealingLR(Schedule):
    """``eta_min + (lr - eta_min) (1 + cos(pi n / T_max)) / 2`` (``CosineAnnealingLR``, its
    closed form: past ``T_max`` the cosine goes on, as PyTorch's)."""

    def __init__(self, lr, T_max: int, eta_min: float = 0.0):  # noqa: N803 (PyTorch's name)
        super().__init__(lr)
        if not T_max >= 1:
            raise ReplicateError(f"T_max must be >= 1, got {T_max!r}")
        self.T_max, self.eta_min = T_max, eta_min

    def __call__(self, step):
        n = rnp.cast(step, np.float64) - 1.0
        base = self.lr(step) if callable(self.lr) else self.lr
        return self.eta_min + (base - self.eta_min) * (1 + rnp.cos(np.pi * n / self.T_max)) / 2


class LinearLR(Schedule):
    """``lr`` times a factor going linearly from ``start_factor`` to ``end_factor`` over
    ``total_iters`` updates, then ``end_factor`` (``LinearLR``): a linear warm-up."""

    def __init__(self, lr, start_factor: float = 1.0 / 3, end_factor: float = 1.0,
                 total_iters: int = 5):
        super().__init__(lr)
        if not 0 < start_factor <= 1 or not 0 <= end_factor <= 1 or total_iters < 1:
            raise ReplicateError("LinearLR: 0 < start_factor <= 1, 0 <= end_factor <= 1, "
                                 f"total_iters >= 1; got {start_factor}, {end_factor}, "
                                 f"{total_iters}")
        self.start, self.end, self.total = start_factor, end_factor, total_iters

    def _factor(self, n):
        return self.start + (self.end - self.start) * rnp.minimum(n, self.total) / self.total


class ReduceLROnPlateau(Schedule):
    """``torch.optim.lr_scheduler.ReduceLROnPlateau``: ``step(metric)`` after each evaluation;
    after more than ``patience`` evaluations without improvement the rate is multiplied by
    ``factor`` (not below ``min_lr``), then ``cooldown`` evaluations pass before counting again.

    The rate lives in a Variable (``variables()``: it and the plateau's counters, for
    checkpoints), which the optimiser reads in its step: a compiled step reads the new rate at
    its next run without tracing again. ``step(metric)`` runs on the host, between steps: call
    it on every rank with the same value (a ``Replicator``'s outputs, reduced over the replicas,
    are the same on every rank: a callback ``lambda rep, step, out: plateau.step(out["loss"])``
    or an evaluation's result). ``lr`` a schedule: the plateau's factor multiplies it."""

    def __init__(self, lr, mode: str = "min", factor: float = 0.1, patience: int = 10,
                 threshold: float = 1e-4, threshold_mode: str = "rel", cooldown: int = 0,
                 min_lr: float = 0.0, eps: float = 1e-8):
        super().__init__(lr)
        if mode not in ("min", "max") or threshold_mode not in ("rel", "abs"):
            raise ReplicateError(f"mode is 'min' or 'max' and threshold_mode 'rel' or 'abs'; "
                                 f"got {mode!r}, {threshold_mode!r}")
        if not 0 <= factor < 1:
            raise ReplicateError(f"factor must be in [0, 1), got {factor!r}")
        self.mode, self.factor, self.patience, self.cooldown = mode, factor, patience, cooldown
        self.threshold, self.threshold_mode, self.min_lr, self.eps = \
            threshold, threshold_mode, min_lr, eps
        # the rate itself (lr a number, as PyTorch keeps it) or the factor on a schedule
        start = 1.0 if callable(lr) else float(lr)
        self.value = Variable(np.float64(start), name="plateau.lr")
        self.best = Variable(np.float64(np.inf if mode == "min" else -np.inf),
                             name="plateau.best")
        self.bad = Variable(np.int64(0), name="plateau.bad_evaluations")
        self.cooling = Variable(np.int64(0), name="plateau.cooldown")

    def __call__(self, step):
        if not callable(self.lr):
            return rnp.cast(self.value.read(), np.float64)
        return rnp.maximum(self.lr(step) * self.value.read(), self.min_lr)

    def step(self, metric) -> float:
        """Note one evaluation's ``metric`` (host side, every rank alike); return the rate the
        next update uses (a schedule: the factor)."""
        current = float(np.asarray(metric))
        best, bad, cooling = float(self.best.numpy()), int(self.bad.numpy()), \
            int(self.cooling.numpy())
        if self._better(current, best):
            best, bad = current, 0
        else:
            bad += 1
        if cooling > 0:
            cooling, bad = cooling - 1, 0
        if bad > self.patience:
            old = float(self.value.numpy())
            new = old * self.factor if callable(self.lr) else max(old * self.factor,
                                                                    self.min_lr)
            if old - new > self.eps:
                self.value.assign(np.float64(new))
            cooling, bad = self.cooldown, 0
        self.best.assign(np.float64(best))
        self.bad.assign(np.int64(bad))
        self.cooling.assign(np.int64(cooling))
        return float(self.value.numpy())

    def _better(self, a: float, best: float) -> bool:
        rel = self.threshold_mode == "rel"
        if self.mode == "min":
            return a < (best * (1 - self.threshold) if rel else best - self.threshold)
        return a > (best * (1 + self.threshold) if rel else best + self.threshold)

    def variables(self) -> dict:
        """The rate (or factor) and the counters, by name (for checkpoints)."""
        return {"lr": self.value, "best": self.best, "bad": self.bad, "cooldown": self.cooling}
