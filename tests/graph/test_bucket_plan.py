"""Every process plans the same gradient buckets, though their graphs differ
(``replicate/graph/passes/bucket_plan.py``).

A plan that differed between processes would reduce one process's gradient with another's
statistics: a wrong number without an error, or MPI's "message truncated". These compile one
step for process 0 and process 1 of 2, here in one process, and compare what each would exchange.
"""

from __future__ import annotations

import numpy as np
import pytest

import replicate as rp
import replicate.numpy as rnp
from replicate.backends import numpy_backend
from replicate.compiler import compile_step, fingerprint
from replicate.context import ReplicaContext
from replicate.graph.primitives import REGISTRY
from replicate.runtime.communication.schedule import check_schedules


def _params():
    rng = np.random.default_rng(0)
    return [rp.Variable(rng.normal(size=s).astype(np.float32), name=f"w{i}")
            for i, s in enumerate([(4, 8), (8, 3), (3, 2)])]


def _compiled(step, rank, k, options):
    contexts = [ReplicaContext(replica_id=rank * k + r, num_replicas=2 * k, rank=rank,
                               num_ranks=2, local_id=r, replicas_per_rank=k) for r in range(k)]
    return compile_step(step, [np.ones((3, 4), np.float32)] * k, contexts,
                        backend=numpy_backend, options=rp.CompileOptions(**options),
                        num_ranks=2, rank=rank, gathers_outputs=False)


def _exchanges(graph):
    return [(n.prim, n.attrs.get("collective"), n.inputs[0].shape, n.out.shape)
            for n in graph.nodes if REGISTRY[n.prim].exchange]


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
