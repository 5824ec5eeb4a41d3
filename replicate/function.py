"""``rp.function``: one step function, run define-and-run (graph) or define-by-run (eager).

>>> import numpy as np, replicate as rp, replicate.numpy as rnp
>>> w = rp.Variable(np.ones(3), name="w")
>>> @rp.function                      # graph mode: traced once per input signature
... def step(x):
...     loss = ((x @ w) ** 2).mean()
...     w.assign(w - 0.1 * rp.grad(loss, w))
...     return loss
>>> float(step(np.ones((2, 3))))
9.0
>>> step.trace_count
1
"""

from __future__ import annotations

import numpy as np

from . import tree
from .backends import get_backend
from .compiler import CompileOptions, compile_graph, debug_enabled
from .errors import ReplicateError
from .graph.core import Array
from .graph.passes import dce
from .graph.trace import signature, trace_function

MODES = ("graph", "eager")


def check_mode(mode):
    if mode not in MODES:
        raise ReplicateError(f"unknown mode {mode!r}; choose 'graph' (define-and-run) or "
                             "'eager' (define-by-run)")
    return mode


def to_numpy(x):
    """Concrete NumPy value of an output leaf (Array, Variable, number)."""
    if isinstance(x, Array):
        return x.numpy()
    if hasattr(x, "numpy"):
        return x.numpy()
    return np.asarray(x)


class _Compiled:
    def __init__(self, graph, backend, options):
        self.graph = graph
        self.run = compile_graph(graph, backend, options)


class Function:
    """A step function with a mode and a backend; see :func:`function`."""

    def __init__(self, fn, mode="graph", backend="numpy", options=None):
        self.fn = fn
        self.mode = check_mode(mode)
        self.backend = get_backend(backend)
        self.options = as_options(options)
        self.cache: dict = {}
        self.trace_count = 0

    def __call__(self, *args):
        if self.mode == "eager":
            from .numpy import as_array

            args = tree.tree_map(lambda x: x if isinstance(x, str) else as_array(x), args)
            return tree.tree_map(to_numpy, self.fn(*args))
        key = signature(args)
        entry = self.cache.get(key)
        if entry is None:
            entry = self.cache[key] = self._compile(args)
        leaves = [np.asarray(x.numpy() if hasattr(x, "numpy") else x)
                  for x in tree.flatten(args)[0] if not isinstance(x, (str, bytes))]
        meta = entry.graph.meta
        outs = entry.run(leaves + [v.value for v in meta["variables"]])
        n = meta["num_results"]
        for var, value in zip(meta["updated"], outs[n:]):
            var.value = value
            var._eager = None
        return tree.unflatten(meta["out_tree"], outs[:n])

    def _compile(self, args):
        self.trace_count += 1
        graph, _ = trace_function(self.fn, args)
        graph = dce(graph)
        if debug_enabled("ir"):
            print(f"# {getattr(self.fn, '__name__', 'fn')} after trace + dce\n{graph}")
        return _Compiled(graph, self.backend, self.options)

    def _entry(self, args):
        key = signature(args)
        if key not in self.cache:
            self.cache[key] = self._compile(args)
        return self.cache[key]

    def graph(self, *args):
        """The traced (and dead-code-eliminated) graph for these arguments."""
        return self._entry(args).graph

    def executable(self, *args):
        """The compiled form for these arguments (``.graph`` after the backend's passes,
        ``.kernels``)."""
        return self._entry(args).run


def as_options(options) -> CompileOptions:
    if options is None:
        return CompileOptions()
    if isinstance(options, CompileOptions):
        return options
    if isinstance(options, dict):
        try:
            return CompileOptions(**options)
        except TypeError as e:
            raise ReplicateError(f"bad compile options: {e}") from None
    raise ReplicateError(f"options must be a dict or rp.CompileOptions, got {type(options)}")


def function(fn=None, *, mode="graph", backend="numpy", options=None):
    """Wrap ``fn`` so it runs in graph mode (default) or eager mode; usable as a decorator.

    ``backend``: ``"numpy"`` (default), ``"jax"``, ``"cupy"`` where installed; ``options``: a
    dict or :class:`rp.CompileOptions` for the optimisation pipeline."""
    if fn is None:
        return lambda f: Function(f, mode, backend, options)
    return Function(fn, mode, backend, options)
