"""``rp.memory_report()``: the bytes this process holds now, by kind.

>>> import numpy as np, replicate as rp
>>> w = rp.Variable(np.zeros((10, 10), np.float32), name="w")
>>> opt = rp.optim.Adam([w])
>>> r = rp.memory_report(opt)
>>> r["parameters"], r["optimizer_state"]  # w; Adam's two moments and its step counter
(400, 808)
"""

from __future__ import annotations

from . import step as _step
from .errors import ReplicateError
from .optim import LIVE, CrossReplicaOptimizer, Optimizer
from .state import live_variables

KINDS = ("parameters", "gradients", "optimizer_state", "master_weights", "other_variables",
         "activations_planned")


def _nbytes(var) -> int:
    if var.released is not None:  # model parallelism: another process holds it now
        return 0
    return int(var.held.nbytes)


def memory_report(*optimizers) -> dict:
    """This process's bytes by kind, as held now (between steps):

    ``parameters`` (the Variables the optimisers update), ``gradients`` (those held between
    steps: ``wrap_optimizer(accumulate=n)``'s buffers — a step's own gradients live inside it,
    in ``activations_planned``), ``optimizer_state`` (slots such as Adam's moments, step
    counters, the loss scale; with ``shard=True`` this process's slices only),
    ``master_weights`` (float32 copies of low-precision parameters, sliced likewise),
    ``other_variables`` (every other live Variable: statistics, random keys; left out when
    ``optimizers`` are named), ``activations_planned`` (the NumPy backend's planned buffers of
    the last step this process ran, at their peak: ``graph.meta.memory_plan``; None when that
    step's backend plans its own memory, as XLA does) and ``total``.

    ``optimizers``: count only these (``rp.optim`` optimisers or ``wrap_optimizer``'s); none:
    every one alive. A Variable is counted once, under its first kind."""
    for o in optimizers:
        if not isinstance(o, (Optimizer, CrossReplicaOptimizer)):
            raise ReplicateError(f"memory_report counts rp.optim optimisers (or wrap_optimizer's), "
                                 f"got {type(o).__name__}")
    chosen = list(optimizers) or list(LIVE)
    wrappers = [o for o in chosen if isinstance(o, CrossReplicaOptimizer)]
    inner = [o for o in chosen if isinstance(o, Optimizer)] + [w.optimizer for w in wrappers]
    kinds: dict = {}  # id(var) -> (kind, var)

    def put(var, kind):
        if var is not None:
            kinds.setdefault(id(var), (kind, var))

    for opt in inner:
        for p in opt.params:
            put(p, "parameters")
        for m in opt.master:
            put(m, "master_weights")
        for var in opt.variables().values():
            put(var, "optimizer_state")
    for w in wrappers:
        for b in w.buffers:
            put(b, "gradients")
        for var in w.variables().values():
            put(var, "optimizer_state")
    if not optimizers:
        for var in live_variables():
            put(var, "other_variables")
    report = dict.fromkeys(KINDS[:-1], 0)
    for kind, var in kinds.values():
        report[kind] += _nbytes(var)
    last = _step.LAST_RUN[0]() if _step.LAST_RUN[0] is not None else None
    plan = None if last is None else getattr(last.executable.graph.meta, "memory_plan", None)
    report["activations_planned"] = None if plan is None else int(plan.nbytes)
    report["total"] = sum(v for v in report.values() if v is not None)
    return report


__all__ = ["KINDS", "memory_report"]
