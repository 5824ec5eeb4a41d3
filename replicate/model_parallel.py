"""The road of a step with model parallelism (logical devices) and micro-batches.

``compile_step(fn, batches, contexts, where, backend=..., options=...)`` is
``compiler.compile_step`` for a replica that spans ``where.m`` logical devices (one process
each) and whose batch is cut into ``where.micro`` micro-batches:

1. each replica's batch is cut into M micro-batches along the first axis, and ``fn`` is traced
   once per micro-batch as if each were a replica of its own (``rp.num_replicas()`` is R·M;
   collectives combine every micro-batch, so ``all_reduce(grads, "mean")`` is the gradient of
   the whole batch): k·M traced replicas, every op placed on a device (``graph/devices.py``);
2. with m > 1, ``check_placement`` (the replicas agree; a parameter on one device);
3. the collective rewrite of the whole replica (every device's collectives go to the same
   device of the other replica groups, on their own communicator); with m > 1
   ``pipeline_order`` (GPipe: every forward, every backward, the update); CSE (the k·M copies
   of what follows the gradient exchange become one, transfers included);
4. with m > 1, ``split_devices`` (this device's part: transfers become send/recv, results reach
   every device; a Variable that lives on one device is fed and updated there only, and
   ``MicroBatchedStep.commit`` drops the other processes' copies: ``Variable.release``);
5. the merge of the updates, DCE, and the backend's passes as for any step.

Every process compares the whole replica's placement (transfers, collectives and their devices,
with their lines) before anything is exchanged, so a process that placed an op elsewhere is an
error naming the lines on every process, not a hang.
"""

from __future__ import annotations

import dataclasses
from typing import NamedTuple

import numpy as np

from . import tree
from .compiler import (
    _checked,
    _dump,
    check_divergence,
    collective_schedule,
    compile_graph,
)
from .compiler import compile_step as compile_replicated
from .debug import debug_enabled
from .errors import DivergenceError, InputError, PlacementError, function_location
from .graph import passes
from .graph.devices import Placement
from .graph.passes.merge_updates import merge_updates
from .graph.passes.pipeline import (
    check_placement,
    describe_pipeline,
    pipeline_order,
    placement_schedule,
)
from .graph.passes.split_devices import split_devices
from .graph.primitives import REGISTRY
from .interop import from_foreign, is_foreign
from .step import CompiledStep, trace_step


@dataclasses.dataclass(frozen=True)
class Where:
    """Where a process stands: logical ``device`` of ``m`` in replica group ``group`` of
    ``groups`` (the processes of one device, one per group, share ``device_comm``; the m
    processes of a group share ``replica_comm``), ``micro`` micro-batches per replica."""

    m: int = 1
    micro: int = 1
    device: int = 0
    group: int = 0
    groups: int = 1
    device_comm: str | None = None
    replica_comm: str | None = None


def split_batch(batch, micro: int, input_fn=None, replica: int = 0) -> list:
    """``batch`` (a nest) cut into ``micro`` nests along the first axis of every leaf."""
    if micro == 1:
        return [batch]
    leaves, treedef = tree.flatten(batch)
    parts = []
    for i, x in enumerate(leaves):
        if isinstance(x, (str, bytes)):
            parts.append([x] * micro)
            continue
        x = from_foreign(x) if is_foreign(x) else np.asarray(
            x.numpy() if hasattr(x, "numpy") else x)
        if x.ndim == 0 or x.shape[0] % micro:
            where = f" of input_fn {function_location(input_fn)}" if input_fn else ""
            raise InputError(
                f"micro_batches={micro} cuts every leaf of the batch{where} along its first axis, "
                f"but leaf {i} of replica {replica}'s batch has shape {list(x.shape)}: make the "
                f"batch a multiple of {micro} rows")
        b = x.shape[0] // micro
        parts.append([x[j * b:(j + 1) * b] for j in range(micro)])
    return [tree.unflatten(treedef, [p[j] for p in parts]) for j in range(micro)]


def micro_contexts(contexts, micro: int) -> list:
    """Each replica's context as ``micro`` replicas of their own (ids ``id * M + j``)."""
    if micro == 1:
        return list(contexts)
    return [dataclasses.replace(c, replica_id=c.replica_id * micro + j,
                                num_replicas=c.num_replicas * micro,
                                local_id=c.local_id * micro + j,
                                replicas_per_rank=c.replicas_per_rank * micro)
            for c in contexts for j in range(micro)]


def trace_only(graph):
    """``graph`` without its nodes: ``collective_schedule`` of it is the outputs' gather only."""
    return dataclasses.replace(graph, nodes=[])


def step_graph(fn, batches, contexts, where: Where, input_fn=None):
    """Steps 1–5 of the road (module docstring) for this process's device."""
    pieces = [p for r, b in enumerate(batches) for p in split_batch(b, where.micro, input_fn, r)]
    placement = Placement(where.m) if where.m > 1 else None
    graph = trace_step(fn, pieces, micro_contexts(contexts, where.micro), placement=placement)
    K = len(pieces)
    shared = [v for v in graph.meta.variables if v.per_replica]
    if shared:
        raise PlacementError(
            f"per-replica Variable {shared[0].name!r} (created at {shared[0].created_at}) with "
            f"logical_devices={where.m}, micro_batches={where.micro}: per-replica state is not "
            "supported with model parallelism or micro-batches yet (rp.wrap_optimizer("
            "accumulate=n) uses it; micro_batches=n accumulates within a step instead)")
    _dump("traced (placeholders)", graph)
    rows = None if placement is None else \
        check_placement(graph, where.micro, placement.differentiated)
    try:
        check_divergence(graph, K, where.groups)
    except DivergenceError as e:
        if where.micro == 1:
            raise
        raise DivergenceError(
            f"{e}\nWith micro_batches={where.micro} each micro-batch is traced as a replica of "
            "its own: its gradients are combined like replicas' (rp.wrap_optimizer(opt) averages "
            "them over the micro-batches and the replicas).") from None
    graph = _checked("replicate_collectives",
                     passes.replicate_collectives(graph, K, where.groups, where.group))
    if where.device_comm is not None:  # this device's group of processes, not the world
        for node in graph.nodes:
            if REGISTRY[node.prim].exchange:
                node.attrs = dict(node.attrs, comm=where.device_comm)
    _dump("after collective rewrite", graph)
    if rows is not None:  # (before CSE: a node the micro-batches share keeps its first place)
        graph = _checked("pipeline_order", pipeline_order(graph, where.micro))
    if K > 1:  # (also merges the replicas' identical transfers after the gradient exchange)
        graph = _checked("cse", passes.cse(graph))
    if rows is None:
        schedule = collective_schedule(graph, fn)
    else:
        schedule = placement_schedule(rows) + collective_schedule(trace_only(graph), fn)
        graph = passes.dce(graph)
        graph.meta.pipeline = describe_pipeline(graph, where.m, where.micro)
        if debug_enabled("ir"):
            print(f"# pipeline schedule ({where.micro} micro-batches)\n{graph.meta.pipeline}\n",
                  flush=True)
        graph = _checked("split_devices",
                         split_devices(graph, where.device, where.m, where.replica_comm))
        _dump(f"logical device {where.device}", graph)
    graph = _checked("merge_updates", merge_updates(graph))
    graph = _checked("dce", passes.dce(graph))
    graph.meta.collective_schedule = schedule
    _dump("final", graph)
    return graph


class Home(NamedTuple):
    """Where a Variable lives (``Variable.home``): logical ``device`` of the replica whose
    processes share communicator ``comm``; ``where``: the same in words, for errors."""

    comm: str | None
    device: int
    where: str


class MicroBatchedStep(CompiledStep):
    """A compiled step fed the replicas' whole batches: ``run`` cuts each leaf into the
    micro-batches it was traced for. With logical devices ``commit`` writes this device's
    updates and drops this process's copy of each Variable that lives on another device."""

    def __init__(self, graph, executable, schedule, micro: int, where: Where = Where()):
        super().__init__(graph, executable, schedule)
        self.micro = micro
        self.where = w = where
        self.homes = [(var, Home(w.replica_comm, d, f"logical device {d} of replica group "
                                 f"{w.group} (rank {w.group * w.m + d})"))
                      for var, d in graph.meta.homes]

    def commit(self, values: list) -> None:
        super().commit(values)
        for var, home in self.homes:
            var.home = home
            if home.device != self.where.device:
                var.release(home.where)

    def run(self, leaves: list, keep_inputs: bool = False):
        M = self.micro
        if M > 1:
            k = self.graph.meta.replicas // M
            per = len(leaves) // k
            leaves = [x[j * (x.shape[0] // M):(j + 1) * (x.shape[0] // M)]
                      for r in range(k) for j in range(M) for x in leaves[r * per:(r + 1) * per]]
        return super().run(leaves, keep_inputs)


def compile_step(fn, batches, contexts, where: Where, *, backend, options=None, num_ranks=1,
                 rank=0, input_fn=None) -> CompiledStep:
    """The whole road for this process (``compiler.compile_step`` when there is one device and
    one micro-batch)."""
    if where.m == 1 and where.micro == 1:
        return compile_replicated(fn, batches, contexts, backend=backend, options=options,
                                  num_ranks=num_ranks, rank=rank)
    graph = step_graph(fn, batches, contexts, where, input_fn)
    return MicroBatchedStep(graph, compile_graph(graph, backend, options),
                            graph.meta.collective_schedule, where.micro, where)


__all__ = ["Home", "MicroBatchedStep", "Where", "compile_step", "micro_contexts", "split_batch",
           "step_graph"]
