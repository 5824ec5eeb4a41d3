"""Adagrad and Adadelta (PyTorch's algorithms and defaults), and how to write an optimiser of
one's own: ``rp.optim.Adagrad`` and ``rp.optim.Adadelta`` are these rules on
``rp.optim.Optimizer`` (``replicate/optim.py``).

An optimiser is a subclass of ``rp.optim.Optimizer`` with an ``update``:

* ``__init__`` calls ``super().__init__(params, lr, master_weights)`` and makes its state with
  ``self.slot(name)`` (a list of Variables shaped like the parameters, zeros, float32 for
  low-precision parameters): state in Variables is traced in graph mode and saved by
  checkpoints (``opt.variables()`` finds every list of Variables it holds);
* ``update(i, p, g, lr, step)`` returns parameter ``i``'s new value from its value ``p`` and
  gradient ``g`` (both in the compute dtype), the learning rate (a number, or a schedule's
  value) and the update count ``step`` (1 at the first update). It reads a slot with
  ``self.xp.read(slot)`` and writes it with ``slot.assign(value)``;
* written with ``self.xp`` (``read``, ``sqrt``, ``power``, ``cast``, ``where``) and arithmetic
  only, it may set ``eager_numpy = True``: eager mode then runs it on NumPy arrays (no tape, no
  per-op dispatch), with the same bits as the compiled step. An ``update`` that calls
  ``replicate.numpy`` leaves it False and runs op by op in eager mode.

``Optimizer.apply`` does the rest: the step counter, the learning-rate schedule, the shape
checks, float32 master weights for float16/bfloat16 parameters.

>>> import numpy as np, replicate as rp
>>> class SignSGD(rp.optim.Optimizer):
...     eager_numpy = True
...     def __init__(self, params, lr=0.01, momentum=0.9):
...         super().__init__(params, lr)
...         self.momentum, self.m = momentum, self.slot("m")
...     def update(self, i, p, g, lr, step):
...         m = self.momentum * self.xp.read(self.m[i]) + (1 - self.momentum) * g
...         self.m[i].assign(m)
...         return p - lr * self.xp.where(m > 0, 1.0, -1.0)
>>> w = rp.Variable(np.array([1.0, -1.0]), name="w")
>>> opt = SignSGD([w], lr=0.5)
>>> opt.apply([np.array([2.0, -3.0])])
>>> w.numpy().tolist(), sorted(opt.variables())
([0.5, -0.5], ['m/0', 'step'])
"""

from __future__ import annotations

from .errors import ReplicateError


def _check(**values) -> None:
    for name, value in values.items():
        if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0:
            raise ReplicateError(f"{name} must be a number >= 0, got {value!r}")


class AdagradRule:
    """Adagrad (Duchi, Hazan & Singer), as ``torch.optim.Adagrad``: the sum of the squared
    gradients scales each element's step, ``p -= lr_t g / (sqrt(sum) + eps)`` with
    ``lr_t = lr / (1 + (t - 1) lr_decay)``; ``weight_decay`` adds ``wd p`` to the gradient."""

    eager_numpy = True

    def __init__(self, params, lr=1e-2, lr_decay=0.0, weight_decay=0.0,
                 initial_accumulator_value=0.0, eps=1e-10, master_weights=None):
        _check(lr_decay=lr_decay, weight_decay=weight_decay, eps=eps,
               initial_accumulator_value=initial_accumulator_value)
        super().__init__(params, lr, master_weights)
        self.lr_decay, self.weight_decay, self.eps = lr_decay, weight_decay, eps
        self.sum = self.slot("sum", initial_accumulator_value)

    def update(self, i, p, g, lr, step):
        xp = self.xp
        if self.weight_decay:
            g = g + self.weight_decay * p
        if self.lr_decay:
            lr = lr / (1 + (xp.cast(step, p.dtype) - 1) * self.lr_decay)
        total = xp.read(self.sum[i]) + g * g
        self.sum[i].assign(total)
        return p - lr * (g / (xp.sqrt(total) + self.eps))


class AdadeltaRule:
    """Adadelta (Zeiler), as ``torch.optim.Adadelta``: running means of the squared gradients
    and of the squared updates, ``delta = sqrt(acc_delta + eps) / sqrt(square_avg + eps) g``,
    ``p -= lr delta``; ``weight_decay`` adds ``wd p`` to the gradient."""

    eager_numpy = True

    def __init__(self, params, lr=1.0, rho=0.9, eps=1e-6, weight_decay=0.0,
                 master_weights=None):
        _check(rho=rho, eps=eps, weight_decay=weight_decay)
        if rho > 1:
            raise ReplicateError(f"rho must be in [0, 1], got {rho!r}")
        super().__init__(params, lr, master_weights)
        self.rho, self.eps, self.weight_decay = rho, eps, weight_decay
        self.square_avg, self.acc_delta = self.slot("square_avg"), self.slot("acc_delta")

    def update(self, i, p, g, lr, step):
        xp, rho = self.xp, self.rho
        if self.weight_decay:
            g = g + self.weight_decay * p
        square_avg = rho * xp.read(self.square_avg[i]) + (1 - rho) * (g * g)
        self.square_avg[i].assign(square_avg)
        acc = xp.read(self.acc_delta[i])
        delta = xp.sqrt(acc + self.eps) / xp.sqrt(square_avg + self.eps) * g
        self.acc_delta[i].assign(rho * acc + (1 - rho) * (delta * delta))
        return p - lr * delta
