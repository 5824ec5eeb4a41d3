"""Optimisers whose state is ``Variable``s, so it is traced in graph mode and checkpointed.

>>> import numpy as np, replicate as rp
>>> w = rp.Variable(np.array([1.0, -2.0]), name="w")
>>> opt = rp.optim.SGD([w], lr=0.5)
>>> opt.apply([np.array([1.0, 1.0])])
>>> w.numpy().tolist()
[0.5, -2.5]
"""

from __future__ import annotations

import numpy as np

from . import numpy as rnp
from . import tree
from .collectives import all_reduce
from .dependency import TraceKeyed
from .errors import ReplicateError
from .state import Variable


def _params(params) -> tuple[list, object]:
    if hasattr(params, "parameters") and callable(params.parameters):
        params = params.parameters()
    leaves, treedef = tree.flatten(params)
    for p in leaves:
        if not isinstance(p, Variable):
            raise ReplicateError(f"optimisers update Variables; got {type(p).__name__}")
    return leaves, treedef


class Optimizer(TraceKeyed):
    """Base: holds the parameters, a step counter and per-parameter slots.

    Its hyper-parameters (``lr``, momentum, ...) are read when a step is traced: assigning one
    (``opt.lr = 1e-4``) after the step was compiled makes it trace again. A learning rate that
    changes every step belongs in a schedule (``lr=fn(step)``), which is traced once."""

    def __init__(self, params, lr):
        self.params, self.treedef = _params(params)
        self.lr = lr
        self.step = Variable(np.zeros((), np.int64), name="opt.step")

    def slot(self, name: str) -> list[Variable]:
        return [Variable(np.zeros_like(p.value), name=f"{p.name}.{name}") for p in self.params]

    def learning_rate(self, step):
        """The learning rate at (traced) ``step``: a number or a schedule ``fn(step)``."""
        return self.lr(step) if callable(self.lr) else self.lr

    def apply(self, grads) -> None:
        """Update every parameter from its gradient (a nest shaped like the parameters)."""
        leaves, treedef = tree.flatten(grads)
        if len(leaves) != len(self.params):
            raise ReplicateError(f"{type(self).__name__}.apply: {len(leaves)} gradients for "
                                 f"{len(self.params)} parameters")
        self.traced_by()
        step = self.step.read() + 1
        self.step.assign(step)
        lr = self.learning_rate(step)
        for i, (p, g) in enumerate(zip(self.params, leaves)):
            g = rnp.as_array(g)
            if g.shape != p.shape:
                raise ReplicateError(f"gradient for {p.name} has shape {g.shape}, parameter "
                                     f"{p.shape}")
            p.assign(self.update(i, p.read(), rnp.cast(g, p.dtype), lr, step))

    def update(self, i, p, g, lr, step):
        raise NotImplementedError

    def variables(self) -> dict:
        """The optimiser's own state by name (for checkpoints): step and every slot."""
        out = {"step": self.step}
        for key, value in vars(self).items():
            if isinstance(value, list) and value and isinstance(value[0], Variable) \
                    and value is not self.params:
                for i, var in enumerate(value):
                    out[f"{key}/{i}"] = var
        return out


class SGD(Optimizer):
    """Stochastic gradient descent with optional momentum, Nesterov and weight decay."""

    def __init__(self, params, lr=0.01, momentum=0.0, nesterov=False, weight_decay=0.0):
        super().__init__(params, lr)
        self.momentum, self.nesterov, self.weight_decay = momentum, nesterov, weight_decay
        self.velocity = self.slot("velocity") if momentum else []

    def update(self, i, p, g, lr, step):
        if self.weight_decay:
            g = g + self.weight_decay * p
        if self.momentum:
            v = self.momentum * self.velocity[i].read() + g
            self.velocity[i].assign(v)
            g = g + self.momentum * v if self.nesterov else v
        return p - lr * g


class Adam(Optimizer):
    """Adam (Kingma & Ba); with ``decoupled_weight_decay`` it is AdamW."""

    def __init__(self, params, lr=1e-3, b1=0.9, b2=0.999, eps=1e-8, weight_decay=0.0,
                 decoupled_weight_decay=False):
        super().__init__(params, lr)
        self.b1, self.b2, self.eps = b1, b2, eps
        self.weight_decay, self.decoupled = weight_decay, decoupled_weight_decay
        self.m, self.v = self.slot("m"), self.slot("v")

    def update(self, i, p, g, lr, step):
        if self.weight_decay and not self.decoupled:
            g = g + self.weight_decay * p
        m = self.b1 * self.m[i].read() + (1 - self.b1) * g
        v = self.b2 * self.v[i].read() + (1 - self.b2) * g * g
        self.m[i].assign(m)
        self.v[i].assign(v)
        t = rnp.cast(step, p.dtype)
        m_hat = m / (1 - rnp.power(np.asarray(self.b1, p.dtype), t))
        v_hat = v / (1 - rnp.power(np.asarray(self.b2, p.dtype), t))
        new = p - lr * m_hat / (rnp.sqrt(v_hat) + self.eps)
        if self.weight_decay and self.decoupled:
            new = new - lr * self.weight_decay * p
        return new


class AdamW(Adam):
    """Adam with decoupled weight decay (Loshchilov & Hutter)."""

    def __init__(self, params, lr=1e-3, b1=0.9, b2=0.999, eps=1e-8, weight_decay=1e-2):
        super().__init__(params, lr, b1, b2, eps, weight_decay, decoupled_weight_decay=True)


class RMSProp(Optimizer):
    """RMSProp (Hinton), optionally with momentum."""

    def __init__(self, params, lr=1e-3, decay=0.9, eps=1e-8, momentum=0.0):
        super().__init__(params, lr)
        self.decay, self.eps, self.momentum = decay, eps, momentum
        self.ms = self.slot("ms")
        self.mom = self.slot("mom") if momentum else []

    def update(self, i, p, g, lr, step):
        ms = self.decay * self.ms[i].read() + (1 - self.decay) * g * g
        self.ms[i].assign(ms)
        delta = lr * g / (rnp.sqrt(ms) + self.eps)
        if self.momentum:
            delta = self.momentum * self.mom[i].read() + delta
            self.mom[i].assign(delta)
        return p - delta


class CrossReplicaOptimizer(TraceKeyed):
    """Wraps an optimiser so ``apply`` first averages the gradients over all replicas.

    The one-line change that turns a single-replica script data-parallel (as TF-Replicator's
    ``wrap_optimizer``).
    """

    def __init__(self, optimizer: Optimizer, max_grad_norm: float | None = None):
        self.optimizer = optimizer
        self.max_grad_norm = max_grad_norm

    def apply(self, grads) -> None:
        self.traced_by()
        grads = all_reduce(grads, "mean")
        if self.max_grad_norm is not None:
            grads = clip_by_global_norm(grads, self.max_grad_norm)
        self.optimizer.apply(grads)

    def __getattr__(self, name):
        return getattr(self.optimizer, name)


def wrap_optimizer(optimizer: Optimizer, max_grad_norm: float | None = None):
    """Average gradients across replicas (then clip them to ``max_grad_norm``, a norm global
    over all replicas) before every update."""
    return CrossReplicaOptimizer(optimizer, max_grad_norm)


def global_norm(grads):
    """The L2 norm of all leaves together."""
    leaves = [rnp.as_array(g) for g in tree.flatten(grads)[0]]
    return rnp.sqrt(sum(rnp.sum(g * g) for g in leaves))


def clip_by_global_norm(grads, max_norm: float, cross_replica: bool = False):
    """Scale ``grads`` so their global norm is at most ``max_norm``.

    After ``all_reduce`` (or inside ``wrap_optimizer(..., max_grad_norm=...)``) the gradients are
    the same on every replica, so their norm is global over all replicas. With
    ``cross_replica=True`` and per-replica gradients the norm is taken over the sum of every
    replica's squared norms.
    """
    norm = global_norm(grads)
    if cross_replica:
        norm = rnp.sqrt(all_reduce(norm * norm, "sum"))
    scale = rnp.minimum(1.0, max_norm / (norm + 1e-12))
    return tree.tree_map(lambda g: g * rnp.cast(scale, rnp.as_array(g).dtype), grads)


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
