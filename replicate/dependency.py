"""Python-level state that a traced step reads, kept in the compiled step's cache key.

A traced step bakes in whatever Python values it read while it was traced: a module's
train/eval flag, a dropout rate, an optimiser's learning rate. ``TraceKeyed`` objects (every
``rp.nn.Module``, every optimiser) note when a trace reads them; the compiled step keeps a
*guard* per object — the object's version, which changes on every attribute assignment, and its
``trace_key()`` — and is reused only while every guard holds. Otherwise the step is traced and
compiled again (``trace_count`` shows it), so ``model.eval()`` after a compiled training step
takes effect, as it does in eager mode.

>>> import numpy as np, replicate as rp
>>> net = rp.nn.Dropout(0.5)
>>> f = rp.function(lambda x: net(x))
>>> x = np.ones(4, np.float32)
>>> _ = f(x); _ = f(x); f.trace_count
1
>>> _ = net.eval(); f(x).tolist(), f.trace_count
([1.0, 1.0, 1.0, 1.0], 2)
"""

from __future__ import annotations

import itertools

from .graph.core import current_trace

_versions = itertools.count(1)


class TraceKeyed:
    """An object whose plain attributes a traced step may read: assigning any attribute after
    a step was compiled makes that step trace again.

    Subclasses call ``self.traced_by()`` where a trace reads them (``Module.__call__`` does;
    reading ``module.training`` does) and may override ``trace_key()`` to add Python-level state
    kept elsewhere (a global setting the layer reads while traced)."""

    _trace_version = 0

    def __setattr__(self, name, value):
        object.__setattr__(self, name, value)
        object.__setattr__(self, "_trace_version", next(_versions))

    def trace_key(self):
        """Extra state a trace of this object depends on (hashable; compared with ``==``)."""
        return ()

    def traced_by(self) -> None:
        """Note that the active trace (if any) reads this object's state."""
        trace = current_trace()
        if trace is not None:
            trace.depends_on(self)


def _custom_key(obj) -> bool:
    return type(obj).trace_key is not TraceKeyed.trace_key


_PLAIN = (bool, int, float, complex, str, bytes, type(None))


def _same(a, b) -> bool:
    """The same attribute value: the same object, or equal plain values (numbers, strings and
    tuples of them) — so ``train()``, ``eval()``, ``train()`` comes back to the first step."""
    if a is b:
        return True
    if type(a) is not type(b):
        return False
    if isinstance(a, _PLAIN):
        return a == b
    if isinstance(a, tuple):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    return False


def _snapshot(obj) -> dict:
    return {k: v for k, v in vars(obj).items() if k != "_trace_version"}


class _Guard:
    __slots__ = ("obj", "version", "state", "key", "keyed")

    def __init__(self, obj):
        self.obj, self.version, self.state = obj, obj._trace_version, _snapshot(obj)
        # (a key may itself be None — autocast off: "no key" is ``keyed``, not the key's value)
        self.keyed = _custom_key(obj)
        self.key = obj.trace_key() if self.keyed else None

    def holds(self) -> bool:
        obj = self.obj
        if obj._trace_version != self.version:  # assigned since: compare the values
            now = _snapshot(obj)
            if now.keys() != self.state.keys() or not all(
                    _same(v, now[k]) for k, v in self.state.items()):
                return False
            self.version = obj._trace_version  # the same values again (train, eval, train)
        return not self.keyed or obj.trace_key() == self.key


def guards(objects) -> tuple:
    """The guards of a finished trace: what each object read by the trace holds now."""
    return tuple(_Guard(obj) for obj in objects)


def guards_hold(guards) -> bool:
    """Whether every guarded object holds what it held when the step was traced."""
    return all(g.holds() for g in guards)


__all__ = ["TraceKeyed", "guards", "guards_hold"]
