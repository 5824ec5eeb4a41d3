"""Every process plans the same gradient buckets, though their graphs differ
(``replicate/graph/passes/bucket_plan.py``).

A plan that differed between processes would reduce one process's gradient with another's
statistics: a wrong number without an error, or MPI's "message truncated". These compile one
step for process 0 and process 1 of 2, here in one process, and compare what each would exchange.
"""

from __future__ import annotations

import random

import numpy as np
import pytest

import replicate as rp
import replicate.numpy as rnp
from replicate.backends import numpy_backend
from replicate.compiler import CompileOptions, compile_graph, compile_step, fingerprint, step_graph
from replicate.context import ReplicaContext
from replicate.graph import Graph, validate
from replicate.graph.primitives import REGISTRY
from replicate.runtime.communication.schedule import check_schedules


def _params():
    rng = np.random.default_rng(0)
    return [rp.Variable(rng.normal(size=s).astype(np.float32), name=f"w{i}")
            for i, s in enumerate([(4, 8), (8, 3), (3, 2)])]


def _contexts(rank, k):
    return [ReplicaContext(replica_id=rank * k + r, num_replicas=2 * k, rank=rank, num_ranks=2,
                           local_id=r, replicas_per_rank=k) for r in range(k)]


def _compiled(step, rank, k, options):
    contexts = _contexts(rank, k)
    return compile_step(step, [np.ones((3, 4), np.float32)] * k, contexts,
                        backend=numpy_backend, options=rp.CompileOptions(**options),
                        num_ranks=2, rank=rank, gathers_outputs=False)


def _exchanges(graph):
    """What a process sends, in order (waiting for a started bucket is its own affair)."""
    return [(n.prim, n.attrs.get("collective"), n.inputs[0].shape, n.out.shape)
            for n in graph.nodes if REGISTRY[n.prim].exchange and n.prim != "comm_wait"]


def _broadcast_step(params):
    """A regulariser made of a broadcast: its gradient (an all-reduce of the cotangents) is
    used on the root's process only, so there it feeds the first layer's gradient and on the
    other process it feeds nothing."""
    def step(x):
        h = rnp.tanh(x @ params[0])
        centre = rp.broadcast(rnp.mean(h, axis=0), root=0)
        loss = rnp.mean((rnp.tanh(h @ params[1]) @ params[2]) ** 2) + rnp.sum(centre ** 2)
        grads = rp.all_reduce(rp.grad(loss, params), "mean")
        for p, g in zip(params, grads):
            p.assign(p - 0.1 * g)
        return loss
    return step


@pytest.mark.parametrize("k", [1, 2])
@pytest.mark.parametrize("options", [{}, dict(overlap=False), dict(bucket_bytes=100)])
def test_every_process_plans_the_same_buckets_though_their_graphs_differ(k, options):
    """(Planned from each graph's positions, process 0 packed the broadcast's gradient apart
    and process 1 with the gradients: 8 + 62 elements against 70.)"""
    step = _broadcast_step(_params())
    steps = [_compiled(step, rank, k, options) for rank in (0, 1)]
    graphs = [s.executable.graph for s in steps]
    if k == 2:  # (the graphs differ: with one replica a process, only in a constant)
        assert [n.prim for n in graphs[0].nodes] != [n.prim for n in graphs[1].nodes]
    first = _exchanges(graphs[0])
    assert first == _exchanges(graphs[1])
    assert steps[0].schedule == steps[1].schedule
    if not options:  # the broadcast's gradient feeds a gradient: apart; the gradients together
        starts = [n.out.size for n in graphs[0].nodes if n.prim == "comm_start"]
        assert starts == [8, 4 * 8 + 8 * 3 + 3 * 2], starts


class _Gathered:
    """A communicator whose allgather returns every rank's row, as MPI would."""

    def __init__(self, rows):
        self.size, self.rank, self.rows = len(rows), 0, rows

    def allgather_obj(self, _):
        return self.rows


def test_a_step_traced_differently_on_some_replicas_stops_with_the_buckets_named():
    """A Python branch on the replica's id traces a different step on each process; where that
    makes the processes plan different buckets, they say so before exchanging anything (the
    rows of ``check_schedules``), with what to do."""
    params = _params()

    def step(x):
        scale = rp.all_reduce(rnp.mean(x, axis=0))
        scale = scale if rp.replica_id() == 0 else rnp.ones_like(scale)  # the branch
        h = rnp.tanh((x * scale) @ params[0])
        loss = rnp.mean((rnp.tanh(h @ params[1]) @ params[2]) ** 2)
        grads = rp.all_reduce(rp.grad(loss, params), "mean")
        for p, g in zip(params, grads):
            p.assign(p - 0.1 * g)
        return loss

    schedules = [_compiled(step, rank, 1, {}).schedule for rank in (0, 1)]
    assert schedules[0] != schedules[1]
    rows = [(None, fingerprint(s), s, None) for s in schedules]
    with pytest.raises(rp.CollectiveMismatchError,
                       match=r"(?s)rank 0: bucket mpi_allreduce.*rank 1: bucket mpi_allreduce"
                             r".*rnp\.where.*'bucket_bytes': 0"):
        check_schedules(_Gathered(rows), schedules[0], None)


def _batchnorm_step(params):
    """Cross-replica BatchNorm (its statistics are all-reduced forward and backward) between
    layers, a broadcast regulariser, Adam's all-reduced gradients."""
    bn = rp.nn.BatchNorm(8, cross_replica=True)
    opt = rp.optim.Adam(params + list(bn.parameters().values()), lr=0.01)

    def step(x):
        h = rnp.tanh(bn(x @ params[0]))
        centre = rp.broadcast(rnp.mean(h, axis=0), root=1)
        loss = rnp.mean((rnp.tanh(h @ params[1]) @ params[2]) ** 2) + rnp.sum(centre ** 2)
        opt.apply(rp.all_reduce(rp.grad(loss, opt.params), "mean"))
        return loss
    return step


def _another_order(graph, seed):
    """``graph``'s nodes in another valid order, picked at random, the exchanges kept in
    theirs: how another process's graph may differ (what the plan must not depend on)."""
    made = {n.out.id: n for n in graph.nodes}
    exchanges = [n for n in graph.nodes if REGISTRY[n.prim].exchange]
    needs = {id(n): {id(made[x.id]) for x in n.inputs if x.id in made} for n in graph.nodes}
    for a, b in zip(exchanges, exchanges[1:]):
        needs[id(b)].add(id(a))
    rng, order, done = random.Random(seed), [], set()
    while len(order) < len(graph.nodes):
        ready = [n for n in graph.nodes if id(n) not in done and needs[id(n)] <= done]
        node = rng.choice(ready)
        order.append(node)
        done.add(id(node))
    return Graph(graph.inputs, order, graph.outputs, graph.meta.copy())


@pytest.mark.parametrize("k", [1, 2])
@pytest.mark.parametrize("options", [{}, dict(bucket_bytes=200), dict(overlap=False)])
def test_the_plan_depends_on_what_every_process_agrees_on_not_on_node_order(k, options):
    """The same step in other valid node orders (as another process's graph may be): the same
    exchanges in the same order, the same buckets (their rows name their collectives)."""
    step = _batchnorm_step(_params())
    graph = step_graph(step, [np.ones((6, 4), np.float32) * (r + 1) for r in range(k)],
                       _contexts(0, k), num_ranks=2, rank=0)
    want = compile_graph(graph, numpy_backend, CompileOptions(**options)).graph
    validate(want)
    assert any(t.startswith("bucket ") for t, _ in want.meta.collective_schedule)
    for seed in range(3):
        got = compile_graph(_another_order(graph, seed), numpy_backend,
                            CompileOptions(**options)).graph
        validate(got)
        assert _exchanges(got) == _exchanges(want), seed
        assert got.meta.collective_schedule == want.meta.collective_schedule, seed


def test_a_bucket_never_holds_an_exchange_another_replica_makes_from_its_partner():
    """Replica 1 feeds collective #0's result into collective #1, replica 0 does not (a Python
    branch): #1 is planned after #0 on every process, and the two never share a bucket."""
    params = _params()

    def step(x):
        made = rnp.sum(x * 2.0)  # (made before #0's input: replica 0 alone would start #1 first)
        first = rp.all_reduce(rnp.sum(x @ params[0]))
        if rp.replica_id() % 2 == 1:
            made = made + first
        largest = rp.all_reduce(made, "max")
        loss = rnp.mean((rnp.tanh(x @ params[0]) @ params[1]) ** 2)
        grads = rp.all_reduce(rp.grad(loss, params[:2]), "mean")
        for p, g in zip(params, grads):
            p.assign(p - 0.1 * g)
        return loss, largest

    steps = [_compiled(step, rank, 2, {}) for rank in (0, 1)]
    assert _exchanges(steps[0].executable.graph) == _exchanges(steps[1].executable.graph)
    assert steps[0].schedule == steps[1].schedule
    rows = [t for t, _ in steps[0].schedule if t.startswith("bucket ")]
    assert rows.index(next(r for r in rows if "#0" in r)) < \
        rows.index(next(r for r in rows if "#1" in r)), rows


def test_gradients_made_in_another_order_on_another_process():
    """A loop whose order differs between processes (over a set of names, in the order their
    hashes give) makes the gradients ready in another order: in one bucket they are packed in
    the collectives' order all the same; in two, which would start in another order, the
    processes say so."""
    params = _params()[:2]
    params[1] = rp.Variable(np.ones((4, 8), np.float32), name="w1b")

    def step(x):
        loss = 0.0
        for i in ([0, 1] if rp.replica_id() == 0 else [1, 0]):
            loss = loss + rnp.mean(rnp.tanh(x @ params[i]) ** 2)
        grads = rp.all_reduce(rp.grad(loss, params), "mean")
        for p, g in zip(params, grads):
            p.assign(p - 0.1 * g)
        return loss

    steps = [_compiled(step, rank, 1, {}) for rank in (0, 1)]
    assert steps[0].schedule == steps[1].schedule
    assert _exchanges(steps[0].executable.graph) == _exchanges(steps[1].executable.graph)
    assert "(collectives #0, #1)" in steps[0].schedule[-1][0], steps[0].schedule
    schedules = [_compiled(step, rank, 1, dict(bucket_bytes=128)).schedule for rank in (0, 1)]
    rows = [(None, fingerprint(s), s, None) for s in schedules]
    with pytest.raises(rp.CollectiveMismatchError,
                       match=r"(?s)collectives #[01]\).*collectives #[01]\).*a loop over a set"):
        check_schedules(_Gathered(rows), schedules[0], None)
