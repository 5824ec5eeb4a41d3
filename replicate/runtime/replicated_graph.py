"""Compile one process's step: k replica subgraphs, collectives rewritten, updates merged.

1. trace ``step_fn`` once per local replica into one trace (variables are shared inputs; each
   replica's updates are kept apart);
2. rewrite the collective placeholders (``replicate_collectives``); the cross-process collective
   schedule the ranks compare (``meta["collective_schedule"]``) is taken here, as the user wrote
   it, before any optimisation (CSE never merges communication, DCE never drops it, so the
   compiled step communicates exactly this);
3. CSE — the k identical optimiser updates that follow an all-reduce become one;
4. check that every variable received one value from all replicas, then DCE.
"""

from __future__ import annotations

import hashlib

from .. import tree
from ..context import replica_scope
from ..errors import CollectiveMismatchError, ReplicateError, function_location, source_line
from ..function import debug_enabled
from ..graph.core import Graph
from ..graph.passes import cse, dce
from ..graph.passes.replicate_collectives import replicate_collectives
from ..graph.trace import Trace, active, output_leaves, trace_inputs


def trace_replicas(step_fn, batches, contexts):
    """Trace ``step_fn`` for every local replica; return (graph, info)."""
    trace = Trace()
    batch_inputs, results, treedefs = [], [], []
    with active(trace):
        for r, (batch, ctx) in enumerate(zip(batches, contexts)):
            trace.replica = r
            with replica_scope(ctx):
                start = len(trace.inputs)
                traced = trace_inputs(trace, batch, prefix=f"r{r}.in")
                batch_inputs.extend(trace.inputs[start:])
                out = step_fn(traced)
                leaves, treedef = output_leaves(trace, out)
            results.append(leaves)
            treedefs.append(treedef)
    if len(set(treedefs)) != 1:
        raise ReplicateError("replicas returned differently structured outputs from step_fn: "
                             f"{treedefs}")
    k = len(batches)
    updated, update_outs = [], []
    for var in trace.variables:
        writes = [trace._var_current.get((r, id(var))) for r in range(k)]
        if all(w is None for w in writes):
            continue
        if any(w is None for w in writes):
            missing = [r for r, w in enumerate(writes) if w is None]
            raise ReplicateError(f"variable {var.name!r} is updated by some replicas but not by "
                                 f"local replica(s) {missing}; every replica must run the same "
                                 "updates")
        updated.append(var)
        update_outs.extend(writes)
    inputs = batch_inputs + [trace.variable_input(v) for v in trace.variables]
    outputs = [x for leaves in results for x in leaves] + update_outs
    graph = Graph(inputs, list(trace.nodes), outputs)
    graph.meta.update(
        input_names=[f"r{i}" for i in range(len(batch_inputs))] + [v.name for v in trace.variables],
        variables=list(trace.variables), updated=updated, out_tree=treedefs[0],
        num_results=len(results[0]), replicas=k)
    return graph


def compile_replicated(step_fn, batches, contexts, num_ranks, rank):
    """The full pipeline; returns the final graph whose outputs are
    ``[replica 0 results..., ..., replica k-1 results..., one value per updated variable]``."""
    k = len(contexts)
    graph = trace_replicas(step_fn, batches, contexts)
    _dump("traced (placeholders)", graph)
    graph = replicate_collectives(graph, k, num_ranks, rank)
    _dump("after collective rewrite", graph)
    schedule = collective_schedule(graph, step_fn)
    graph = cse(graph)
    _dump("after cse", graph)
    meta = graph.meta
    n_res = meta["num_results"] * k
    merged = []
    for v, var in enumerate(meta["updated"]):
        values = graph.outputs[n_res + v * k: n_res + (v + 1) * k]
        if len({x.id for x in values}) != 1:
            lines = "\n".join(
                f"  replica {r}: {source_line(x.node.where) if x.node and x.node.where else '?'}"
                for r, x in enumerate(values))
            raise ReplicateError(
                f"replicas would write different values into variable {var.name!r}:\n{lines}\n"
                "Reduce what they write across replicas first (e.g. rp.all_reduce(grads, 'mean') "
                "or rp.optim.wrap_optimizer).")
        merged.append(values[0])
    graph = Graph(graph.inputs, graph.nodes, graph.outputs[:n_res] + merged, meta)
    graph = dce(graph)
    graph.meta["collective_schedule"] = schedule
    _dump("final", graph)
    return graph


def collective_schedule(graph, step_fn=None) -> list:
    """The cross-process exchanges of a step in execution order (what every rank must agree on):
    each ``mpi_*`` collective as ``(text, source line)`` and, when ``step_fn`` is given, the
    gathering of its outputs after the step (their shapes and dtypes must agree too)."""
    out = []
    for node in graph.nodes:
        if node.prim.startswith("mpi_"):
            attrs = ",".join(f"{k}={v}" for k, v in sorted(node.attrs.items()))
            where = source_line(node.where) if node.where else "?"
            out.append((f"{node.prim}[{attrs}] {node.inputs[0].aval}", where))
    if step_fn is not None:
        results = graph.outputs[:graph.meta["num_results"]]
        avals = ", ".join(str(x.aval) for x in results)
        out.append((f"gather of step_fn's outputs ({avals})", function_location(step_fn)))
    return out


def fingerprint(schedule) -> str:
    return hashlib.sha256(repr([s for s, _ in schedule]).encode()).hexdigest()[:16]


def check_schedules(comm, schedule, error, about=None):
    """Every rank compares its collective schedule (and compile status) before communicating.

    ``about``: ``(batch signature, when compiled, input_fn)`` of this rank; the signatures are
    named in the error when the ranks' differ (say, one rank's batches changed shape and it
    compiled anew)."""
    if comm.size == 1:
        if error is not None:
            raise error
        return
    mine = (None if error is None else f"{type(error).__name__}: {error}",
            fingerprint(schedule), schedule, about)
    everyone = comm.allgather_obj(mine)
    # From here on every rank reaches the same verdict from the same data: the errors are
    # ``consistent`` (raised on every rank, so each can report it; no abort is needed).
    if error is not None:
        error.consistent = True
        raise error
    failed = [(r, e) for r, (e, _, _, _) in enumerate(everyone) if e is not None]
    if failed:
        r, msg = failed[0]
        raise _consistent(ReplicateError(f"rank {r} failed to compile the step: {msg}"))
    prints = {fp for _, fp, _, _ in everyone}
    if len(prints) == 1:
        return
    abouts = [a for _, _, _, a in everyone]
    batches = ""
    if all(abouts) and len({a[0] for a in abouts}) > 1:
        batches = f"\nThe ranks' batches differ ({abouts[0][2]}):\n" + "\n".join(
            f"  rank {r}: {a[0]} ({a[1]})" for r, a in enumerate(abouts))
    schedules = [s for _, _, s, _ in everyone]
    for i in range(max(len(s) for s in schedules)):
        column = [s[i] if i < len(s) else ("<none>", "-") for s in schedules]
        if len({c[0] for c in column}) > 1:
            lines = "\n".join(f"  rank {r}: {c[0]} at {c[1]}" for r, c in enumerate(column))
            raise _consistent(CollectiveMismatchError(
                f"processes disagree about cross-process collective #{i}:\n{lines}{batches}"))
    raise _consistent(CollectiveMismatchError(
        f"processes disagree about their collective schedule{batches}"))


def _consistent(error):
    error.consistent = True
    return error


def _dump(title, graph):
    if debug_enabled("ir"):
        print(f"# replicated step: {title}\n{graph}\n", flush=True)


__all__ = ["compile_replicated", "check_schedules", "collective_schedule", "tree"]
