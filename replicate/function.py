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

import threading

import numpy as np

from . import tree
from .backends import get_backend
from .compiler import CompileOptions, compile_step
from .errors import ReplicateError, function_location
from .graph.core import Array
from .graph.trace import signature, signature_of
from .interop import as_kind, device_kind
from .numpy import as_array
from .step import StepCache, fed_leaves

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


class Function:
    """A step function with a mode and a backend; see :func:`function`.

    Graph mode compiles through the same road as ``Replicator`` (``replicate.compiler``), as
    one replica: its collectives are rewritten (one replica per process, across the processes
    of an MPI launch) like any step's. A compiled step reuses its buffers every call, so each
    thread that calls a ``Function`` compiles its own copy (actor threads sharing one policy:
    ``trace_count`` counts every thread's traces)."""

    def __init__(self, fn, mode="graph", backend="numpy", options=None):
        self.fn = fn
        self.mode = check_mode(mode)
        self.backend = get_backend(backend)
        self.options = as_options(options)
        self._per_thread = threading.local()
        self.trace_count = 0

    @property
    def cache(self) -> StepCache:
        """This thread's compiled steps."""
        cache = getattr(self._per_thread, "cache", None)
        if cache is None:
            cache = self._per_thread.cache = StepCache()
            self._per_thread.agreements = {}  # id(step) -> what each of its calls runs first
        return cache

    def __call__(self, *args):
        if self.mode == "eager":
            args = tree.tree_map(lambda x: x if isinstance(x, str) else as_array(x), args)
            return tree.tree_map(to_numpy, self.fn(*args))
        flat, treedef = tree.flatten(args)  # (once: the key, the feed, the kind)
        step = self._entry(args, signature_of(flat, treedef))
        agreement = self._per_thread.agreements[id(step)]
        if agreement is not None:  # its collectives span the processes: they agree first
            agreement()
        leaves = fed_leaves(flat, step.device)
        kind = device_kind(flat)  # given CuPy/JAX arrays: return them
        (results,) = step(leaves, on_device=kind is not None)
        if kind is not None:
            results = self._as_kind(step, results, kind)
        return tree.unflatten(step.graph.meta.out_tree, results)

    @staticmethod
    def _as_kind(step, results, kind):
        device, run = step.device, step.executable.run
        behind = getattr(run, "device_array", None)  # JAX: the device array behind an output
        if kind == "jax" and behind is not None:
            results = [behind(x) if behind(x) is not None else x for x in results]
        return [as_kind(x, kind, device.to_host if device is not None else np.asarray)
                for x in results]

    def _entry(self, args, key=None):
        key = signature(args) if key is None else key
        step = self.cache.find(key)
        if step is None:  # a new signature, or state the last trace read has changed
            step = self._compile(args)
            self.cache.add(key, step)
        return step

    def _compile(self, args):
        # a step outside a Replicator is one replica per process: its collectives (if any: only
        # then is the communicator asked for) span the processes; the runtime owns it, above
        # (and, as a Replicator's step start, every call agrees on what it will exchange)
        from .runtime.communication import comm, schedule

        self.trace_count += 1
        step = compile_step(lambda a: self.fn(*a), [args], backend=self.backend,
                            options=self.options, processes=comm.world, prefix="arg",
                            gathers_outputs=False)
        self._per_thread.agreements[id(step)] = schedule.on_every_call(
            comm.world(), step.schedule, function_location(self.fn)) if step.schedule else None
        return step

    def graph(self, *args):
        """The step's graph for these arguments: traced, collectives rewritten, dead code
        removed (before the backend's passes)."""
        return self._entry(args).graph

    def executable(self, *args):
        """The compiled form for these arguments (``.graph`` after the backend's passes,
        ``.kernels``)."""
        return self._entry(args).executable


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
