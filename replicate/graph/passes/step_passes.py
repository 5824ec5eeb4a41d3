"""The step passes: what turns k traced replicas into this process's step, in one list.

``STEP_PASSES`` is the road of every step after tracing — a data-parallel step, ``rp.function``
(one replica), a model-parallel device's part and a micro-batched step alike; the driver
(``replicate.compiler.compile_step``) runs each pass whose ``when`` holds for the step's
``StepContext``, then validates and prints the graph, then runs the backend's optimisation
passes (``PIPELINE``) through the same loop:

====================  =================================================================
check_per_replica     model parallelism or micro-batches: no per-replica Variable
check_divergence      no update leaves replicas with different copies of one variable
check_placement       logical devices: replicas agree on placement; a parameter on one
                      device (records the placement rows the processes compare)
replicate_collectives the placeholders become communication (on the device's group)
pipeline_order        logical devices: the GPipe order
cse                   k > 1: the k copies of every update after an exchange become one
shard_state           wrap_optimizer(shard=True): reduce-scatter, update this process's
                      slice of the state, all-gather the parameters (ZeRO-1/2; logical
                      devices: each device's state over its device group)
collective_schedule   what the ranks compare before they exchange anything
split_devices         logical devices: this device's part (transfers become send/recv)
merge_updates         one value per updated variable
dce                   dead code removed
====================  =================================================================

A new step rewrite (a hierarchical all-reduce, say) is one more row here.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Callable

from ...debug import debug_enabled
from ...errors import DivergenceError, PlacementError, function_location, source_line
from ..core import Graph
from ..primitives import REGISTRY, shown_attrs
from .cse import cse
from .dce import dce
from .merge_updates import merge_updates
from .pipeline import check_placement, describe_pipeline, pipeline_order, placement_schedule
from .replicate_collectives import replicate_collectives
from .shard_state import shard_state
from .split_devices import split_devices


@dataclass(frozen=True)
class StepContext:
    """Where a step runs, as its passes see it: ``replicas`` traced in this process (k, or k·M
    with ``micro`` micro-batches each), ``processes`` replica groups exchanging over MPI (this
    one ``rank``), ``devices`` logical devices per replica (this process: ``device``; its
    collectives go over ``device_comm``, its transfers over ``replica_comm``), ``placement``
    (the trace's ``graph.devices.Placement``), ``step_fn`` (a ``Replicator``'s: the gathering
    of its outputs ends the schedule), and the backend's ``options``/``backend`` for the
    optimisation passes."""

    replicas: int = 1
    processes: int = 1
    rank: int = 0
    micro: int = 1
    devices: int = 1
    device: int = 0
    device_comm: str | None = None
    replica_comm: str | None = None
    placement: Any = None
    step_fn: Callable | None = None
    options: Any = None
    backend: Any = None

    def replace(self, **changes) -> StepContext:
        return dataclasses.replace(self, **changes)


@dataclass(frozen=True)
class Pass:
    """``run(graph, ctx) -> graph``, run when ``when(ctx)`` holds; ``shows``: the title under
    which ``REPLICATE_DEBUG=ir`` prints the graph after it (else only ``passes`` does)."""

    name: str
    run: Callable[[Graph, StepContext], Graph]
    when: Callable[[StepContext], bool] = lambda ctx: True
    shows: str = ""


def check_per_replica(graph: Graph, ctx: StepContext) -> Graph:
    shared = [v for v in graph.meta.variables if v.per_replica]
    if shared:
        raise PlacementError(
            f"per-replica Variable {shared[0].name!r} (created at {shared[0].created_at}) with "
            f"logical_devices={ctx.devices}, micro_batches={ctx.micro}: per-replica state is not "
            "supported with model parallelism or micro-batches yet (rp.wrap_optimizer("
            "accumulate=n) uses it; micro_batches=n accumulates within a step instead)")
    return graph


def check_divergence(graph: Graph, ctx: StepContext) -> Graph:
    """Refuse a step whose updates would leave replicas holding different copies of a variable
    (``graph.meta.divergent``, found while tracing): with one replica in all there is nothing to
    diverge from, and a ``local=True`` variable is each replica's own."""
    k, n = ctx.replicas, ctx.processes
    found = [(var, where, source) for var, where, source in graph.meta.divergent
             if not getattr(var, "local", False)] if k * n > 1 else []
    if not found:
        return graph
    lines = "\n".join(f"  variable {var.name!r} assigned at "
                      f"{source_line(where) if where else '?'}\n    from {source}"
                      for var, where, source in found)
    raise DivergenceError(
        f"this step would leave the {k * n} replicas ({n} process(es) x {k}) "
        f"holding different values of variables that must be one value everywhere:\n{lines}\n"
        "The new value depends on per-replica data that no collective combined. Average the "
        "gradients before the update — rp.wrap_optimizer(opt), or "
        "rp.all_reduce(grads, 'mean')"
        + (" — or, if each process should keep its own value, create the variable with "
           "rp.Variable(..., local=True)." if k == 1 else ".")
        + (f"\nWith micro_batches={ctx.micro} each micro-batch is traced as a replica of "
           "its own: its gradients are combined like replicas' (rp.wrap_optimizer(opt) averages "
           "them over the micro-batches and the replicas)." if ctx.micro > 1 else ""))


def check_placement_pass(graph: Graph, ctx: StepContext) -> Graph:
    """The whole replica's placement, checked; its rows start the schedule the processes
    compare (every process holds the whole replica's, whichever device it runs)."""
    rows = check_placement(graph, ctx.micro, ctx.placement.differentiated)
    return Graph(graph.inputs, graph.nodes, graph.outputs,
                 graph.meta.copy(collective_schedule=placement_schedule(rows)))


def collective_schedule(graph: Graph, step_fn=None) -> list:
    """The cross-process exchanges of a step in execution order (what every rank must agree on):
    each ``exchange`` node as ``(text, source line)`` and, when ``step_fn`` is given, the
    gathering of its outputs after the step (their shapes and dtypes must agree too)."""
    out = []
    for node in graph.nodes:
        if REGISTRY[node.prim].exchange:
            attrs = ",".join(f"{k}={v}" for k, v in sorted(shown_attrs(node.attrs).items()))
            where = source_line(node.where) if node.where else "?"
            out.append((f"{node.prim}[{attrs}] {node.inputs[0].aval}", where))
    return out + outputs_gather(graph, step_fn)


def outputs_gather(graph: Graph, step_fn) -> list:
    """The schedule's last row: the gathering of ``step_fn``'s outputs (none without one)."""
    if step_fn is None:
        return []
    results = graph.outputs[:graph.meta.num_results * graph.meta.replicas]
    avals = ", ".join(str(x.aval) for x in results[:graph.meta.num_results])
    return [(f"gather of step_fn's outputs ({avals})", function_location(step_fn))]


def schedule_pass(graph: Graph, ctx: StepContext) -> Graph:
    """``meta.collective_schedule``: the placement rows (logical devices) or this graph's
    exchanges, then the outputs' gather. Communication is never merged or reordered by the
    passes before this one, so it is the schedule as written."""
    placed = graph.meta.collective_schedule
    schedule = placed + outputs_gather(graph, ctx.step_fn) if placed is not None \
        else collective_schedule(graph, ctx.step_fn)
    return Graph(graph.inputs, graph.nodes, graph.outputs,
                 graph.meta.copy(collective_schedule=schedule))


def split_devices_pass(graph: Graph, ctx: StepContext) -> Graph:
    graph = dce(graph)
    graph.meta.pipeline = describe_pipeline(graph, ctx.devices, ctx.micro)
    if debug_enabled("ir"):
        print(f"# pipeline schedule ({ctx.micro} micro-batches)\n{graph.meta.pipeline}\n",
              flush=True)
    return split_devices(graph, ctx.device, ctx.devices, ctx.replica_comm)


def _model_parallel(ctx: StepContext) -> bool:
    return ctx.devices > 1


STEP_PASSES = (
    Pass("check_per_replica", check_per_replica, lambda c: c.devices > 1 or c.micro > 1),
    Pass("check_divergence", check_divergence),
    Pass("check_placement", check_placement_pass, _model_parallel),
    Pass("replicate_collectives", lambda g, c: replicate_collectives(
        g, c.replicas, c.processes, c.rank, c.device_comm), shows="after collective rewrite"),
    # (before CSE: a node the micro-batches share keeps its first place)
    Pass("pipeline_order", lambda g, c: pipeline_order(g, c.micro), _model_parallel),
    # (merges the k copies of what follows the exchange, transfers included)
    Pass("cse", lambda g, c: cse(g), lambda c: c.replicas > 1),
    # (after CSE: the k replicas' updates are one, so the slice is computed once)
    Pass("shard_state", lambda g, c: shard_state(g, c.processes, c.rank, c.device, c.devices,
                                                 c.device_comm), shows="sharded state"),
    Pass("collective_schedule", schedule_pass),
    Pass("split_devices", split_devices_pass, _model_parallel, shows="this logical device"),
    Pass("merge_updates", lambda g, c: merge_updates(g)),
    Pass("dce", lambda g, c: dce(g)),
)

__all__ = ["STEP_PASSES", "Pass", "StepContext", "check_divergence", "collective_schedule"]
