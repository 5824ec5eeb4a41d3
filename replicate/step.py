"""A step, traced and compiled: the one road that ``rp.function`` and ``Replicator`` both take.

``trace_step`` traces a function once per local replica into one graph (k subgraphs: the
variables are shared inputs, each replica's updates are kept apart, its collectives are
placeholders). ``replicate.compiler.compile_step`` then rewrites, merges and optimises it and
lowers it into a ``CompiledStep``, which feeds the variables in and writes their new values back;
``gather_outputs`` exchanges a step's outputs with the other processes — one exchange per step.
"""

from __future__ import annotations

import contextlib
import weakref

import numpy as np

from . import dependency, profile, state, tree
from . import numpy as rnp
from .context import replica_scope
from .dtypes import autocast_dtype
from .errors import ReplicateError
from .graph.core import Graph, GraphMeta
from .graph.passes.divergence import divergent_writes
from .graph.trace import Trace, active, trace_inputs
from .interop import from_foreign, is_foreign
from .numpy import as_array


def output_leaves(trace: Trace, out) -> tuple[list, object]:
    """Flatten a traced function's result into graph values (numbers become constants)."""
    leaves, treedef = tree.flatten(out)
    values = []
    for leaf in leaves:
        try:
            values.append(trace.lift(as_array(leaf)))
        except ReplicateError:
            raise ReplicateError(
                f"a step function must return arrays (or nests of them); got "
                f"{type(leaf).__name__}") from None
    return values, treedef


class _Autocast(dependency.TraceKeyed):
    """``rp.autocast`` around a call (not inside the step function) is Python state the trace
    bakes in: a compiled step is reused only under the same autocast setting."""

    def trace_key(self):
        return autocast_dtype()


AUTOCAST = _Autocast()


def trace_step(fn, batches, contexts=None, prefix=None, placement=None) -> Graph:
    """Trace ``fn(batch)`` for each replica's batch (``contexts[r]`` active while replica r is
    traced; ``None``: leave the current context alone). The graph's inputs are every replica's
    batch leaves, then the variables read; its outputs every replica's results, then each
    replica's final value of every updated variable (``meta`` says which is which).
    ``placement``: model parallelism (``graph.devices.Placement``), the ops placed on devices."""
    k = len(batches)
    contexts = contexts if contexts is not None else [None] * k
    trace = Trace()
    trace.replicas, trace.placement = k, placement
    trace.depends_on(AUTOCAST)
    batch_inputs, names, results, treedefs = [], [], [], []
    with active(trace):
        for r, (batch, ctx) in enumerate(zip(batches, contexts)):
            trace.replica = r
            scope = replica_scope(ctx) if ctx is not None else contextlib.nullcontext()
            with scope:
                start = len(trace.inputs)
                traced = trace_inputs(trace, batch, prefix=prefix or f"r{r}.in")
                batch_inputs.extend(trace.inputs[start:])
                names.extend(trace.input_names[start:] if prefix else
                             [f"r{len(names) + j}" for j in range(len(trace.inputs) - start)])
                leaves, treedef = output_leaves(trace, fn(traced))
            results.append(leaves)
            treedefs.append(treedef)
    if len(set(treedefs)) != 1:
        raise ReplicateError("replicas returned differently structured outputs from step_fn: "
                             f"{treedefs}")
    updated, update_outs, writes = [], [], []
    for var in trace.variables:
        values = trace.writes(var, k)
        if all(w is None for w in values):
            continue
        if var.per_replica:  # each replica's own row of one (k, ...) update
            with active(trace):
                stacked = rnp.stack(trace.replica_values(var), 0)
            updated.append(var)
            update_outs.extend([stacked] * k)
            continue
        if any(w is None for w in values):
            missing = [r for r, w in enumerate(values) if w is None]
            raise ReplicateError(f"variable {var.name!r} is updated by some replicas but not by "
                                 f"local replica(s) {missing}; every replica must run the same "
                                 "updates")
        updated.append(var)
        update_outs.extend(values)
        writes.extend((var, r, x, trace.write_location(var, r)) for r, x in enumerate(values))
    inputs = batch_inputs + [trace.variable_input(v) for v in trace.variables]
    meta = GraphMeta(input_names=names + [v.name for v in trace.variables],
                     variables=list(trace.variables), updated=updated, out_tree=treedefs[0],
                     num_results=len(results[0]), replicas=k,
                     guards=dependency.guards(trace.dependents.values()))
    graph = Graph(inputs, list(trace.nodes), [x for leaves in results for x in leaves]
                  + update_outs, meta)
    sources = {x.id: f"the batch (graph input {name!r})" for x, name in zip(batch_inputs, names)}
    sources.update((i, "a per-replica random key") for i in trace.varying)
    meta.divergent = tuple(divergent_writes(graph, sources, writes))
    return graph


def batch_leaves(batches, device=None) -> list:
    """The arrays a compiled step is fed: every replica's batch leaves, as NumPy arrays (those of
    ``device``, a device backend's ``Device``, as they are: no copy through the host)."""
    return [x for b in batches for x in fed_leaves(tree.flatten(b)[0], device)]


def fed_leaves(leaves, device=None) -> list:
    """``batch_leaves`` of one batch already flattened (``tree.flatten``)."""
    return [x if device is not None and (device.is_array(x) or is_foreign(x)) else
            from_foreign(x) if is_foreign(x) else
            np.asarray(x.numpy() if hasattr(x, "numpy") else x)
            for x in leaves if not isinstance(x, (str, bytes))]


class StepCache:
    """Compiled steps by call signature. A signature may hold several: each is reused only
    while the Python-level state its trace read is unchanged (``graph.meta.guards``: a module's
    train/eval flag, an optimiser's learning rate — ``replicate.dependency``)."""

    def __init__(self):
        self._by_signature: dict = {}
        self._count = 0

    def find(self, signature):
        """The compiled step for ``signature`` whose guards hold, or None."""
        for step in self._by_signature.get(signature, ()):
            if dependency.guards_hold(step.graph.meta.guards):
                return step
        return None

    def add(self, signature, step):
        """Keep ``step``; returns its key (the signature and a number)."""
        self._count += 1
        step.key = (signature, self._count)
        self._by_signature.setdefault(signature, []).append(step)
        return step.key

    def __len__(self) -> int:
        return self._count

    def values(self) -> list:
        return sorted((s for steps in self._by_signature.values() for s in steps),
                      key=lambda s: s.key[1])


LAST_RUN: list = [None]  # a weak reference to the compiled step this process ran last


class CompiledStep:
    """One compiled signature of a step: ``graph`` (the step after the collective rewrite and the
    merge of the replicas' updates), ``executable`` (what the backend runs: ``.graph`` after its
    passes, ``.kernels``) and ``schedule`` (the cross-process exchanges, as written).

    ``step(leaves)`` runs it on the batch leaves of its k replicas: the variables are fed in
    and their new values written back; returns each replica's result leaves. ``run`` and
    ``commit`` are the two halves, for a caller that checks the new values before they are
    written (``Replicator(check_finite=True)``)."""

    def __init__(self, graph: Graph, executable, schedule: list):
        self.graph, self.executable, self.schedule = graph, executable, schedule
        self.last_inputs = None  # kept when asked (``keep_inputs``): the NaN finder re-runs them
        self.key = None  # set by the StepCache that holds it

    def __call__(self, leaves: list, keep_inputs: bool = False, on_device: bool = False) -> list:
        results, updates = self.run(leaves, keep_inputs, on_device)
        self.commit(updates)
        return results

    @property
    def device(self):
        """The device backend's ``Device`` (its variables stay in device memory), or None."""
        return self.executable.device

    def run(self, leaves: list, keep_inputs: bool = False,
            on_device: bool = False) -> tuple[list, list]:
        """Run on the batch leaves: (each replica's result leaves, the variables' new values
        — not written yet).

        On a device backend the variables are read from, and their new values left in, device
        memory; the batch leaves are copied up (device arrays pass as they are) and the results
        copied down in one transfer (``on_device``: left on the device)."""
        meta, device = self.graph.meta, self.executable.device
        LAST_RUN[0] = weakref.ref(self)  # (rp.memory_report: its planned bytes)
        fed = meta.variables if meta.fed is None else meta.fed  # (logical devices: its own)
        state.note_input_thread_reads(fed)
        if getattr(state.hooks, "values", None):  # an actor thread: its published copy
            inputs = leaves + [state.value_of(v) for v in fed]
        elif device is None:
            inputs = leaves + [v.value for v in fed]
        else:
            inputs = leaves + [v.device_value(device) for v in fed]  # (``run``
            # copies the leaves up: host index arrays among them are bounds-checked first)
        if keep_inputs:  # (device arrays stay there: copied down only if the NaN finder runs)
            self.last_inputs = inputs
        profiler = profile.active()
        if profiler is None:
            outs = self.executable.run(inputs)
        else:
            with profiler.span("compiled step", "step", kernels=len(self.executable.kernels)):
                outs = self.executable.run(inputs)
        n, k = meta.num_results, meta.replicas
        results = outs[:n * k]
        if device is not None and not on_device:
            results = device.to_host_many(results)
        return [results[r * n:(r + 1) * n] for r in range(k)], outs[n * k:]

    def updates(self, values: list) -> list:
        """``(variable, new value)`` pairs of a ``run``'s updates."""
        return list(zip(self.graph.meta.updated, values))

    def commit(self, values: list) -> None:
        """Write a ``run``'s new values into the variables (on a device backend: into each
        variable's device buffer, in place)."""
        device = self.executable.device
        for var, value in zip(self.graph.meta.updated, values):
            var.load(value, device, in_place=True)


def gather_outputs(comm, results: list, flag=None):
    """Every replica's result leaves on every process, in global replica order: one exchange
    (``allgather`` of the local leaves packed into one byte buffer), not one per leaf.

    ``results``: per local replica, a list of leaves (the same shapes and dtypes on every
    replica and process: the ranks compared them before). Returns per leaf an array
    ``(R, ...)``. With ``flag`` (a bool of this process's) it travels in the same exchange:
    returns ``(leaves, flags)``, ``flags`` per process."""
    if flag is not None:
        k = len(results)
        gathered = gather_outputs(comm, [list(r) + [np.asarray(flag, np.uint8)]
                                         for r in results])
        return gathered[:-1], gathered[-1].reshape(-1, k).any(1)
    local = [[np.asarray(x) for x in leaves] for leaves in results]
    for j, first in enumerate(local[0] if local else ()):  # before anything is exchanged
        if any((r[j].shape, r[j].dtype) != (first.shape, first.dtype) for r in local[1:]):
            raise ReplicateError(
                f"step_fn's output leaf {j} differs between the replicas of this process: "
                f"{[f'{r[j].dtype}{list(r[j].shape)}' for r in local]}; outputs are reduced "
                "over replicas, so every replica must return the same shapes")
    if comm.size == 1:
        return [np.stack([r[j] for r in local]) for j in range(len(local[0]))]
    packed = np.concatenate([np.ascontiguousarray(x).reshape(-1).view(np.uint8)
                             for leaves in local for x in leaves] or [np.zeros(0, np.uint8)])
    rows = comm.allgather(packed)  # (processes, bytes)
    everyone = []  # per global replica: its leaves
    for row in rows:
        offset = 0
        for leaves in local:
            mine = []
            for x in leaves:
                part = row[offset:offset + x.nbytes]
                mine.append(np.frombuffer(part.tobytes(), x.dtype).reshape(x.shape))
                offset += x.nbytes
            everyone.append(mine)
    return [np.stack([r[j] for r in everyone]) for j in range(len(local[0]))]


__all__ = ["CompiledStep", "StepCache", "batch_leaves", "gather_outputs", "output_leaves",
           "trace_step"]
