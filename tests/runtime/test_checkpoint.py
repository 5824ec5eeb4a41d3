"""Checkpoints, resuming, and the things around ``Replicator.run`` (callbacks, metrics, progress).

The resume tests train a small model with BatchNorm running statistics, Dropout (a random key in
a buffer) and Adam under a learning-rate schedule, so every kind of state must survive the round
trip: a run saved at step 50 and continued in a *fresh process* to step 100 must end bitwise equal
to an uninterrupted 100-step run — with one process, and with two processes under ``mpiexec``.
"""

from __future__ import annotations

import json
import os
import sys
import textwrap

import numpy as np
import pytest

import replicate as rp
import replicate.numpy as rnp
from conftest import MPIEXEC, have_mpi, run
from conftest import checkpoint_files as _listing
from replicate.runtime.variables import checkpoint

TIMEOUT = 120


# ================================================================================================
# save / restore / load
# ================================================================================================
def _state(seed=0):
    rng = np.random.default_rng(seed)
    model = rp.nn.Sequential(rp.nn.Linear(3, 4, rng=rng), rp.nn.BatchNorm(4),
                             rp.nn.Dropout(0.5, seed=seed), rp.nn.Linear(4, 2, rng=rng,
                                                                         dtype=np.float64))
    opt = rp.optim.Adam(model.parameters(), lr=0.1)
    for var in model.variables().values():  # non-trivial values everywhere
        if var.dtype.kind == "f":
            var.assign(rng.normal(size=var.shape))
    return model, opt, {"model": model.variables(), "opt": opt.variables(),
                        "extra": [rp.Variable(np.arange(5, dtype=np.int32))]}


def _values(state):
    return {k: v.numpy().copy() for k, v in checkpoint.named_variables(state).items()}


def test_round_trip(tmp_path):
    model, opt, state = _state(0)
    opt.apply({n: np.ones(v.shape, v.dtype) for n, v in model.parameters().items()})
    saved = _values(state)
    path = str(tmp_path / "sub" / "ck.npz")  # the folder is created
    rp.checkpoint.save(path, state, step=42, meta={"note": "hello", "lr": 0.1})

    _, _, other = _state(1)  # a fresh model with different values
    before = _values(other)
    assert any(not np.array_equal(before[k], saved[k]) for k in saved)
    info = rp.checkpoint.restore(path, other)
    assert info["step"] == 42 and info["meta"] == {"note": "hello", "lr": 0.1}
    after = _values(other)
    assert set(after) == set(saved)
    for key in saved:
        assert after[key].dtype == saved[key].dtype and after[key].shape == saved[key].shape
        assert after[key].tobytes() == saved[key].tobytes(), key
    # the restored variables are independent copies, and they are used by the next step
    other["extra"][0].assign(np.zeros(5, np.int32))
    assert rp.checkpoint.load(path)[0]["extra/0"].tolist() == [0, 1, 2, 3, 4]


@pytest.mark.parametrize("mode", ["graph", "eager"])
def test_restored_values_are_used_by_compiled_and_eager_steps(tmp_path, mode):
    w = rp.Variable(np.ones(3), name="w")
    f = rp.function(lambda x: rnp.sum(x * w), mode=mode)
    assert float(f(np.ones(3))) == 3.0  # compiled / cached with the old value around
    rp.checkpoint.save(str(tmp_path / "a.npz"), {"w": rp.Variable(np.full(3, 2.0))})
    rp.checkpoint.restore(str(tmp_path / "a.npz"), {"w": w})
    assert float(f(np.ones(3))) == 6.0
    w.read()  # an eager read after restore sees the restored value
    assert float(rnp.sum(w.read())) == 6.0


def test_npz_is_plain_numpy(tmp_path):
    model, opt, state = _state(0)
    path = str(tmp_path / "ck.npz")
    rp.checkpoint.save(path, state, step=7, meta={"epoch": 3})
    with np.load(path, allow_pickle=False) as data:  # no pickles: plain arrays only
        files = set(data.files)
        assert "info" in files
        info = json.loads(bytes(data["info"]).decode())
        assert info["step"] == 7 and info["meta"] == {"epoch": 3}
        for name, var in checkpoint.named_variables(state).items():
            key = f"var/{name}"
            assert key in files
            np.testing.assert_array_equal(data[key], var.numpy())
            assert data[key].dtype == var.dtype
    assert "var/model/0.weight" in files and "var/model/1.running_mean" in files
    assert "var/opt/step" in files and "var/opt/m/0" in files and "var/extra/0" in files


def test_named_variables_accepts_modules_and_refuses_other_leaves():
    model = rp.nn.Sequential(rp.nn.Linear(2, 2), rp.nn.BatchNorm(2))
    assert set(checkpoint.named_variables(model)) == set(model.variables())
    with pytest.raises(rp.ReplicateError, match="nest of Variables"):
        checkpoint.named_variables({"a": np.zeros(2)})


def _no_temp_files(folder):
    leftovers = [f for f in os.listdir(folder) if f.startswith(".tmp") or f.endswith(".tmp")]
    assert not leftovers, leftovers


def test_atomic_write_leaves_no_temporary_files(tmp_path):
    _, _, state = _state(0)
    for i in range(3):
        rp.checkpoint.save(str(tmp_path / "ck.npz"), state, step=i)
    assert sorted(os.listdir(tmp_path)) == ["ck.npz"]
    _no_temp_files(tmp_path)


@pytest.mark.parametrize("exc", [OSError("disk full"), KeyboardInterrupt()])
def test_failed_write_does_not_clobber_the_existing_checkpoint(tmp_path, monkeypatch, exc):
    _, _, state = _state(0)
    path = str(tmp_path / "ck.npz")
    rp.checkpoint.save(path, state, step=1)
    with open(path, "rb") as f:
        good = f.read()

    def failing_savez(file, *args, **kwargs):
        file.write(b"PK\x03\x04 half a zip")  # part of the data reaches the disk, then it fails
        raise exc

    for var in checkpoint.named_variables(state).values():
        if var.dtype.kind == "f":
            var.assign(np.zeros(var.shape))
    monkeypatch.setattr(np, "savez", failing_savez)
    # an error is a CheckpointError naming the path (raised alike on every rank), caused by it
    with pytest.raises(rp.CheckpointError if isinstance(exc, Exception) else type(exc)) as e:
        rp.checkpoint.save(path, state, step=2)
    if isinstance(exc, Exception):
        assert path in str(e.value) and "disk full" in str(e.value)
        assert e.value.__cause__ is exc
    monkeypatch.undo()
    with open(path, "rb") as f:
        assert f.read() == good
    assert os.listdir(tmp_path) == ["ck.npz"]
    _no_temp_files(tmp_path)
    assert rp.checkpoint.load(path)[1]["step"] == 1
    # and saving works again afterwards
    rp.checkpoint.save(path, state, step=3)
    assert rp.checkpoint.load(path)[1]["step"] == 3


def test_restore_errors(tmp_path):
    _, _, state = _state(0)
    path = str(tmp_path / "ck.npz")
    rp.checkpoint.save(path, {"model": state["model"]})
    with pytest.raises(rp.ReplicateError, match="lacks"):
        rp.checkpoint.restore(path, state)
    wrong = {"model": dict(state["model"])}
    wrong["model"]["0.weight"] = rp.Variable(np.zeros((4, 3), np.float32))
    with pytest.raises(rp.ReplicateError, match="0.weight"):
        rp.checkpoint.restore(path, wrong)
    wrong["model"]["0.weight"] = rp.Variable(np.zeros((3, 4), np.float64))  # dtype differs
    with pytest.raises(rp.ReplicateError, match="0.weight"):
        rp.checkpoint.restore(path, wrong)
    with pytest.raises(rp.ReplicateError, match="cannot read"):
        rp.checkpoint.restore(str(tmp_path / "missing.npz"), state)
    (tmp_path / "garbage.npz").write_bytes(b"not a zip")
    with pytest.raises(rp.ReplicateError, match="cannot read"):
        rp.checkpoint.restore(str(tmp_path / "garbage.npz"), state)


# ================================================================================================
# A small training program (used in-process and as a script in fresh processes)
# ================================================================================================
PROGRAM = textwrap.dedent('''
    """Train a small classifier; optionally resume from a checkpoint; save every variable."""
    import argparse
    import json

    import numpy as np

    import replicate as rp
    from replicate.runtime.variables import checkpoint
    from replicate.runtime.communication.comm import world


    def build():
        rng = np.random.default_rng(0)
        model = rp.nn.Sequential(rp.nn.Linear(6, 16, rng=rng), rp.nn.BatchNorm(16),
                                 rp.nn.relu, rp.nn.Dropout(0.2, seed=1),
                                 rp.nn.Linear(16, 3, rng=rng))
        schedule = rp.optim.warmup_cosine(0.02, 10, 100, final_lr=0.001)
        opt = rp.wrap_optimizer(rp.optim.Adam(model.parameters(), lr=schedule))
        return model, opt


    def dataset():
        rng = np.random.default_rng(1)
        x = rng.normal(size=(200, 6)).astype(np.float32)
        y = (x[:, 0] + x[:, 1] > 0).astype(np.int64) + (x[:, 2] > 0.5).astype(np.int64)
        return x, y


    def make(k=2, mode="graph"):
        model, opt = build()
        x, y = dataset()

        def input_fn(ctx):
            return rp.shard_batches((x, y), 8, ctx, seed=2, epochs=None)

        def step_fn(batch):
            xb, yb = batch
            logits = model(xb)
            loss = rp.nn.softmax_cross_entropy(logits, yb).mean()
            opt.apply(rp.grad(loss, model.parameters()))
            return {"loss": loss, "logits": logits}

        rep = rp.Replicator(input_fn, step_fn, mode=mode, replicas_per_rank=k)
        return rep, {"model": model.variables(), "opt": opt.variables()}


    def main(argv=None):
        ap = argparse.ArgumentParser()
        ap.add_argument("out")
        ap.add_argument("--steps", type=int, required=True)
        ap.add_argument("--k", type=int, default=2)
        ap.add_argument("--resume", default=None)
        ap.add_argument("--ckpt", default=None, help="pattern for the Checkpoint callback")
        ap.add_argument("--every", type=int, default=25)
        args = ap.parse_args(argv)
        rep, state = make(args.k)
        if args.resume:
            assert rep.restore(args.resume, state) == 50
        callbacks = []
        if args.ckpt:
            callbacks.append(rp.callbacks.Checkpoint(args.ckpt, state, every=args.every, keep=2))
        hist = rep.run(steps=args.steps, callbacks=callbacks)
        rank = world().rank
        arrays = {name: var.numpy() for name, var in checkpoint.named_variables(state).items()}
        np.savez(args.out if rank == 0 else f"{args.out}.rank{rank}.npz",
                 _step=np.array(rep.step), _losses=np.array([h["loss"] for h in hist]),
                 _ranks=np.array(rep.num_ranks), **arrays)


    if __name__ == "__main__":
        main()
''')


def _program(tmp_path):
    path = tmp_path / "ckprog.py"
    path.write_text(PROGRAM)
    return str(path)


def _run(cmd, cwd, timeout=TIMEOUT):
    """Run a command with a hard timeout (a hang fails the test instead of blocking the suite)."""
    result = run(cmd, cwd=cwd, timeout=timeout, check=True, job=cmd[0] != sys.executable)
    return result.stdout, result.stderr


def _load(path):
    with np.load(path) as data:
        return {k: data[k] for k in data.files}


def _assert_bitwise(a, b, what):
    assert set(a) == set(b), what
    for key in a:
        if key == "_losses":
            continue
        assert a[key].dtype == b[key].dtype, (what, key)
        assert a[key].tobytes() == b[key].tobytes(), f"{what}: {key} differs"


def _check_resume(tmp_path, launcher):
    prog = _program(tmp_path)
    ck = str(tmp_path / "ck_{step}.npz")
    full, first, resumed = (str(tmp_path / n) for n in ("full.npz", "first.npz", "resumed.npz"))
    # 1. the uninterrupted run
    _run(launcher + [prog, full, "--steps", "100"], tmp_path)
    # 2. an interrupted one: 50 steps, checkpoints at 25 and 50, then the process ends
    _run(launcher + [prog, first, "--steps", "50", "--ckpt", ck], tmp_path)
    assert os.path.exists(ck.format(step=50)) and os.path.exists(ck.format(step=25))
    _no_temp_files(tmp_path)
    # 3. a fresh process restores step 50 and runs the remaining 50 steps
    _run(launcher + [prog, resumed, "--steps", "50", "--resume", ck.format(step=50)], tmp_path)
    a, b = _load(full), _load(resumed)
    assert int(a["_step"]) == int(b["_step"]) == 100
    assert int(b["opt/step"]) == 100
    _assert_bitwise(a, b, "resumed vs uninterrupted")
    # the resumed run saw the same batches, so its losses are the tail of the full run's
    assert a["_losses"][50:].tobytes() == b["_losses"].tobytes()
    assert not np.array_equal(_load(first)["model/0.weight"], a["model/0.weight"])
    return a, b


def test_resume_in_a_fresh_process_is_bitwise_equal(tmp_path):
    a, _ = _check_resume(tmp_path, [sys.executable])
    assert int(a["_ranks"]) == 1


@pytest.mark.mpi
@pytest.mark.skipif(not have_mpi(), reason="needs mpi4py and mpiexec (mpich wheel)")
def test_resume_with_two_processes_is_bitwise_equal(tmp_path):
    a, b = _check_resume(tmp_path, [MPIEXEC, "-n", "2", sys.executable])
    assert int(a["_ranks"]) == 2
    for name in ("full.npz", "resumed.npz"):  # every rank ends in the same state
        _assert_bitwise(_load(str(tmp_path / name)), _load(str(tmp_path / f"{name}.rank1.npz")),
                        f"rank 0 vs rank 1 ({name})")


@pytest.fixture
def program():
    namespace = {"__name__": "ckprog"}
    exec(compile(PROGRAM, "ckprog.py", "exec"), namespace)  # noqa: S102 - our own source above
    return namespace


def test_resume_in_one_process_is_bitwise_equal(tmp_path, program):
    """The same, in-process: fresh objects, restored with ``Replicator.restore``."""
    rep, state = program["make"]()
    full_hist = rep.run(steps=30)
    full = _values(state)

    rep, state = program["make"]()
    rep.run(steps=17)
    rp.checkpoint.save(str(tmp_path / "ck.npz"), state, step=rep.step)

    rep, state = program["make"]()
    assert rep.restore(str(tmp_path / "ck.npz"), state) == 17 and rep.step == 17
    hist = rep.run(steps=13)
    assert rep.step == 30
    resumed = _values(state)
    for key in full:
        assert full[key].tobytes() == resumed[key].tobytes(), key
    for h_full, h in zip(full_hist[17:], hist):
        assert h_full["loss"].tobytes() == h["loss"].tobytes()


# ================================================================================================
# Callbacks, metrics, progress
# ================================================================================================
def _tiny(k=2, mode="graph"):
    w = rp.Variable(np.ones(2), name="w")

    def input_fn(ctx):
        while True:
            yield np.full(2, ctx.replica_id + 1.0)

    def step_fn(x):
        loss = rnp.sum((x * w) ** 2)
        w.assign(w - 0.01 * rp.all_reduce(rp.grad(loss, w), "mean"))
        return {"loss": loss, "parts": {"a": rnp.sum(w.read()), "vec": x * 2.0}}

    return rp.Replicator(input_fn, step_fn, mode=mode, replicas_per_rank=k), w


def test_checkpoint_callback_keeps_the_last_n(tmp_path):
    rep, w = _tiny()
    pattern = str(tmp_path / "ck-{step:04d}.npz")
    cb = rp.callbacks.Checkpoint(pattern, {"w": w}, every=2, keep=3)
    rep.run(steps=11, callbacks=[cb])
    assert _listing(tmp_path) == ["ck-0006.npz", "ck-0008.npz", "ck-0010.npz"]
    assert cb.written == [pattern.format(step=s) for s in (6, 8, 10)]
    arrays, info = rp.checkpoint.load(pattern.format(step=10))
    assert info["step"] == 10
    # a later run goes on counting steps and rotating files
    rep.run(steps=3, callbacks=[cb])
    assert _listing(tmp_path) == ["ck-0010.npz", "ck-0012.npz", "ck-0014.npz"]
    np.testing.assert_array_equal(rp.checkpoint.load(pattern.format(step=14))[0]["w"],
                                  w.numpy())


def test_checkpoint_callback_keep_zero_keeps_everything(tmp_path):
    rep, w = _tiny(k=1)
    cb = rp.callbacks.Checkpoint(str(tmp_path / "ck-{step}.npz"), {"w": w}, every=3, keep=0)
    rep.run(steps=10, callbacks=[cb])
    assert _listing(tmp_path) == ["ck-3.npz", "ck-6.npz", "ck-9.npz"]


@pytest.mark.parametrize("mode,k", [("graph", 2), ("eager", 1)])
def test_metrics_jsonl(tmp_path, mode, k):
    rep, _ = _tiny(k, mode)
    path = str(tmp_path / "logs" / "metrics.jsonl")  # the folder is created
    hist = rep.run(steps=5, metrics=path)
    with open(path) as f:
        lines = [json.loads(line) for line in f]
    assert len(lines) == 5
    for i, (line, h) in enumerate(zip(lines, hist), start=1):
        # only the scalar outputs, by dotted name, with the step
        assert set(line) == {"step", "loss", "parts.a"}
        assert line["step"] == i
        assert line["loss"] == float(h["loss"])
        assert line["parts.a"] == float(h["parts"]["a"])
    rep.run(steps=2, metrics=path)  # appends, numbering on
    with open(path) as f:
        assert [json.loads(line)["step"] for line in f] == [1, 2, 3, 4, 5, 6, 7]


def test_progress_bar(capsys):
    rep, _ = _tiny()
    hist = rep.run(steps=4, progress=True)
    assert len(hist) == 4
    err = capsys.readouterr().err
    assert "4/4" in err and "loss" in err
    # and without a total (until the input runs out)
    def finite_input(ctx):
        for _ in range(3):
            yield np.ones(2)

    rep2 = rp.Replicator(finite_input, lambda x: {"s": rnp.sum(x)}, replicas_per_rank=2)
    assert len(rep2.run(progress=True)) == 3
    assert "3step" in capsys.readouterr().err.replace(" ", "")


def test_callbacks_every_step_and_every_n():
    rep, w = _tiny()
    calls, every3 = [], []

    def record(r, step, outputs):
        assert r is rep
        calls.append((step, float(outputs["loss"]), w.numpy().copy()))

    hist = rep.run(steps=7, callbacks=[record, rp.callbacks.Every(3, lambda r, s, o:
                                                                    every3.append(s))])
    assert [c[0] for c in calls] == list(range(1, 8))
    assert [c[1] for c in calls] == [float(h["loss"]) for h in hist]
    # a callback runs after the step's variable updates
    np.testing.assert_array_equal(calls[-1][2], w.numpy())
    assert not np.array_equal(calls[0][2], calls[1][2])
    assert every3 == [3, 6]
    rep.run(steps=3, callbacks=[rp.callbacks.Every(3, lambda r, s, o: every3.append(s))])
    assert every3 == [3, 6, 9]


def test_scalars_helper():
    out = rp.callbacks.scalars({"b": np.float32(2.0), "a": [np.array(1.0), np.zeros(3)],
                                "c": {"d": np.array([5.0])}})
    assert out == {"a.0": 1.0, "b": 2.0, "c.d": 5.0}
    assert rp.callbacks.scalars(np.array(3.0)) == {"value": 3.0}


def test_metrics_of_per_replica_outputs_with_one_replica(tmp_path):
    """With outputs="per_replica" and one replica every scalar leaf has shape (1,): it is still
    a scalar for the metrics log and the progress bar."""
    def input_fn(ctx):
        while True:
            yield np.ones(2)

    rep = rp.Replicator(input_fn, lambda x: {"s": rnp.sum(x)}, outputs="per_replica")
    path = str(tmp_path / "m.jsonl")
    hist = rep.run(steps=2, metrics=path, progress=True)
    assert hist[0]["s"].shape == (1,)
    with open(path) as f:
        assert [json.loads(line) for line in f] == [{"step": 1, "s": 2.0}, {"step": 2, "s": 2.0}]


def test_checkpoint_callback_with_a_fixed_file_name_keeps_it(tmp_path):
    """A pattern without {step} ("last.npz") is overwritten each time and never rotated away."""
    rep, w = _tiny()
    path = str(tmp_path / "last.npz")
    cb = rp.callbacks.Checkpoint(path, {"w": w}, every=1, keep=2)
    rep.run(steps=5, callbacks=[cb])
    assert _listing(tmp_path) == ["last.npz"]
    arrays, info = rp.checkpoint.load(path)
    assert info["step"] == 5
    np.testing.assert_array_equal(arrays["w"], w.numpy())


@pytest.mark.skipif(not hasattr(os, "umask") or os.name != "posix", reason="POSIX permissions")
def test_checkpoint_file_has_the_permissions_of_a_plain_file(tmp_path):
    """The temporary file is private (mkstemp); the checkpoint it becomes is not."""
    import stat

    path = str(tmp_path / "ck.npz")
    rp.checkpoint.save(path, {"w": rp.Variable(np.ones(2))})
    np.savez(str(tmp_path / "plain.npz"), a=np.ones(2))
    mode = stat.S_IMODE(os.stat(path).st_mode)
    assert mode == stat.S_IMODE(os.stat(str(tmp_path / "plain.npz")).st_mode), oct(mode)


# ================================================================================================
# save under two processes: every rank returns once the file is in place, or raises alike
# ================================================================================================
def test_failed_write_in_one_process_is_a_checkpoint_error_naming_the_path(tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    path = str(blocker / "ck.npz")
    with pytest.raises(rp.CheckpointError, match="cannot write checkpoint") as e:
        rp.checkpoint.save(path, {"w": rp.Variable(np.ones(2))})
    assert path in str(e.value) and isinstance(e.value.__cause__, OSError)


@pytest.mark.mpi
@pytest.mark.skipif(not have_mpi(), reason="needs mpi4py and mpiexec (mpich wheel)")
def test_every_rank_reads_the_checkpoint_right_after_save_and_sees_a_failed_write(tmp_path):
    """``tests/runtime/programs/checkpoint_mpi.py``: after each of 10 saves (a fixed name and a
    ``{step}`` pattern) each rank reads the file itself and finds this save's step and values;
    a write that fails on rank 0 is a ``CheckpointError`` naming the path on both ranks, and the
    ranks save together again afterwards."""
    out = str(tmp_path / "seen")
    result = run([MPIEXEC, "-n", "2", sys.executable, "checkpoint_mpi.py", out],
                 timeout=TIMEOUT, check=True)
    blocked = str(tmp_path / "a-file" / "ck.npz")
    for rank in (0, 1):
        with open(f"{out}.rank{rank}.json") as f:
            seen = json.load(f)
        assert seen["size"] == 2, result.stderr
        assert seen["reads"] == [[s, s, True] for s in range(10)], (rank, seen["reads"])
        error = seen["error"]
        assert error is not None and error["type"] == "CheckpointError", (rank, error)
        assert blocked in error["message"] and error["consistent"], (rank, error)
        assert seen["after"] == 11
