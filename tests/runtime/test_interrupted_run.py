"""The test suite leaves no process behind when it is interrupted: a pytest run (plain, and
with two xdist workers) whose test is in the middle of a 2-rank MPI job gets SIGINT (Ctrl-C) or
SIGTERM; once it has ended, no process of that job is left (``tests/job_cleanup.py``)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid

import job_cleanup
import pytest

from conftest import child_env, exclusive, needs_mpi, orphans

pytestmark = needs_mpi

INNER = '''
from conftest import mpirun


def test_a_job_that_outlasts_the_run():
    mpirun("-c", "import time; time.sleep(120)", {token!r}, timeout=300)
'''


def _ctrl_c_default():
    """SIGINT as a terminal gives it (in the child, before exec). An ignored signal survives
    exec, and a non-interactive shell starts its background commands (``pytest ... &``) with
    SIGINT ignored: the inner run would then ignore the Ctrl-C this test sends."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


@pytest.mark.parametrize("workers", [0, 2], ids=["plain", "xdist"])
@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_an_interrupted_run_leaves_no_process_of_its_jobs(signum, workers, tmp_path):
    token = f"interrupted-{uuid.uuid4().hex}"  # in the ranks' and mpiexec's command lines
    session = f"inner{uuid.uuid4().hex[:12]}"
    (tmp_path / "test_inner.py").write_text(INNER.format(token=token))
    env = child_env(TMPDIR=str(tmp_path))  # the inner run's core locks are its own
    for name in [n for n in env if n.startswith("PYTEST_")]:  # not this run's xdist worker
        del env[name]
    env[job_cleanup.SESSION_VAR] = session
    cmd = [sys.executable, "-m", "pytest", "-p", "conftest", "-p", "no:cacheprovider", "-q",
           "--rootdir", str(tmp_path), "test_inner.py", *(["-n", str(workers)] if workers else [])]
    with exclusive():
        pytest_run = subprocess.Popen(cmd, cwd=tmp_path, env=env, stdout=subprocess.PIPE,
                                      stderr=subprocess.STDOUT, text=True,
                                      start_new_session=True, preexec_fn=_ctrl_c_default)
        try:
            deadline = time.monotonic() + 90
            while len(orphans(token)) < 3:  # mpiexec and its 2 ranks are running
                assert pytest_run.poll() is None, pytest_run.communicate()[0]
                assert time.monotonic() < deadline, "the inner job never started"
                time.sleep(0.1)
            os.kill(pytest_run.pid, signum)  # pytest alone, as `kill` or a CI runner would
            out = pytest_run.communicate(timeout=60)[0]
        finally:
            if pytest_run.poll() is None:
                os.killpg(pytest_run.pid, signal.SIGKILL)
            left = orphans(token), job_cleanup.tagged(f"{session}.")
            job_cleanup.kill_tagged(f"{session}.")  # leave nothing to the next test either
            for pid in orphans(token):
                os.kill(pid, signal.SIGKILL)
    assert left == ([], []), (f"left behind: with the token {left[0]}, with the run's tag "
                              f"{left[1]}\n{out}")
    assert pytest_run.returncode != 0, out


def test_the_cleanup_finds_a_jobs_ranks_by_their_tag():
    """The ranks and hydra's proxy run in sessions of their own: the job's process group is
    mpiexec alone, so only the environment's tag reaches them."""
    token = f"tagged-{uuid.uuid4().hex}"
    env = child_env()
    tag = env[job_cleanup.VAR] = job_cleanup.new_job_tag()
    mpiexec = os.path.join(os.path.dirname(sys.executable), "mpiexec")
    with exclusive():
        job = subprocess.Popen([mpiexec, "-n", "2", sys.executable, "-c",
                                "import time; time.sleep(120)", token], env=env,
                               start_new_session=True)
        try:
            deadline = time.monotonic() + 60
            while len(orphans(token)) < 3:
                assert time.monotonic() < deadline, "the job never started"
                time.sleep(0.1)
            sessions = {os.getsid(pid) for pid in orphans(token)}
            assert len(sessions) == 3, sessions  # mpiexec's and each rank's own
            job_cleanup.kill_job(job, tag)
            job.wait(timeout=10)
            assert orphans(token) == [] and job_cleanup.tagged(tag + "\0") == []
        finally:
            job_cleanup.kill_tagged(tag + "\0")
