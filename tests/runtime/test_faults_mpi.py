"""The fault suite across processes: a rank that raises, is killed with SIGKILL, stalls, leaves
early, calls a different collective or produces NaN. Every case runs ``mpiexec -n 2`` with a hard
timeout and must end the whole job — non-zero exit, within a bounded time, a report naming the
rank, the collective and the step — with no process left behind.

The programs are in tests/runtime/programs/faults_mpi.py (scenarios) and faults_resume.py (kill and
resume).
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
import uuid

import numpy as np
import pytest

from conftest import (
    MPIEXEC,
    PROGRAMS,
    assert_no_orphans,
    checkpoint_files,
    child_env,
    exclusive,
    mpirun,
    needs_mpi,
    report,
)
from replicate.runtime.job import mpi_shm

pytestmark = needs_mpi
PROGRAM = "faults_mpi.py"
EXIT_WITHIN = 10.0  # seconds from the fault to the end of the job (issue 7)
STALL_TIMEOUT = 2  # REPLICATE_COLLECTIVE_TIMEOUT for the stall cases


def marker_line(marker, program=PROGRAM):
    with open(os.path.join(PROGRAMS, program)) as f:
        hits = [i for i, line in enumerate(f, 1) if line.rstrip().endswith(f"# MARK {marker}")]
    assert len(hits) == 1, marker
    return f"{program}:{hits[0]}"


def faults(*args, timeout=60, **env):
    token = f"tok-{uuid.uuid4().hex}"
    result = mpirun(PROGRAM, *args, "--token", token, timeout=timeout, env=child_env(**env))
    assert_no_orphans(token)
    return result


# -- a healthy run is not disturbed ----------------------------------------------------------------
@pytest.mark.parametrize("mode", ["graph", "eager"])
def test_healthy_run_finishes_without_reports(mode):
    result = faults("ok", "--mode", mode, REPLICATE_COLLECTIVE_TIMEOUT=STALL_TIMEOUT)
    assert result.returncode == 0, report(result)
    for rank in (0, 1):
        assert f"rank {rank} finished 8 steps" in result.stdout, report(result)
    assert "[replicate]" not in result.stderr, report(result)


# -- a rank fails ---------------------------------------------------------------------------------
@pytest.mark.parametrize("rank", [0, 1])
@pytest.mark.parametrize("mode", ["graph", "eager"])
def test_exception_on_any_rank_ends_the_job_within_10s(rank, mode):
    result = faults("raise", "--mode", mode, "--rank", str(rank))
    text = report(result)
    assert result.returncode != 0, text
    assert result.seconds < EXIT_WITHIN, text
    assert f"[replicate] rank {rank} failed at step 3" in result.stderr, text
    assert f"RuntimeError: injected failure on rank {rank}" in result.stderr, text
    # the user's frame, not the library's
    assert "faults_mpi.py" in result.stderr and "replicator.py" not in result.stderr, text
    assert "finished" not in result.stdout, text


def run_and_kill(args, rank, step):
    """Start ``mpiexec -n 2 python ARGS``, SIGKILL rank ``rank`` from outside once it printed
    step ``step``; return (returncode, seconds from the kill to the end of the job, stdout,
    stderr)."""
    with exclusive():
        return _run_and_kill(args, rank, step)


def _run_and_kill(args, rank, step):
    token = f"tok-{uuid.uuid4().hex}"
    cmd = [MPIEXEC, "-n", "2", sys.executable, *args, "--token", token]
    proc = subprocess.Popen(cmd, cwd=PROGRAMS, env=child_env(), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)
    lines, pid, killed_at, shm = [], None, None, []
    deadline = time.monotonic() + 60
    try:
        for line in proc.stdout:  # (two ranks' lines may arrive glued together)
            lines.append(line)
            pid = pid or next(iter(re.findall(rf"rank {rank} pid (\d+)", line)), None)
            steps = [int(s) for s in re.findall(rf"rank {rank} step (\d+)", line)]
            if pid and steps and max(steps) >= step:
                # no rank aborts: MPICH's files in /dev/shm would outlive the job (removed below)
                shm = mpi_shm.identify(f"/proc/{pid}/maps")
                os.kill(int(pid), signal.SIGKILL)
                killed_at = time.monotonic()
                break
            if time.monotonic() > deadline:
                break
        if killed_at is None:
            out, err = proc.communicate(timeout=30)
            pytest.fail(f"rank {rank} never reached step {step}:\n{''.join(lines)}{out}\n{err}")
        out, err = proc.communicate(timeout=30)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        pytest.fail(f"hang after kill -9 of rank {rank}:\n{''.join(lines)}{out}\n{err}")
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        mpi_shm.remove_same(shm)
    seconds = time.monotonic() - killed_at
    assert_no_orphans(token)
    return proc.returncode, seconds, "".join(lines) + out, err


@pytest.mark.parametrize("rank,mode", [(0, "graph"), (1, "graph"), (1, "eager")])
def test_kill_9_of_any_rank_ends_the_job_within_10s(rank, mode):
    args = [PROGRAM, "ok", "--mode", mode, "--steps", "1000", "--sleep", "0.02"]
    code, seconds, out, err = run_and_kill(args, rank, 5)
    assert code != 0, (out, err)
    assert seconds < EXIT_WITHIN, (seconds, out, err)
    assert "finished" not in out, (out, err)
    assert "BAD TERMINATION" in out + err and "signal 9" in out + err, (out, err)


# -- a rank stalls: the watchdog names it, the collective and the step -----------------------------
def _assert_stall_report(result, collective, step_text, rank_where, limit=STALL_TIMEOUT):
    text = report(result)
    assert result.returncode != 0, text
    # the timeout, the peers' answers (up to 2 s), the abort, and process start-up
    assert result.seconds < limit + EXIT_WITHIN, text
    assert "collective timed out: rank 0 waited" in result.stderr, text
    assert collective in result.stderr, text
    assert step_text in result.stderr, text
    assert "ranks that have not arrived: [1]; arrived: [0]" in result.stderr, text
    assert f"rank 1: has not arrived: {step_text}" in result.stderr, text
    assert rank_where in result.stderr, text


def test_stall_in_an_eager_step_is_reported_and_aborted():
    result = faults("stall-step", "--mode", "eager", REPLICATE_COLLECTIVE_TIMEOUT=STALL_TIMEOUT)
    # (rank 0 waits in the tagged check of its first collective: a fixed-size header)
    _assert_stall_report(result, "allgather #", "at step 3",
                         f"main thread is at {marker_line('step-sleep')}")
    assert f"called from {marker_line('first-collective')}" in result.stderr, report(result)


def test_stall_in_input_fn_is_reported_and_aborted_graph_mode():
    """The timeout given as a Replicator option (the environment has none)."""
    result = faults("stall-input", "--mode", "graph", "--k", "2", "--timeout", str(STALL_TIMEOUT))
    _assert_stall_report(result, "allgather #", "at step 3",
                         f"main thread is at {marker_line('input-sleep')}")
    assert "at step 3 (input)" in result.stderr, report(result)


def test_stall_in_an_nccl_collective_is_reported_and_aborted():
    """A rank that never joins a collective on the device (the stand-in's NCCL, one stand-in GPU
    per rank): named by the watchdog with the collective, its step and the rank's line, as an
    MPI one."""
    token = f"tok-{uuid.uuid4().hex}"
    result = mpirun("stall_nccl_mpi.py", "--token", token, timeout=60, env=child_env())
    assert_no_orphans(token)
    _assert_stall_report(result, "on communicator 'nccl'", "at step 3",
                         f"main thread is at {marker_line('nccl-sleep', 'stall_nccl_mpi.py')}")
    assert re.search(r"allreduce\(sum\)( \(bucket\))? #2 on communicator 'nccl' "
                     r"\(float64\[4\]\) at step 3 \(step\)", result.stderr), report(result)
    assert "rank 0 step 2" in result.stdout and "rank 0 step 3" not in result.stdout


def test_stall_on_a_duplicate_communicator_in_another_thread():
    """A communication thread (as the gradient-bucketing one) waits on ``world().dup()``."""
    result = faults("stall-thread", REPLICATE_COLLECTIVE_TIMEOUT=STALL_TIMEOUT)
    text = report(result)
    assert result.returncode != 0, text
    assert result.seconds < STALL_TIMEOUT + EXIT_WITHIN, text
    assert "allreduce(sum) #0 on communicator 'world.dup1' (float64[50000])" in result.stderr, text
    assert "(thread 'comm-thread')" in result.stderr, text
    assert "ranks that have not arrived: [1]" in result.stderr, text
    assert f"main thread is at {marker_line('thread-sleep')}" in result.stderr, text


def test_rank_that_leaves_early_is_noticed_at_once():
    """With the default timeout (300 s) a rank that exits while its peer waits for it in a
    collective it will never join still ends the job in seconds (it says goodbye)."""
    result = faults("exit-early", "--mode", "graph")
    text = report(result)
    assert result.returncode != 0, text
    assert result.seconds < EXIT_WITHIN, text
    assert "rank 1 exited early at step 3; rank 0 waits for it in allgather" in result.stderr, text
    assert "rank 1: has exited, at step 3" in result.stderr, text
    assert "rank 0 finished" not in result.stdout, text


# -- processes disagree about a collective ---------------------------------------------------------
@pytest.mark.parametrize("mode", ["graph", "eager"])
def test_mismatch_names_the_first_divergent_collective_and_its_line(mode):
    result = faults("mismatch-later", "--mode", mode)
    text = report(result)
    assert result.returncode != 0, text
    assert result.seconds < EXIT_WITHIN, text
    assert result.stderr.count("CollectiveMismatchError") >= 2, text  # every rank says it
    assert "rank 1: " in result.stderr and marker_line("divergent") in result.stderr, text
    assert marker_line("common") in result.stderr, text
    assert marker_line("first-collective") not in result.stderr.split("Mismatch")[-1], text
    if mode == "graph":
        assert "processes disagree about cross-process collective #1:" in result.stderr, text
    else:
        assert "processes disagree about an eager collective" in result.stderr, text


# batch shapes that change on one rank only (graph mode): that rank compiles a new step, the
# others do not; the per-step exchange makes every rank compare schedules that step
MISMATCH_TIMEOUT = 5  # a regression (a stall) ends in seconds, not after the 300 s default


def test_batch_shape_change_on_one_rank_is_a_mismatch_not_a_stall():
    result = faults("shape-change", "--mode", "graph",
                    REPLICATE_COLLECTIVE_TIMEOUT=MISMATCH_TIMEOUT)
    text = report(result)
    assert result.returncode != 0, text
    assert result.seconds < EXIT_WITHIN, text
    assert "timed out" not in result.stderr, text
    assert result.stderr.count("CollectiveMismatchError") >= 2, text  # every rank says it
    assert "processes disagree about cross-process collective #2:" in result.stderr, text
    line = marker_line("batch-shaped")
    assert f"rank 0: mpi_allreduce[op=sum,size=2] f64[4] at {line}" in result.stderr, text
    assert f"rank 1: mpi_allreduce[op=sum,size=2] f64[2,4] at {line}" in result.stderr, text
    assert "The ranks' batches differ (input_fn make.<locals>.input_fn (faults_mpi.py:" \
        in result.stderr, text
    assert "rank 0: batch f64[4] (its step was compiled at step 1)" in result.stderr, text
    assert "rank 1: batch f64[2,4] (compiled for it now)" in result.stderr, text
    assert "rank 0 step 2" in result.stdout and "step 3" not in result.stdout, text


def test_batch_shape_change_on_one_rank_runs_when_the_schedules_agree():
    """Only the gradients (parameter-shaped) cross processes: the new step's schedule equals
    the others' compiled one, so every rank goes on."""
    result = faults("shape-change-ok", "--mode", "graph",
                    REPLICATE_COLLECTIVE_TIMEOUT=MISMATCH_TIMEOUT)
    assert result.returncode == 0, report(result)
    for rank in (0, 1):
        assert f"rank {rank} finished 8 steps" in result.stdout, report(result)
    assert "[replicate]" not in result.stderr, report(result)


# a collective on one rank only that equals one every rank calls: graph mode compares the
# schedule as written (CSE merged the two before); eager mode's tagged exchanges meet the other
# rank's step end as a mismatch (before: a misread message, mpi4py's MemoryError)
@pytest.mark.parametrize("mode,rank", [("graph", 1), ("eager", 1), ("eager", 0)])
def test_collective_on_one_rank_equal_to_a_common_one_is_a_mismatch(mode, rank):
    result = faults("duplicate", "--mode", mode, "--rank", str(rank),
                    REPLICATE_COLLECTIVE_TIMEOUT=MISMATCH_TIMEOUT)
    text = report(result)
    other = 1 - rank
    assert result.returncode != 0, text
    assert result.seconds < EXIT_WITHIN, text
    assert "timed out" not in result.stderr and "MemoryError" not in result.stderr, text
    assert "finished" not in result.stdout, text
    assert result.stderr.count("CollectiveMismatchError") >= 2, text  # every rank says it
    line = marker_line("duplicate")
    if mode == "graph":
        assert "processes disagree about cross-process collective #2:" in result.stderr, text
        assert f"rank {rank}: mpi_allreduce[op=sum,size=2] f64[2] at {line}" in result.stderr, text
        assert f"rank {other}: gather of step_fn's outputs (f64[], f64[])" in result.stderr, text
    else:
        assert "processes disagree about an eager collective:" in result.stderr, text
        assert f"rank {rank}: all_reduce(f64[2], op='sum') at {line}" in result.stderr, text
        assert f"rank {other}: the end of step 3: gathering the outputs (f64[], f64[]) of " \
            "step_fn make.<locals>.step_fn" in result.stderr, text


# -- NaN ------------------------------------------------------------------------------------------
@pytest.mark.parametrize("mode,step", [("graph", 1), ("eager", 3)])
def test_non_finite_loss_stops_every_rank_with_the_step(mode, step):
    result = faults("nan", "--mode", mode)
    text = report(result)
    assert result.returncode != 0, text
    assert result.stderr.count("NonFiniteError: step") == 2, text
    assert f"step {step}: non-finite values (check_finite=True)" in result.stderr, text
    assert "output['loss']: inf" in result.stderr, text
    if mode == "graph":
        assert f"log(f64[4]) -> f64[4] at {marker_line('nan-source')}" in result.stderr, text


# -- kill -9 mid-training, restart from the newest checkpoint: bitwise the uninterrupted run -------
def _load(path):
    with np.load(path) as data:
        return {k: data[k] for k in data.files}


def _assert_bitwise(a, b, what):
    assert set(a) == set(b), what
    for key in a:
        if key != "_losses":
            assert a[key].dtype == b[key].dtype and a[key].tobytes() == b[key].tobytes(), \
                f"{what}: {key} differs"


@pytest.mark.parametrize("victim,corrupt", [(1, False), (0, True)])
def test_kill_9_and_resume_is_bitwise_equal_to_an_uninterrupted_run(tmp_path, victim, corrupt):
    """30 steps, a checkpoint every 3 (the last 3 kept). Rank ``victim`` is killed after step
    16; the restarted job resumes from the newest checkpoint (or, when that one is then
    truncated, from the one before, with a warning) and ends bitwise equal to a run that was
    never interrupted, on both ranks."""
    full, resumed = str(tmp_path / "full.npz"), str(tmp_path / "resumed.npz")
    ck = str(tmp_path / "ck" / "step-{step:04d}.npz")
    mpirun("faults_resume.py", full, "--steps", "30", check=True)
    code, seconds, out, err = run_and_kill(
        ["faults_resume.py", str(tmp_path / "killed.npz"), "--steps", "30", "--ckpt", ck,
         "--sleep", "0.05"], victim, 16)
    assert code != 0 and seconds < EXIT_WITHIN, (code, seconds, out, err)
    assert not os.path.exists(str(tmp_path / "killed.npz")), out
    saved = checkpoint_files(tmp_path / "ck")
    assert saved and len(saved) <= 3 and "step-0015.npz" in saved, saved
    newest = ck.format(step=max(int(f[5:9]) for f in saved))
    expect = int(newest[-8:-4])
    if corrupt:
        with open(newest, "r+b") as f:  # the newest checkpoint loses its tail
            f.truncate(os.path.getsize(newest) // 2)
        expect -= 3
    result = mpirun("faults_resume.py", resumed, "--steps", "30", "--ckpt", ck, "--resume",
                    check=True)
    for rank in (0, 1):
        assert f"rank {rank} resumed at step {expect}" in result.stdout, report(result)
    if corrupt:
        assert result.stderr.count("truncated or corrupt") == 2, report(result)  # each rank
        assert "using the previous checkpoint" in result.stderr, report(result)
    a, b = _load(full), _load(resumed)
    assert int(a["_step"]) == int(b["_step"]) == 30
    _assert_bitwise(a, b, "resumed vs uninterrupted")
    assert a["_losses"][expect:].tobytes() == b["_losses"].tobytes()
    _assert_bitwise(b, _load(resumed + ".rank1.npz"), "rank 0 vs rank 1")
