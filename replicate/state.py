"""``Variable``: state that step code reads and updates, in eager and graph mode alike.

In eager mode a read gives a concrete array and ``assign`` replaces the value at once. In graph
mode the first read of a variable becomes a graph input and the last ``assign`` a graph output;
the compiled step writes it back after each call.

>>> import replicate as rp
>>> w = rp.Variable([1.0, 2.0], name="w")
>>> w.assign(w * 2)
>>> w.numpy().tolist()
[2.0, 4.0]
"""

from __future__ import annotations

import itertools
import weakref

import numpy as np

from .errors import NumpyConversionError, ReplicateError, source_line, user_frame
from .graph.core import (
    Array,
    concrete,
    current_trace,
    numpy_array_ufunc,
    numpy_function_error,
)
from .numpy import _install_operators, as_array, cast

_counter = itertools.count()
_serial = itertools.count()
_live: weakref.WeakValueDictionary = weakref.WeakValueDictionary()  # creation order -> Variable

# Called with each variable on an eager read while a Replicator runs (it syncs values from rank 0).
eager_read_hook = None
# Called with each variable read (traced or eager), innermost last: rp.custom_vjp finds the
# Variables its fwd reads without taking them as arguments.
read_observers: list = []
# Called with each variable before an eager write while a Replicator runs (with check_finite it
# keeps the old value, so a step whose update is not finite can be taken back).
eager_write_hook = None


class Variable:
    """A named, mutable array (a model parameter, optimiser slot or random-generator key).

    Under a ``Replicator`` a variable is one value on every replica and rank: rank 0's value is
    broadcast on first use, and a step that would update it from per-replica data without a
    collective is refused (``rp.DivergenceError``); the ranks' copies are compared at
    checkpoints and at the end of ``run``. ``local=True`` makes it each process's own instead
    (not broadcast, not compared): per-process statistics, an actor's own state. A checkpoint
    holds rank 0's copy of a local variable, and ``restore`` gives every rank that copy."""

    def __init__(self, value, name: str | None = None, dtype=None, *, local: bool = False):
        self.value = np.array(value.numpy() if isinstance(value, (Array, Variable)) else value,
                              dtype=dtype)
        self.name = name or f"var{next(_counter)}"
        self.local = bool(local)
        self._eager: Array | None = None
        self._created = user_frame()  # (file, line) of the user's code that made it
        _live[next(_serial)] = self

    @property
    def created_at(self) -> str:
        """'file:line: code' of the user's code that created this variable."""
        return source_line(self._created)

    shape = property(lambda self: self.value.shape)
    dtype = property(lambda self: self.value.dtype)
    ndim = property(lambda self: self.value.ndim)
    size = property(lambda self: self.value.size)

    def read(self) -> Array:
        """The current value as an Array (a graph input when traced)."""
        if read_observers:
            for observe in read_observers:
                observe(self)
        trace = current_trace()
        if trace is not None:
            return trace.read_variable(self)
        if eager_read_hook is not None:
            eager_read_hook(self)
        if self._eager is None:
            self._eager = concrete(self.value)
        return self._eager

    def assign(self, new) -> None:
        """Replace the value (shape must match; the dtype is kept)."""
        new = as_array(new)
        if new.shape != self.value.shape:
            raise ReplicateError(
                f"assign to variable {self.name!r}: shape {new.shape} != {self.value.shape}")
        if new.dtype != self.value.dtype:
            new = cast(new, self.value.dtype)
        trace = current_trace()
        if trace is not None:
            trace.write_variable(self, new)
            return
        if eager_write_hook is not None:
            eager_write_hook(self)
        self.value = new.value
        self._eager = None  # the next read starts a fresh tape leaf

    def load(self, value) -> None:
        """Replace the value from outside any step (a compiled step writing its update back, a
        checkpoint restored): the next eager read starts a fresh tape leaf."""
        self.value = value
        self._eager = None

    def numpy(self) -> np.ndarray:
        """The current value (outside a traced step: inside one it would be a constant)."""
        if current_trace() is not None:
            self._refuse_in_trace("w.numpy()")
        return self.value

    # -- Python conversions read the value (graph mode: the tracer error at the user's line); an
    # object's default truthiness would make ``if flag:`` always true --------------------------
    def __bool__(self):
        return bool(self.read())

    def __int__(self):
        return int(self.read())

    def __float__(self):
        return float(self.read())

    def __index__(self):
        return self.read().__index__()

    # -- NumPy: np.asarray(w) outside a traced step; NumPy functions on a Variable refuse -------
    def __array__(self, dtype=None, copy=None):
        if current_trace() is not None:
            self._refuse_in_trace("conversion to a NumPy array")
        return self.value if dtype is None else self.value.astype(dtype)

    def _refuse_in_trace(self, what):
        loc = source_line(user_frame(skip_numpy=True))
        raise NumpyConversionError(
            f"{what} of Variable {self.name!r} inside a traced step at {loc}\n"
            "  Its current value would be baked into the compiled step as a constant: every "
            "later call would see this value, not the Variable's.\n"
            "  Read it through rnp ops (import replicate.numpy as rnp; rnp.tanh(w), w * x, "
            "rnp.asarray(w)), or convert it outside the step (np.asarray(w), w.numpy()).")

    def __array_ufunc__(self, ufunc, method, *inputs, **kwargs):
        return numpy_array_ufunc(self, ufunc, method, inputs, kwargs)

    def __array_function__(self, func, types, args, kwargs):
        raise numpy_function_error(func, self)

    def __repr__(self) -> str:
        return f"Variable({self.name!r}, shape={self.shape}, dtype={self.dtype})"


_install_operators(Variable)  # w + 1, w @ x, ... on a Variable read it


def live_variables() -> list:
    """Every Variable alive in this process, in the order they were created."""
    return [var for _, var in sorted(_live.items())]
