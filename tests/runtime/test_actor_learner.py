"""``rp.ActorLearner`` in one process: actor threads feeding a learner (issue 19).

The multi-process cases (actor processes, learners in two processes, crashes that end the job)
are in test_actor_learner_mpi.py. Every wait here is bounded: a hang fails through the
``collective_timeout`` the tests pass, or pytest's own timeout of the file's process."""

from __future__ import annotations

import threading
import time
import warnings

import numpy as np
import pytest

import replicate as rp
import replicate.numpy as rnp

MODES = ["graph", "eager"]


def actor_threads():
    return [t for t in threading.enumerate() if t.name.startswith("replicate-actor")]


def wait_for_no_actor_threads(seconds=3.0):
    deadline = time.monotonic() + seconds
    while actor_threads() and time.monotonic() < deadline:
        time.sleep(0.02)
    return actor_threads()


def counting_setup(publish_every, mode="graph", actors=2, batch_size=2, **kwargs):
    """A learner whose Variable ``count`` is the number of its updates: the actors record the
    count they act with (the published copy) and the live one, so lags and staleness are
    checkable exactly."""
    count = rp.Variable(np.zeros((), np.int64), name="count")
    w = rp.Variable(np.zeros(3, np.float32), name="w")
    seen = []  # (actor, published count, live count) at the start of each trajectory

    def actor_fn(ctx):
        while True:
            published = int(count.numpy())  # the copy this trajectory acts with
            seen.append((ctx.actor_id, published, int(count.value)))
            yield {"x": np.full(3, ctx.actor_id, np.float32),
                   "seen": np.array(published, np.int64)}

    def step_fn(traj, lag):
        loss = ((traj["x"] * w - 1.0) ** 2).mean()
        w.assign(w - 0.1 * rp.grad(loss, w))
        expected = count - traj["seen"]  # (count: updates before this step)
        count.assign(count + 1)
        return {"lag": lag, "expected": expected, "loss": loss}

    al = rp.ActorLearner(actor_fn, step_fn, params=[count, w], actors=actors,
                         batch_size=batch_size, publish_every=publish_every, mode=mode,
                         outputs="per_replica", collective_timeout=20, **kwargs)
    return al, seen, count


@pytest.mark.parametrize("mode", MODES)
def test_lag_is_recorded_and_publication_every_n_steps_bounds_staleness(mode):
    al, seen, count = counting_setup(publish_every=3, mode=mode)
    history = al.run(steps=12)
    assert len(history) == 12 and int(count.numpy()) == 12
    for step, out in enumerate(history):
        lag = np.asarray(out["lag"]).reshape(-1)
        assert lag.dtype == np.int64 and lag.shape == (2,), out
        np.testing.assert_array_equal(lag, np.asarray(out["expected"]).reshape(-1),
                                      err_msg=f"step {step + 1}")
        assert (lag >= 0).all()
    published = {p for _, p, _ in seen}
    assert published <= {0, 3, 6, 9, 12}, published  # only what was published, every 3 steps
    assert all(0 <= live - p <= 3 for _, p, live in seen), seen  # at most publish_every old
    assert al.stats["trajectories"] == 24 and sum(al.stats["lags"].values()) == 24
    assert al.stats["publications"] == 5  # at the start, then after steps 3, 6, 9, 12
    assert not wait_for_no_actor_threads()


def test_max_lag_drops_older_trajectories():
    al, _, _ = counting_setup(publish_every=1, actors=1, batch_size=1, max_lag=0, queue_size=4)
    history = al.run(steps=6)
    assert all(int(np.asarray(h["lag"]).max()) == 0 for h in history)
    assert al.stats["dropped"] > 0  # the queue held trajectories of older parameters


@pytest.mark.parametrize("mode", MODES)
def test_newcomer_policy_at_module_level_shared_by_actor_threads(mode):
    """The habit from a single-threaded script: one policy at module level — ``rp.function``
    (graph) or the model itself (eager) — called from every actor thread. A compiled function
    is compiled once per thread (it reuses its buffers), so concurrent actors never mix their
    results; each acts with the published copy."""
    rp.nn.init.default_rng(0)
    model = rp.nn.Linear(4, 2)
    policy = rp.function(model) if mode == "graph" else model
    params = model.parameters()
    opt = rp.optim.SGD(params, lr=0.1)
    results = []

    def actor_fn(ctx):
        x = np.full((5, 4), ctx.actor_id + 1.0, np.float32)
        while True:
            logits = policy(x)
            reference = x @ model.weight.numpy() + model.bias.numpy()  # the same copy
            results.append(np.abs(np.asarray(logits) - reference).max())
            yield {"x": x, "target": np.zeros(5, np.int64)}

    def step_fn(traj, lag):
        logits = model(rnp.reshape(traj["x"], (-1, 4)))
        loss = rp.nn.softmax_cross_entropy(logits, rnp.reshape(traj["target"], (-1,))).mean()
        opt.apply(rp.grad(loss, params))
        return {"loss": loss}

    al = rp.ActorLearner(actor_fn, step_fn, params=params, actors=3, batch_size=2, mode=mode,
                         collective_timeout=20)
    losses = [float(h["loss"]) for h in al.run(steps=15)]
    assert losses[-1] < losses[0]
    assert results and max(results) < 1e-5
    if mode == "graph":
        assert policy.trace_count == 3  # one per actor thread


@pytest.mark.parametrize("mode", MODES)
def test_a_slow_actor_is_waited_for_and_a_fast_one_is_not_held_back(mode):
    w = rp.Variable(np.ones(2), name="w")

    def actor_fn(ctx):
        while True:
            if ctx.actor_id == 0:
                time.sleep(0.05)  # slow environment
            yield {"actor": np.array(ctx.actor_id, np.int64), "x": np.ones(2)}

    def step_fn(traj, lag):
        w.assign(w * 0.5 + 0.5 * traj["x"].mean(0))
        return {"actor": traj["actor"]}

    al = rp.ActorLearner(actor_fn, step_fn, params=[w], actors=2, mode=mode,
                         outputs="per_replica", collective_timeout=20)
    history = al.run(steps=20)
    actors = [int(np.asarray(h["actor"]).reshape(-1)[0]) for h in history]
    assert len(history) == 20 and actors.count(1) > actors.count(0), actors


def test_the_learner_finishing_first_stops_the_actors_and_a_second_run_restarts_them():
    w = rp.Variable(np.ones(2), name="w")
    runs = []

    def actor_fn(ctx):
        runs.append(ctx.run)
        while True:  # far faster than the learner: blocked on the full queue at the end
            yield np.ones(2)

    def step_fn(traj, lag):
        w.assign(w + traj.mean())
        return {}

    al = rp.ActorLearner(actor_fn, step_fn, params=[w], actors=2, queue_size=2,
                         collective_timeout=20)
    assert len(al.run(steps=4)) == 4
    assert not wait_for_no_actor_threads(), "actor threads left running after run()"
    assert len(al.run(steps=3)) == 3
    assert sorted(runs) == [0, 0, 1, 1]
    np.testing.assert_allclose(w.numpy(), 8.0)


def test_actors_that_finish_end_the_run_like_input_running_out():
    w = rp.Variable(np.ones(2), name="w")

    def actor_fn(ctx):
        for _ in range(3):
            yield np.ones(2)

    def step_fn(traj, lag):
        w.assign(w + 1.0)
        return {}

    al = rp.ActorLearner(actor_fn, step_fn, params=[w], actors=2, collective_timeout=20)
    assert len(al.run(steps=100)) == 6  # 2 actors x 3 trajectories, one per step


def crashing_setup(policy, crash_at=3, crashing=(1,), actors=2):
    w = rp.Variable(np.ones(2), name="w")

    def actor_fn(ctx):
        for i in range(1, 10 ** 6):
            if ctx.actor_id in crashing and i == crash_at:
                raise RuntimeError(f"injected failure in actor {ctx.actor_id}")  # MARK crash
            time.sleep(0.005)  # (the run outlasts the failing actor's first trajectories)
            yield np.ones(2)

    def step_fn(traj, lag):
        w.assign(w + traj.mean())
        return {}

    return rp.ActorLearner(actor_fn, step_fn, params=[w], actors=actors,
                           on_actor_failure=policy, collective_timeout=20)


def test_a_crashed_actor_ends_the_run_with_its_traceback_by_default():
    al = crashing_setup("abort")
    with pytest.raises(rp.ActorError) as info:
        al.run(steps=200)
    text = str(info.value)
    assert "actor 1 (rank 0, thread 'replicate-actor-1') failed making trajectory 3" in text
    assert "RuntimeError: injected failure in actor 1" in text
    assert "# MARK crash" in text and "test_actor_learner.py" in text  # the user's line
    assert "on_actor_failure='continue'" in text  # the way out is named
    assert not wait_for_no_actor_threads()


def test_a_crashed_actor_with_continue_is_reported_and_the_others_carry_on():
    al = crashing_setup("continue")
    with pytest.warns(UserWarning, match=r"(?s)actor 1 .*failed making trajectory 3.*"
                                         r"injected failure in actor 1.*carry on with the "
                                         r"remaining 1 actor"):
        history = al.run(steps=30)
    assert len(history) == 30
    assert len(al.stats["failed"]) == 1 and "actor 1" in al.stats["failed"][0]


def test_when_every_actor_has_crashed_continue_ends_with_an_error():
    al = crashing_setup("continue", crashing=(0, 1))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with pytest.raises(rp.ActorError, match=r"every actor has stopped \(2 failed"):
            al.run(steps=200)


def test_a_stalled_actor_is_reported_with_its_line_not_a_hang():
    release = threading.Event()
    w = rp.Variable(np.ones(2), name="w")

    def actor_fn(ctx):
        yield np.ones(2)
        release.wait(30)  # MARK stall
        yield np.ones(2)

    def step_fn(traj, lag):
        w.assign(w + 1.0)
        return {}

    al = rp.ActorLearner(actor_fn, step_fn, params=[w], actors=1, collective_timeout=0.5)
    t0 = time.monotonic()
    try:
        with pytest.raises(rp.ActorError) as info:
            al.run(steps=5)
    finally:
        release.set()
    assert time.monotonic() - t0 < 5
    text = str(info.value)
    assert "waited" in text and "limit 0.5 s" in text and "at step 2" in text, text
    assert "actor 0 (rank 0, thread 'replicate-actor-0'): at" in text and "# MARK stall" in text


def _ok_step(traj, lag):
    return {}


@pytest.mark.parametrize("kwargs, match", [
    (dict(actors=0), "actors must be a positive int"),
    (dict(publish_every=0), "publish_every must be a positive int"),
    (dict(batch_size=1.5), "batch_size must be a positive int"),
    (dict(queue_size=0), "queue_size must be a positive int"),
    (dict(max_lag=-1), "max_lag must be None or an int >= 0"),
    (dict(on_actor_failure="ignore"), "on_actor_failure must be one of"),
    (dict(actor_ranks=[0]), r"actor_ranks \[0\] leaves no process to learn"),
    (dict(actor_ranks=[2]), r"this job has processes 0..0"),
    (dict(params=[]), "params is empty"),
    (dict(params={"w": np.zeros(2)}), "params must be the rp.Variables.*got a ndarray"),
    (dict(params=[rp.Variable(np.zeros(2), local=True, name="mine")]),
     "Variable 'mine' is local"),
    (dict(step_fn=lambda batch: {}), r"called as step_fn\(trajectories, lag\)"),
])
def test_bad_arguments_are_named(kwargs, match):
    args = dict(params=[rp.Variable(np.zeros(2))], step_fn=_ok_step)
    args.update(kwargs)
    step_fn = args.pop("step_fn")
    with pytest.raises(rp.ReplicateError, match=match):
        rp.ActorLearner(lambda ctx: iter(()), step_fn, **args)


@pytest.mark.parametrize("bad, match", [
    ("shape", r"actor \d and actor \d yielded trajectories of another structure, shape or "
              r"dtype \(trajectory f64\[\d\] vs trajectory f64\[\d\]\)"),
    ("string", r"yielded a str \(dtype <U8\) at trajectory\['name'\]"),
])
def test_trajectories_that_cannot_be_batched_name_the_actors(bad, match):
    w = rp.Variable(np.ones(2), name="w")
    gate = threading.Barrier(2)

    def actor_fn(ctx):
        gate.wait(5)  # both actors' first trajectories land in the first batch
        if bad == "shape":
            yield np.ones(2 + ctx.actor_id) if ctx.actor_id == 1 else np.ones(2)
        else:
            yield {"x": np.ones(2), "name": "cartpole"}
        while True:
            yield np.ones(2)

    def step_fn(traj, lag):
        return {}

    al = rp.ActorLearner(actor_fn, step_fn, params=[w], actors=2, batch_size=2,
                         collective_timeout=20)
    with pytest.raises(rp.InputError, match=match) as info:
        al.run(steps=2)
    assert "actor_fn" in str(info.value)


def test_a_function_called_from_two_threads_gives_each_its_own_results():
    w = rp.Variable(np.arange(6, dtype=np.float64).reshape(3, 2), name="w")
    f = rp.function(lambda x: rnp.tanh(x @ w) * 2.0 + 1.0)
    errors = []

    def work(value):
        x = np.full((64, 3), value)
        expected = np.tanh(x @ w.numpy()) * 2.0 + 1.0
        for _ in range(200):
            errors.append(np.abs(np.asarray(f(x)) - expected).max())

    threads = [threading.Thread(target=work, args=(v,)) for v in (0.01, -0.02)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert len(errors) == 400 and max(errors) == 0.0
    assert f.trace_count == 2


@pytest.mark.parametrize("how", ["compiled", "eager", "numpy"])
def test_an_actor_thread_reads_its_own_copy_while_the_variable_changes(how):
    """The mechanism under the actors (``state.hooks.values``): a thread with its own copy of
    a Variable reads that copy — in a compiled call, an eager op, ``numpy()`` — whatever the
    Variable holds meanwhile; other threads read the Variable."""
    from replicate import state

    w = rp.Variable(np.ones(3), name="w")
    read = {"compiled": rp.function(lambda: w * 1.0), "eager": lambda: w * 1.0,
            "numpy": lambda: w.numpy()}[how]
    seen = {}

    def actor():
        state.hooks.values = {id(w): np.full(3, 7.0)}
        seen["copy"] = np.asarray(read()).copy()
        w.assign(np.full(3, 5.0)) if how == "eager" else w.load(np.full(3, 5.0))
        seen["after"] = np.asarray(read()).copy()  # the Variable changed; the copy did not

    thread = threading.Thread(target=actor)
    thread.start()
    thread.join(10)
    np.testing.assert_array_equal(seen["copy"], 7.0)
    np.testing.assert_array_equal(seen["after"], 7.0)
    np.testing.assert_array_equal(np.asarray(read()), 5.0)  # this thread: the Variable
