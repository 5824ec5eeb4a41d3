"""Input prefetch (``Replicator(..., prefetch=n)``): input_fn runs ahead on a background thread;
order, errors, resume, stop and the warnings for input that reads parameters are as without it.
(Under ``mpiexec -n 2`` the default ``prefetch=2`` runs in every multi-process test: uneven
input, faults, stalls in input_fn — tests/runtime/programs/faults_mpi.py.)"""

from __future__ import annotations

import sys
import threading
import time
import traceback
import warnings

import numpy as np
import pytest

import replicate as rp
import replicate.numpy as rnp
from replicate.runtime.communication import host as host_mod
from replicate.runtime.inputs import prefetch as prefetch_mod


def _wait_for(cond, timeout=10.0):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if cond():
            return True
        time.sleep(0.01)
    return cond()


def _counting_input(counts, n=None):
    def input_fn(ctx):
        i = 0
        while n is None or i < n:
            counts[ctx.local_id] = counts.get(ctx.local_id, 0) + 1
            yield np.full(3, 10.0 * ctx.replica_id + i)
            i += 1
    return input_fn


def _training(prefetch, mode="graph", k=2, steps=7, data=23):
    """A small model trained on shard_batches: the loss history and the parameters."""
    rng = np.random.default_rng(0)
    x, y = rng.normal(size=(data, 4)), rng.normal(size=(data,))
    w = rp.Variable(np.zeros(4), name="w")
    opt = rp.optim.SGD([w], lr=0.1)

    def input_fn(ctx):
        return rp.shard_batches((x, y), 2, ctx, seed=3, epochs=3)

    def step_fn(batch):
        bx, by = batch
        loss = ((bx @ w - by) ** 2).mean()
        opt.apply(rp.all_reduce(rp.grad(loss, [w]), "mean"))
        return {"loss": loss}

    rep = rp.Replicator(input_fn, step_fn, mode=mode, replicas_per_rank=k, prefetch=prefetch)
    first = rep.run(steps)
    rest = rep.run()  # to the end of the data, continuing where the first run stopped
    return [float(h["loss"]) for h in first + rest], w.numpy().copy()


@pytest.mark.parametrize("mode,k", [("graph", 1), ("graph", 2), ("eager", 1)])
def test_same_batches_same_steps_as_without_prefetch(mode, k):
    base_losses, base_w = _training(0, mode, k)
    for depth in (1, 2, 5):
        losses, w = _training(depth, mode, k)
        assert losses == base_losses
        np.testing.assert_array_equal(w, base_w)


def test_input_runs_ahead_bounded_by_prefetch():
    counts: dict = {}
    rep = rp.Replicator(_counting_input(counts), lambda x: {"s": x.sum()},
                        replicas_per_rank=2, prefetch=2)
    hist = rep.run(1)
    assert float(hist[0]["s"]) == pytest.approx(np.mean([0.0, 30.0]))  # 3 x 0, 3 x 10
    # one batch taken by the step, two made ahead, one more drawn and waiting for room
    assert _wait_for(lambda: counts == {0: 4, 1: 4})
    time.sleep(0.3)
    assert counts == {0: 4, 1: 4}  # bounded: no more until a step takes one


def test_prefetch_zero_draws_in_lock_step():
    counts: dict = {}
    rep = rp.Replicator(_counting_input(counts), lambda x: {"s": x.sum()},
                        replicas_per_rank=2, prefetch=0)
    rep.run(3)
    time.sleep(0.1)
    assert counts == {0: 3, 1: 3} and rep._prefetcher is None


def test_set_up_code_before_the_first_yield_runs_on_the_callers_thread():
    seen = []

    def input_fn(ctx):
        seen.append(threading.current_thread().name)
        data = rp.host.broadcast(np.arange(3.0))  # allowed: before the first yield
        while True:
            seen.append(threading.current_thread().name)
            yield data

    rp.Replicator(input_fn, lambda x: {"s": x.sum()}, prefetch=2).run(3)
    assert seen[0] == seen[1] == threading.current_thread().name
    assert "replicate-prefetch" in seen[2:]


def _raises_at(n):
    def input_fn(ctx):
        for i in range(100):
            if i == n:
                raise ValueError(f"bad record {i}")  # THE LINE
            yield np.full(2, float(i))
    return input_fn


@pytest.mark.parametrize("mode", ["graph", "eager"])
@pytest.mark.parametrize("depth", [0, 2])
@pytest.mark.parametrize("at", [0, 3])
def test_an_error_in_input_fn_reaches_the_step_that_needed_it(mode, depth, at):
    rep = rp.Replicator(_raises_at(at), lambda x: {"s": x.sum()}, mode=mode, prefetch=depth)
    with pytest.raises(ValueError, match=f"bad record {at}") as info:
        rep.run(10)
    assert rep.step == at  # steps 1..at used batches 0..at-1; the next step's batch raised
    text = "".join(traceback.format_exception(info.value))
    assert "# THE LINE" in text and "test_prefetch.py" in text
    assert rep.run(5) == []  # the generator is finished: the input has run out


def test_input_that_runs_out_ends_the_run_at_the_same_step():
    for depth in (0, 1, 3):
        rep = rp.Replicator(lambda ctx: iter([np.ones(2)] * (4 + ctx.local_id)),
                            lambda x: {"s": x.sum()}, replicas_per_rank=2, prefetch=depth)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            assert len(rep.run()) == 4
            assert rep.run() == []
        assert any("input ran out on some replicas" in str(w.message) for w in caught)


def test_stop_from_a_callback_keeps_the_batches_made_ahead():
    for depth in (0, 2):
        got = []
        rep = rp.Replicator(lambda ctx: (np.full(1, float(i)) for i in range(10)),
                            lambda x: {"x": x.sum()}, prefetch=depth)

        def early(r, step, out):
            got.append(float(out["x"]))
            if step == 3:
                r.stop()
        rep.run(callbacks=[early])
        rep.run(callbacks=[lambda r, s, out: got.append(float(out["x"]))])
        assert got == [float(i) for i in range(10)], depth


def test_restore_restarts_the_input_from_the_checkpoint(tmp_path):
    w = rp.Variable(np.zeros(2), name="w_restore")
    used = []

    def input_fn(ctx):
        for i in range(ctx.start_step, 20):
            yield np.full(2, float(i))

    def step_fn(x):
        w.assign(w + x)
        return {"x": x[0]}

    rep = rp.Replicator(input_fn, step_fn, prefetch=2)
    rep.run(3, callbacks=[rp.callbacks.Checkpoint(str(tmp_path / "ck{step}.npz"), {"w": w},
                                                  every=3)])
    rep.run(2)  # batches 3, 4 (and some made ahead)
    old = rep._prefetcher
    assert rep.restore(str(tmp_path / "ck{step}.npz"), {"w": w}) == 3
    assert old._closed.is_set() and not old._thread.is_alive()
    used = [float(h["x"]) for h in rep.run(2)]
    assert used == [3.0, 4.0]
    np.testing.assert_array_equal(w.numpy(), np.full(2, 0 + 1 + 2 + 3 + 4.0))


@pytest.mark.parametrize("how", ["read", "numpy", "function", "eager_op"])
def test_input_fn_reading_parameters_while_prefetching_warns(how):
    """On-policy RL reads the policy's parameters in input_fn: with input made ahead they may be
    steps old — a silent change of algorithm unless said."""
    w = rp.Variable(np.ones(2), name=f"policy_w_{how}")
    act = rp.function(lambda obs: obs * w)

    def input_fn(ctx):
        while True:
            if how == "read":
                value = w.read().numpy()
            elif how == "numpy":
                value = w.numpy()
            elif how == "function":
                value = np.asarray(act(np.ones(2)))
            else:
                value = (w * 2.0).numpy()
            yield value

    def step_fn(x):
        w.assign(w + 0.0 * x)
        return {"s": x.sum()}

    for depth in (0, 2):
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            rp.Replicator(input_fn, step_fn, prefetch=depth).run(4)
        said = [str(c.message) for c in caught if "while it runs ahead" in str(c.message)]
        if depth:
            assert len(said) == 1 and f"policy_w_{how}" in said[0] and "prefetch=0" in said[0]
        else:
            assert said == []


def test_eager_steps_sync_hooks_never_run_on_the_input_thread():
    """An eager step syncs each variable at its first read (an exchange on the step's thread);
    a read by input_fn on the prefetch thread must not trigger it."""
    w = rp.Variable(np.ones(2), name="w_hook")
    threads = []
    def input_fn(ctx):
        while True:
            yield w.numpy() * 1.0

    rep = rp.Replicator(input_fn,
                        lambda x: {"s": (x * w).sum()}, mode="eager", prefetch=2)
    real = rep._sync_variable
    rep._sync_variable = lambda var: (threads.append(threading.current_thread().name),
                                      real(var))[1]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        rep.run(5)
    assert threads and set(threads) == {threading.current_thread().name}


def test_host_exchange_from_the_input_thread_is_refused():
    def input_fn(ctx):
        yield np.zeros(2)
        while True:
            yield rp.host.all_reduce(np.ones(2), "sum")

    rep = rp.Replicator(input_fn, lambda x: {"s": x.sum()}, prefetch=1)
    with pytest.raises(rp.ReplicateError, match="prefetch=0"):
        rep.run(3)
    hist = rp.Replicator(input_fn, lambda x: {"s": x.sum()}, prefetch=0).run(3)
    assert [float(h["s"]) for h in hist] == [0.0, 2.0, 2.0]


@pytest.mark.parametrize("bad", [-1, 1.5, True, "2", None])
def test_bad_prefetch_values_are_errors(bad):
    with pytest.raises(rp.ReplicateError, match="prefetch must be an int >= 0"):
        rp.Replicator(lambda ctx: iter([]), lambda x: x, prefetch=bad)


def test_the_thread_ends_with_its_replicator():
    rep = rp.Replicator(_counting_input({}), lambda x: {"s": x.sum()}, prefetch=2)
    rep.run(1)
    thread = rep._prefetcher._thread
    assert thread.is_alive()
    del rep
    import gc

    gc.collect()
    assert _wait_for(lambda: not thread.is_alive(), 5.0)


def test_newcomer_dataloader_habit_epoch_loop():
    """A PyTorch habit: an epoch loop around run(), the data a generator over shuffled indices,
    evaluation between epochs reading the parameters outside input_fn (no warning)."""
    rng = np.random.default_rng(1)
    x = rng.normal(size=(32, 3))
    y = x @ np.array([1.0, -2.0, 0.5])
    w = rp.Variable(np.zeros(3), name="w_epochs")
    opt = rp.optim.SGD([w], lr=0.05)

    def input_fn(ctx):
        return rp.shard_batches((x, y), 4, ctx, seed=0, epochs=None)

    def step_fn(batch):
        bx, by = batch
        loss = ((bx @ w - by) ** 2).mean()
        opt.apply(rp.all_reduce(rp.grad(loss, [w]), "mean"))
        return {"loss": loss}

    def train(depth):
        w.assign(np.zeros(3))
        rep = rp.Replicator(input_fn, step_fn, replicas_per_rank=2, prefetch=depth)
        evals = []
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # no prefetch warning: input_fn reads no Variable
            for _ in range(3):
                rep.run(4)
                evals.append(float(((x @ w.numpy() - y) ** 2).mean()))
        return evals

    assert train(2) == train(0)
    assert train(2)[-1] < train(2)[0]


def test_on_input_thread_flag():
    assert not host_mod.on_input_thread()
    flags = []

    def input_fn(ctx):
        while True:
            flags.append(host_mod.on_input_thread())
            yield rnp.zeros(1).numpy()

    rp.Replicator(input_fn, lambda x: {"s": x.sum()}, prefetch=1).run(3)
    assert flags[0] is False and True in flags[1:]


def test_the_gil_switch_interval_is_short_only_while_input_runs_ahead():
    before = sys.getswitchinterval()
    rep = rp.Replicator(_counting_input({}), lambda x: {"s": x.sum()}, prefetch=1)
    rep.run(2)
    assert sys.getswitchinterval() <= prefetch_mod.SWITCH
    rep._prefetcher.close()
    assert _wait_for(lambda: sys.getswitchinterval() == before)


def test_a_users_own_thread_reading_variables_never_runs_the_steps_hooks():
    """The hooks on Variable access belong to the thread that set them: a logging thread reading
    a parameter while an eager step runs must not trigger the step's sync (an exchange)."""
    w = rp.Variable(np.ones(2), name="w_logger")
    seen, stop = [], threading.Event()

    def logger():
        while not stop.is_set():
            w.read()
            w.numpy()

    rep = rp.Replicator(lambda ctx: iter([np.ones(2)] * 50), lambda x: {"s": (x * w).sum()},
                        mode="eager", prefetch=0)
    real = rep._sync_variable
    rep._sync_variable = lambda var: (seen.append(threading.current_thread().name),
                                      real(var))[1]
    thread = threading.Thread(target=logger, name="logger")
    thread.start()
    try:
        rep.run()
    finally:
        stop.set()
        thread.join()
    assert seen and set(seen) == {threading.current_thread().name}


@pytest.mark.parametrize("mode", ["graph", "eager"])
def test_an_input_fn_that_refills_one_buffer_gets_the_right_batches(mode):
    """A PyTorch/C habit: fill one preallocated buffer and yield it each time. With input made
    ahead, the next fill would overwrite a batch still waiting for its step — silently wrong
    data; each batch is taken as it was when yielded."""
    def input_fn(ctx):
        buf = np.empty(3)
        for i in range(8):
            buf[:] = i
            yield buf

    sums = {}
    for depth in (0, 2):
        hist = rp.Replicator(input_fn, lambda x: {"s": x.sum()}, mode=mode,
                             prefetch=depth).run()
        sums[depth] = [float(h["s"]) for h in hist]
    assert sums[0] == sums[2] == [3.0 * i for i in range(8)]


def test_a_refilled_torch_buffer_too():
    torch = pytest.importorskip("torch", reason="PyTorch not installed (optional)")

    def input_fn(ctx):
        buf = torch.empty(3, dtype=torch.float64)
        for i in range(6):
            buf.fill_(i)
            yield buf

    hist = rp.Replicator(input_fn, lambda x: {"s": x.sum()}, prefetch=2).run()
    assert [float(h["s"]) for h in hist] == [3.0 * i for i in range(6)]
