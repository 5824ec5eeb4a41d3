"""No silent wrong results (issue 13): the seven ways a newcomer's first-day program got a wrong
number without a word, each held here in graph and eager mode, against a NumPy reference or the
error that now says what is wrong — plus the class each belongs to:

1. a Variable written inside a traced ``rp.cond`` branch (and ``rp.switch``);
2. ``model.eval()`` after the step was compiled (and any attribute a trace reads);
3. ranks drifting apart without ``rp.wrap_optimizer`` (found at compile time and at run time);
4. a NumPy function on a library value (tests/api/test_numpy_functions.py holds the rest);
5. two default ``Dropout`` layers sharing a mask (tests/runtime/test_default_seeds.py holds
   the rest);
6. ``all_reduce(int, "mean")``;
7. ``check_finite`` letting a NaN update into the variables and a checkpoint.

The cases that need two processes run tests/runtime/programs/trust_mpi.py under ``mpiexec -n 2``.
"""

from __future__ import annotations

import json
import sys

import numpy as np
import pytest

import replicate as rp
import replicate.numpy as rnp
from conftest import PROGRAMS, checkpoint_files, held_back, mpirun, needs_mpi, report

sys.path.insert(0, PROGRAMS)
from trust_mpi import batches_of, nan_gradient_program  # noqa: E402

MODES = ("graph", "eager")


def accumulate_reference(replicas, steps=12, every=4, lr=0.05):
    """Gradient accumulation in NumPy: the mean gradient over replicas, applied every 4th."""
    streams = [batches_of(r) for r in range(replicas)]
    w, acc = np.zeros(3, np.float32), np.zeros(3, np.float32)
    for t in range(1, steps + 1):
        grads = []
        for s in streams:
            x, y = next(s)
            grads.append(2.0 / len(x) * x.T @ (x @ w - y))
        acc = acc + np.mean(grads, 0)
        if t % every == 0:
            w, acc = w - lr * acc, np.zeros(3, np.float32)
    return w


# -- 1. traced control flow with state ------------------------------------------------------------
def make_accumulating_step(w, acc, t, every=4, lr=0.05, construct="cond"):
    def step(x, y):
        loss = ((x @ w - y) ** 2).mean()
        acc.assign(acc + rp.grad(loss, w))
        t.assign(t + 1)

        def apply():
            w.assign(w - lr * acc)
            acc.assign(rnp.zeros_like(acc.read()))
            return rnp.asarray(1.0)

        def skip():
            return rnp.asarray(0.0)

        due = (t // every) * every == t
        if construct == "cond":
            applied = rp.cond(due, apply, skip)
        else:
            applied = rp.switch(rnp.cast(due, np.int32), [skip, apply])
        return loss, applied

    return step


@pytest.mark.parametrize("construct", ["cond", "switch"])
@pytest.mark.parametrize("mode", MODES)
def test_variable_written_in_a_branch_is_committed_only_when_taken(mode, construct):
    w = rp.Variable(np.zeros(3, np.float32), name="w")
    acc = rp.Variable(np.zeros(3, np.float32), name="acc")
    t = rp.Variable(np.zeros((), np.int64), name="t")
    step = rp.function(make_accumulating_step(w, acc, t, construct=construct), mode=mode)
    batches = batches_of(0)
    applied = [float(step(*next(batches))[1]) for _ in range(12)]
    assert applied == [0, 0, 0, 1] * 3
    np.testing.assert_allclose(w.numpy(), accumulate_reference(1), rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(acc.numpy(), np.zeros(3))
    if mode == "graph":
        assert step.trace_count == 1


@pytest.mark.parametrize("mode", MODES)
def test_a_branch_reads_variables_as_they_were_before_the_choice(mode):
    v = rp.Variable(np.array(1.0, np.float32), name="v")
    seen = rp.Variable(np.array(0.0, np.float32), name="seen")

    def bump():
        v.assign(v + 10.0)
        return v.read()

    def look():
        seen.assign(v.read())  # the other branch's write is not visible here
        return v.read()

    f = rp.function(lambda p: rp.cond(p, bump, look), mode=mode)
    assert float(f(np.array(False))) == 1.0 and float(seen.numpy()) == 1.0
    assert float(f(np.array(True))) == 11.0 and float(v.numpy()) == 11.0
    assert float(seen.numpy()) == 1.0  # not written when its branch was not taken


@pytest.mark.parametrize("mode", MODES)
def test_nested_conds_and_a_random_generator_in_a_branch(mode):
    gen = rnp.random.Generator(seed=7)
    count = rp.Variable(np.zeros((), np.int64), name="count")

    def inner_true():
        count.assign(count + 100)
        return gen.uniform(())

    def outer_true(x):
        count.assign(count + 1)
        return rp.cond(x > 5.0, inner_true, lambda: rnp.asarray(0.0, np.float32))

    f = rp.function(lambda x: rp.cond(x > 0.0, outer_true, lambda x: rnp.asarray(-1.0, np.float32),
                                      x), mode=mode)
    state0 = gen.state.numpy().copy()
    assert float(f(np.float32(-1.0))) == -1.0
    assert int(count.numpy()) == 0
    np.testing.assert_array_equal(gen.state.numpy(), state0)  # no draw: the key did not move
    assert float(f(np.float32(1.0))) == 0.0 and int(count.numpy()) == 1
    u = float(f(np.float32(9.0)))
    assert 0.0 <= u < 1.0 and int(count.numpy()) == 102
    assert not np.array_equal(gen.state.numpy(), state0)


@pytest.mark.parametrize("mode", MODES)
def test_cond_refuses_a_non_scalar_predicate(mode):
    f = rp.function(lambda x: rp.cond(x > 0, lambda: x, lambda: -x), mode=mode)
    with pytest.raises(rp.ReplicateError, match="predicate must be a scalar"):
        f(np.ones(3))


def test_switch_clamps_its_index_in_both_modes():
    fns = [lambda x: x, lambda x: x * 2.0, lambda x: x * 3.0]
    for mode in MODES:
        f = rp.function(lambda i, x: rp.switch(i, fns, x), mode=mode)
        assert [float(f(np.int32(i), np.float32(1.0))) for i in (-1, 0, 1, 2, 7)] == \
            [1.0, 1.0, 2.0, 3.0, 3.0]


# -- 2. everything a trace depends on is in the cache key -----------------------------------------
def test_eval_after_compile_turns_dropout_off_and_retraces_once():
    net = rp.nn.Sequential(rp.nn.Linear(4, 32), rp.nn.Dropout(0.5))
    step = rp.function(lambda x: net(x))
    x = np.ones((4, 4), np.float32)
    assert (step(x) == 0).sum() > 0
    net.eval()
    out = step(x)
    assert (out == 0).sum() == 0
    p = {n: v.numpy() for n, v in net.parameters().items()}
    np.testing.assert_allclose(out, x @ p["0.weight"] + p["0.bias"], rtol=1e-5)
    assert step.trace_count == 2
    net.train()  # back to the first compiled step: no third trace
    assert (step(x) == 0).sum() > 0
    net.eval()
    step(x)
    assert step.trace_count == 2


def test_eval_after_compile_in_a_replicator_both_modes():
    for mode in MODES:
        net = rp.nn.Sequential(rp.nn.Linear(3, 16), rp.nn.Dropout(0.5))
        rep = rp.Replicator(lambda ctx: batches_of(ctx.replica_id),
                            lambda b: {"zeros": rnp.sum(net(b[0]) == 0.0)}, mode=mode)
        assert all(h["zeros"] > 0 for h in rep.run(2))
        net.eval()
        assert all(h["zeros"] == 0 for h in rep.run(2))
        assert rep.trace_count == (2 if mode == "graph" else 0)


class Temperature(rp.nn.Module):
    """A custom layer with a plain attribute read at trace time."""

    def __init__(self, temperature=1.0):
        super().__init__()
        self.temperature = temperature

    def forward(self, logits):
        return rp.nn.functional.softmax(rnp.as_array(logits) / self.temperature)


SETTINGS = {"scale": 1.0}


class GloballyScaled(rp.nn.Module):
    """A layer that reads Python state kept outside itself: it declares it in trace_key()."""

    def trace_key(self):
        return SETTINGS["scale"]

    def forward(self, x):
        return rnp.as_array(x) * SETTINGS["scale"]


def test_a_layer_attribute_changed_after_compile_takes_effect():
    layer = Temperature(1.0)
    f = rp.function(lambda x: layer(x))
    logits = np.array([1.0, 2.0, 3.0], np.float32)
    a = f(logits)
    layer.temperature = 100.0
    b = f(logits)
    np.testing.assert_allclose(b, np.exp(logits / 100) / np.exp(logits / 100).sum(), rtol=1e-5)
    assert not np.allclose(a, b) and f.trace_count == 2


def test_a_layer_declares_outside_state_in_trace_key():
    layer = GloballyScaled()
    f = rp.function(lambda x: layer(x))
    try:
        assert float(f(np.float32(2.0))) == 2.0
        SETTINGS["scale"] = 3.0
        assert float(f(np.float32(2.0))) == 6.0
        assert f.trace_count == 2
    finally:
        SETTINGS["scale"] = 1.0


def test_optimizer_learning_rate_changed_after_compile_takes_effect():
    w = rp.Variable(np.zeros(2), name="w_lr")
    opt = rp.optim.SGD([w], lr=0.1)
    step = rp.function(lambda g: opt.apply([g]))
    step(np.ones(2))
    opt.lr = 1.0
    step(np.ones(2))
    np.testing.assert_allclose(w.numpy(), [-1.1, -1.1])
    assert step.trace_count == 2


# -- 3. divergence: one replica's update from its own data ----------------------------------------
def test_unreduced_update_with_two_replicas_in_a_process_names_the_variable_and_line():
    w = rp.Variable(np.zeros(3, np.float32), name="w_local_grads")
    opt = rp.optim.SGD([w], lr=0.1)

    def step_fn(batch):
        x, y = batch
        loss = ((x @ w - y) ** 2).mean()
        opt.apply([rp.grad(loss, w)])  # MARK no-wrap
        return {"loss": loss}

    rep = rp.Replicator(lambda ctx: batches_of(ctx.replica_id), step_fn,
                        replicas_per_rank=2)
    with pytest.raises(rp.DivergenceError, match="'w_local_grads'") as e:
        rep.run(1)
    assert "MARK no-wrap" in str(e.value) and "wrap_optimizer" in str(e.value)
    np.testing.assert_array_equal(w.numpy(), np.zeros(3))


def test_a_per_replica_random_key_reaching_a_variable_is_divergent():
    gen = rnp.random.Generator(seed=1)
    noise = rp.Variable(np.zeros(2, np.float32), name="noise")

    def step_fn(x):
        noise.assign(gen.normal((2,)))  # each replica draws its own numbers
        return {"x": x.sum()}

    rep = rp.Replicator(lambda ctx: iter([np.ones(2)] * 3), step_fn, replicas_per_rank=2)
    with pytest.raises(rp.DivergenceError, match="per-replica random key"):
        rep.run(1)


def test_one_replica_in_all_has_nothing_to_diverge_from():
    w = rp.Variable(np.zeros(3, np.float32), name="w_single")
    opt = rp.optim.SGD([w], lr=0.1)

    def step_fn(batch):
        x, y = batch
        opt.apply([rp.grad(((x @ w - y) ** 2).mean(), w)])
        return {}

    rp.Replicator(lambda ctx: batches_of(0), step_fn).run(2)
    assert np.abs(w.numpy()).sum() > 0


# -- 4. a NumPy function on a library value (the rest: tests/api/test_numpy_functions.py) ----------
@pytest.mark.parametrize("mode", MODES)
def test_numpy_function_on_a_library_value_names_the_rnp_equivalent(mode):
    w = rp.Variable(np.ones((3, 2), np.float32), name="w_np")

    def step(x):
        h = np.tanh(x @ w)  # MARK numpy-habit
        return rnp.sum(h)

    with pytest.raises(rp.NumpyConversionError, match="np.tanh") as e:
        rp.function(step, mode=mode)(np.ones((4, 3), np.float32))
    assert "rnp.tanh" in str(e.value) and "MARK numpy-habit" in str(e.value)


# -- 5. default dropout keys (the rest: tests/runtime/test_default_seeds.py) -----------------------
@pytest.mark.parametrize("mode", MODES)
def test_two_default_dropouts_draw_different_masks(mode):
    a, b = rp.nn.Dropout(0.5), rp.nn.Dropout(0.5)
    x = np.ones(64, np.float32)
    f = rp.function(lambda v: (a(v) == 0, b(v) == 0), mode=mode)
    mask_a, mask_b = f(x)
    assert mask_a.any() and mask_b.any() and (mask_a != mask_b).any()


@pytest.mark.parametrize("mode", MODES)
def test_python_if_on_a_variable_reads_its_value_or_refuses(mode):
    """The PyTorch habit ``if flag:`` on a Variable holding False: an object's default truthiness
    would be True in both modes."""
    flag = rp.Variable(np.array(False), name="flag")
    w = rp.Variable(np.array(0.0), name="w_if")

    def step():
        if flag:
            w.assign(w + 1.0)
        return w.read()

    f = rp.function(step, mode=mode)
    if mode == "eager":
        assert float(f()) == 0.0 and float(w.numpy()) == 0.0
    else:
        with pytest.raises(rp.TracerConversionError, match="bool"):
            f()
    assert float(rp.Variable(np.array(2.5))) == 2.5 and int(rp.Variable(np.array(3))) == 3


# -- 6. integer collectives -----------------------------------------------------------------------
@pytest.mark.parametrize("dtype", [np.int32, np.int64, np.uint32, np.bool_])
@pytest.mark.parametrize("mode", MODES)
def test_integer_mean_is_an_error_in_both_modes(mode, dtype):
    x = np.array([1, 2, 3]).astype(dtype)
    for collective in (lambda v: rp.all_reduce(v, "mean"),
                       lambda v: rp.reduce_scatter(v, "mean")):
        with pytest.raises(rp.DTypeError, match="cast first"):
            rp.function(collective, mode=mode)(x)
    # sum, max and min stay integer operations
    np.testing.assert_array_equal(rp.function(lambda v: rp.all_reduce(v, "sum"), mode=mode)(x),
                                  x)


def test_integer_mean_in_a_replicator_with_two_replicas():
    rep = rp.Replicator(lambda ctx: iter([np.arange(3)] * 2),
                        lambda x: {"m": rp.all_reduce(x, "mean")}, replicas_per_rank=2)
    with pytest.raises(rp.DTypeError, match="int64"):
        rep.run(1)


# -- 7. check_finite checks what is written -------------------------------------------------------
BACKGROUND = pytest.mark.parametrize("asynchronous", [False, True], ids=["sync", "background"])


@BACKGROUND
@pytest.mark.parametrize("mode,k", [("graph", 1), ("graph", 2), ("eager", 1)])
def test_a_nan_update_is_never_written_nor_checkpointed(mode, k, asynchronous, tmp_path,
                                                        monkeypatch):
    """In the background (``asynchronous=True``) step 3's write is held back, so step 4's update
    is refused while it is in flight: ``run`` raises once that write is done."""
    if asynchronous:
        held_back(monkeypatch, 0.3)
    rep, w, opt = nan_gradient_program(mode, k)
    pattern = str(tmp_path / "ckpt-{step}.npz")
    state = {"w": w, "opt": opt.optimizer.variables()}
    ck = rp.callbacks.Checkpoint(pattern, state, every=1, asynchronous=asynchronous)
    with np.errstate(all="ignore"), pytest.raises(rp.NonFiniteError) as e:
        rep.run(callbacks=[ck])
    if asynchronous:
        assert ck.writer._thread is None  # waited for
    message = str(e.value)
    assert message.startswith("step 4: non-finite values"), message
    assert "variable 'w' (this step's update, not written): nan" in message
    if mode == "graph":
        assert "first non-finite value" in message and "MARK nan-update" in message
    assert rep.step == 3 and np.isfinite(w.numpy()).all()
    assert int(opt.optimizer.step.numpy()) == 3  # the whole update was held back
    assert checkpoint_files(tmp_path) == ["ckpt-1.npz", "ckpt-2.npz", "ckpt-3.npz"]
    saved = np.load(tmp_path / "ckpt-3.npz")
    before = w.numpy().copy()
    w.load(np.zeros(3, np.float32))
    rp.checkpoint.restore(pattern, state)
    np.testing.assert_array_equal(w.numpy(), before)
    assert all(np.isfinite(saved[k]).all() for k in saved.files if saved[k].dtype.kind == "f")


# -- the cases across two processes ---------------------------------------------------------------
def with_mpi(test):
    for mark in needs_mpi:
        test = mark(test)
    return test


def run_case(case, mode, tmp_path, expect_ok=True):
    result = mpirun("trust_mpi.py", case, mode, str(tmp_path), timeout=120)
    if expect_ok:
        assert result.returncode == 0, report(result)
    out = []
    for r in range(2):
        path = tmp_path / f"rank{r}.json"
        out.append(json.loads(path.read_text()) if path.exists() else None)
    return out, result


@with_mpi
@pytest.mark.parametrize("mode", MODES)
def test_mpi_accumulation_with_cond_matches_numpy(mode, tmp_path):
    ranks, _ = run_case("accumulate", mode, tmp_path)
    for r in ranks:
        assert r["error"] is None
        assert r["applied"] == [0, 0, 0, 1] * 3
        np.testing.assert_allclose(r["w"], accumulate_reference(2), rtol=1e-5, atol=1e-6)


@with_mpi
@pytest.mark.parametrize("mode", MODES)
def test_mpi_eval_after_compile(mode, tmp_path):
    ranks, _ = run_case("eval_after_compile", mode, tmp_path)
    for r in ranks:
        assert r["error"] is None and min(r["train"]) > 0 and r["eval"] == [0, 0]
        assert r["trace_count"] == (2 if mode == "graph" else 0)


@with_mpi
@pytest.mark.parametrize("mode", MODES)
def test_mpi_drift_without_wrap_optimizer_is_found(mode, tmp_path):
    ranks, _ = run_case("drift", mode, tmp_path)
    for r in ranks:
        kind, message = r["error"]
        assert kind == "DivergenceError" and "'w'" in message, message
        if mode == "graph":  # at compile time, naming the assign's line
            assert "MARK drift-local" in message
        else:  # at run time, naming the step
            assert message.startswith("step 3, at the end of run"), message


@with_mpi
@pytest.mark.parametrize("mode", MODES)
def test_mpi_rank_dependent_branch_is_found_at_run_time(mode, tmp_path):
    ranks, _ = run_case("drift_branch", mode, tmp_path)
    for r in ranks:
        kind, message = r["error"]
        assert kind == "DivergenceError" and "variable 'w'" in message
        assert "rank(s) [1] differ from rank 0" in message


@with_mpi
@BACKGROUND
@pytest.mark.parametrize("mode", MODES)
def test_mpi_diverged_state_is_never_checkpointed(mode, asynchronous, tmp_path):
    """In the background every rank raises the synchronous save's error at the next step
    boundary after the write found the copies differ (the end of this 3-step run)."""
    ranks, result = run_case("drift_checkpoint" + "_async" * asynchronous, mode, tmp_path)
    for r in ranks:
        kind, message = r["error"]
        assert kind == "DivergenceError", message
        assert message.startswith("step 2, before writing checkpoint"), message
    assert checkpoint_files(tmp_path / "ckpt") == []


@with_mpi
@pytest.mark.parametrize("mode", MODES)
def test_mpi_local_variable_is_each_process_own(mode, tmp_path):
    ranks, _ = run_case("local_variable", mode, tmp_path)
    assert all(r["error"] is None for r in ranks)
    assert ranks[0]["w"] == ranks[1]["w"] and ranks[0]["seen"] != ranks[1]["seen"]


@with_mpi
@pytest.mark.parametrize("mode", MODES)
def test_mpi_integer_mean_is_an_error(mode, tmp_path):
    ranks, result = run_case("int_mean", mode, tmp_path, expect_ok=False)
    if mode == "graph":  # found while compiling: every rank raises it
        assert result.returncode == 0, report(result)
        for r in ranks:
            assert r["error"][0] == "DTypeError" and "MARK int-mean" in r["error"][1]
    else:  # raised inside the eager step on each rank: the job ends, each rank names it
        assert result.returncode != 0
        assert result.stderr.count("DTypeError: all_reduce(i32[3], op='mean')") == 2, \
            report(result)


@with_mpi
@BACKGROUND
@pytest.mark.parametrize("mode", MODES)
def test_mpi_nan_update_is_not_written_on_any_rank(mode, asynchronous, tmp_path):
    ranks, _ = run_case("nan_update" + "_async" * asynchronous, mode, tmp_path)
    for r in ranks:
        kind, message = r["error"]
        assert kind == "NonFiniteError" and message.startswith("step 4:"), message
        assert r["step"] == 3 and np.isfinite(r["w"]).all()
        assert r["files"] == ["ckpt-1.npz", "ckpt-2.npz", "ckpt-3.npz"]
    assert ranks[0]["w"] == ranks[1]["w"]
    if asynchronous:  # (the writes of steps 1-3 done when run raised, the same on both ranks)
        saved = np.load(tmp_path / "ckpt" / "ckpt-3.npz")["var/w"]
        np.testing.assert_array_equal(saved, np.asarray(ranks[0]["w"], np.float32))
