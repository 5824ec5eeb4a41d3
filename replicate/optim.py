"""Optimisers whose state is ``Variable``s, so it is traced in graph mode and checkpointed.

>>> import numpy as np, replicate as rp
>>> w = rp.Variable(np.array([1.0, -2.0]), name="w")
>>> opt = rp.optim.SGD([w], lr=0.5)
>>> opt.apply([np.array([1.0, 1.0])])
>>> w.numpy().tolist()
[0.5, -2.5]

The optimisers themselves are in ``optimizers.py``; here the cross-replica wrapper
(``wrap_optimizer``) and gradient clipping.
"""

from __future__ import annotations

import weakref

import numpy as np

from . import numpy as rnp
from . import tree
from .collectives import all_reduce, gradient_mean
from .control import cond
from .dependency import TraceKeyed
from .dtypes import compute_dtype
from .errors import ReplicateError
from .graph.core import current_trace
from .optimizers import (  # (rp.optim.*: __all__)
    LIVE,
    SGD,
    Adadelta,
    Adagrad,
    Adam,
    AdamW,
    Optimizer,
    RMSProp,
)
from .optimizers import check_structure as _check_structure
from .schedules import (  # (rp.optim.*: __all__)
    CosineAnnealingLR,
    ExponentialLR,
    LinearLR,
    MultiStepLR,
    ReduceLROnPlateau,
    StepLR,
    step_decay,
    warmup_cosine,
)
from .sharding import shard_state
from .state import Variable

# wrap_optimizer(accumulate=n)'s micro-step counters, by id (run's history: one entry per update)
MICRO_STEPS: weakref.WeakValueDictionary = weakref.WeakValueDictionary()

class CrossReplicaOptimizer(TraceKeyed):
    """Wraps an optimiser so ``apply`` first averages the gradients over all replicas (the
    one-line change that turns a single-replica script data-parallel, as TF-Replicator's
    ``wrap_optimizer``); made by :func:`wrap_optimizer`, which documents the options."""

    def __init__(self, optimizer: Optimizer, max_grad_norm: float | None = None,
                 accumulate: int = 1, loss_scale=None, growth_interval: int = 2000,
                 shard: bool = False):
        if not isinstance(optimizer, Optimizer):
            raise ReplicateError(f"wrap_optimizer wraps an rp.optim optimiser, got "
                                 f"{type(optimizer).__name__}")
        if isinstance(accumulate, bool) or not isinstance(accumulate, (int, np.integer)) \
                or accumulate < 1:
            raise ReplicateError(f"accumulate must be an int >= 1, got {accumulate!r}")
        dynamic = isinstance(loss_scale, str)
        if dynamic and loss_scale != "dynamic" or not dynamic and loss_scale is not None and (
                isinstance(loss_scale, bool) or not isinstance(loss_scale, (int, float))
                or not loss_scale > 0):
            raise ReplicateError(f"loss_scale must be 'dynamic', a number > 0 or None, got "
                                 f"{loss_scale!r}")
        LIVE.add(self)
        self.optimizer = optimizer
        self.max_grad_norm = max_grad_norm
        self.accumulate = int(accumulate)
        self.dynamic = dynamic
        self.growth_interval = int(growth_interval)
        self.fixed_scale = None if dynamic or loss_scale is None else float(loss_scale)
        self.buffers, self.micro = [], None
        if self.accumulate > 1:  # each replica's running sum of its gradients
            self.buffers = [Variable(np.zeros(p.shape, compute_dtype(p.dtype)),
                                     name=f"{p.name}.accumulated", per_replica=True)
                            for p in optimizer.params]
            self.micro = Variable(np.zeros((), np.int64), name="opt.micro_step")
            MICRO_STEPS[id(self.micro)] = self.micro
        self.scale_var = self.good_steps = None
        self._scaled = [0]  # opt.scale calls not yet matched by an apply (a list: one object)
        if dynamic:
            self.scale_var = Variable(np.float32(2.0 ** 15), name="opt.loss_scale")
            self.good_steps = Variable(np.zeros((), np.int64), name="opt.good_steps")
        self.shard = bool(shard)
        if self.shard:
            shard_state(optimizer)

    def sharded(self) -> list:
        """The Variables of which this process holds only its slice (``shard=True``)."""
        return [v for v in self.variables().values() if v.shard is not None]

    # -- what the user calls ------------------------------------------------------------------
    @property
    def loss_scale(self) -> float:
        """The current loss scale (1.0 without loss scaling)."""
        if self.scale_var is not None:
            return float(self.scale_var.numpy())
        return self.fixed_scale or 1.0

    def scale(self, loss):
        """``loss`` times the loss scale: differentiate this, pass the gradients to ``apply``
        (which divides them by the scale again). Without loss scaling: ``loss``."""
        loss = rnp.as_array(loss)
        self._scaled[0] += 1
        if self.scale_var is not None:
            return loss * rnp.cast(self.scale_var.read(), loss.dtype)
        return loss if self.fixed_scale is None else loss * self.fixed_scale

    def trace_key(self):
        # with accumulation a step either only accumulates or also updates: two compiled steps,
        # chosen by the micro-step counter (the same on every replica and rank)
        return () if self.micro is None else (self._updates_now(),)

    def _updates_now(self) -> bool:
        return (int(self.micro.value) + 1) % self.accumulate == 0  # (the host value)

    def apply(self, grads) -> None:
        self.traced_by()
        if self.dynamic or self.fixed_scale is not None:
            if not self._scaled[0]:  # the gradients would be divided by a scale never applied
                raise ReplicateError(
                    "wrap_optimizer(..., loss_scale=...).apply: the loss was not scaled — "
                    "differentiate opt.scale(loss), not loss (apply divides the gradients by "
                    "the loss scale)")
            self._scaled[0] -= 1
        leaves, treedef = tree.flatten(grads)
        _check_structure(treedef, self.optimizer.treedef, len(leaves),
                        len(self.optimizer.params), "apply")
        leaves = [rnp.cast(rnp.as_array(g), compute_dtype(p.dtype))
                  for g, p in zip(leaves, self.optimizer.params)]
        if self.micro is not None:
            leaves = [b.read() + g for b, g in zip(self.buffers, leaves)]
            if not self._updates_now():  # this replica's sums only: no communication
                for b, g in zip(self.buffers, leaves):
                    b.assign(g)
                self.micro.assign(self.micro.read() + 1)
                return
            for b in self.buffers:
                b.assign(rnp.zeros(b.shape, b.dtype))
            self.micro.assign(rnp.zeros((), np.int64))
            leaves = [g * (1.0 / self.accumulate) for g in leaves]
        if self.shard and current_trace() is None:
            raise ReplicateError(
                "wrap_optimizer(..., shard=True).apply in eager mode: the sharded update is a "
                "rewrite of a compiled step (reduce-scatter, update this process's slice, "
                "all-gather). Run the step in graph mode — Replicator(mode='graph') (the "
                "default) or rp.function — or use shard=False in eager mode")
        leaves = gradient_mean(leaves, shard=self.shard)
        scale = self._scale_value()
        if scale is not None:
            leaves = [g / rnp.cast(scale, g.dtype) for g in leaves]
        grads = tree.unflatten(treedef, leaves)
        if self.max_grad_norm is not None:
            grads = clip_by_global_norm(grads, self.max_grad_norm)
        if not self.dynamic:
            self.optimizer.apply(grads)
            return
        # the reduced gradients are the same on every replica and rank: so is this verdict
        finite = rnp.min(rnp.stack([rnp.min(rnp.isfinite(g)) for g in leaves]))  # every element
        cond(finite, lambda: self.optimizer.apply(grads), lambda: None)
        good = rnp.where(finite, self.good_steps.read() + 1, 0)
        grow = good >= self.growth_interval
        s = self.scale_var.read()
        self.scale_var.assign(rnp.where(finite, rnp.where(grow, s * 2, s),
                                        rnp.maximum(s * 0.5, 1.0)))
        self.good_steps.assign(rnp.where(grow, 0, good))

    def _scale_value(self):
        if self.scale_var is not None:
            return self.scale_var.read()
        return None if self.fixed_scale is None else rnp.asarray(self.fixed_scale, np.float32)

    def variables(self) -> dict:
        """The inner optimiser's state plus the wrapper's (loss scale, accumulation buffers)."""
        out = self.optimizer.variables()
        for name in ("scale_var", "good_steps", "micro"):
            if getattr(self, name) is not None:
                out[name] = getattr(self, name)
        out.update((f"accumulated/{i}", b) for i, b in enumerate(self.buffers))
        return out

    def __getattr__(self, name):
        return getattr(self.optimizer, name)

    def __setattr__(self, name, value):
        inner = self.__dict__.get("optimizer")
        if inner is not None and name not in self.__dict__ and not hasattr(type(self), name) \
                and hasattr(inner, name):  # opt.lr = 1e-4: the inner optimiser's, which a
            setattr(inner, name, value)    # step reads (and retraces for)
            return
        super().__setattr__(name, value)


def wrap_optimizer(optimizer: Optimizer, max_grad_norm: float | None = None, *,
                   accumulate: int = 1, loss_scale=None, growth_interval: int = 2000,
                   shard: bool = False):
    """Average gradients across replicas before every update (then clip them to
    ``max_grad_norm``, a norm global over all replicas).

    ``accumulate=n``: gradient accumulation. Each replica adds its gradients into its own
    buffer for n steps; on the n-th only, the buffers' cross-replica mean (divided by n) goes to
    the optimiser — the other steps communicate nothing. n steps of batch B on R replicas make
    the update of one step with batch n·R·B (for a loss that is a mean over the batch).

    ``loss_scale``: for float16 training. ``opt.scale(loss)`` multiplies the loss, and ``apply``
    divides the gradients back. ``"dynamic"`` starts at 2**15, doubles after
    ``growth_interval`` steps without overflow, and on a step whose reduced gradients are not
    finite halves and skips the update — every replica and rank decides alike, from the
    all-reduced gradients themselves (no extra exchange). ``opt.loss_scale`` reads it; it is in
    ``opt.variables()``, so checkpoints keep it. A number: a fixed scale.

    ``shard=True``: sharded optimiser state (ZeRO-1/2) over the processes. Each process keeps
    only its 1/n slice of the optimiser's slots (and float32 master weights); in the compiled
    step the gradients' all-reduce becomes a reduce-scatter, each process updates its slice,
    and the new parameters are all-gathered (``graph/passes/shard_state.py``). The results
    equal the unsharded step's (bitwise but for the global norm of ``max_grad_norm``, whose
    partial sums add in another order). Checkpoints hold the whole state (gathered on save) and
    restore into any number of processes. Graph mode only; one process: no effect."""
    return CrossReplicaOptimizer(optimizer, max_grad_norm, accumulate, loss_scale,
                                 growth_interval, shard)


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


__all__ = [  # what ``rp.optim.`` offers (the API reference lists these)
    "Optimizer", "SGD", "Adam", "AdamW", "RMSProp", "Adagrad", "Adadelta",
    "StepLR", "MultiStepLR", "ExponentialLR", "CosineAnnealingLR", "LinearLR",
    "ReduceLROnPlateau", "warmup_cosine", "step_decay",
    "CrossReplicaOptimizer", "wrap_optimizer", "global_norm", "clip_by_global_norm",
]
