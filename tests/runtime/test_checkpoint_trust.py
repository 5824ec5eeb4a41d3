"""Checkpoints from someone else, and two jobs on one pattern (issue 36): reading is bounded by
the file, every malformed file is a ``CheckpointError`` that ``restore(pattern)`` falls back from,
the files name their run, and rotation deletes only its own run's files."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
import time
import tracemalloc
import zipfile

import numpy as np
import pytest

import replicate as rp
from conftest import checkpoint_files
from replicate.runtime.variables import checkpoint, runs


def _npy(a) -> bytes:
    buf = io.BytesIO()
    np.lib.format.write_array(buf, np.asarray(a), allow_pickle=False)
    return buf.getvalue()


def _craft(path, arrays: dict, info: dict | None = None, raw: dict | None = None,
           compression=zipfile.ZIP_STORED):
    """A checkpoint written by hand: ``arrays`` (with a correct index unless ``info`` is given),
    ``raw`` members as given bytes."""
    if info is None:
        info = {"step": 1, "meta": {}, "format": 2, "dtypes": {}, "per_replica": {},
                "sha256": {f"var/{k}": checkpoint.digest(np.asarray(v)) for k, v in arrays.items()}}
    with zipfile.ZipFile(path, "w", compression=compression) as z:
        for key, value in arrays.items():
            z.writestr(f"var/{key}.npy", _npy(value))
        for name, data in (raw or {}).items():
            z.writestr(name, data)
        z.writestr("info.npy", _npy(np.frombuffer(json.dumps(info).encode(), np.uint8)))


def test_a_compressed_member_is_refused_before_it_is_inflated(tmp_path):
    """64 MiB of zeros deflate to 64 KiB: ``np.load`` inflated it all. Only stored members are
    read."""
    path = str(tmp_path / "bomb.npz")
    _craft(path, {"w": np.zeros(8 << 20)}, compression=zipfile.ZIP_DEFLATED)
    assert os.path.getsize(path) < 200_000
    tracemalloc.start()
    try:
        with pytest.raises(rp.CheckpointError, match="is compressed"):
            checkpoint.load(path)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 8 << 20, f"{peak} bytes allocated reading a {os.path.getsize(path)}-byte file"


def test_a_header_declaring_more_than_the_file_holds_allocates_nothing(tmp_path):
    path = str(tmp_path / "liar.npz")
    header = io.BytesIO()
    np.lib.format.write_array_header_1_0(header, {"descr": "<f8", "fortran_order": False,
                                                  "shape": (8 << 20,)})
    _craft(path, {}, raw={"var/w.npy": header.getvalue() + b"\0" * 64},
           info={"step": 1, "sha256": {"var/w": "0" * 64}})
    tracemalloc.start()
    try:
        with pytest.raises(rp.CheckpointError, match="declares"):
            checkpoint.load(path)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 8 << 20, f"{peak} bytes allocated for a member of 64 bytes"


@pytest.mark.parametrize("info", [
    {"step": 2, "dtypes": {"var/w": "no-such-dtype"}},  # was a TypeError out of restore
    {"step": "2"},
    [1, 2],
    {"step": 2, "per_replica": {"var/w": "x"}},
    {"step": 2, "sha256": ["x"]},
])
def test_a_malformed_newest_file_falls_back_to_the_previous_one(tmp_path, info):
    w = rp.Variable(np.arange(3.0), name="w")
    pattern = str(tmp_path / "ck-{step}.npz")
    rp.checkpoint.save(pattern.format(step=1), {"w": w}, step=1)
    if isinstance(info, dict):
        info["sha256"] = info.get("sha256", {"var/w": checkpoint.digest(np.ones(3))})
    _craft(pattern.format(step=2), {"w": np.ones(3)}, info=info)
    with pytest.raises(rp.CheckpointError):
        checkpoint.load(pattern.format(step=2))
    w.assign(np.zeros(3))
    with pytest.warns(UserWarning, match="using the previous checkpoint"):
        got = rp.checkpoint.restore(pattern, {"w": w})
    assert got["step"] == 1 and w.numpy().tolist() == [0.0, 1.0, 2.0]


def test_only_the_members_the_state_names_are_read(tmp_path):
    path = str(tmp_path / "ck.npz")
    a, b = rp.Variable(np.arange(3.0), name="a"), rp.Variable(np.arange(4.0), name="b")
    rp.checkpoint.save(path, {"a": a, "b": b}, step=5)
    with zipfile.ZipFile(path) as z:  # b's bytes flipped: its checksum no longer matches
        members = {m: z.read(m) for m in z.namelist()}
    members["var/b.npy"] = members["var/b.npy"][:-8] + b"\xff" * 8
    with zipfile.ZipFile(path, "w") as z:
        for name, data in members.items():
            z.writestr(name, data)
    with pytest.raises(rp.CheckpointError, match="checksum mismatch in 'b'"):
        checkpoint.load(path)
    a.assign(np.zeros(3))
    assert rp.checkpoint.restore(path, {"a": a})["step"] == 5  # b is never read
    assert a.numpy().tolist() == [0.0, 1.0, 2.0]
    with pytest.raises(rp.CheckpointError, match="checksum mismatch in 'b'"):
        rp.checkpoint.restore(path, {"a": a, "b": b})


def test_temporary_files_of_dead_writers_are_removed_by_the_next_save(tmp_path):
    w = rp.Variable(np.arange(3.0), name="w")
    dead, alive, young = (str(tmp_path / f".tmp-{n}.npz") for n in ("dead", "alive", "young"))
    for path in (dead, alive, young):
        with open(path, "wb") as f:
            f.write(b"PK half a checkpoint")
    old = time.time() - 2 * checkpoint.STALE_AFTER
    os.utime(dead, (old, old))
    os.utime(alive, (old, old))
    holder = subprocess.Popen([sys.executable, "-c", (  # a live writer: holds its file's lock
        "import fcntl, sys, time; f = open(sys.argv[1], 'rb'); fcntl.flock(f, fcntl.LOCK_EX); "
        "print('locked', flush=True); time.sleep(60)"), alive], stdout=subprocess.PIPE,
        text=True)
    try:
        assert holder.stdout.readline().strip() == "locked"
        rp.checkpoint.save(str(tmp_path / "ck.npz"), {"w": w}, step=1)
    finally:
        holder.kill()
        holder.wait()
    assert sorted(os.listdir(tmp_path)) == [".tmp-alive.npz", ".tmp-young.npz", "ck.npz"]


def _tiny(w):
    def input_fn(ctx):
        while True:
            yield np.ones(2, np.float32)

    def step_fn(x):
        w.assign(w + x.sum())
        return {"w": w}

    return rp.Replicator(input_fn, step_fn, mode="eager", replicas_per_rank=1)


def test_a_second_run_on_one_pattern_is_refused_and_rotation_keeps_other_runs_files(tmp_path):
    pattern = str(tmp_path / "ck-{step:03d}.npz")
    w = rp.Variable(np.zeros(()), name="w")
    first = rp.callbacks.Checkpoint(pattern, {"w": w}, every=1, keep=2)
    _tiny(w).run(steps=3, callbacks=[first])
    assert checkpoint_files(tmp_path) == ["ck-002.npz", "ck-003.npz"]
    run = first.run
    assert len(run) == 16 and runs.run_of(pattern.format(step=3)) == run
    # a new job on the same pattern, not continuing that run: refused before it writes
    other = rp.callbacks.Checkpoint(pattern, {"w": w}, every=1, keep=2)
    with pytest.raises(rp.CheckpointError, match=f"another run.*{run}"):
        _tiny(w).run(steps=1, callbacks=[other])
    assert checkpoint_files(tmp_path) == ["ck-002.npz", "ck-003.npz"]
    # a job that says which run it is (here another one) keeps to its own files
    mine = rp.callbacks.Checkpoint(pattern, {"w": w}, every=1, keep=1, run="beef")
    rep = _tiny(w)
    rep.step = 10
    rep.run(steps=3, callbacks=[mine])
    assert checkpoint_files(tmp_path) == ["ck-002.npz", "ck-003.npz", "ck-013.npz"]
    assert runs.run_of(pattern.format(step=13)) == "beef"


def test_rotation_deletes_neither_another_runs_file_nor_through_a_link(tmp_path):
    w = rp.Variable(np.zeros(()), name="w")
    theirs, link = str(tmp_path / "ck-1.npz"), str(tmp_path / "ck-2.npz")
    rp.checkpoint.save(theirs, {"w": w}, run="aaaa")
    os.symlink(theirs, link)
    assert not runs.remove_own(theirs, "bbbb") and not runs.remove_own(link, "aaaa")
    assert os.path.exists(theirs) and os.path.islink(link)
    assert runs.remove_own(theirs, "aaaa") and not os.path.exists(theirs)


def test_a_restored_run_goes_on_under_its_id(tmp_path, monkeypatch):
    pattern = str(tmp_path / "ck-{step:03d}.npz")
    w = rp.Variable(np.zeros(()), name="w")
    first = rp.callbacks.Checkpoint(pattern, {"w": w}, every=1, keep=2)
    _tiny(w).run(steps=2, callbacks=[first])
    for fd in runs._locks.values():  # a fresh process: the first job has ended, its lock gone
        os.close(fd)
    monkeypatch.setattr(runs, "_locks", {})
    monkeypatch.setattr(runs, "_continued", {})  # (and it restored nothing yet)
    rep = _tiny(w)
    assert rep.restore(pattern, {"w": w}) == 2
    again = rp.callbacks.Checkpoint(pattern, {"w": w}, every=1, keep=2)
    rep.run(steps=2, callbacks=[again])
    assert again.run == first.run
    assert checkpoint_files(tmp_path) == ["ck-003.npz", "ck-004.npz"]  # its own files rotated


def test_a_second_live_job_on_one_pattern_is_refused_even_when_it_restored(tmp_path):
    pattern = str(tmp_path / "ck-{step}.npz")
    holder = subprocess.Popen([sys.executable, "-c", (
        "import sys, time; from replicate.runtime.variables import runs; "
        "print(runs.claim(sys.argv[1]), flush=True); time.sleep(60)"), pattern],
        stdout=subprocess.PIPE, text=True)
    try:
        run = holder.stdout.readline().strip()
        with pytest.raises(rp.CheckpointError, match=f"in use by another live job.*{run}"):
            runs.claim(pattern, run)
    finally:
        holder.kill()
        holder.wait()
    assert runs.claim(pattern, run) == run  # the first job is gone: its run may go on
