"""Per-replica Variables and gradient accumulation (``rp.Variable(per_replica=True)``,
``rp.wrap_optimizer(opt, accumulate=n)``), in graph and eager mode, 1 and 2 processes."""

from __future__ import annotations

import json
import re

import numpy as np
import pytest

import replicate as rp
import replicate.numpy as rnp
from conftest import have_mpi, mpirun, report

LAYOUTS = [("graph", 1), ("graph", 2), ("graph", 3), ("eager", 1)]


def counting(x):
    return np.full(2, float(x))


# -- per-replica Variables ---------------------------------------------------------------------
@pytest.mark.parametrize("mode,k", LAYOUTS)
def test_each_replica_reads_and_writes_its_own(mode, k):
    total = rp.Variable(np.zeros(2), name="total", per_replica=True)
    shared = rp.Variable(np.zeros(2), name="shared")

    def input_fn(ctx):
        while True:
            yield counting(ctx.replica_id + 1)

    def step_fn(x):
        total.assign(total + x)  # from the batch, no collective: allowed, it is per replica
        shared.assign(shared + rp.all_reduce(x, "sum"))
        return {"mine": total.read()[0]}

    rep = rp.Replicator(input_fn, step_fn, mode=mode, replicas_per_rank=k,
                        outputs="per_replica")
    hist = rep.run(3)
    expect = [3.0 * (r + 1) for r in range(k)]
    assert total.numpy().shape == (k, 2)
    assert total.numpy()[:, 0].tolist() == expect
    assert hist[-1]["mine"].tolist() == expect
    assert shared.numpy().tolist() == [3.0 * k * (k + 1) / 2] * 2
    assert total.shape == (2,) and total.size == 2 and total.ndim == 1


def test_a_fresh_per_replica_variable_shows_its_starting_value():
    v = rp.Variable(np.arange(3.0), per_replica=True)
    assert v.numpy().tolist() == [[0.0, 1.0, 2.0]]
    v.bind_replicas(2)
    assert v.numpy().tolist() == [[0.0, 1.0, 2.0]] * 2


def test_assign_outside_a_step_sets_every_local_replica():
    v = rp.Variable(np.zeros(2), name="acc", per_replica=True)
    rep = rp.Replicator(lambda ctx: iter([counting(ctx.replica_id)] * 5),
                        lambda x: v.assign(v + x) or {}, replicas_per_rank=2)
    rep.run(2)
    assert v.numpy().tolist() == [[0.0, 0.0], [2.0, 2.0]]
    v.assign(np.ones(2))  # a reset between epochs
    assert v.numpy().tolist() == [[1.0, 1.0], [1.0, 1.0]]
    rep.run(1)
    assert v.numpy().tolist() == [[1.0, 1.0], [2.0, 2.0]]


def test_rnn_state_carried_across_steps_per_replica():
    """An RNN's hidden state, kept per replica from one step (one chunk of a sequence) to the
    next: each replica's state must be its own sequence's, whatever the layout."""
    Wh = rp.Variable(np.eye(3) * 0.5, name="Wh")
    Wx = rp.Variable(np.ones((1, 3)), name="Wx")
    h = rp.Variable(np.zeros((1, 3)), name="h", per_replica=True)
    seqs = np.random.default_rng(1).normal(size=(4, 6, 1, 1))  # 4 sequences of 6 steps

    def input_fn(ctx):
        yield from seqs[ctx.replica_id]

    def step_fn(x):
        new = rnp.tanh(h.read() @ Wh + x @ Wx)
        h.assign(new)
        return {"h": new}

    def expected(seq):
        state = np.zeros((1, 3))
        for x in seq:
            state = np.tanh(state @ (np.eye(3) * 0.5) + x @ np.ones((1, 3)))
        return state

    for mode, k in [("graph", 4), ("graph", 2), ("eager", 1)]:
        h.restart(np.zeros((1, 3)))  # back to the start (and to any layout)
        rep = rp.Replicator(input_fn, step_fn, mode=mode, replicas_per_rank=k)
        rep.run()
        for r in range(k):
            np.testing.assert_allclose(h.numpy()[r], expected(seqs[r]), rtol=1e-12)


def test_a_per_replica_variable_keeps_its_layout():
    v = rp.Variable(np.zeros(2), name="acc", per_replica=True)
    rp.Replicator(lambda ctx: iter([counting(1)] * 3), lambda x: v.assign(v + x) or {},
                  replicas_per_rank=2).run(1)
    other = rp.Replicator(lambda ctx: iter([counting(1)] * 3), lambda x: v.assign(v + x) or {},
                          replicas_per_rank=3)
    with pytest.raises(rp.ReplicateError, match=r"holds the values of 2 replica\(s\).*3 replica"):
        other.run(1)


def test_per_replica_and_local_together_is_refused():
    with pytest.raises(rp.ReplicateError, match="not both"):
        rp.Variable(np.zeros(2), local=True, per_replica=True)


def test_checkpoint_restores_each_replica_and_refuses_another_count(tmp_path):
    v = rp.Variable(np.zeros(2), name="acc", per_replica=True)
    rep = rp.Replicator(lambda ctx: iter([counting(ctx.replica_id + 1)] * 9),
                        lambda x: v.assign(v + x) or {}, replicas_per_rank=2)
    rep.run(2)
    path = str(tmp_path / "ck.npz")
    rp.checkpoint.save(path, {"acc": v}, step=2)
    assert np.load(path)["var/acc"].tolist() == [[2.0, 2.0], [4.0, 4.0]]  # (R, ...) in the file
    v.assign(np.zeros(2))
    assert rep.restore(path, {"acc": v}) == 2
    assert v.numpy().tolist() == [[2.0, 2.0], [4.0, 4.0]]
    three = rp.Variable(np.zeros(2), name="acc", per_replica=True)
    three.bind_replicas(3)
    three.assign(np.ones(2))
    with pytest.raises(rp.CheckpointError, match="holds the values of 2 replicas, this job has 3"):
        rp.checkpoint.restore(path, {"acc": three})
    assert three.numpy().tolist() == [[1.0, 1.0]] * 3  # untouched
    plain = rp.Variable(np.zeros(2), name="acc")
    with pytest.raises(rp.CheckpointError, match="per replica in the checkpoint"):
        rp.checkpoint.restore(path, {"acc": plain})


def test_an_unused_per_replica_variable_checkpoints_its_starting_value(tmp_path):
    v = rp.Variable(np.full(2, 7.0), name="acc", per_replica=True)
    path = str(tmp_path / "fresh.npz")
    rp.checkpoint.save(path, {"acc": v})
    w = rp.Variable(np.zeros(2), name="acc", per_replica=True)
    w.bind_replicas(4)
    w.assign(np.ones(2))
    rp.checkpoint.restore(path, {"acc": w})
    assert w.numpy().tolist() == [[7.0, 7.0]]  # every replica starts from it again
    w.bind_replicas(3)
    assert w.numpy().tolist() == [[7.0, 7.0]] * 3


# -- gradient accumulation ----------------------------------------------------------------------
def _big_batch_reference(n_rows, steps, batch, opt="adam"):
    """One replica, batch ``batch`` (= n·R·B), ``steps`` updates: the oracle."""
    X, Y = _data(n_rows)
    w = rp.Variable(np.linspace(-1, 1, 5).reshape(5, 1), name="w")
    b = rp.Variable(np.zeros(1), name="b")
    inner = rp.optim.Adam([w, b], lr=0.05) if opt == "adam" else rp.optim.SGD([w, b], lr=0.1)
    for s in range(steps):
        x, y = X[s * batch:(s + 1) * batch], Y[s * batch:(s + 1) * batch]
        g = rp.grad(rnp.mean((x @ w + b - y) ** 2), [w, b])
        inner.apply(g)
    return w.numpy().ravel(), b.numpy().ravel()


def _data(rows=96, seed=0):
    rng = np.random.default_rng(seed)
    return rng.normal(size=(rows, 5)), rng.normal(size=(rows, 1))


@pytest.mark.parametrize("mode,k,n,batch", [("graph", 2, 3, 4), ("graph", 1, 4, 6),
                                            ("graph", 3, 2, 4), ("eager", 1, 2, 12),
                                            ("eager", 1, 3, 8)])
def test_accumulation_equals_one_big_batch(mode, k, n, batch):
    """R replicas × batch B × n accumulation steps == 1 replica, batch n·R·B, one update."""
    X, Y = _data()
    w = rp.Variable(np.linspace(-1, 1, 5).reshape(5, 1), name="w")
    b = rp.Variable(np.zeros(1), name="b")
    opt = rp.wrap_optimizer(rp.optim.Adam([w, b], lr=0.05), accumulate=n)

    def input_fn(ctx):
        for step in range(10 ** 6):
            big, micro = divmod(step, n)
            lo = big * n * k * batch + (micro * k + ctx.replica_id) * batch
            if lo + batch > len(X):
                return
            yield X[lo:lo + batch], Y[lo:lo + batch]

    def step_fn(xy):
        x, y = xy
        loss, g = rp.value_and_grad(lambda: rnp.mean((x @ w + b - y) ** 2), wrt=[w, b])()
        opt.apply(g)
        return {"loss": loss}

    rep = rp.Replicator(input_fn, step_fn, mode=mode, replicas_per_rank=k)
    rep.run(2 * n)
    ref_w, ref_b = _big_batch_reference(96, 2, n * k * batch)
    np.testing.assert_allclose(w.numpy().ravel(), ref_w, rtol=1e-12, atol=1e-14)
    np.testing.assert_allclose(b.numpy().ravel(), ref_b, rtol=1e-12, atol=1e-14)
    assert int(opt.optimizer.step.numpy()) == 2  # two updates in 2n steps
    if mode == "graph":
        assert rep.trace_count == 2  # the accumulating step and the updating step, reused
        combines = sorted(_combines(s.graph) for s in rep.cache.values())
        assert combines[0] == 0 and (k == 1 or combines[1] > 0)  # accumulating: no combine


def _combines(graph):
    return sum(n.prim == "local_reduce" or n.prim.startswith("mpi_") for n in graph.nodes)


def test_accumulation_buffers_are_checkpointed_mid_cycle(tmp_path):
    """A checkpoint taken between updates keeps each replica's partial sums and the
    micro-step: resuming gives the parameters of an uninterrupted run."""
    X, Y = _data()

    def make():
        w = rp.Variable(np.linspace(-1, 1, 5).reshape(5, 1), name="w")
        opt = rp.wrap_optimizer(rp.optim.SGD([w], lr=0.1), accumulate=3)

        def input_fn(ctx):
            for s in range(ctx.start_step, 12):
                yield X[(2 * s + ctx.replica_id) * 4:(2 * s + ctx.replica_id + 1) * 4]

        def step_fn(x):
            opt.apply([rp.grad(rnp.mean((x @ w) ** 2), w)])
            return {}
        return w, opt, rp.Replicator(input_fn, step_fn, replicas_per_rank=2)

    w, opt, rep = make()
    rep.run(12)
    straight = w.numpy().copy()
    w, opt, rep = make()
    rep.run(4)  # one update, then one accumulated step
    path = str(tmp_path / "mid.npz")
    rp.checkpoint.save(path, {"w": w, "opt": opt.variables()}, step=4)
    w2, opt2, rep2 = make()
    rep2.restore(path, {"w": w2, "opt": opt2.variables()})
    assert int(opt2.micro.numpy()) == 1
    assert opt2.buffers[0].numpy().shape == (2, 5, 1) and np.abs(opt2.buffers[0].numpy()).sum() > 0
    rep2.run(8)
    np.testing.assert_allclose(w2.numpy(), straight, rtol=1e-13)


def test_accumulate_is_checked():
    w = rp.Variable(np.zeros(2))
    for bad in (0, -1, 2.5, True):
        with pytest.raises(rp.ReplicateError, match="accumulate must be an int >= 1"):
            rp.wrap_optimizer(rp.optim.SGD([w]), accumulate=bad)


def test_pytorch_habit_gradient_accumulation_loop():
    """A PyTorch user's loop: ``loss / n`` per micro-batch, ``optimizer.step()`` every n —
    written here as accumulate=n with the plain mean loss; the same parameters result."""
    X, Y = _data()
    w = rp.Variable(np.zeros((5, 1)), name="w")
    opt = rp.wrap_optimizer(rp.optim.SGD([w], lr=0.1), accumulate=4)
    for s in range(8):  # eager, no Replicator: one replica
        x, y = X[s * 6:(s + 1) * 6], Y[s * 6:(s + 1) * 6]
        opt.apply([rp.grad(rnp.mean((x @ w - y) ** 2), w)])
    ref = np.zeros((5, 1))
    for big in range(2):
        x, y = X[big * 24:(big + 1) * 24], Y[big * 24:(big + 1) * 24]
        ref = ref - 0.1 * (2 * x.T @ (x @ ref - y) / 24)
    np.testing.assert_allclose(w.numpy(), ref, rtol=1e-12)


# -- two processes ------------------------------------------------------------------------------
def _lines(stdout, rank, name):
    m = re.search(rf"^rank {rank} {name} (.*)$", stdout, re.M)
    assert m, f"no 'rank {rank} {name}' in:\n{stdout}"
    return json.loads(m.group(1))


@pytest.mark.mpi
@pytest.mark.parametrize("mode,k,n,batch", [("graph", 2, 2, 4), ("eager", 1, 3, 4),
                                            ("graph", 1, 2, 6)])
def test_accumulation_oracle_on_two_processes(mode, k, n, batch):
    if not have_mpi():
        pytest.skip("needs mpi4py and mpiexec (mpich wheel)")
    result = mpirun("state_mpi.py", "accumulation", mode, str(k), str(n), str(batch),
                    check=True)
    R = 2 * k
    ref_w, ref_b = _big_batch_reference(96, 2, n * R * batch)
    for rank in (0, 1):
        np.testing.assert_allclose(_lines(result.stdout, rank, "w"), ref_w, rtol=1e-12,
                                   err_msg=report(result))
        np.testing.assert_allclose(_lines(result.stdout, rank, "b"), ref_b, rtol=1e-12,
                                   atol=1e-14)
        if mode == "graph":  # accumulating: only the outputs cross; updating: the all-reduce too
            exchanges = _lines(result.stdout, rank, "exchanges")
            assert exchanges[0] == 1 and exchanges[1] > 1, report(result)


@pytest.mark.mpi
@pytest.mark.parametrize("mode,k", [("graph", 2), ("eager", 1)])
def test_per_replica_variables_on_two_processes(mode, k, tmp_path):
    if not have_mpi():
        pytest.skip("needs mpi4py and mpiexec (mpich wheel)")
    result = mpirun("state_mpi.py", "per_replica", mode, str(k), str(tmp_path), check=True)
    R = 2 * k
    everyone = [3.0 * 2 * (r + 1) for r in range(R)]  # total.sum() per global replica
    for rank in (0, 1):
        mine = [[3.0 * (rank * k + r + 1)] * 2 for r in range(k)]
        assert _lines(result.stdout, rank, "outputs") == everyone, report(result)
        assert _lines(result.stdout, rank, "total") == mine
        assert _lines(result.stdout, rank, "restored") == mine
        assert _lines(result.stdout, rank, "seen") == [3] * k
    assert _lines(result.stdout, 0, "file") == [[3.0 * (r + 1)] * 2 for r in range(R)]
