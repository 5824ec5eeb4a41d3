"""Asynchronous checkpoints (``rp.callbacks.Checkpoint(..., asynchronous=True)``,
``runtime/variables/background.py``): the files equal the synchronous save's, resume is bitwise,
a failed write is raised, and a process killed during a background write leaves the previous
checkpoint intact. The synchronous save's guarantees of tests/api/test_trust.py hold here too:
diverged state (2 processes) and a refused non-finite update are never written, with the same
error."""

import json
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time

import numpy as np
import pytest

import replicate as rp
import replicate.numpy as rnp
from conftest import PROGRAMS, checkpoint_files, mpirun, needs_mpi, report
from replicate.runtime.variables import checkpoint

sys.path.insert(0, PROGRAMS)
from trust_mpi import nan_gradient_program  # noqa: E402

X = np.random.default_rng(0).normal(size=(64, 4))
Y = X @ np.array([1.0, -2.0, 0.5, 3.0]) + 0.1


def _setup():
    w = rp.Variable(np.zeros(4), name="w")
    b = rp.Variable(np.zeros(()), name="b")
    opt = rp.wrap_optimizer(rp.optim.Adam([w, b], lr=0.1))
    state = {"model": {"w": w, "b": b}, "opt": opt.variables()}

    def input_fn(ctx):
        return rp.shard_batches((X, Y), 8, ctx, seed=1, epochs=None)

    def step_fn(batch):
        x, y = batch
        loss = rnp.mean((x @ w + b - y) ** 2)
        opt.apply(rp.grad(loss, [w, b]))
        return {"loss": loss}

    return rp.Replicator(input_fn, step_fn), state, (w, b)


def test_the_background_files_are_the_synchronous_ones(tmp_path):
    rep, state, _ = _setup()
    background = rp.callbacks.Checkpoint(str(tmp_path / "a-{step}.npz"), state, every=2,
                                         keep=0, asynchronous=True)
    plain = rp.callbacks.Checkpoint(str(tmp_path / "s-{step}.npz"), state, every=2, keep=0)
    rep.run(steps=7, callbacks=[background, plain])
    assert background.writer is not None and background.writer._thread is None  # waited for
    for step in (2, 4, 6):
        a, ai = checkpoint.load(str(tmp_path / f"a-{step}.npz"))
        s, si = checkpoint.load(str(tmp_path / f"s-{step}.npz"))
        assert ai["step"] == si["step"] == step and sorted(a) == sorted(s)
        assert all(np.array_equal(a[k], s[k]) for k in a), step
    # each save copied the state at its own step: the files differ from step to step
    assert not np.array_equal(checkpoint.load(str(tmp_path / "a-2.npz"))[0]["model/w"],
                              checkpoint.load(str(tmp_path / "a-6.npz"))[0]["model/w"])


def test_the_copy_buffers_are_ready_before_the_first_save(tmp_path):
    """The copy's buffers are allocated (and their pages touched) on a thread when the callback
    is made: the first save copies into them, as every later one does, instead of mapping fresh
    memory on the step's thread (bench/checkpoint_async.py)."""
    rep, state, _ = _setup()
    ck = rp.callbacks.Checkpoint(str(tmp_path / "ck-{step}.npz"), state, every=2,
                                 asynchronous=True)
    for thread in list(ck.writer._staging):
        thread.join()
    staged = dict(ck.writer._buffers)
    names = {f"{name}/" for name in checkpoint.named_variables(state)}
    assert set(staged) == names
    rep.run(steps=4, callbacks=[ck])
    assert all(ck.writer._buffers[k] is v for k, v in staged.items())


class Holder:
    """A state given as an object with ``.variables()`` (which ``checkpoint.save`` expands)."""

    def __init__(self, nest):
        self.nest, self.threads = nest, []

    def variables(self):
        self.threads.append(threading.current_thread())
        return self.nest


def test_a_state_object_is_copied_at_the_step_boundary(tmp_path):
    """Its variables are read on the step's thread at the save, never by the writer's thread
    while the next steps change them; the files are the synchronous save's."""
    rep, state, _ = _setup()
    holder = Holder(state)
    background = rp.callbacks.Checkpoint(str(tmp_path / "a-{step}.npz"), holder, every=2,
                                         keep=0, asynchronous=True)
    plain = rp.callbacks.Checkpoint(str(tmp_path / "s-{step}.npz"), state, every=2, keep=0)
    rep.run(steps=5, callbacks=[background, plain])
    assert holder.threads and all(t is threading.main_thread() for t in holder.threads)
    for step in (2, 4):
        a, _ = checkpoint.load(str(tmp_path / f"a-{step}.npz"))
        s, _ = checkpoint.load(str(tmp_path / f"s-{step}.npz"))
        assert sorted(a) == sorted(s) and all(np.array_equal(a[k], s[k]) for k in a), step


def test_keep_rotates_after_each_background_write(tmp_path):
    rep, state, _ = _setup()
    ck = rp.callbacks.Checkpoint(str(tmp_path / "ck-{step}.npz"), state, every=1, keep=2,
                                 asynchronous=True)
    rep.run(steps=5, callbacks=[ck])
    assert checkpoint_files(tmp_path) == ["ck-4.npz", "ck-5.npz"]


def test_resume_from_a_background_checkpoint_is_bitwise(tmp_path):
    rep, _, straight = _setup()
    rep.run(steps=8)
    rep, state, _ = _setup()
    ck = rp.callbacks.Checkpoint(str(tmp_path / "ck-{step}.npz"), state, every=4,
                                 asynchronous=True)
    rep.run(steps=5, callbacks=[ck])
    rep, state, resumed = _setup()
    assert rep.restore(str(tmp_path / "ck-{step}.npz"), state) == 4
    rep.run(steps=4)
    for a, b in zip(straight, resumed):
        assert np.array_equal(a.numpy(), b.numpy())


def test_a_failed_background_write_is_raised(tmp_path):
    rep, state, _ = _setup()
    (tmp_path / "a-file").write_text("")
    ck = rp.callbacks.Checkpoint(str(tmp_path / "a-file" / "ck-{step}.npz"), state, every=2,
                                 asynchronous=True)
    with pytest.raises(rp.CheckpointError, match="a-file"):
        rep.run(steps=3, callbacks=[ck])


KILLED = textwrap.dedent("""
    import glob, os, signal, sys, time
    import numpy as np
    import replicate as rp
    folder = sys.argv[1]
    big = rp.Variable(np.zeros(3 << 20), name="big")  # 24 MB: a write that takes a while
    rp.checkpoint.save(os.path.join(folder, "ck-1.npz"), {"big": big}, step=1)
    big.assign(np.ones(3 << 20))
    from replicate.runtime.variables.background import BackgroundWriter
    from replicate.runtime.communication.comm import world
    writer = BackgroundWriter(world())
    writer.submit(os.path.join(folder, "ck-2.npz"), {"big": big}, step=2)
    while not glob.glob(os.path.join(folder, ".tmp-*")):  # the write has begun
        time.sleep(0.0005)
    os.kill(os.getpid(), signal.SIGKILL)
""")


def test_kill_9_during_a_background_write_leaves_the_previous_checkpoint(tmp_path):
    result = subprocess.run([sys.executable, "-c", KILLED, str(tmp_path)], capture_output=True,
                            text=True, timeout=300)
    assert result.returncode == -signal.SIGKILL, result.stderr
    assert any(n.startswith(".tmp-") for n in os.listdir(tmp_path))  # killed mid-write
    assert not os.path.exists(tmp_path / "ck-2.npz")
    big = rp.Variable(np.full(3 << 20, 7.0), name="big")
    info = rp.checkpoint.restore(str(tmp_path / "ck-{step}.npz"), {"big": big})
    assert info["step"] == 1 and not big.numpy().any()


# -- the synchronous save's guarantees (tests/api/test_trust.py), with asynchronous=True ---------
def held_back(monkeypatch, seconds, fail_at=None):
    """Each background write starts ``seconds`` late (so the next steps run while it is in
    flight); the one of step ``fail_at`` then fails as a full disk would."""
    save = checkpoint.save

    def late_save(path, state, step=0, **kw):
        time.sleep(seconds)
        if step == fail_at:
            raise rp.CheckpointError(f"cannot write checkpoint {path!r}: OSError: disk full")
        save(path, state, step=step, **kw)

    monkeypatch.setattr(checkpoint, "save", late_save)


@pytest.mark.parametrize("mode,k", [("graph", 1), ("graph", 2), ("eager", 1)])
def test_a_nan_update_is_never_checkpointed_in_the_background(mode, k, tmp_path, monkeypatch):
    """test_a_nan_update_is_never_written_nor_checkpointed: step 4's NaN update is refused while
    step 3's write is still in flight; ``run`` raises once that write is done, and no file holds
    a non-finite value."""
    held_back(monkeypatch, 0.3)
    rep, w, opt = nan_gradient_program(mode, k)
    pattern = str(tmp_path / "ckpt-{step}.npz")
    state = {"w": w, "opt": opt.optimizer.variables()}
    ck = rp.callbacks.Checkpoint(pattern, state, every=1, asynchronous=True)
    with np.errstate(all="ignore"), pytest.raises(rp.NonFiniteError) as e:
        rep.run(callbacks=[ck])
    message = str(e.value)
    assert message.startswith("step 4: non-finite values"), message
    assert "variable 'w' (this step's update, not written): nan" in message
    assert rep.step == 3 and np.isfinite(w.numpy()).all()
    assert ck.writer._thread is None  # waited for
    assert checkpoint_files(tmp_path) == ["ckpt-1.npz", "ckpt-2.npz", "ckpt-3.npz"]
    saved = np.load(tmp_path / "ckpt-3.npz")
    before = w.numpy().copy()
    w.load(np.zeros(3, np.float32))
    rp.checkpoint.restore(pattern, state)
    np.testing.assert_array_equal(w.numpy(), before)
    assert all(np.isfinite(saved[k]).all() for k in saved.files if saved[k].dtype.kind == "f")


def test_a_write_failing_while_the_run_fails_is_raised(tmp_path, monkeypatch):
    """Step 3's write fails while step 4 is refused: the write's error is raised (the one the
    synchronous save raises at step 3), the step's error as its context — never dropped."""
    held_back(monkeypatch, 0.3, fail_at=3)
    rep, w, opt = nan_gradient_program("graph")
    ck = rp.callbacks.Checkpoint(str(tmp_path / "ckpt-{step}.npz"), {"w": w}, every=1,
                                 asynchronous=True)
    with np.errstate(all="ignore"), pytest.raises(rp.CheckpointError, match="disk full") as e:
        rep.run(callbacks=[ck])
    assert isinstance(e.value.__context__, rp.NonFiniteError), e.value.__context__
    assert rep.step == 3 and checkpoint_files(tmp_path) == ["ckpt-1.npz", "ckpt-2.npz"]
    ck.wait()  # (raised once)


def with_mpi(test):
    for mark in needs_mpi:
        test = mark(test)
    return test


def run_case(case, mode, tmp_path):
    """tests/runtime/programs/trust_mpi.py's CASE on 2 processes: each rank's report."""
    result = mpirun("trust_mpi.py", case, mode, str(tmp_path), timeout=120)
    assert result.returncode == 0, report(result)
    return [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2)]


@with_mpi
@pytest.mark.parametrize("mode", ["graph", "eager"])
def test_mpi_diverged_state_is_never_checkpointed_in_the_background(mode, tmp_path):
    """test_mpi_diverged_state_is_never_checkpointed: the step-2 write finds the ranks' copies
    differ; every rank raises the synchronous save's DivergenceError (at the end of run, the
    next step boundary of this 3-step run) and no file is written."""
    for r in run_case("drift_checkpoint_async", mode, tmp_path):
        kind, message = r["error"]
        assert kind == "DivergenceError", message
        assert message.startswith("step 2, before writing checkpoint"), message
    assert checkpoint_files(tmp_path / "ckpt") == []


@with_mpi
@pytest.mark.parametrize("mode", ["graph", "eager"])
def test_mpi_nan_update_is_not_checkpointed_in_the_background(mode, tmp_path):
    """test_mpi_nan_update_is_not_written_on_any_rank: step 4 is refused on both ranks; the
    writes of steps 1-3 are done when run raises, and hold the same finite state."""
    ranks = run_case("nan_update_async", mode, tmp_path)
    for r in ranks:
        kind, message = r["error"]
        assert kind == "NonFiniteError" and message.startswith("step 4:"), message
        assert r["step"] == 3 and np.isfinite(r["w"]).all()
        assert r["files"] == ["ckpt-1.npz", "ckpt-2.npz", "ckpt-3.npz"]
    assert ranks[0]["w"] == ranks[1]["w"]
    saved = np.load(tmp_path / "ckpt" / "ckpt-3.npz")["var/w"]
    np.testing.assert_array_equal(saved, np.asarray(ranks[0]["w"], np.float32))
