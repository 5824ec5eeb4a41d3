"""Asynchronous checkpoints (``rp.callbacks.Checkpoint(..., asynchronous=True)``,
``runtime/variables/background.py``): the files equal the synchronous save's, resume is bitwise,
a failed write is raised, and a process killed during a background write leaves the previous
checkpoint intact. The synchronous save's guarantees hold too: diverged state (2 processes) and
a refused non-finite update are never written, with the same error (tests/api/test_trust.py
runs those tests with ``asynchronous`` False and True)."""

import os
import signal
import subprocess
import sys
import textwrap
import threading

import numpy as np
import pytest

import replicate as rp
import replicate.numpy as rnp
from conftest import PROGRAMS, checkpoint_files, held_back
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


# -- the synchronous save's guarantees with asynchronous=True: tests/api/test_trust.py (a refused
# non-finite update, diverged state on 2 processes: each test there runs both ways) -------------
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

