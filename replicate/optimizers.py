"""The optimisers: their state is ``Variable``s, so it is traced in graph mode and checkpointed;
``update`` is written once and runs traced (graph mode) or on NumPy arrays (eager mode).
``replicate.optim`` is the public module (these, the cross-replica wrapper, the schedules)."""

from __future__ import annotations

import weakref

import numpy as np

from . import habits, tree
from . import numpy as rnp
from .dependency import TraceKeyed
from .dtypes import compute_dtype, is_low_precision
from .errors import ReplicateError
from .graph.core import Array, current_trace
from .optim_adaptive import AdadeltaRule, AdagradRule
from .optim_flat import FlatSlot, Group, Slots, groups
from .state import Variable

LIVE: weakref.WeakSet = weakref.WeakSet()  # every optimiser (and wrapper) alive in this process


def _params(params) -> tuple[list, object]:
    if hasattr(params, "parameters") and callable(params.parameters):
        params = params.parameters()
    leaves, treedef = tree.flatten(params)
    for p in leaves:
        if not isinstance(p, Variable):
            raise ReplicateError(f"optimisers update Variables; got {type(p).__name__}")
    return leaves, treedef


def _kind(treedef):
    """A nest's structure with lists, tuples and named tuples alike (a sequence)."""
    if treedef == tree.LEAF or treedef[0] == "none":
        return treedef
    if treedef[0] == "dict":
        return ("dict", treedef[1], tuple(_kind(t) for t in treedef[2]))
    return ("sequence", len(treedef[2]), tuple(_kind(t) for t in treedef[2]))


def check_structure(grads, params, n_grads, n_params, who) -> None:
    """Gradients (``grads``, a treedef) must be nested as the parameters (``params``): a list
    for a dict would be matched by position with the dict's sorted keys ("10.weight" before
    "2.weight"), each gradient on another parameter of its shape. Lists and tuples are alike."""
    if n_grads != n_params:
        raise ReplicateError(f"{who}: {n_grads} gradients for {n_params} parameters")
    if grads != params and _kind(grads) != _kind(params):  # (equal: the common case, at once)
        raise ReplicateError(
            f"{who}: the gradients are nested differently from the parameters (a dict's keys "
            "are matched by name, a sequence by position) — pass rp.grad(loss, params) for the "
            "params the optimiser was given, e.g. rp.grad(loss, model.parameters()) for "
            "rp.optim.SGD(model.parameters())")


class _Traced:
    """What ``update`` computes with in graph mode (and eager mode for other optimisers)."""
    read = staticmethod(lambda var: var.read())
    value = staticmethod(lambda x: x)
    sqrt, power, where = staticmethod(rnp.sqrt), staticmethod(rnp.power), staticmethod(rnp.where)
    cast = staticmethod(rnp.cast)
    minus = staticmethod(lambda a, b: a - b)


def _minus_into(a, b):
    """``a - b`` written into ``b`` where it fits (same shape, ``b``'s dtype the result's):
    ``b`` is a temporary the update made, so eager mode makes one array fewer."""
    if type(b) is np.ndarray and b.flags.writeable and np.shape(a) == b.shape and (
            a.dtype == b.dtype if type(a) is np.ndarray else np.result_type(a, b) == b.dtype):
        return np.subtract(a, b, out=b)
    return a - b


class _Eager:
    """... and in eager mode: the values as NumPy arrays (a Variable read through ``read``, so
    every hook a read has still runs; a group's slot, ``FlatSlot``, as one flat array)."""
    read = staticmethod(lambda var: var.values() if isinstance(var, FlatSlot) else
                        var.read().value)
    value = staticmethod(lambda x: x.value if isinstance(x, Array) else np.asarray(x))
    sqrt, power, where = staticmethod(np.sqrt), staticmethod(np.power), staticmethod(np.where)
    cast = staticmethod(lambda x, dtype: x if type(x) is np.ndarray and x.dtype == dtype else
                        _Eager.value(x).astype(dtype, copy=False))
    minus = staticmethod(_minus_into)


_TRACED, _EAGER = _Traced, _Eager


def elementwise(update):
    """Mark a built-in ``update`` as elementwise: eager mode may run it on a group of
    parameters laid end to end (``optim_flat.py``; a subclass that overrides ``update`` runs
    per parameter)."""
    update.elementwise = True
    return update


class Optimizer(TraceKeyed):
    """Base: holds the parameters, a step counter and per-parameter slots.

    Its hyper-parameters (``lr``, momentum, ...) are read when a step is traced: assigning one
    (``opt.lr = 1e-4``) after the step was compiled makes it trace again. A learning rate that
    changes every step belongs in a schedule (``lr=fn(step)``), which is traced once.

    Low-precision parameters (float16, bfloat16): the update is computed in float32, the slots
    (momentum, Adam's moments) are float32, and with ``master_weights`` (the default for such
    parameters) the optimiser keeps a float32 copy of each one that the updates accumulate into
    — the parameter is that copy rounded, so small updates are not lost to rounding. A
    parameter assigned from outside (a checkpoint, pretrained weights) is noticed at the next
    update: its master copy restarts from it."""

    # ``update`` is written with ``self.xp`` (``read``, ``sqrt``, ``power``, ``cast``, ``where``,
    # ``minus(a, b)``: ``a - b`` for a temporary ``b``) and arithmetic, so eager mode may run
    # it on NumPy arrays; a subclass whose ``update`` uses ``replicate.numpy`` directly leaves
    # this False and runs op by op in eager mode
    eager_numpy = False
    __getattr__ = habits.answers(habits.OPTIMIZER)  # (opt.zero_grad(), ...)

    def __init__(self, params, lr, master_weights: bool | None = None):
        LIVE.add(self)  # (rp.memory_report)
        self.params, self.treedef = _params(params)
        self.lr = lr
        self.step = Variable(np.zeros((), np.int64), name="opt.step")
        low = [is_low_precision(p.dtype) for p in self.params]
        self.master_weights = any(low) if master_weights is None else bool(master_weights)
        self.master = [Variable(p.value.astype(np.float32), name=f"{p.name}.master")
                       if lo and self.master_weights else None for p, lo in zip(self.params, low)]

    def slot(self, name: str, fill=0.0) -> list[Variable]:
        return Slots(Variable(np.full(p.shape, fill, compute_dtype(p.dtype)),
                              name=f"{p.name}.{name}") for p in self.params)

    def lr_at(self, step):
        """The learning rate at (traced) ``step``: a number or a schedule ``fn(step)``."""
        return self.lr(step) if callable(self.lr) else self.lr

    @property
    def learning_rate(self) -> float:
        """The learning rate the next update uses (a schedule evaluated at the next step)."""
        if not callable(self.lr):
            return float(self.lr)
        return float(np.asarray(rnp.as_array(self.lr(rnp.asarray(self.step.value + 1))).numpy()))

    def apply(self, grads) -> None:
        """Update every parameter from its gradient (a nest shaped like the parameters)."""
        leaves, treedef = tree.flatten(grads)
        check_structure(treedef, self.treedef, len(leaves), len(self.params),
                        f"{type(self).__name__}.apply")
        self.traced_by()
        # eager mode: the built-in updates run on the values as NumPy arrays — no tape (an
        # update is never differentiated) and no per-op dispatch, the same ops in the same
        # order as the compiled step, so the same values
        xp = _EAGER if self.eager_numpy and current_trace() is None else _TRACED
        if self.__dict__.get("xp") is not xp:  # (setting an attribute counts as a change)
            self.xp = xp
        step = xp.read(self.step) + 1
        if xp is _EAGER:
            step = np.asarray(step)  # (a 0-d array, as the counter holds: assigned as it is)
        self.step.assign(step)
        lr = self.lr_at(step)
        if xp is _EAGER and not isinstance(lr, (int, float)):
            lr = xp.value(rnp.as_array(lr))
        grads = []
        for p, g in zip(self.params, leaves):
            g = g.value if xp is _EAGER and type(g) is Array and g.value is not None else \
                xp.value(rnp.as_array(g))
            if g.shape != p.shape:
                raise ReplicateError(f"gradient for {p.name} has shape {g.shape}, parameter "
                                     f"{p.shape}")
            grads.append(g)
        if xp is _EAGER and getattr(type(self).update, "elementwise", False):
            for group in self._groups():  # no loop over the parameters (optim_flat.py)
                if len(group.index) == 1:  # (a group of one: the parameter as it is)
                    self._update(group.index[0], [grads[group.index[0]]], lr, step)
                else:
                    self._update(group, [grads[i] for i in group.index], lr, step)
            return
        for i, g in enumerate(grads):
            self._update(i, [g], lr, step)

    def _update(self, i, grads, lr, step) -> None:
        """Update parameter ``i`` (or a ``Group`` of them, laid end to end) from its gradient."""
        xp = self.xp
        group = i if isinstance(i, Group) else None
        params = [self.params[k] for k in group.index] if group else [self.params[i]]
        dtype = params[0].dtype
        work = compute_dtype(dtype)
        if group:
            value = group.flat([xp.read(p) for p in params], dtype, key="params")
            g = group.flat([xp.cast(g, work) for g in grads], work)
        else:
            value, g = xp.read(params[0]), grads[0]
        master = self.master[group.index[0] if group else i]
        if master is not None:  # the float32 copy, unless p was assigned from outside
            master = FlatSlot([self.master[k] for k in group.index], group) if group else master
            m = xp.read(master)
            value = xp.where(xp.cast(m, dtype) == value, m, xp.cast(value, work))
        new = self.update(i, xp.cast(value, work), xp.cast(g, work), lr, step)
        if master is not None:
            master.assign(new)
        new = xp.cast(new, dtype)
        for p, piece in zip(params, group.split(new, key="params") if group else [new]):
            p.assign(piece)

    def _groups(self) -> list:
        """Eager mode's groups of parameters (``optim_flat.groups``), made once."""
        key = [(p.dtype, p.shape, m is None) for p, m in zip(self.params, self.master)]
        cached = getattr(self, "_group_cache", None)
        if cached is None or cached[0] != key:
            cached = self._group_cache = (key, groups(self.params, self.master))
        return cached[1]

    def update(self, i, p, g, lr, step):
        raise NotImplementedError

    def variables(self) -> dict:
        """The optimiser's own state by name (for checkpoints): step and every slot, and the
        state of a schedule that keeps some (``ReduceLROnPlateau``'s rate and counters)."""
        out = {"step": self.step}
        keeps = getattr(self.lr, "variables", None)
        if callable(keeps):
            out.update((f"lr/{name}", var) for name, var in keeps().items())
        for key, value in vars(self).items():
            if isinstance(value, list) and any(isinstance(v, Variable) for v in value) \
                    and value is not self.params:
                for i, var in enumerate(value):
                    if var is not None:
                        out[f"{key}/{i}"] = var
        return out


class SGD(Optimizer):
    """Stochastic gradient descent with optional momentum, Nesterov and weight decay
    (PyTorch's ``SGD`` and its default rate, 1e-3)."""

    eager_numpy = True

    def __init__(self, params, lr=1e-3, momentum=0.0, nesterov=False, weight_decay=0.0,
                 master_weights=None):
        super().__init__(params, lr, master_weights)
        self.momentum, self.nesterov, self.weight_decay = momentum, nesterov, weight_decay
        self.velocity = self.slot("velocity") if momentum else []

    @elementwise
    def update(self, i, p, g, lr, step):
        if self.weight_decay:
            g = g + self.weight_decay * p
        if self.momentum:
            v = self.momentum * self.xp.read(self.velocity[i]) + g
            self.velocity[i].assign(v)
            g = g + self.momentum * v if self.nesterov else v
        return self.xp.minus(p, lr * g)


class Adam(Optimizer):
    """Adam (Kingma & Ba); with ``decoupled_weight_decay`` it is AdamW."""

    eager_numpy = True

    def __init__(self, params, lr=1e-3, b1=0.9, b2=0.999, eps=1e-8, weight_decay=0.0,
                 decoupled_weight_decay=False, master_weights=None):
        super().__init__(params, lr, master_weights)
        self.b1, self.b2, self.eps = b1, b2, eps
        self.weight_decay, self.decoupled = weight_decay, decoupled_weight_decay
        self.m, self.v = self.slot("m"), self.slot("v")

    @elementwise
    def update(self, i, p, g, lr, step):
        if self.weight_decay and not self.decoupled:
            g = g + self.weight_decay * p
        xp = self.xp
        m = self.b1 * xp.read(self.m[i]) + (1 - self.b1) * g
        v = self.b2 * xp.read(self.v[i]) + (1 - self.b2) * (g * g)
        self.m[i].assign(m)
        self.v[i].assign(v)
        step_size, root2, keep = self._step_scalars(step, lr, p.dtype)
        if keep is not None:  # decoupled weight decay: p (1 - lr wd)
            p = p * keep
        # PyTorch's order: lr / (1 - b1^t) * m / (sqrt(v) / sqrt(1 - b2^t) + eps)
        return xp.minus(p, m / (xp.sqrt(v) / root2 + self.eps) * step_size)

    def apply(self, grads) -> None:
        try:
            super().apply(grads)
        finally:
            self._scalars = None  # (holds this trace's values)

    def _step_scalars(self, step, lr, dtype):
        """The step's scalars (the bias corrections, the decay factor), made once per update
        rather than once per parameter (eager mode runs every op; graph mode would merge them)."""
        key = (step, lr, dtype)
        cached = getattr(self, "_scalars", None)
        if cached is not None and all(a is b for a, b in zip(cached[0], key)):
            return cached[1]
        xp = self.xp
        t = xp.cast(step, dtype)
        step_size = lr / (1 - xp.power(np.asarray(self.b1, dtype), t))
        root2 = xp.sqrt(1 - xp.power(np.asarray(self.b2, dtype), t))
        keep = 1 - lr * self.weight_decay if self.weight_decay and self.decoupled else None
        self._scalars = (key, (step_size, root2, keep))
        return self._scalars[1]


class AdamW(Adam):
    """Adam with decoupled weight decay (Loshchilov & Hutter)."""

    def __init__(self, params, lr=1e-3, b1=0.9, b2=0.999, eps=1e-8, weight_decay=1e-2,
                 master_weights=None):
        super().__init__(params, lr, b1, b2, eps, weight_decay, decoupled_weight_decay=True,
                         master_weights=master_weights)


class RMSProp(Optimizer):
    """RMSProp (Tieleman & Hinton), optionally with momentum: PyTorch's ``RMSprop`` (``decay`` is
    its ``alpha``; the same defaults), the rate applied to the momentum buffer, not inside it."""

    eager_numpy = True

    def __init__(self, params, lr=1e-2, decay=0.99, eps=1e-8, momentum=0.0, master_weights=None):
        super().__init__(params, lr, master_weights)
        self.decay, self.eps, self.momentum = decay, eps, momentum
        self.ms = self.slot("ms")
        self.mom = self.slot("mom") if momentum else []

    @elementwise
    def update(self, i, p, g, lr, step):
        xp = self.xp
        ms = self.decay * xp.read(self.ms[i]) + (1 - self.decay) * g * g
        self.ms[i].assign(ms)
        delta = g / (xp.sqrt(ms) + self.eps)
        if self.momentum:
            delta = self.momentum * xp.read(self.mom[i]) + delta
            self.mom[i].assign(delta)
        return xp.minus(p, lr * delta)


class Adagrad(AdagradRule, Optimizer):
    """Adagrad, PyTorch's algorithm and defaults (``replicate/optim_adaptive.py``)."""

    update = elementwise(AdagradRule.update)


class Adadelta(AdadeltaRule, Optimizer):
    """Adadelta, PyTorch's algorithm and defaults (``replicate/optim_adaptive.py``)."""

    update = elementwise(AdadeltaRule.update)
