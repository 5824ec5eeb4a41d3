"""The one road of every step: trace → the step passes → the backend's passes → lower.

``compile_step`` is the one driver that ``rp.function`` (one replica), ``Replicator`` (k
replicas per process, n processes) and model parallelism (m logical devices, M micro-batches)
all take:

1. ``trace_step``: ``fn`` traced once per local replica (and micro-batch) into one graph
   (``replicate/step.py``), its ops placed on logical devices when there are several;
2. ``STEP_PASSES`` (``graph/passes/step_passes.py``), each ``(graph, ctx) -> graph`` with a
   ``StepContext`` (replicas, processes, rank, devices, micro-batches): the checks, the
   collective rewrite, the pipeline order, CSE, the schedule the ranks compare, this device's
   part, the merge of the replicas' updates, DCE;
3. the optimisation passes the backend asks for, in ``PIPELINE`` order (const_fold, cse, dce,
   bucketing, widen, fusion), then the backend's own (``own_passes``: the NumPy backend's
   memory plan);
4. ``backend.lower`` → a ``CompiledStep`` (a ``MicroBatchedStep`` with micro-batches or
   logical devices).

After every pass of 2 and 3, one loop validates the graph (``REPLICATE_VALIDATE=1``, on for the
whole test suite) and prints it (``REPLICATE_DEBUG=passes``).

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
import warnings
from dataclasses import dataclass, field

import numpy as np

from . import tree
from .backends import numpy_backend
from .backends.base import Executable
from .debug import debug_enabled
from .errors import ReplicateError
from .graph import passes
from .graph.devices import Placement
from .graph.passes.step_passes import STEP_PASSES, StepContext, collective_schedule
from .graph.primitives import REGISTRY
from .graph.validate import validate
from .model_parallel import MicroBatchedStep, Where, micro_contexts, split_batch
from .step import CompiledStep, trace_step

# every optimisation pass by name, in the order they run: those a backend may ask for
# (``backend.passes``), then the backends' own (``own_passes``: the NumPy backend's memory plan)
PIPELINE = {**passes.PIPELINE, **{p.name: p for p in numpy_backend.own_passes}}


@dataclass(frozen=True)
class CompileOptions:
    """Knobs of the optimisation pipeline.

    ``bucket_bytes``: gradient all-reduces are packed into flat buffers of at most this size
    (default 25 MB; 0 turns bucketing off). ``compress``: ``None``, ``"float16"`` or
    ``"bfloat16"`` — the dtype bucketed float32 buffers travel in. ``overlap``: start each
    bucket's communication as soon as its gradients exist and wait for it only where its result
    is needed (a communication thread carries it). ``disable``: names of passes to skip.
    ``cuda_graph``: the cupy backend captures a step without communication as a CUDA graph and
    replays it (also ``REPLICATE_CUDA_GRAPH=1``; off by default, not yet verified on a GPU, and
    a step that calls cuBLAS — a matmul — runs normally, since CuPy refuses library calls during
    a capture: ``docs/guides/gpu.md``); other backends ignore it.
    """

    bucket_bytes: int = 25 * 2**20
    compress: str | None = None
    overlap: bool = True
    disable: frozenset = field(default_factory=frozenset)
    cuda_graph: bool = False

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


def run_passes(graph, todo, ctx: StepContext):
    """The one loop: each pass of ``todo`` whose ``when`` holds, then validation
    (``REPLICATE_VALIDATE=1``) and printing (``REPLICATE_DEBUG=passes``) of its graph."""
    check = os.environ.get("REPLICATE_VALIDATE") == "1"
    for p in todo:
        if p.when(ctx):
            graph = p.run(graph, ctx)
            if check:
                validate(graph)
            if debug_enabled("passes"):
                print(f"# after pass {p.name}\n{graph}\n", flush=True)
            if p.shows and debug_enabled("ir"):
                print(f"# replicated step: {p.shows}\n{graph}\n", flush=True)
    return graph


def backend_passes(backend, options: CompileOptions) -> list:
    """The passes ``backend`` asks for, in pipeline order, then its own; less the disabled."""
    names = set(backend.passes) - options.disable
    return [p for p in passes.PIPELINE.values() if p.name in names] + \
        [p for p in getattr(backend, "own_passes", ()) if p.name not in options.disable]


def optimize(graph, names, options: CompileOptions | None = None, backend=None):
    """Run the named optimisation passes (in pipeline order) over ``graph``."""
    options = options or CompileOptions()
    todo = [p for name, p in PIPELINE.items() if name in names and name not in options.disable]
    return run_passes(graph, todo, StepContext(options=options, backend=backend or numpy_backend))


def compile_graph(graph, backend, options: CompileOptions | None = None) -> Executable:
    """Optimise ``graph`` for ``backend`` (a backend module) and lower it."""
    options = options or CompileOptions()
    graph = run_passes(graph, backend_passes(backend, options),
                       StepContext(options=options, backend=backend))
    replay = options.cuda_graph and getattr(backend, "cuda_graph_replay", False)
    lowered = backend.lower(graph, cuda_graph=True) if replay else backend.lower(graph)
    return lowered if isinstance(lowered, Executable) else Executable(graph, lowered)


def warn_uneven(batches, graph) -> None:
    """A warning when this process's replicas were handed batches of different sizes and
    exchange something: a mean over replicas (of gradients, of a loss) weighs each replica
    alike, not each example — the mean of their means, as DDP's (BatchNorm's cross-replica
    statistics weigh each replica by its size)."""
    if len(batches) < 2 or not any(REGISTRY[n.prim].placeholder for n in graph.nodes):
        return
    sizes = [[np.shape(x)[0] if np.ndim(x) else None for x in tree.flatten(b)[0]]
             for b in batches]
    if any(s != sizes[0] for s in sizes):
        firsts = [s[0] if s else None for s in sizes]
        warnings.warn(f"the replicas' batches differ in size ({firsts} along their first axis): "
                      "a mean over replicas (rp.all_reduce(..., 'mean'), wrap_optimizer's "
                      "gradients, outputs='mean') weighs each replica alike, not each example "
                      "— the mean of the replicas' means. Give every replica the same batch "
                      "size (rp.shard_batches does) or weigh by the counts yourself",
                      stacklevel=2)


def step_graph(fn, batches, contexts=None, num_ranks: int = 1, rank: int = 0, prefix=None,
               gathers_outputs: bool = True, processes=None, where: Where | None = None,
               input_fn=None):
    """Steps 1–2 of the road: the traced step through ``STEP_PASSES``.
    ``graph.meta.collective_schedule`` is what this rank will exchange (with
    ``gathers_outputs``, the exchange of the step's outputs at its end: a ``Replicator``).

    ``processes``: instead of ``num_ranks``/``rank``, a function giving the communicator (its
    ``size`` and ``rank``), asked only if the step calls a collective — so a step without one
    never starts MPI (``rp.function``). ``where``: model parallelism and micro-batches (this
    process's logical device; its replica group is the rank: ``where.groups``/``where.group``).
    """
    where = where or Where()
    if where.micro > 1:  # each micro-batch is traced as a replica of its own
        batches = [p for r, b in enumerate(batches)
                   for p in split_batch(b, where.micro, input_fn, r)]
        contexts = micro_contexts(contexts, where.micro)
    placement = Placement(where.m) if where.m > 1 else None
    graph = trace_step(fn, batches, contexts, prefix, placement=placement)
    if where.m > 1 or where.micro > 1:
        num_ranks, rank = where.groups, where.group
    elif processes is not None and any(REGISTRY[n.prim].placeholder for n in graph.nodes):
        comm = processes()
        num_ranks, rank = comm.size, comm.rank
    if where.micro == 1:
        warn_uneven(batches, graph)
    if debug_enabled("ir"):
        print(f"# replicated step: traced (placeholders)\n{graph}\n", flush=True)
    ctx = StepContext(replicas=len(batches), processes=num_ranks, rank=rank, micro=where.micro,
                      devices=where.m, device=where.device, device_comm=where.device_comm,
                      replica_comm=where.replica_comm, placement=placement,
                      step_fn=fn if gathers_outputs else None)
    graph = run_passes(graph, STEP_PASSES, ctx)
    if debug_enabled("ir"):
        print(f"# replicated step: final\n{graph}\n", flush=True)
    return graph


def compile_step(fn, batches, contexts=None, *, backend, options=None, num_ranks: int = 1,
                 rank: int = 0, prefix=None, gathers_outputs: bool = True, processes=None,
                 where: Where | None = None, input_fn=None) -> CompiledStep:
    """The whole road: ``fn`` traced for each replica's batch, through the step passes, the
    backend's passes and lowered (see the module docstring)."""
    graph = step_graph(fn, batches, contexts, num_ranks, rank, prefix, gathers_outputs,
                       processes, where, input_fn)
    executable = compile_graph(graph, backend, options)
    # (the optimised graph's: bucketing adds a sharded step's buckets to it)
    schedule = executable.graph.meta.collective_schedule
    if where is None or (where.m == 1 and where.micro == 1):
        return CompiledStep(graph, executable, schedule)
    return MicroBatchedStep(graph, executable, schedule, where.micro, where)


def fingerprint(schedule) -> str:
    return hashlib.sha256(repr([s for s, _ in schedule]).encode()).hexdigest()[:16]


__all__ = ["PIPELINE", "CompileOptions", "Executable", "collective_schedule", "compile_graph",
           "compile_step", "debug_enabled", "fingerprint", "optimize", "run_passes",
           "step_graph"]
