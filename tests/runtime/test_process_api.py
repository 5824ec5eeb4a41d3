"""The process API (``rp.process_index``, ``rp.barrier``, ``rp.host``), early stopping from a
callback, the progress bar's total; 1, 2 and 3 processes."""

from __future__ import annotations

import json
import re

import numpy as np
import pytest

import replicate as rp
from conftest import have_mpi, mpirun, report


def test_one_process():
    assert (rp.process_index(), rp.process_count(), rp.is_main_process()) == (0, 1, True)
    rp.barrier()
    x = np.arange(6.0).reshape(2, 3)
    assert rp.host.all_reduce(x, "mean").tolist() == x.tolist()
    assert rp.host.all_gather(x).shape == (1, 2, 3)
    assert rp.host.broadcast(np.float32(2.5)).shape == ()
    assert rp.host.all_reduce(np.int64(4), "max").shape == ()


def test_host_calls_are_refused_inside_a_step():
    def step_fn(x):
        rp.host.all_reduce(np.ones(2), "sum")
        return {}

    for mode in ("graph", "eager"):
        rep = rp.Replicator(lambda ctx: iter([np.ones(2)] * 2), step_fn, mode=mode)
        with pytest.raises(rp.ReplicaContextError, match="inside a step.*rp.all_reduce"):
            rep.run(1)


def test_host_arguments_are_checked():
    with pytest.raises(rp.ReplicateError, match="op must be one of"):
        rp.host.all_reduce(np.ones(2), "avg")
    with pytest.raises(rp.ReplicateError, match="cast to a float first"):
        rp.host.all_reduce(np.ones(2, np.int32), "mean")
    with pytest.raises(rp.ReplicateError, match="root must be a process index"):
        rp.host.broadcast(np.ones(2), root=1)
    with pytest.raises(rp.ReplicateError, match="NumPy arrays or numbers"):
        rp.host.all_gather("text")


@pytest.mark.parametrize("mode", ["graph", "eager"])
def test_stop_from_a_callback_ends_run_after_that_step(mode):
    """Keras-style early stopping: the run ends after the step whose callback asked; the next
    run goes on with the following batch."""
    def input_fn(ctx):
        yield from (np.full(2, float(i)) for i in range(20))

    def early_stop(rep, step, outputs):
        if float(outputs["x"][0]) >= 4:
            rep.stop()

    rep = rp.Replicator(input_fn, lambda x: {"x": x}, mode=mode)
    hist = rep.run(callbacks=[early_stop])
    assert [float(h["x"][0]) for h in hist] == [0, 1, 2, 3, 4] and rep.step == 5
    assert [float(h["x"][0]) for h in rep.run(2)] == [5, 6]  # stop() lasts one run


def test_progress_total_comes_from_shard_batches():
    x = np.arange(40.0).reshape(20, 2)
    ctx = rp.ReplicaContext(0, 2)
    it = rp.shard_batches(x, 2, ctx, epochs=3)  # 20 rows / (2 x 2) = 5 per epoch
    assert it.total_steps == 15
    next(it)
    assert it.total_steps == 14
    assert rp.shard_batches(x, 2, ctx, epochs=None).total_steps is None
    assert rp.shard_batches(x, 2, rp.ReplicaContext(0, 2, start_step=4), epochs=3).total_steps \
        == 11

    totals = []

    class Bar:  # what run(progress=True) builds, observed
        def __init__(self, total):
            totals.append(total)

        def __call__(self, *args):
            pass

        def close(self):
            pass

    import replicate.runtime.loop.replicator as replicator

    real, replicator.Progress = replicator.Progress, Bar
    try:
        rep = rp.Replicator(lambda ctx: rp.shard_batches(x, 2, ctx, epochs=2),
                            lambda b: {"s": b.sum()}, replicas_per_rank=2)
        rep.run(progress=True)
        rep.run(3, progress=True)
    finally:
        replicator.Progress = real
    assert totals == [10, 13]


# -- several processes ----------------------------------------------------------------------------
def _line(stdout, rank, name):
    m = re.search(rf"^rank {rank} {name} (.*)$", stdout, re.M)
    assert m, f"no 'rank {rank} {name}' in:\n{stdout}"
    return json.loads(m.group(1))


@pytest.mark.mpi
@pytest.mark.parametrize("n", [2, 3])
def test_host_exchanges(n):
    if not have_mpi():
        pytest.skip("needs mpi4py and mpiexec (mpich wheel)")
    result = mpirun("host_mpi.py", "host", n=n, check=True)
    for p in range(n):
        out = result.stdout
        assert _line(out, p, "count") == [p, n, p == 0], report(result)
        assert _line(out, p, "sum") == [sum(range(n)), n]
        assert _line(out, p, "mean") == [sum(range(n)) / n, 1.0]
        assert _line(out, p, "max") == 10 * (n - 1)
        assert _line(out, p, "gather") == [[q, q * q] for q in range(n)]
        assert _line(out, p, "bcast") == [n - 1.0] * 2
        assert "rp.host.all_reduce" in _line(out, p, "outside")


@pytest.mark.mpi
def test_processes_making_different_host_calls_are_named():
    if not have_mpi():
        pytest.skip("needs mpi4py and mpiexec (mpich wheel)")
    result = mpirun("host_mpi.py", "mismatch", check=True)
    assert _line(result.stdout, 0, "mismatch") is True, report(result)
    assert _line(result.stdout, 1, "mismatch") is True, report(result)


@pytest.mark.mpi
@pytest.mark.parametrize("mode,n", [("graph", 2), ("eager", 2), ("graph", 3)])
def test_stop_on_one_rank_stops_every_rank_at_the_same_step(mode, n):
    if not have_mpi():
        pytest.skip("needs mpi4py and mpiexec (mpich wheel)")
    result = mpirun("host_mpi.py", "early_stop", mode, n=n, check=True)
    for rank in range(n):
        assert _line(result.stdout, rank, "first") == [3, 3], report(result)
        assert _line(result.stdout, rank, "second") == [3.0, 4.0], report(result)


def test_host_all_reduce_names_its_op_and_sums_low_precision_in_float32():
    with pytest.raises(TypeError):
        rp.host.all_reduce(np.ones(2))  # no default: Horovod averages, torch.distributed sums
    out = rp.host.all_reduce(np.ones(3, np.float16), "mean")
    assert out.dtype == np.float16 and out.tolist() == [1.0] * 3
