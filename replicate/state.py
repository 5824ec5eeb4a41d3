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

import numpy as np

from .errors import ReplicateError
from .graph.core import Array, concrete, current_trace
from .numpy import _install_operators, as_array, cast

_counter = itertools.count()

# Called with each variable on an eager read while a Replicator runs (it syncs values from rank 0).
eager_read_hook = None


class Variable:
    """A named, mutable array (a model parameter, optimiser slot or random-generator key)."""

    def __init__(self, value, name: str | None = None, dtype=None):
        self.value = np.array(value.numpy() if isinstance(value, (Array, Variable)) else value,
                              dtype=dtype)
        self.name = name or f"var{next(_counter)}"
        self._eager: Array | None = None

    shape = property(lambda self: self.value.shape)
    dtype = property(lambda self: self.value.dtype)
    ndim = property(lambda self: self.value.ndim)
    size = property(lambda self: self.value.size)

    def read(self) -> Array:
        """The current value as an Array (a graph input when traced)."""
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
        self.value = new.value
        self._eager = None  # the next read starts a fresh tape leaf

    def load(self, value) -> None:
        """Replace the value from outside any step (a compiled step writing its update back, a
        checkpoint restored): the next eager read starts a fresh tape leaf."""
        self.value = value
        self._eager = None

    def numpy(self) -> np.ndarray:
        return self.value

    def __array__(self, dtype=None, copy=None):
        return self.value if dtype is None else self.value.astype(dtype)

    def __repr__(self) -> str:
        return f"Variable({self.name!r}, shape={self.shape}, dtype={self.dtype})"


_install_operators(Variable)  # w + 1, w @ x, ... on a Variable read it
