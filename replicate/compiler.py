"""The road of a step, top to bottom: trace → rewrite collectives → merge → optimise → lower.

``compile_step`` is the one pipeline that ``rp.function`` (one replica) and ``Replicator`` (k
replicas per process, n processes) both take:

1. ``trace_step``: ``fn`` traced once per local replica into one graph (``replicate/step.py``);
2. ``step_graph``: the collective placeholders rewritten into communication (every
   collective, for k replicas and n processes), the cross-process schedule taken as written,
   CSE when k > 1 (the k identical updates after an all-reduce become one), the replicas'
   variable updates merged, dead code removed;
3. the backend's passes from ``PIPELINE``, in its order (const_fold, cse, dce, bucketing,
   fusion, memory);
4. ``backend.lower`` → a ``CompiledStep``.

With ``REPLICATE_VALIDATE=1`` (the tests set it) the graph is validated after every pass, the
collective rewrite included; ``REPLICATE_DEBUG=passes`` prints it after each one.

>>> import numpy as np, replicate as rp, replicate.numpy as rnp
>>> f = rp.function(lambda x: rnp.tanh(x * 2.0 + 1.0).sum())
>>> float(f(np.zeros(3)))
2.2847...
>>> f.executable(np.zeros(3)).kernels  # one kernel: mul, add, tanh and the sum
['fused[mul,add,tanh,reduce_sum]']
"""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass, field

from .backends import numpy_backend, numpy_memory
from .backends.base import Executable
from .debug import debug_enabled
from .errors import DivergenceError, ReplicateError, function_location, source_line
from .graph import passes
from .graph.passes.merge_updates import merge_updates
from .graph.primitives import REGISTRY
from .graph.validate import validate
from .step import CompiledStep, trace_step

# the optimisation passes a backend may ask for, in the order they run
PIPELINE = {
    **passes.PIPELINE,
    "memory": lambda g, o, backend=None: numpy_memory.memory(
        g, getattr(backend or numpy_backend, "writes_out", numpy_memory.NOTHING)),
}


@dataclass(frozen=True)
class CompileOptions:
    """Knobs of the optimisation pipeline.

    ``bucket_bytes``: gradient all-reduces are packed into flat buffers of at most this size
    (default 25 MB; 0 turns bucketing off). ``compress``: ``None``, ``"float16"`` or
    ``"bfloat16"`` — the dtype bucketed float32 buffers travel in. ``overlap``: start each
    bucket's communication as soon as its gradients exist and wait for it only where its result
    is needed (a communication thread carries it). ``disable``: names of passes to skip.
    """

    bucket_bytes: int = 25 * 2**20
    compress: str | None = None
    overlap: bool = True
    disable: frozenset = field(default_factory=frozenset)

    def __post_init__(self):
        if self.bucket_bytes < 0:
            raise ReplicateError(f"bucket_bytes must be >= 0, got {self.bucket_bytes}")
        if self.compress not in (None, "float16", "bfloat16"):
            raise ReplicateError(f"compress must be None, 'float16' or 'bfloat16', got "
                                 f"{self.compress!r}")
        unknown = set(self.disable) - set(PIPELINE)
        if unknown:
            raise ReplicateError(f"unknown passes {sorted(unknown)}; passes: {list(PIPELINE)}")
        object.__setattr__(self, "disable", frozenset(self.disable))


def _checked(name, graph):
    """After each pass: validate (``REPLICATE_VALIDATE=1``) and print (``REPLICATE_DEBUG``)."""
    if os.environ.get("REPLICATE_VALIDATE") == "1":
        validate(graph)
    if debug_enabled("passes"):
        print(f"# after pass {name}\n{graph}\n", flush=True)
    return graph


def optimize(graph, names, options: CompileOptions | None = None, backend=None):
    """Run the named passes (in pipeline order) over ``graph``."""
    options = options or CompileOptions()
    for name, run_pass in PIPELINE.items():
        if name in names and name not in options.disable:
            graph = _checked(name, run_pass(graph, options, backend))
    return graph


def compile_graph(graph, backend, options: CompileOptions | None = None) -> Executable:
    """Optimise ``graph`` for ``backend`` (a backend module) and lower it."""
    graph = optimize(graph, backend.passes, options, backend)
    lowered = backend.lower(graph)
    return lowered if isinstance(lowered, Executable) else Executable(graph, lowered)


def step_graph(fn, batches, contexts=None, num_ranks: int = 1, rank: int = 0, prefix=None,
               gathers_outputs: bool = True, processes=None):
    """Steps 1–2 of the road: the traced step with its collectives rewritten and its replicas'
    updates merged. ``graph.meta.collective_schedule`` is what this rank will exchange (with
    ``gathers_outputs``, the exchange of the step's outputs at its end: a ``Replicator``).

    ``processes``: instead of ``num_ranks``/``rank``, a function giving the communicator (its
    ``size`` and ``rank``), asked only if the step calls a collective — so a step without one
    never starts MPI (``rp.function``)."""
    graph = trace_step(fn, batches, contexts, prefix)
    k = len(batches)
    _dump("traced (placeholders)", graph)
    if processes is not None and any(REGISTRY[n.prim].placeholder for n in graph.nodes):
        comm = processes()
        num_ranks, rank = comm.size, comm.rank
    check_divergence(graph, k, num_ranks)
    graph = _checked("replicate_collectives",
                     passes.replicate_collectives(graph, k, num_ranks, rank))
    _dump("after collective rewrite", graph)
    schedule = collective_schedule(graph, fn if gathers_outputs else None)
    if k > 1:  # the k copies of every update after an all-reduce become one
        graph = _checked("cse", passes.cse(graph))
        _dump("after cse", graph)
    graph = _checked("merge_updates", merge_updates(graph))
    graph = _checked("dce", passes.dce(graph))
    graph.meta.collective_schedule = schedule
    _dump("final", graph)
    return graph


def compile_step(fn, batches, contexts=None, *, backend, options=None, num_ranks: int = 1,
                 rank: int = 0, prefix=None, gathers_outputs: bool = True,
                 processes=None) -> CompiledStep:
    """The whole road: ``fn`` traced for each replica's batch, rewritten, merged, optimised for
    ``backend`` and lowered (see the module docstring)."""
    graph = step_graph(fn, batches, contexts, num_ranks, rank, prefix, gathers_outputs,
                       processes)
    return CompiledStep(graph, compile_graph(graph, backend, options),
                        graph.meta.collective_schedule)


def check_divergence(graph, k: int, num_ranks: int) -> None:
    """Refuse a step whose updates would leave replicas holding different copies of a variable
    (``graph.meta.divergent``, found while tracing): with one replica in all there is nothing to
    diverge from, and a ``local=True`` variable is each replica's own."""
    if k * num_ranks == 1:
        return
    found = [(var, where, source) for var, where, source in graph.meta.divergent
             if not getattr(var, "local", False)]
    if not found:
        return
    lines = "\n".join(f"  variable {var.name!r} assigned at "
                      f"{source_line(where) if where else '?'}\n    from {source}"
                      for var, where, source in found)
    raise DivergenceError(
        f"this step would leave the {k * num_ranks} replicas ({num_ranks} process(es) x {k}) "
        f"holding different values of variables that must be one value everywhere:\n{lines}\n"
        "The new value depends on per-replica data that no collective combined. Average the "
        "gradients before the update — rp.wrap_optimizer(opt), or "
        "rp.all_reduce(grads, 'mean')"
        + (" — or, if each process should keep its own value, create the variable with "
           "rp.Variable(..., local=True)." if k == 1 else "."))


def collective_schedule(graph, step_fn=None) -> list:
    """The cross-process exchanges of a step in execution order (what every rank must agree on):
    each ``exchange`` node as ``(text, source line)`` and, when ``step_fn`` is given, the
    gathering of its outputs after the step (their shapes and dtypes must agree too)."""
    out = []
    for node in graph.nodes:
        if REGISTRY[node.prim].exchange:
            attrs = ",".join(f"{k}={v}" for k, v in sorted(node.attrs.items()))
            where = source_line(node.where) if node.where else "?"
            out.append((f"{node.prim}[{attrs}] {node.inputs[0].aval}", where))
    if step_fn is not None:
        results = graph.outputs[:graph.meta.num_results * graph.meta.replicas]
        avals = ", ".join(str(x.aval) for x in results[:graph.meta.num_results])
        out.append((f"gather of step_fn's outputs ({avals})", function_location(step_fn)))
    return out


def fingerprint(schedule) -> str:
    return hashlib.sha256(repr([s for s, _ in schedule]).encode()).hexdigest()[:16]


def _dump(title, graph):
    if debug_enabled("ir"):
        print(f"# replicated step: {title}\n{graph}\n", flush=True)


__all__ = ["PIPELINE", "CompileOptions", "Executable", "collective_schedule", "compile_graph",
           "compile_step", "debug_enabled", "fingerprint", "optimize", "step_graph"]
