"""Faults in one process: bad options, bad batches, bad outputs, shape errors, non-finite losses,
corrupt checkpoints. Each must be a ``ReplicateError`` subclass whose message names the user's
function or source line, with a traceback of the user's frames only.

The multi-process cases (crash, kill -9, stall, mismatch, kill and resume) are in
tests/runtime/test_faults_mpi.py.
"""

from __future__ import annotations

import inspect
import os
import traceback
import warnings
import zipfile

import numpy as np
import pytest

import replicate as rp
import replicate.numpy as rnp
from conftest import checkpoint_files
from replicate.runtime.checks.entry import leaf_paths
from replicate.runtime.job import watchdog
from replicate.runtime.variables import checkpoint

HERE = os.path.basename(__file__)


def line_of(fn, text):
    """'test_faults.py:N' of the line of ``fn`` that contains ``text``."""
    lines, first = inspect.getsourcelines(fn)
    hits = [first + i for i, line in enumerate(lines) if text in line]
    assert len(hits) == 1, (text, hits)
    return f"{HERE}:{hits[0]}"


def forever(value):
    def input_fn(ctx):
        while True:
            yield value
    return input_fn


def only_user_frames(error):
    frames = traceback.extract_tb(error.__traceback__)
    assert frames, "no traceback"
    inside = [f.filename for f in frames if f"{os.sep}replicate{os.sep}" in f.filename
              and f"{os.sep}tests{os.sep}" not in f.filename]
    assert not inside, inside


# ================================================================================================
# Options
# ================================================================================================
@pytest.mark.parametrize("kwargs,match", [
    ({"replicas_per_rank": 0}, "replicas_per_rank"),
    ({"replicas_per_rank": 1.5}, "replicas_per_rank"),
    ({"mode": "lazy"}, "unknown mode"),
    ({"backend": "tpu"}, "unknown backend"),
    ({"outputs": "median"}, "outputs"),
    ({"options": 3}, "options"),
    ({"options": {"no_such_option": 1}}, "compile options"),
    ({"check_finite": "yes"}, "check_finite"),
    ({"collective_timeout": -1}, "collective_timeout"),
    ({"collective_timeout": "soon"}, "collective_timeout"),
    ({"collective_timeout": True}, "collective_timeout"),
    ({"mode": "eager", "replicas_per_rank": 2}, "one replica per process"),
])
def test_invalid_options_are_library_errors(kwargs, match):
    with pytest.raises(rp.ReplicateError, match=match):
        rp.Replicator(forever(np.ones(2)), lambda x: x, **kwargs)


@pytest.mark.parametrize("text,seconds", [("300", 300.0), ("2.5", 2.5), ("0", 0.0),
                                          ("off", 0.0), ("inf", 0.0), (" 10 ", 10.0)])
def test_collective_timeout_values(text, seconds):
    assert watchdog.parse_timeout(text) == seconds


def test_collective_timeout_from_the_environment(monkeypatch):
    monkeypatch.delenv(watchdog.ENV, raising=False)
    assert watchdog.timeout_from_env() == watchdog.DEFAULT_TIMEOUT == 300.0
    monkeypatch.setenv(watchdog.ENV, "12")
    assert watchdog.timeout_from_env() == 12.0
    monkeypatch.setenv(watchdog.ENV, "twelve")
    with pytest.raises(rp.ReplicateError, match=watchdog.ENV):
        watchdog.timeout_from_env()


def test_checkpoint_callback_options():
    with pytest.raises(rp.ReplicateError, match="every"):
        rp.callbacks.Checkpoint("ck-{step}.npz", {}, every=0)
    with pytest.raises(rp.ReplicateError, match="keep"):
        rp.callbacks.Checkpoint("ck-{step}.npz", {}, every=1, keep=-1)


# ================================================================================================
# What step_fn returns
# ================================================================================================
@pytest.mark.parametrize("mode", ["graph", "eager"])
@pytest.mark.parametrize("bad,what", [("text", "str"), (object(), "object"),
                                      (np.array(["a"]), "dtype <U1")])
def test_step_fn_returning_non_arrays(mode, bad, what):
    def step_fn(x):
        return {"loss": rnp.sum(x), "note": bad}

    rep = rp.Replicator(forever(np.ones(2)), step_fn, mode=mode)
    with pytest.raises(rp.InputError) as e:
        rep.run(2)
    message = str(e.value)
    assert "step_fn" in message and what in message and "output['note']" in message, message
    assert line_of(step_fn, "def step_fn") in message, message  # where it is defined
    only_user_frames(e.value)


@pytest.mark.parametrize("mode", ["graph", "eager"])
def test_step_fn_returning_numbers_and_none_is_fine(mode):
    rep = rp.Replicator(forever(np.ones(2)), lambda x: {"a": 1.0, "b": None, "c": rnp.sum(x)},
                        mode=mode)
    out = rep.run(2)[-1]
    assert float(out["a"]) == 1.0 and out["b"] is None and float(out["c"]) == 2.0


# ================================================================================================
# What input_fn yields
# ================================================================================================
@pytest.mark.parametrize("mode", ["graph", "eager"])
@pytest.mark.parametrize("batch,what", [
    ((np.ones(2), "label"), "str"),
    ({"x": np.ones(2), "y": np.array([object()])}, "dtype object"),
    ([np.ones(2), {1.0, 2.0}], "a set"),
    (np.array(["a", "b"]), "dtype <U1"),
])
def test_batches_that_are_not_numeric_arrays(mode, batch, what):
    def input_fn(ctx):
        while True:
            yield batch

    rep = rp.Replicator(input_fn, lambda b: {"n": rnp.ones(())}, mode=mode)
    with pytest.raises(rp.InputError) as e:
        rep.run(2)
    message = str(e.value)
    assert what in message and "at step 1" in message, message
    assert line_of(input_fn, "def input_fn") in message, message
    only_user_frames(e.value)


@pytest.mark.parametrize("mode,k", [("graph", 2), ("eager", 1)])
def test_batch_structure_changing_between_steps(mode, k):
    def input_fn(ctx):
        for i in range(10):
            yield (np.ones(2), np.ones(2)) if i < 3 else {"x": np.ones(2)}

    rep = rp.Replicator(input_fn, lambda b: {"n": rnp.ones(())}, mode=mode,
                        replicas_per_rank=k)
    with pytest.raises(rp.InputError, match="another structure than at step 1") as e:
        rep.run(10)
    assert "step 4: {'x': *}" in str(e.value) and "step 1: (*, *)" in str(e.value)
    assert rep.step == 3  # the three good steps ran


def test_batch_shapes_may_change_but_many_signatures_warn():
    def input_fn(ctx):
        for n in range(1, 12):
            yield np.ones(n)

    rep = rp.Replicator(input_fn, lambda x: {"s": rnp.sum(x)})
    with pytest.warns(UserWarning, match="compiled for 9 different input signatures"):
        hist = rep.run()
    assert len(hist) == 11 and rep.trace_count == 11


def test_leaf_paths():
    from replicate import tree

    _, treedef = tree.flatten({"a": [1, (2, None)], "b": 3})
    assert leaf_paths(treedef) == ["['a'][0]", "['a'][1][0]", "['b']"]


# ================================================================================================
# Shape errors inside step_fn name the user's line; the traceback is the user's
# ================================================================================================
@pytest.mark.parametrize("mode", ["graph", "eager"])
def test_shape_error_in_step_fn_names_the_user_line(mode):
    w = rp.Variable(np.ones((3, 2)), name="w_shape")

    def step_fn(x):
        return {"y": rnp.sum(x @ w)}  # (4,) @ (3, 2): a contraction mismatch

    rep = rp.Replicator(forever(np.ones(4)), step_fn, mode=mode)
    with pytest.raises(rp.ShapeError) as e:
        rep.run(1)
    assert line_of(step_fn, "x @ w") in str(e.value), str(e.value)
    only_user_frames(e.value)


def test_debug_traceback_keeps_the_library_frames(monkeypatch):
    monkeypatch.setenv("REPLICATE_DEBUG", "traceback")
    rep = rp.Replicator(forever(np.ones(4)), lambda x: {"y": x @ np.ones((3, 2))})
    with pytest.raises(rp.ShapeError) as e:
        rep.run(1)
    files = [f.filename for f in traceback.extract_tb(e.value.__traceback__)]
    assert any(f.endswith(os.path.join("runtime", "loop", "replicator.py")) for f in files)


# ================================================================================================
# Non-finite values (check_finite=True)
# ================================================================================================
def _nan_step(at_step):
    w = rp.Variable(np.ones(3), name="w_nan")
    counter = {"step": 0}

    def input_fn(ctx):
        step = 0
        while True:
            step += 1
            yield np.full(3, 1.0 if step < at_step else -1.0)

    def step_fn(x):
        h = rnp.sqrt(x) * w  # sqrt(-1) = nan from step `at_step` on
        loss = rnp.sum(h * h)
        w.assign(w - 0.01 * rp.grad(loss, w))
        counter["step"] += 1
        return {"loss": loss, "ok": rnp.sum(x)}

    return input_fn, step_fn, w


@pytest.mark.parametrize("mode", ["graph", "eager"])
def test_non_finite_loss_names_the_step_and_in_graph_mode_the_op(mode):
    input_fn, step_fn, w = _nan_step(4)
    rep = rp.Replicator(input_fn, step_fn, mode=mode, check_finite=True)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # NumPy's own "invalid value" note
        with pytest.raises(rp.NonFiniteError) as e:
            rep.run(10)
    message = str(e.value)
    assert message.startswith("step 4: non-finite values (check_finite=True)"), message
    assert "output['loss']: nan in 1 of 1" in message, message
    assert "output['ok']" not in message, message  # finite outputs are not listed
    if mode == "graph":
        assert "sqrt(f64[3]) -> f64[3] at " in message, message
        assert f"{line_of(step_fn, 'rnp.sqrt(x)')}: h = rnp.sqrt(x) * w" in message, message
        assert "from finite operands" in message
    assert rep.step == 3  # the failed step is not counted, and no callback ran for it
    only_user_frames(e.value)


def test_non_finite_input_is_named():
    w = rp.Variable(np.ones(2), name="w_in")
    rep = rp.Replicator(forever(np.array([1.0, np.inf])), lambda x: {"l": rnp.sum(x * w)},
                        check_finite=True)
    with pytest.raises(rp.NonFiniteError, match=r"graph input 'r0' \(f64\[2\]\) already holds "
                                                r"inf"):
        rep.run(1)


def test_check_finite_is_off_by_default():
    input_fn, step_fn, _ = _nan_step(2)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        hist = rp.Replicator(input_fn, step_fn).run(3)
    assert np.isnan(hist[-1]["loss"])


# ================================================================================================
# Checkpoints: checksums, a corrupt newest file, keep the last N
# ================================================================================================
def _save_series(tmp_path, steps=(3, 6, 9)):
    w = rp.Variable(np.arange(4.0), name="w")
    pattern = str(tmp_path / "ck-{step:03d}.npz")
    for s in steps:
        w.assign(np.full(4, float(s)))
        checkpoint.save(pattern.format(step=s), {"w": w}, step=s)
    return pattern, w


def test_checkpoint_stores_a_checksum_per_array_and_numpy_reads_it(tmp_path):
    pattern, w = _save_series(tmp_path, (3,))
    with np.load(pattern.format(step=3), allow_pickle=False) as data:
        import json

        info = json.loads(bytes(data["info"]).decode())
        assert info["format"] == 2 and set(info["sha256"]) == {"var/w"}
        assert info["sha256"]["var/w"] == checkpoint.digest(data["var/w"])


def _rewrite(path, **replace):
    """Rewrite an npz with some arrays replaced (zip CRCs stay valid: only the checksum can
    tell)."""
    with np.load(path) as data:
        arrays = {k: data[k] for k in data.files}
    arrays.update(replace)
    with open(path, "wb") as f:
        np.savez(f, **arrays)


@pytest.mark.parametrize("damage", ["truncate", "flip", "rewrite", "empty"])
def test_corrupt_checkpoint_is_detected(tmp_path, damage):
    pattern, _ = _save_series(tmp_path, (3,))
    path = pattern.format(step=3)
    size = os.path.getsize(path)
    if damage == "truncate":
        with open(path, "r+b") as f:
            f.truncate(size - 100)
    elif damage == "flip":  # one bit of w's stored values (not of a zip header's date field)
        with open(path, "rb") as f:
            at = f.read().index(np.full(4, 3.0).tobytes()) + 13
        with open(path, "r+b") as f:
            f.seek(at)
            byte = f.read(1)
            f.seek(at)
            f.write(bytes([byte[0] ^ 0x01]))
    elif damage == "rewrite":
        _rewrite(path, **{"var/w": np.full(4, 7.0)})
    else:
        open(path, "wb").close()
    with pytest.raises(rp.CheckpointError, match="corrupt"):
        checkpoint.load(path)
    with pytest.raises(rp.CheckpointError):
        checkpoint.restore(path, {"w": rp.Variable(np.zeros(4))})


def test_restore_from_a_pattern_skips_a_corrupt_newest_checkpoint_with_a_warning(tmp_path):
    pattern, _ = _save_series(tmp_path)
    with open(pattern.format(step=9), "r+b") as f:
        f.truncate(50)
    w = rp.Variable(np.zeros(4), name="w")
    with pytest.warns(UserWarning, match=r"ck-009.npz.*truncated or corrupt.*using the "
                                         "previous checkpoint"):
        info = checkpoint.restore(pattern, {"w": w})
    assert info["step"] == 6 and info["path"] == pattern.format(step=6)
    assert w.numpy().tolist() == [6.0] * 4


def test_restore_from_a_pattern_takes_the_newest(tmp_path):
    pattern, _ = _save_series(tmp_path, (3, 12, 6))
    w = rp.Variable(np.zeros(4), name="w")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert checkpoint.restore(pattern, {"w": w})["step"] == 12
    assert [s for s, _ in checkpoint.step_files(pattern)] == [12, 6, 3]


def test_no_intact_checkpoint_is_an_error(tmp_path):
    pattern, _ = _save_series(tmp_path, (3, 6))
    for s in (3, 6):
        _rewrite(pattern.format(step=s), **{"var/w": np.zeros(4)})
    with pytest.raises(rp.CheckpointError, match="no intact checkpoint"):
        checkpoint.restore(pattern, {"w": rp.Variable(np.zeros(4))})
    with pytest.raises(rp.CheckpointError, match="no checkpoint matches"):
        checkpoint.restore(str(tmp_path / "none-{step}.npz"), {"w": rp.Variable(np.zeros(4))})


def test_a_state_that_does_not_fit_is_left_untouched(tmp_path):
    pattern, _ = _save_series(tmp_path, (3,))
    a, b = rp.Variable(np.zeros(4)), rp.Variable(np.zeros(5))
    with pytest.raises(rp.CheckpointError, match="does not fit"):
        checkpoint.restore(pattern.format(step=3), {"w": a, "v": b})
    assert a.numpy().tolist() == [0.0] * 4  # nothing half-restored


def test_format_1_checkpoints_still_load(tmp_path):
    path = str(tmp_path / "old.npz")
    import json

    info = json.dumps({"step": 5, "meta": {}, "format": 1}).encode()
    np.savez(path, **{"var/w": np.ones(2), "info": np.frombuffer(info, np.uint8)})
    arrays, info = checkpoint.load(path)
    assert info["step"] == 5 and arrays["w"].tolist() == [1.0, 1.0]


def test_checkpoint_callback_keeps_the_last_n_across_restarts(tmp_path):
    w = rp.Variable(np.ones(2), name="w_keep")
    pattern = str(tmp_path / "ck-{step:03d}.npz")

    def make():
        return rp.Replicator(forever(np.ones(2)), lambda x: {"s": rnp.sum(x * w)})

    rep = make()
    rep.run(9, callbacks=[rp.callbacks.Checkpoint(pattern, {"w": w}, every=2, keep=3)])
    assert checkpoint_files(tmp_path) == ["ck-004.npz", "ck-006.npz", "ck-008.npz"]
    rep = make()  # a restarted run, resumed from the newest
    assert rep.restore(pattern, {"w": w}) == 8
    rep.run(6, callbacks=[rp.callbacks.Checkpoint(pattern, {"w": w}, every=2, keep=3)])
    assert checkpoint_files(tmp_path) == ["ck-010.npz", "ck-012.npz", "ck-014.npz"]


def test_replicator_restore_falls_back_and_resumes(tmp_path):
    """A resumed run from the previous intact checkpoint ends where an uninterrupted one does."""
    import sys

    sys.path.insert(0, os.path.join(os.path.dirname(__file__), "programs"))
    import faults_resume

    rep, state = faults_resume.make()
    rep.run(20)
    full = {k: v.value.copy() for k, v in checkpoint.named_variables(state).items()}

    pattern = str(tmp_path / "ck-{step:03d}.npz")
    rep, state = faults_resume.make()
    rep.run(14, callbacks=[rp.callbacks.Checkpoint(pattern, state, every=4, keep=2)])
    assert checkpoint_files(tmp_path) == ["ck-008.npz", "ck-012.npz"]
    with zipfile.ZipFile(pattern.format(step=12), "a") as z:  # an extra member: not its index
        z.writestr("var/junk.npy", b"junk")
    rep, state = faults_resume.make()
    with pytest.warns(UserWarning, match="ck-012.npz"):
        assert rep.restore(pattern, state) == 8
    rep.run(12)
    for key, value in checkpoint.named_variables(state).items():
        assert value.value.tobytes() == full[key].tobytes(), key
