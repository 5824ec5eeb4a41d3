"""Nothing hangs before the Replicator exists, and no lost work exits 0 (issue 14).

Each case of tests/runtime/programs/startup_mpi.py runs under the launcher
(``python -m replicate.launch -n N``) and under a plain ``mpiexec -n N python -m replicate``
(the documented entry for other launchers), with 2 and 3 processes (the 3-process variants in
the second tier: ``pytest -n 2 -m slow``, run by CI too), with a hard timeout. A
failing case must end the whole job within ``EXIT_WITHIN`` seconds, non-zero, with a message
naming the rank and what happened, and leave no process behind.
"""

from __future__ import annotations

import os
import subprocess
import sys
import uuid

import numpy as np
import pytest

from conftest import (
    MPIEXEC,
    PROGRAMS,
    ROOT,
    assert_no_orphans,
    assert_no_shm_left,
    child_env,
    needs_mpi,
    report,
    run,
    shm_mapped,
)

PROGRAM = "startup_mpi.py"
EXIT_WITHIN = 10.0  # seconds from start to the end of the job, the bound
# the 3-process variants are in the second tier (``slow``: ``pytest -n 2 -m slow``, and CI)
STYLES = [pytest.param(launcher, n, id=f"{'launcher' if launcher else 'mpiexec'}-n{n}",
                       marks=[pytest.mark.slow] if n == 3 else [])
          for launcher in (True, False) for n in (2, 3)]


def marker_line(marker):
    with open(os.path.join(PROGRAMS, PROGRAM)) as f:
        hits = [i for i, line in enumerate(f, 1) if line.rstrip().endswith(f"# MARK {marker}")]
    assert len(hits) == 1, marker
    return f"{PROGRAM}:{hits[0]}"


def job(case, *extra, n=2, launcher=False, bootstrap=True, timeout=60, **env):
    token = f"tok-{uuid.uuid4().hex}"
    args = [PROGRAM, case, "--token", token, *extra]
    if launcher:
        cmd = [sys.executable, "-m", "replicate.launch", "-n", str(n), *args]
    else:
        cmd = [MPIEXEC, "-n", str(n), sys.executable, *(["-m", "replicate"] if bootstrap else []),
               *args]
    result = run(cmd, timeout=timeout, env=child_env(**env))
    assert_no_orphans(token)
    assert_no_shm_left(result)
    return result


def mpi(test):
    """Marks a test that runs under mpiexec (skipped without mpi4py and the wheel's mpiexec)."""
    for mark in needs_mpi:
        test = mark(test)
    return test


def ends_fast(result):
    text = report(result)
    assert result.returncode != 0, text
    assert result.seconds < EXIT_WITHIN, f"took {result.seconds:.1f} s\n{text}"
    return text


@pytest.fixture(scope="module")
def data_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("data") / "data.npy"
    np.save(path, np.arange(4.0))
    return str(path)


# -- healthy jobs are not disturbed ------------------------------------------------------------
@pytest.mark.parametrize("launcher,n", STYLES)
@mpi
def test_a_healthy_job_ends_with_exit_code_0(launcher, n):
    result = job("ok", n=n, launcher=launcher)
    assert result.returncode == 0, report(result)
    for rank in range(n):
        assert f"rank {rank} finished 6 steps" in result.stdout, report(result)
    assert "[replicate" not in result.stderr, report(result)


@mpi
def test_a_slow_rank_is_not_a_dead_one():
    """Rank 1 spends 3 s before its Replicator (loading data, compiling): no timeout fires."""
    result = job("slow-start", launcher=True)
    assert result.returncode == 0, report(result)
    assert "rank 1 finished 6 steps" in result.stdout, report(result)


# -- a rank fails before or after its Replicator exists -----------------------------------------
RAISES = {  # case -> (exception line, marker)
    "raise-before-import": ("RuntimeError: rank 1 broke before importing replicate",
                            "before-import"),
    "raise-after-import": ("ValueError: rank 1 broke before its Replicator", "after-import"),
    "raise-after-mpi4py": ("RuntimeError: rank 1 broke after its own mpi4py import",
                           "after-mpi4py"),
}


@pytest.mark.parametrize("launcher,n", STYLES)
@pytest.mark.parametrize("case", sorted(RAISES))
@mpi
def test_a_rank_that_raises_before_its_replicator_ends_the_job(case, launcher, n):
    text = ends_fast(job(case, n=n, launcher=launcher))
    line, marker = RAISES[case]
    kind = line.split(":")[0]
    assert f"[replicate] rank 1: uncaught {kind}; aborting the job" in text, text
    assert f"[rank 1] {line}" in text, text  # the traceback, every line prefixed with the rank
    assert f'[rank 1]   File "{PROGRAM}", line {marker_line(marker).split(":")[1]}' in text, text


@pytest.mark.parametrize("launcher,n", STYLES)
@mpi
def test_a_data_file_missing_on_one_rank_ends_the_job(launcher, n, data_file):
    text = ends_fast(job("missing-file", "--data", data_file, n=n, launcher=launcher))
    assert "[replicate] rank 1: uncaught FileNotFoundError; aborting the job" in text, text
    assert f"[rank 1] FileNotFoundError: [Errno 2] No such file or directory: " \
           f"'{data_file}.missing'" in text, text


@pytest.mark.parametrize("launcher,n", STYLES)
@mpi
def test_an_argparse_error_on_one_rank_ends_the_job(launcher, n):
    result = job("argparse-error", n=n, launcher=launcher)
    text = ends_fast(result)
    assert "error: argument --steps: invalid int value: 'six'" in text, text
    assert "[replicate] rank 1: exited with code 2; aborting the job" in text, text
    assert result.returncode == 2, text


# -- a rank leaves early with exit code 0 ----------------------------------------------------------
@pytest.mark.parametrize("launcher,n", STYLES)
@pytest.mark.parametrize("case", ["sys-exit-0", "os-exit-0"])
@mpi
def test_a_rank_that_exits_0_mid_run_fails_the_job(case, launcher, n):
    text = ends_fast(job(case, n=n, launcher=launcher))
    assert "rank 1 exited early (code 0) at step 3" in text, text
    assert "finished 6 steps" not in text, text


@pytest.mark.parametrize("n", [2, pytest.param(3, marks=pytest.mark.slow)])
@mpi
def test_exit_0_below_python_is_caught_by_the_launcher(n):
    """``_exit(0)`` from C: no hook sees it; mpiexec ends the others and returns 0 (or, when it
    counts one it killed, 9); the launcher's records show rank 1 left first, unfinished."""
    result = job("c-exit-0", n=n, launcher=True)
    text = ends_fast(result)
    if result.returncode == 1:
        assert "[replicate.launch] rank 1 exited early (code 0) at step 3: " in text, text
    else:
        assert "[replicate.launch] rank 1 ended first, at step 3, without finishing its " \
               "script" in text, text


@pytest.mark.parametrize("launcher", [True, False])
@mpi
def test_the_ranks_lines_reach_the_terminal_whole(launcher):
    """Two ranks print 2000 lines each at once with ``print(a, b, c)`` under PYTHONUNBUFFERED
    (its pieces are separate writes): every line arrives whole (before: ``line 0 5line 1 5``)."""
    import re

    result = job("lines", launcher=launcher)
    assert result.returncode == 0, report(result)
    lines = [x for x in result.stdout.splitlines() if "mpich-shm-mapped" not in x]
    broken = [x for x in lines if not re.fullmatch(r"line [01] \d+", x)]
    assert not broken and len(lines) == 4000, (len(lines), broken[:5])


@pytest.mark.skipif(not os.path.exists("/proc/self/fd"), reason="needs Linux's /proc/self/fd")
@mpi
def test_the_launchers_link_is_numbered_above_hydras_pmi_connection():
    """hydra kills the other ranks when a rank's PMI connection closes: it must close after the
    link that tells the launcher which rank ended first. A dead process's files are released
    highest descriptor first, so the link must be numbered above every PMI descriptor (else a
    rank hydra killed is seen ending first: the CI and Linux 6.18 here saw it in about half the
    runs of the test below; 0 of 20 after)."""
    result = job("pmi-order", n=2, launcher=True)
    assert result.returncode == 0, report(result)
    lines = [x for x in result.stdout.splitlines() if " pmi-order " in x]
    assert len(lines) == 2 and all(" pmi-order ok:" in x for x in lines), report(result)


@pytest.mark.skipif(not os.path.exists("/proc/self/maps"),
                    reason="needs /proc/self/maps (Linux) to find MPICH's shared-memory files")
@mpi
def test_the_launcher_removes_the_shared_memory_of_a_job_no_rank_aborted():
    """Rank 1 ends by ``_exit(0)`` below Python and mpiexec kills rank 0: no rank ran the
    cleanup before ``MPI_Abort``, and MPICH's file in /dev/shm would stay until the machine
    restarts. The launcher removes the files its ranks recorded (``runtime/job/mpi_shm.py``)."""
    result = job("c-exit-0", launcher=True)  # (job() asserts that none is left)
    assert result.returncode != 0, report(result)
    assert result.stdout.count("mpich-shm-mapped:") == 2, report(result)
    assert shm_mapped(result), report(result)


# -- ranks configured differently ----------------------------------------------------------------
FIELDS = ["mode", "backend", "replicas_per_rank", "outputs", "options", "check_finite",
          "check_sync", "collective_timeout", "variables", "bucket_exchange"]


@pytest.mark.parametrize("launcher,n", STYLES)
@mpi
def test_each_configuration_field_differing_on_one_rank_is_named_on_every_rank(launcher, n):
    result = job("config-fields", n=n, launcher=launcher)
    text = report(result)
    assert result.returncode == 0, text
    for rank in range(n):
        for field in FIELDS:
            lines = [line for line in result.stdout.splitlines()
                     if line.startswith(f"rank {rank} field {field}: ")]
            assert len(lines) == 1, (field, text)
            assert "the ranks constructed their Replicator differently" in lines[0], text
            if field == "variables":
                assert "variables (number of Variables alive in the process; rank 0: " in \
                    lines[0], text
                assert "rank 1: 'extra' float64[3, 2] created at startup_mpi.py:" in lines[0], text
            elif field == "options":
                assert "options.bucket_bytes: rank 0: 1048576, rank 1: 1024" in lines[0], text
            elif field == "bucket_exchange":
                assert "  bucket_exchange: rank 0: 'parts', rank 1: 'packed'" in lines[0], text
            else:
                assert f"  {field}: rank 0: " in lines[0], text
        assert f"rank {rank} config-fields done" in result.stdout, text


@pytest.mark.parametrize("launcher,n", STYLES)
@mpi
def test_a_configuration_difference_ends_the_job_with_the_error_on_every_rank(launcher, n):
    text = ends_fast(job("config-replicas_per_rank", n=n, launcher=launcher))
    for rank in range(n):
        assert f"[rank {rank}] replicate.errors.ConfigMismatchError: the ranks constructed " \
               f"their Replicator differently (at {marker_line('config')}" in text, text
    assert "  replicas_per_rank: rank 0: 1, rank 1: 2" in text, text
    assert "input ran out" not in text, text


@pytest.mark.parametrize("launcher,n", STYLES)
@mpi
def test_restore_on_one_rank_is_named_by_the_library(launcher, n, tmp_path):
    ckpt = str(tmp_path / "ck.npz")
    text = ends_fast(job("restore-one-rank", "--data", ckpt, n=n, launcher=launcher))
    assert "CollectiveMismatchError: processes disagree about their next cross-process " \
           "exchange" in text, text
    assert f"rank 1: checkpoint restore({ckpt!r}) at {marker_line('restore')}" in text, text
    assert f"rank 0: the start of step 1 (its input check, before step_fn) in Replicator.run " \
           f"at {marker_line('run')}" in text, text
    assert "MPIR_" not in text and "Fatal error" not in text, text  # no MPICH error stack


# -- a runtime error inside a compiled step -----------------------------------------------------
@pytest.mark.parametrize("launcher,n", STYLES)
@mpi
def test_an_out_of_range_index_in_a_compiled_step_ends_the_job_with_the_line(launcher, n):
    text = ends_fast(job("index", n=n, launcher=launcher))
    assert "[replicate] rank 1 failed at step 3 (step); aborting the job:" in text, text
    assert "[rank 1] IndexError: index 20 is out of bounds for axis 0 with size 10" in text, text
    assert f"at {marker_line('index')}" in text, text


# -- without the bootstrap ------------------------------------------------------------------------
@mpi
def test_import_replicate_under_mpiexec_installs_the_hook():
    """Plain ``mpiexec python script.py``: a failure after ``import replicate`` ends the job."""
    text = ends_fast(job("raise-after-import", bootstrap=False))
    assert "[replicate] rank 1: uncaught ValueError; aborting the job" in text, text


@mpi
def test_sys_exit_0_without_the_bootstrap_is_still_noticed():
    text = ends_fast(job("sys-exit-0", bootstrap=False))
    assert "rank 1 exited early at step 3" in text, text  # (the exit code is the bootstrap's)


# -- the bootstrap on one process -------------------------------------------------------------
def bootstrap(*args, cwd=PROGRAMS):
    return subprocess.run([sys.executable, "-m", "replicate", *args], cwd=cwd, env=child_env(),
                          capture_output=True, text=True, timeout=60)


def test_the_bootstrap_runs_a_script_like_python(tmp_path):
    script = tmp_path / "hello.py"
    script.write_text("import sys\nprint(__name__, sys.argv, sys.path[0] == %r)\n"
                      "sys.exit(int(sys.argv[1]))\n" % str(tmp_path))
    result = bootstrap(str(script), "0")
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == f"__main__ {[str(script), '0']} True"
    assert bootstrap(str(script), "3").returncode == 3


def test_the_bootstrap_runs_a_module_and_reports_errors_like_python(tmp_path):
    (tmp_path / "mod_ok.py").write_text("import sys\nprint(__name__, sys.argv[1:])\n")
    (tmp_path / "mod_bad.py").write_text("def f():\n    raise KeyError('k')\nf()\n")
    result = bootstrap("-m", "mod_ok", "a", "b", cwd=tmp_path)
    assert (result.returncode, result.stdout.strip()) == (0, "__main__ ['a', 'b']"), result.stderr
    result = bootstrap("-m", "mod_bad", cwd=tmp_path)
    assert result.returncode == 1
    assert "KeyError: 'k'" in result.stderr and 'mod_bad.py", line 2, in f' in result.stderr
    assert "runpy" not in result.stderr and "bootstrap.py" not in result.stderr, result.stderr


def test_the_bootstrap_refuses_what_it_cannot_run(tmp_path):
    result = bootstrap(str(tmp_path / "nope.py"))
    assert result.returncode == 2 and "no such file" in result.stderr, result.stderr
    result = bootstrap("--frobnicate")
    assert result.returncode == 1 and "unknown option '--frobnicate'" in result.stderr
    result = bootstrap("--help")
    assert result.returncode == 0 and "usage: python -m replicate" in result.stdout


# -- the launcher's verdict (no processes) ----------------------------------------------------
def test_the_launchers_verdict_from_the_ranks_records():
    import functools

    from replicate.launch import verdict as verdict_on
    from replicate.runtime.job import status

    def rec(state, step):
        return {"pid": 1, "state": state, "code": 0, "step": step, "host": "h"}

    verdict = functools.partial(verdict_on, here="h")  # (every rank ran on this host)
    done = {0: rec(status.DONE, 6), 1: rec(status.DONE, 6)}
    assert verdict(0, done, 2) == (0, None)
    assert verdict(3, done, 2) == (3, None)  # mpiexec's own failure stands
    code, text = verdict(0, {0: rec(status.DONE, 6), 1: rec(status.RUNNING, 3)}, 2)
    assert code == 1 and text.startswith("[replicate.launch] rank 1 exited early (code 0) at "
                                         "step 3: "), text
    both = {0: rec(status.RUNNING, 4), 1: rec(status.RUNNING, 3)}
    code, text = verdict(0, both, 2, first=1)
    assert code == 1 and "rank 1 exited early (code 0) at step 3" in text
    assert "(unfinished: rank 0 at step 4)" in text, text
    code, text = verdict(0, both, 2, first=None)  # which one left first is not known
    assert code == 1 and "ranks [0, 1] exited early (code 0)" in text, text
    code, text = verdict(9, both, 2, first=1)  # killed, or exit() below Python
    assert code == 9 and "rank 1 ended first, at step 3, without finishing" in text, text
    failed = {0: rec(status.FAILED, 4), 1: rec(status.RUNNING, 4)}
    assert verdict(1, failed, 2) == (1, None)  # rank 0 said why itself
    # seen ending at one instant (a busy machine): the rank the others waited for is named
    three = {0: rec(status.RUNNING, 4), 1: rec(status.RUNNING, 3), 2: rec(status.RUNNING, 4)}
    code, text = verdict(0, three, 3, first=None, together=[0, 1, 2])
    assert code == 1 and text.startswith("[replicate.launch] rank 1 exited early (code 0) at "
                                         "step 3: "), text
    assert "ranks [0, 1, 2] were seen ending together; rank 1 is the one the others" in text
    code, text = verdict(9, three, 3, first=None, together=[0, 1, 2])
    assert code == 9 and "rank 1 ended first, at step 3, without finishing" in text, text
    # no one rank behind (two at the lowest step, or no step yet): none is named
    tied = {**three, 2: rec(status.RUNNING, 3)}
    code, text = verdict(0, tied, 3, first=None, together=[0, 1, 2])
    assert "ranks [0, 1, 2] exited early (code 0)" in text, text
    unstarted = {**three, 0: rec(status.RUNNING, None)}
    code, text = verdict(0, unstarted, 3, first=None, together=[0, 1, 2])
    assert "ranks [0, 1, 2] exited early (code 0)" in text, text
    code, text = verdict(0, three, 3, first=None, together=[0, 2])  # rank 1 not among them
    assert "ranks [0, 1, 2] exited early (code 0)" in text, text
    # rank 1 left no record (its host did not answer): it is named, not rank 0, which ended
    # first here because mpiexec ended it
    code, text = verdict(9, {0: rec(status.RUNNING, 7)}, 2, first=0, together=[0])
    assert code == 9 and "ranks [1] left no record here" in text, text
    assert "rank 0 ended first" not in text, text
    # rank 1 ran on another host (its record fetched): rank 0 here ended first, but that
    # says nothing about rank 1; rank 1 is behind, so it is named, with its host
    away = {**three, 1: dict(three[1], host="g")}
    code, text = verdict(9, away, 3, first=0, together=[0])
    assert "rank 1 on g ended first, at step 3, without finishing" in text, text
    assert "ranks [0, 1, 2] ended on several hosts; rank 1 is the one" in text, text
    code, text = verdict(9, {**away, 1: dict(away[1], step=4)}, 3, first=0, together=[0])
    assert "ranks [0, 1, 2] ended without finishing: rank 0 on h at step 4, rank 1 on g at " \
        "step 4" in text and "(which one is not known across hosts)" in text, text


def test_status_records_round_trip(tmp_path, monkeypatch):
    from replicate.runtime.job import status

    record = status.Record(str(tmp_path / "rank-3"))
    record.set_step(41)
    record.set_state(status.DONE, 0)
    record.set_state(status.FAILED, 7)  # the first verdict stands
    (tmp_path / "rank-x").write_text("not a record")
    found = status.read(str(tmp_path))
    assert list(found) == [3]
    assert (found[3]["state"], found[3]["code"], found[3]["step"], found[3]["pid"]) == \
        (status.DONE, 0, 41, os.getpid())


def test_a_rank_on_another_host_keeps_its_record_there_for_the_launcher_to_fetch(tmp_path):
    """A rank whose launcher folder is missing on its host makes it (private) and keeps its
    record there; ``python -m replicate.launch.remote FOLDER`` prints the records as JSON lines
    and removes the folder — but not a folder a launcher holds, nor one that is not the user's."""
    from replicate.launch import remote
    from replicate.runtime.job import status

    folder = tmp_path / "replicate-launch-elsewhere"
    code = ("from replicate.runtime.job import status; status.open_record(3); status.set_step(12);"
            "status.set_reason('Traceback...\\n[rank 3] KeyError: 7'); "
            "status.set_state(status.FAILED, 1)")
    run([sys.executable, "-c", code], env=child_env(REPLICATE_LAUNCH_DIR=str(folder)), check=True,
        job=False)
    assert folder.is_dir() and folder.stat().st_mode & 0o777 == 0o700
    result = run([sys.executable, "-m", "replicate.launch.remote", str(folder)], check=True,
                 job=False)
    got = remote.parse("a login banner\n" + result.stdout)
    assert list(got) == [3] and got[3]["step"] == 12 and got[3]["why"] == "KeyError: 7", got
    assert got[3]["state"] == status.FAILED and got[3]["host"] and not folder.exists()
    import socket

    assert all(remote.this_host(h) for h in ("localhost", "127.0.0.1", socket.gethostname()))
    assert not remote.this_host("node1-of-another-machine")
    held = tmp_path / "held"  # a launcher's own folder: read, not removed
    held.mkdir(mode=0o700)
    status.Record(str(held / "rank-0"))
    (held / remote.LOCK).write_text("")
    assert remote.main([str(held)]) == 0 and held.exists()
    shared = tmp_path / "shared"  # writable by others: neither read nor removed
    shared.mkdir()
    shared.chmod(0o777)
    status.Record(str(shared / "rank-0"))
    result = run([sys.executable, "-m", "replicate.launch.remote", str(shared)], check=True,
                 job=False)
    assert result.stdout == "" and shared.exists()


@mpi
def test_the_launcher_passes_module_and_arguments(tmp_path):
    (tmp_path / "shout.py").write_text(
        "import sys, replicate as rp\n"
        "sys.stdout.write(f'rank {rp.process_index()} args {sys.argv[1:]}\\n')\n")
    result = run([sys.executable, "-m", "replicate.launch", "-n", "2", "-m", "shout", "x", "--y"],
                 cwd=str(tmp_path), env=child_env(PYTHONPATH=f"{ROOT}{os.pathsep}{tmp_path}"))
    assert result.returncode == 0, report(result)
    for rank in (0, 1):
        assert f"rank {rank} args ['x', '--y']" in result.stdout, report(result)


def test_local_variables_and_generators_are_left_out_of_the_configuration():
    import replicate as rp
    import replicate.numpy as rnp
    from replicate.runtime.checks.config import fields

    rep = rp.Replicator(lambda ctx: iter([]), lambda batch: None)
    before = fields(rep.settings)["variables"]
    own = [rp.Variable(np.zeros(2), local=True), rnp.random.Generator(local=True)]
    assert fields(rep.settings)["variables"] == before
    shared = rp.Variable(np.zeros((2, 3), np.float32))
    assert fields(rep.settings)["variables"] == before + [((2, 3), "float32")]
    del own, shared
    assert fields(rep.settings)["variables"] == before  # gone with the last reference
