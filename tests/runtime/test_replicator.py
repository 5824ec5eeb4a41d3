"""The Replicator in one process: the oracle, error cases, data sharding, the rewrite and CSE.

The oracle: R = k replicas with per-replica batch B end with the same parameters as one replica
with batch R*B (the multi-process half of it is in tests/runtime/test_mpi.py).
"""

import collections
import itertools
import os
import sys
import warnings

import numpy as np
import pytest

import replicate as rp
import replicate.numpy as rnp
from replicate.compiler import collective_schedule, step_graph
from replicate.context import ReplicaContext
from replicate.graph.passes import cse, dce
from replicate.graph.passes.replicate_collectives import replicate_collectives
from replicate.graph.validate import validate
from replicate.step import trace_step

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "programs"))
import oracle  # noqa: E402

THIS_FILE = os.path.basename(__file__)


def line_of(marker: str) -> int:
    """The line number of the line of this file that ends with ``# <marker>``."""
    with open(__file__) as f:
        hits = [i for i, line in enumerate(f, 1) if line.rstrip().endswith(f"# {marker}")]
    assert len(hits) == 1, (marker, hits)
    return hits[0]


def run(step_fn, batches_of, k=2, steps=2, **kw):
    """Run step_fn with k replicas; replica r's batches are ``batches_of(r)`` repeated."""

    def input_fn(ctx):
        while True:
            yield batches_of(ctx.replica_id)

    rep = rp.Replicator(input_fn, step_fn, replicas_per_rank=k, **kw)
    return rep.run(steps), rep


# -- the oracle ------------------------------------------------------------------------------------
@pytest.mark.parametrize("opt", ["sgd", "adam"])
@pytest.mark.parametrize("k", [1, 2, 4])
def test_oracle_k_replicas_equal_one_replica_with_k_times_the_batch(k, opt):
    B = 8
    params, losses = oracle.train(k, opt=opt, steps=10, batch=B)
    ref_params, ref_losses = oracle.train(1, opt=opt, steps=10, batch=k * B)
    assert len(losses) == len(ref_losses) == 10
    for name in ref_params:
        assert params[name].dtype == np.float64
        np.testing.assert_allclose(params[name], ref_params[name], rtol=1e-6, atol=1e-12,
                                   err_msg=name)
    # every replica's batch has B rows, so the mean of the replicas' losses is the big batch's
    np.testing.assert_allclose(losses, ref_losses, rtol=1e-6)
    # and training did something
    start = {n: v.numpy() for n, v in oracle.make_params().items()}
    assert any(np.abs(params[n] - start[n]).max() > 1e-3 for n in start)


@pytest.mark.parametrize("opt", ["sgd", "adam"])
def test_oracle_eager_mode_matches_graph_mode(opt):
    graph_params, graph_losses = oracle.train(1, mode="graph", opt=opt, batch=16)
    eager_params, eager_losses = oracle.train(1, mode="eager", opt=opt, batch=16)
    for name in graph_params:
        np.testing.assert_allclose(eager_params[name], graph_params[name], rtol=1e-6, atol=1e-12)
    np.testing.assert_allclose(eager_losses, graph_losses, rtol=1e-6)


def test_oracle_with_padded_epoch_and_masked_loss():
    """remainder='pad' and a mask-weighted loss: R replicas over one epoch of 50 rows equal one
    replica with batch R*B (the padding rows contribute nothing)."""
    rng = np.random.default_rng(4)
    X, Y = rng.normal(size=(50, 3)), rng.normal(size=50)

    def train(k, batch):
        w = rp.Variable(np.zeros(3), name="w_pad")
        opt = rp.optim.SGD([w], lr=0.1)

        def input_fn(ctx):
            return rp.shard_batches((X, Y), batch, ctx, seed=1, epochs=1, remainder="pad")

        def step_fn(b):
            (x, y), mask = b
            loss = (mask * (x @ w - y) ** 2).sum()
            count = rp.all_reduce(mask.sum(), "sum")
            opt.apply([rp.all_reduce(rp.grad(loss, w), "sum") / count])
            return {"rows": mask.sum()}

        hist = rp.Replicator(input_fn, step_fn, replicas_per_rank=k, outputs="sum").run()
        return w.numpy().copy(), hist

    w3, hist3 = train(3, 4)
    w1, hist1 = train(1, 12)
    assert len(hist3) == len(hist1) == 5  # ceil(50 / 12)
    assert sum(float(h["rows"]) for h in hist3) == 50.0
    np.testing.assert_allclose(w3, w1, rtol=1e-9)


# -- errors: collective mismatches name the source lines -------------------------------------------
def _assert_names_lines(error, *markers):
    msg = str(error.value)
    assert THIS_FILE in msg, msg
    for marker in markers:
        assert f"{THIS_FILE}:{line_of(marker)}" in msg, (marker, msg)


@pytest.mark.parametrize("k", [2, 3])
def test_replica_dependent_shapes_into_a_collective_is_a_mismatch(k):
    def step_fn(x):
        return {"y": rp.all_reduce(x, "sum")}  # MARK shapes

    with pytest.raises(rp.CollectiveMismatchError) as e:
        run(step_fn, lambda r: np.ones((2 + r, 3)), k=k)
    _assert_names_lines(e, "MARK shapes")
    assert "f64[2,3]" in str(e.value) and "f64[3,3]" in str(e.value)


def test_replica_dependent_dtypes_into_a_collective_is_a_mismatch():
    def step_fn(x):
        return {"y": rp.all_gather(x)}  # MARK dtypes

    with pytest.raises(rp.CollectiveMismatchError) as e:
        run(step_fn, lambda r: np.ones(3, np.float32 if r else np.float64))
    _assert_names_lines(e, "MARK dtypes")


def test_replica_dependent_shapes_are_fine_when_the_collectives_agree():
    def step_fn(x):
        return {"mean": rp.all_reduce(x.mean(), "mean"), "rows": rnp.asarray(float(x.shape[0]))}

    hist, _ = run(step_fn, lambda r: np.full((2 + r, 3), float(r)), k=3, outputs="per_replica")
    np.testing.assert_allclose(hist[-1]["mean"], np.full(3, 1.0))
    np.testing.assert_array_equal(hist[-1]["rows"], [2.0, 3.0, 4.0])


@pytest.mark.parametrize("k", [2, 3])
def test_collective_called_by_only_some_replicas(k):
    def step_fn(x):
        if rp.replica_id() == 0:
            rp.all_reduce(x, "sum")  # MARK some
        return {"y": x.sum()}

    with pytest.raises(rp.CollectiveMismatchError) as e:
        run(step_fn, lambda r: np.ones(3), k=k)
    _assert_names_lines(e, "MARK some")
    assert "only some replicas" in str(e.value)


def test_conditional_collective_followed_by_a_common_one():
    def step_fn(x):
        if rp.replica_id() == 0:
            x = rp.all_reduce(x, "sum")  # MARK cond-first
        return {"y": rp.all_gather(x)}  # MARK cond-second

    with pytest.raises(rp.CollectiveMismatchError) as e:
        run(step_fn, lambda r: np.ones(3))
    _assert_names_lines(e, "MARK cond-first", "MARK cond-second")


def test_different_op_in_different_replicas():
    def step_fn(x):
        if rp.replica_id() == 0:
            y = rp.all_reduce(x, "sum")  # MARK op-sum
        else:
            y = rp.all_reduce(x, "max")  # MARK op-max
        return {"y": y}

    with pytest.raises(rp.CollectiveMismatchError) as e:
        run(step_fn, lambda r: np.ones(3))
    _assert_names_lines(e, "MARK op-sum", "MARK op-max")
    assert "'sum'" in str(e.value) and "'max'" in str(e.value)


def test_different_argument_in_different_replicas():
    def step_fn(x):
        return {"y": rp.broadcast(x, root=rp.replica_id())}  # MARK root

    with pytest.raises(rp.CollectiveMismatchError) as e:
        run(step_fn, lambda r: np.ones(3))
    _assert_names_lines(e, "MARK root")


def test_mismatch_is_a_replicate_error_and_nothing_is_written():
    w = rp.Variable(np.ones(2), name="w_untouched")

    def step_fn(x):
        w.assign(w + rp.all_reduce(x, "sum" if rp.replica_id() == 0 else "min"))
        return {"y": x.sum()}

    with pytest.raises(rp.ReplicateError):
        run(step_fn, lambda r: np.ones(2))
    np.testing.assert_array_equal(w.numpy(), np.ones(2))


def test_replicas_writing_different_values_into_a_variable():
    w = rp.Variable(np.zeros(3), name="w_diverging")

    def step_fn(x):
        w.assign(w + x)  # MARK diverge
        return {"y": x.sum()}

    with pytest.raises(rp.DivergenceError, match="different values of variables.*\n.*"
                       "variable 'w_diverging'") as e:
        run(step_fn, lambda r: np.full(3, float(r)))
    _assert_names_lines(e, "MARK diverge")
    np.testing.assert_array_equal(w.numpy(), np.zeros(3))


def test_variable_updated_by_only_some_replicas():
    w = rp.Variable(np.zeros(3), name="w_some")

    def step_fn(x):
        if rp.replica_id() == 1:
            w.assign(w + rp.all_reduce(x) * 0.0)
        else:
            rp.all_reduce(x)
        return {"y": x.sum()}

    with pytest.raises(rp.ReplicateError, match="w_some"):
        run(step_fn, lambda r: np.ones(3))


def test_replicas_writing_the_same_reduced_value_is_fine():
    w = rp.Variable(np.zeros(3), name="w_same")

    def step_fn(x):
        w.assign(w + rp.all_reduce(x, "mean"))
        return {"y": x.sum()}

    run(step_fn, lambda r: np.full(3, float(r)), k=3, steps=4)
    np.testing.assert_allclose(w.numpy(), np.full(3, 4.0))


# -- errors: invalid options -----------------------------------------------------------------------
def _input_fn(ctx):
    while True:
        yield np.ones(2)


def _step_fn(x):
    return {"y": x.sum()}


@pytest.mark.parametrize("kwargs,match", [
    ({"replicas_per_rank": 0}, "replicas_per_rank"),
    ({"replicas_per_rank": -1}, "replicas_per_rank"),
    ({"replicas_per_rank": 1.5}, "replicas_per_rank"),
    ({"replicas_per_rank": "2"}, "replicas_per_rank"),
    ({"mode": "lazy"}, "mode"),
    ({"backend": "no-such-backend"}, "backend"),
    ({"mode": "eager", "replicas_per_rank": 2}, "eager"),
    ({"outputs": "median"}, "outputs"),
])
def test_invalid_options(kwargs, match):
    with pytest.raises(rp.ReplicateError, match=match):
        rp.Replicator(_input_fn, _step_fn, **kwargs)


def test_invalid_callables_and_steps():
    with pytest.raises(rp.ReplicateError):
        rp.Replicator(None, _step_fn)
    with pytest.raises(rp.ReplicateError):
        rp.Replicator(_input_fn, "not a function")
    with pytest.raises(rp.ReplicateError, match="steps"):
        rp.Replicator(_input_fn, _step_fn).run(steps=-1)


def test_step_fn_returning_differently_structured_outputs():
    def step_fn(x):
        return {"a": x.sum()} if rp.replica_id() == 0 else {"b": x.sum()}

    with pytest.raises(rp.ReplicateError):
        run(step_fn, lambda r: np.ones(2))


# -- outputs, replica ids, tracing -----------------------------------------------------------------
@pytest.mark.parametrize("k", [1, 2, 4])
def test_output_reductions(k):
    def step_fn(x):
        rid = rnp.asarray(float(rp.replica_id()))
        return {"id": rid, "vec": x * rid}

    ids = np.arange(k, dtype=float)
    for outputs, expect_id in [("mean", ids.mean()), ("sum", ids.sum()), ("per_replica", ids)]:
        hist, _ = run(step_fn, lambda r: np.ones(2), k=k, outputs=outputs, steps=1)
        np.testing.assert_allclose(hist[0]["id"], expect_id)
        expect_vec = {"mean": np.full(2, ids.mean()), "sum": np.full(2, ids.sum()),
                      "per_replica": np.stack([np.full(2, i) for i in ids])}[outputs]
        np.testing.assert_allclose(hist[0]["vec"], expect_vec)


def test_trace_count_stays_one_over_many_steps_and_runs():
    w = rp.Variable(np.zeros(3), name="w_count")
    calls = []

    def step_fn(x):
        calls.append(rp.replica_id())
        w.assign(w + rp.all_reduce(x, "mean"))
        return {"y": x.sum()}

    hist, rep = run(step_fn, lambda r: np.full(3, float(r)), k=3, steps=25)
    assert len(hist) == 25
    hist += rep.run(15)
    assert len(hist) == 40
    assert rep.trace_count == 1
    assert sorted(calls) == [0, 1, 2]  # step_fn was traced once per local replica, then replayed
    np.testing.assert_allclose(w.numpy(), np.full(3, 40.0))


def test_a_new_input_signature_retraces_once():
    def input_fn(ctx):
        for i in range(12):
            yield np.ones(4 if i < 6 else 2)

    def step_fn(x):
        return {"s": rp.all_reduce(x.sum(), "sum")}

    rep = rp.Replicator(input_fn, step_fn, replicas_per_rank=2)
    hist = rep.run()
    assert [float(h["s"]) for h in hist] == [8.0] * 6 + [4.0] * 6
    assert rep.trace_count == 2


def test_compiled_graph_before_any_step_is_an_error():
    with pytest.raises(rp.ReplicateError):
        rp.Replicator(_input_fn, _step_fn).compiled_graph()


# -- input that runs out ---------------------------------------------------------------------------
@pytest.mark.parametrize("k", [2, 3])
def test_input_running_out_on_one_replica_stops_all_with_a_warning(k):
    def input_fn(ctx):
        for i in range(3 + 2 * ctx.replica_id):
            yield np.full(2, float(i))

    def step_fn(x):
        return {"s": rp.all_reduce(x, "sum")}

    rep = rp.Replicator(input_fn, step_fn, replicas_per_rank=k, outputs="per_replica")
    with pytest.warns(UserWarning, match="ran out"):
        hist = rep.run(steps=10)
    assert len(hist) == 3
    for i, h in enumerate(hist):
        np.testing.assert_allclose(h["s"], np.full((k, 2), float(i * k)))
    assert rep.step == 3
    with pytest.warns(UserWarning, match="ran out"):  # asking again: still stopped, no error
        assert rep.run(steps=2) == []


def test_input_ending_everywhere_at_once_stops_quietly():
    def input_fn(ctx):
        return rp.shard_batches(np.arange(48.0), 4, ctx, epochs=1)

    rep = rp.Replicator(input_fn, lambda x: {"s": rp.all_reduce(x.sum())}, replicas_per_rank=3)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        hist = rep.run()
    assert len(hist) == rp.data.steps_per_epoch(48, 4, 3) == 4
    # every replica sees the all-reduced sum of the global batch: over the epoch, every row once
    assert sum(float(h["s"]) for h in hist) == np.arange(48.0).sum()


# -- data sharding ---------------------------------------------------------------------------------
def _ctx(r, R):
    return ReplicaContext(replica_id=r, num_replicas=R)


def _epoch(data, B, R, **kw):
    return [list(rp.shard_batches(data, B, _ctx(r, R), **kw)) for r in range(R)]


@pytest.mark.parametrize("R", [1, 2, 3, 4])
@pytest.mark.parametrize("shuffle", [True, False])
def test_shards_are_disjoint_equal_length_and_cover_the_epoch(R, shuffle):
    n, B = 96, 4
    data = {"x": np.arange(n), "neg": -np.arange(n) * 10}
    per_replica = _epoch(data, B, R, shuffle=shuffle, seed=5)
    assert len({len(b) for b in per_replica}) == 1  # the same number of batches everywhere
    assert len(per_replica[0]) == n // (R * B)
    rows = []
    for batches in per_replica:
        for b in batches:
            assert b["x"].shape == (B,)
            np.testing.assert_array_equal(b["neg"], -b["x"] * 10)  # rows stay together
            rows.extend(b["x"].tolist())
    assert sorted(rows) == list(range(n))  # disjoint and covering


@pytest.mark.parametrize("R", [2, 3, 4])
@pytest.mark.parametrize("remainder", ["drop", "pad"])
def test_global_batches_equal_one_replica_with_R_times_the_batch(R, remainder):
    n, B = 100, 4
    data = (np.arange(n), np.arange(n) * 2.0)
    per_replica = _epoch(data, B, R, seed=9, epochs=2, remainder=remainder)
    single = list(rp.shard_batches(data, R * B, None, seed=9, epochs=2, remainder=remainder))
    assert all(len(b) == len(single) for b in per_replica)
    for s, big in enumerate(single):
        parts = [per_replica[r][s] for r in range(R)]
        if remainder == "pad":
            np.testing.assert_array_equal(np.concatenate([p[1] for p in parts]), big[1])
            parts, big = [p[0] for p in parts], big[0]
        for j in range(2):
            np.testing.assert_array_equal(np.concatenate([p[j] for p in parts]), big[j])


def test_drop_remainder_leaves_out_the_incomplete_global_batch():
    n, B, R = 50, 4, 3
    per_replica = _epoch(np.arange(n), B, R, seed=2, remainder="drop")
    assert [len(b) for b in per_replica] == [4, 4, 4]  # 50 // 12
    rows = np.concatenate([b for batches in per_replica for b in batches])
    assert len(rows) == 48 and len(set(rows.tolist())) == 48
    assert rp.data.steps_per_epoch(n, B, R, "drop") == 4


def test_pad_remainder_masks_the_filler_rows():
    n, B, R = 50, 4, 3
    per_replica = _epoch(np.arange(n), B, R, seed=2, remainder="pad")
    assert [len(b) for b in per_replica] == [5, 5, 5]  # ceil(50 / 12)
    assert rp.data.steps_per_epoch(n, B, R, "pad") == 5
    real, filler = [], 0
    for batches in per_replica:
        for rows, mask in batches:
            assert rows.shape == (B,) and mask.shape == (B,)
            assert set(np.unique(mask).tolist()) <= {0.0, 1.0}
            real.extend(rows[mask == 1].tolist())
            filler += int((mask == 0).sum())
    assert sorted(real) == list(range(n))  # every real row exactly once
    assert filler == 5 * R * B - n


def test_epochs_reshuffle_and_repeat():
    n, B = 24, 4
    two = list(rp.shard_batches(np.arange(n), B, None, seed=1, epochs=2))
    first, second = np.concatenate(two[:6]), np.concatenate(two[6:])
    assert sorted(first.tolist()) == sorted(second.tolist()) == list(range(n))
    assert not np.array_equal(first, second)
    forever = rp.shard_batches(np.arange(n), B, None, seed=1, epochs=None)
    head = list(itertools.islice(forever, 12))
    for a, b in zip(head, two):
        np.testing.assert_array_equal(a, b)


def test_start_step_resumes_the_same_sequence():
    data = np.arange(40)
    full = list(rp.shard_batches(data, 2, _ctx(1, 2), seed=3, epochs=3))
    resumed = list(rp.shard_batches(data, 2, _ctx(1, 2), seed=3, epochs=3, start_step=7))
    assert len(resumed) == len(full) - 7
    for a, b in zip(resumed, full[7:]):
        np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("kwargs", [{"remainder": "wrap"}, {"batch_size": 0}, {"batch_size": 99}])
def test_shard_batches_rejects_bad_arguments(kwargs):
    args = {"batch_size": 4, **kwargs}
    with pytest.raises(rp.ReplicateError):
        list(rp.shard_batches(np.arange(20), args.pop("batch_size"), _ctx(0, 2), **args))


def test_shard_batches_rejects_arrays_of_different_lengths():
    with pytest.raises(rp.ReplicateError, match="different lengths"):
        list(rp.shard_batches((np.arange(10), np.arange(11)), 2))


# -- the rewrite, seen in the printed IR -----------------------------------------------------------
def _mean_step(w):
    def step_fn(x):
        w.assign(w + rp.all_reduce(x, "mean"))
        return {"y": x.sum()}
    return step_fn


def test_debug_ir_shows_placeholders_before_and_local_reduce_after(monkeypatch, capsys):
    monkeypatch.setenv("REPLICATE_DEBUG", "ir")
    w = rp.Variable(np.zeros(2), name="w_ir")
    run(_mean_step(w), lambda r: np.full(2, r + 1.0), k=2, steps=3)
    out = capsys.readouterr().out
    sections = {}
    for block in out.split("# replicated step: ")[1:]:
        title, _, body = block.partition("\n")
        sections[title.strip()] = body
    assert {"traced (placeholders)", "after collective rewrite", "final"} <= set(sections)
    before, after = sections["traced (placeholders)"], sections["after collective rewrite"]
    assert before.count("collective[") == 2 and "kind='all_reduce'" in before
    assert "local_reduce" not in before
    assert "collective[" not in after and "local_reduce" in after
    assert "collective[" not in sections["final"] and "local_reduce" in sections["final"]
    assert out.count("# replicated step: final") == 1  # compiled once for three steps
    np.testing.assert_allclose(w.numpy(), np.full(2, 4.5))


def _oracle_step(k, opt="adam"):
    params = oracle.make_params()
    base = rp.optim.Adam(params, lr=0.05) if opt == "adam" else rp.optim.SGD(params, lr=0.3)
    optimizer = rp.wrap_optimizer(base)
    x, y = oracle.dataset()

    def step_fn(b):
        loss = oracle.loss_fn(params, *b)
        optimizer.apply(rp.grad(loss, params))  # MARK apply
        return {"loss": loss}

    batches = [(x[8 * r:8 * r + 8], y[8 * r:8 * r + 8]) for r in range(k)]
    contexts = [ReplicaContext(r, k, 0, 1, r, k) for r in range(k)]
    return step_fn, batches, contexts, params


@pytest.mark.parametrize("k", [1, 2, 3])
def test_pipeline_stages_printed_and_valid(k):
    step_fn, batches, contexts, _ = _oracle_step(k)
    traced = trace_step(step_fn, batches, contexts)
    validate(traced)
    text = str(traced)
    # three gradients all-reduced per replica
    assert text.count("collective[") == 3 * k and "local_reduce" not in text
    rewritten = replicate_collectives(traced, k)
    validate(rewritten)
    text = str(rewritten)
    assert "collective[" not in text and "mpi_" not in text
    assert text.count("local_reduce") == (3 if k > 1 else 0)
    merged = cse(rewritten)
    validate(merged)
    final = step_graph(step_fn, batches, contexts, 1, 0)
    validate(final)
    validate(dce(merged))


def test_rewrite_for_several_processes_emits_one_mpi_call_per_collective():
    """Rewriting for n=2 processes (without running it): one local combine then one MPI call."""
    k = 2
    step_fn, batches, contexts, _ = _oracle_step(k)
    traced = trace_step(step_fn, batches, contexts)
    rewritten = replicate_collectives(traced, k, n=2, rank=1)
    validate(rewritten)
    prims = collections.Counter(node.prim for node in rewritten.nodes)
    assert prims["local_reduce"] == 3 and prims["mpi_allreduce"] == 3
    assert prims["collective"] == 0
    schedule = collective_schedule(cse(rewritten))
    assert len(schedule) == 3
    for text, where in schedule:
        assert text.startswith("mpi_allreduce[op=sum,size=2]")
        # the cross-process mismatch check reports this: it must name the user's line
        assert f"{THIS_FILE}:{line_of('MARK apply')}" in where, where


def test_equal_collectives_are_neither_merged_nor_hidden_from_the_schedule():
    """Two equal all-reduces are two exchanges with the other processes: CSE keeps both (one
    rank's duplicate must not vanish into the call every rank makes) and the schedule the ranks
    compare is the one written, with the gathering of the outputs at its end."""
    k = 2
    contexts = [ReplicaContext(2 + r, k * 2, 1, 2, r, k) for r in range(k)]

    def step_fn(x):
        a = rp.all_reduce(x, "sum")  # MARK equal-a
        b = rp.all_reduce(x, "sum")  # MARK equal-b
        return {"y": a + b}

    graph = step_graph(step_fn, [np.ones(3)] * k, contexts, 2, 1)
    assert [n.prim for n in cse(graph).nodes].count("mpi_allreduce") == 2
    schedule = graph.meta["collective_schedule"]
    assert [text for text, _ in schedule] == ["mpi_allreduce[op=sum,size=2] f64[3]"] * 2 + [
        "gather of step_fn's outputs (f64[3])"]
    for (_, where), mark in zip(schedule, ("equal-a", "equal-b")):
        assert f"{THIS_FILE}:{line_of('MARK ' + mark)}" in where, where
    assert "step_fn" in schedule[-1][1]


@pytest.mark.parametrize("kind,attrs", [("all_gather", {"axis": 0}), ("permute", {"shift": 1}),
                                        ("broadcast", {"root": 3}),
                                        ("reduce_scatter", {"op": "sum"})])
def test_rewrite_for_several_processes_other_kinds(kind, attrs):
    k, n = 2, 2
    fn = {"all_gather": rp.all_gather, "permute": rp.permute, "broadcast": rp.broadcast,
          "reduce_scatter": rp.reduce_scatter}[kind]
    contexts = [ReplicaContext(2 + r, k * n, 1, n, r, k) for r in range(k)]
    traced = trace_step(lambda x: {"y": fn(x, **attrs)},
                                             [np.ones(4)] * k, contexts)
    rewritten = replicate_collectives(traced, k, n=n, rank=1)
    validate(rewritten)
    prims = {node.prim for node in rewritten.nodes}
    expect = {"all_gather": "mpi_allgather", "permute": "mpi_allgather",
              "broadcast": "mpi_broadcast", "reduce_scatter": "mpi_allreduce"}[kind]
    assert expect in prims and "collective" not in prims


def _case_step(kind, attrs):
    import collective_cases as cc

    def step_fn(batch):
        y = cc.apply(kind, attrs, batch["x"])
        loss = (batch["c"] * y).sum()
        return {"y": y, "g": rp.grad(loss, batch["x"])}

    return step_fn


def _collective_case_params():
    import collective_cases as cc

    return [pytest.param(k, kind, attrs, id=f"k{k}-{name}")
            for k in (1, 2) for name, kind, attrs in cc.cases(2 * k)]


@pytest.mark.parametrize("k,kind,attrs", _collective_case_params())
def test_every_rank_compiles_the_same_cross_process_schedule(k, kind, attrs):
    """Compile (without running) the forward+gradient step of every collective as rank 0 and as
    rank 1 of two processes: both must emit the same MPI calls in the same order, or the run
    would fail the cross-process check (or hang). The gradient of a broadcast is unused on a rank
    without the root; its communication must not be dead-code eliminated there."""
    import collective_cases as cc

    n, R = 2, 2 * k
    X, C = cc.make_data(kind, attrs, R)
    schedules = []
    for rank in range(n):
        contexts = [ReplicaContext(rank * k + r, R, rank, n, r, k) for r in range(k)]
        batches = [{"x": X[c.replica_id], "c": C[c.replica_id]} for c in contexts]
        graph = step_graph(_case_step(kind, attrs), batches, contexts,
                                                    n, rank)
        validate(graph)
        assert not any(node.prim == "collective" for node in graph.nodes)
        schedules.append(collective_schedule(graph))
        # what the ranks compare (as written, plus the outputs' gathering) is what runs
        written = graph.meta["collective_schedule"]
        assert written[:-1] == schedules[-1] and "step_fn's outputs" in written[-1][0]
    assert len(schedules[0]) >= 2  # the forward collective and the one of its gradient
    assert [s for s, _ in schedules[0]] == [s for s, _ in schedules[1]]
    for _, where in schedules[0]:
        # the user's line (the collective's call or the rp.grad that made it), not the library's
        assert THIS_FILE in where or "collective_cases.py" in where, where


# -- CSE merges the k identical optimiser updates --------------------------------------------------
def _descendants_of(graph, prim):
    """Nodes that depend (transitively) on a node of primitive ``prim``."""
    tainted, count = set(), 0
    for node in graph.nodes:
        if node.prim == prim or any(i.id in tainted for i in node.inputs):
            tainted.add(node.out.id)
            count += node.prim != prim
    return count


@pytest.mark.parametrize("opt", ["sgd", "adam"])
def test_cse_leaves_one_update_chain_per_parameter(opt):
    update_sizes, sizes, before_cse = {}, {}, {}
    for k in (2, 3, 4):
        step_fn, batches, contexts, params = _oracle_step(k, opt)

        def input_fn(ctx, batches=batches):
            while True:
                yield batches[ctx.replica_id]

        rep = rp.Replicator(input_fn, step_fn, replicas_per_rank=k)
        rep.run(3)
        graph = rep.compiled_graph()
        validate(graph)
        prims = collections.Counter(node.prim for node in graph.nodes)
        # one local combine per gradient, one update per parameter (Adam: one sqrt of v each,
        # besides the step's one scalar bias correction)
        assert prims["local_reduce"] == len(params)
        if opt == "adam":
            assert sum(n.prim == "sqrt" and n.out.shape != () for n in graph.nodes) \
                == len(params)
            assert sum(n.prim == "sqrt" and n.out.shape == () for n in graph.nodes) == 1
        # outputs: k losses, then each updated variable once
        updated = graph.meta["updated"]
        assert len(graph.outputs) == k + len(updated)
        assert len({id(v) for v in updated}) == len(updated)
        slots = 1 if opt == "sgd" else 3  # the parameter (Adam: and its m and v)
        assert len(updated) == slots * len(params) + 1  # + the optimiser's step counter
        update_sizes[k] = _descendants_of(graph, "local_reduce")
        sizes[k] = len(graph.nodes)
        # before CSE each replica has its own copy of the update
        traced = trace_step(step_fn, batches, contexts)
        before_cse[k] = _descendants_of(replicate_collectives(traced, k), "local_reduce")
    # everything after the all-reduce is shared: it does not grow with k (before CSE it did)
    assert update_sizes[2] == update_sizes[3] == update_sizes[4] > 0
    assert update_sizes[2] < before_cse[2] < before_cse[3] < before_cse[4]
    # the per-replica part (forward and backward) grows by the same amount for every replica
    growth = [sizes[3] - sizes[2], sizes[4] - sizes[3]]
    assert all(g > 0 for g in growth)
    assert abs(growth[0] - growth[1]) <= 3  # (a few constants are shared once CSE'd)
