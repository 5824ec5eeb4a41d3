"""The launcher's process manager for one-machine jobs (``replicate/launch/forker.py``, issue
36): MPI starts over inherited socket pairs with nothing listening; a rank that fails ends the
job at once, as hydra ends it; signals reach the ranks; the ranks die with it."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

from conftest import child_env, exclusive, needs_mpi, report, run
from replicate.launch import launcher
from replicate.launch.forker import main as forker_main

FORKER = launcher.FORKER

MPI_JOB = """
import os, sys, time
from mpi4py import MPI
comm = MPI.COMM_WORLD
what = sys.argv[1] if len(sys.argv) > 1 else ""
if what == "sleep":
    sys.stdout.write(f"up {comm.rank} {os.getpid()}\\n")  # (one write: the ranks share the pipe)
    sys.stdout.flush()
    time.sleep(60)
if what == "kill" and comm.rank == 1:
    os.kill(os.getpid(), 9)
if what == "abort" and comm.rank == 1:
    comm.Abort(5)
if what == "exit0" and comm.rank == 1:
    os._exit(0)
total = comm.allreduce(comm.rank + 1)
local = os.environ["MPI_LOCALRANKID"], os.environ["MPI_LOCALNRANKS"]
sys.stdout.write(f"sum {comm.rank} {total} {local[0]} {local[1]}\\n")
sys.stdout.flush()
"""

BEFORE_MPI = """
import os, sys, time
if os.environ["PMI_RANK"] == "1":
    time.sleep(0.5)
    sys.exit(int(sys.argv[1]))
from mpi4py import MPI
MPI.COMM_WORLD.Barrier()
"""

PMI_NAME = """
import os, socket
s = socket.socket(fileno=int(os.environ["PMI_FD"]))
s.sendall(b"cmd=init pmi_version=1 pmi_subversion=1\\ncmd=get_my_kvsname\\n")
data = b""
while data.count(b"\\n") < 2:
    data += s.recv(4096)
print(data.decode().split("kvsname=")[1].split()[0])
"""

UNKNOWN = """
import os, socket
s = socket.socket(fileno=int(os.environ["PMI_FD"]))
s.sendall(b"cmd=init pmi_version=1 pmi_subversion=1\\n")
s.recv(4096)
s.sendall(b"cmd=frobnicate\\n")
s.recv(4096)
"""

NAMES = """
import sys
from mpi4py import MPI
comm = MPI.COMM_WORLD
if comm.rank == 0:
    MPI.Publish_name("svc", "port-of-rank-0")
comm.Barrier()
found = MPI.Lookup_name("svc")
comm.Barrier()
if comm.rank == 0:
    MPI.Unpublish_name("svc", "port-of-rank-0")
comm.Barrier()
try:
    MPI.Lookup_name("svc")
    gone = "still there"
except MPI.Exception:
    gone = "gone"
sys.stdout.write(f"{comm.rank} {found} {gone}\\n")
sys.stdout.flush()
"""

SPAWN = """
import sys
from mpi4py import MPI
MPI.COMM_WORLD.Set_errhandler(MPI.ERRORS_RETURN)
try:
    MPI.COMM_SELF.Spawn(sys.executable, ["-c", "pass"], maxprocs=1)
    print("spawned")
except MPI.Exception:
    print("refused")
"""

CHILDREN = """
import os, subprocess, sys, time
from mpi4py import MPI
comm = MPI.COMM_WORLD
child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
sys.stdout.write(f"child {child.pid}\\n")
sys.stdout.flush()
comm.Barrier()
if comm.rank == 1:
    comm.Abort(3)
time.sleep(60)
"""


def mpi(test):
    for mark in needs_mpi:
        test = mark(test)
    return test


def forker(n, code, *args, timeout=60):
    return run([sys.executable, "-I", "-S", FORKER, "-n", str(n), sys.executable, "-c", code,
                *args],
               timeout=timeout, env=child_env())


@mpi
def test_three_ranks_start_mpi_and_sum_with_hydras_local_variables():
    result = forker(3, MPI_JOB)
    assert result.returncode == 0, report(result)
    lines = sorted(line.split() for line in result.stdout.splitlines() if line.startswith("sum"))
    assert lines == [["sum", str(r), "6", str(r), "3"] for r in range(3)], report(result)


@mpi
@pytest.mark.parametrize("what, code", [("kill", 128 + 9), ("abort", 5), ("exit0", 0)])
def test_a_rank_that_fails_ends_the_others_at_once(what, code):
    """Killed by a signal, ``MPI_Abort``, ``_exit(0)`` without ``MPI_Finalize``: rank 0 is
    waiting in the sum and is killed; the exit code is the failed rank's (hydra's rules)."""
    result = forker(2, MPI_JOB, what, timeout=30)
    assert result.returncode == code, report(result)
    assert "sum" not in result.stdout and result.seconds < 20, report(result)


@mpi
@pytest.mark.parametrize("code", [4, 0])
def test_a_rank_that_ends_before_mpi_does_not_leave_the_others_waiting(code):
    """hydra leaves rank 0 in MPI's start-up forever here; the forker ends the job with the
    rank's code (1 for 0: the job cannot have done its work)."""
    result = forker(2, BEFORE_MPI, str(code), timeout=30)
    assert result.returncode == (code or 1) and result.seconds < 20, report(result)


def test_no_mpi_at_all_runs_every_rank_to_its_end():
    result = forker(3, "import os; print('rank', os.environ['PMI_RANK'])")
    assert result.returncode == 0 and sorted(result.stdout.split()[1::2]) == ["0", "1", "2"], \
        report(result)
    result = forker(2, "import os, sys; sys.exit(3 if os.environ['PMI_RANK'] == '1' else 0)")
    assert result.returncode == 3, report(result)


def test_the_jobs_pmi_name_is_random():
    """MPICH's shared-memory file names derive from it: another user cannot guess them."""
    names = [forker(1, PMI_NAME).stdout.strip() for _ in range(2)]
    secret = [name.rsplit("_", 1)[1] for name in names]  # (the rest is the forker's pid)
    assert secret[0] != secret[1] and all(len(s) == 16 for s in secret), names


def test_a_request_it_does_not_know_ends_the_job_with_a_reason():
    result = forker(2, UNKNOWN, timeout=30)
    assert result.returncode == 1 and "does not serve" in result.stderr, report(result)
    assert "REPLICATE_PROCESS_MANAGER=hydra" in result.stderr


@mpi
def test_mpis_name_service_works_within_the_job():
    result = forker(2, NAMES, timeout=30)
    assert result.returncode == 0, report(result)
    assert sorted(result.stdout.split("\n")[:2]) == ["0 port-of-rank-0 gone",
                                                      "1 port-of-rank-0 gone"], report(result)


@mpi
def test_spawn_is_refused_as_an_mpi_error_said_once():
    result = forker(1, SPAWN, timeout=30)
    assert result.returncode == 0 and result.stdout.strip() == "refused", report(result)
    assert result.stderr.count("MPI_Comm_spawn") == 1, report(result)


@mpi
def test_what_the_ranks_started_goes_with_a_failed_job():
    """Rank 1 aborts: every rank's process group is killed, the processes they started too (a
    child holding the job's output would keep a pipe like ``| tee log`` open)."""
    with exclusive():
        proc = subprocess.Popen([sys.executable, "-I", "-S", FORKER, "-n", "2", sys.executable,
                                 "-c", CHILDREN], env=child_env(), stdout=subprocess.PIPE,
                                stderr=subprocess.DEVNULL, text=True, start_new_session=True)
        try:
            children = [int(proc.stdout.readline().split()[1]) for _ in range(2)]
            assert proc.wait(timeout=30) == 3
            assert _gone(children), f"the ranks' children {children} outlived the job"
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
            proc.stdout.close()


def _started(code, *args):
    proc = subprocess.Popen([sys.executable, "-I", "-S", FORKER, "-n", "2", sys.executable, "-c",
                             code, *args], env=child_env(), stdout=subprocess.PIPE, text=True,
                            start_new_session=True)
    pids = [int(proc.stdout.readline().split()[2]) for _ in range(2)]
    return proc, pids


def _gone(pids, seconds=10.0) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        alive = []
        for pid in pids:
            try:
                with open(f"/proc/{pid}/stat") as f:
                    alive.append(f.read().rsplit(")", 1)[1].split()[0] != "Z")
            except OSError:
                alive.append(False)
        if not any(alive):
            return True
        time.sleep(0.05)
    return False


@mpi
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL])
def test_the_ranks_end_with_the_forker(sig):
    """SIGTERM is passed on to the ranks; SIGKILL of the forker kills them (PR_SET_PDEATHSIG)."""
    with exclusive():
        proc, pids = _started(MPI_JOB, "sleep")
        try:
            proc.send_signal(sig)
            assert _gone(pids), f"ranks {pids} outlived the forker's {sig!r}"
            assert proc.wait(timeout=10) == (128 + 15 if sig == signal.SIGTERM else -9)
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
            proc.stdout.close()


def test_usage():
    assert forker_main(["-n", "x", "true"]) == 2 and forker_main([]) == 2


def test_the_launcher_uses_it_for_a_job_that_names_no_host(monkeypatch):
    monkeypatch.setattr(launcher, "find_mpiexec", lambda: "/opt/mpich/bin/mpiexec")
    assert launcher.command(2, "t.py", ["x"], environ={}) == [
        sys.executable, "-I", "-S", FORKER, "-n", "2", sys.executable, "-m", "replicate", "t.py",
        "x"]
    assert launcher.command(2, "t.py", [], mpi_args=["-ppn", "1"], environ={})[:5] == [
        "/opt/mpich/bin/mpiexec", "-n", "2", "-ppn", "1"]
    hydra = {launcher.MANAGER: "hydra"}
    assert launcher.command(2, "t.py", [], environ=hydra)[0] == "/opt/mpich/bin/mpiexec"
    with pytest.raises(SystemExit, match="must be hydra or auto"):
        launcher.command(2, "t.py", [], environ={launcher.MANAGER: "gforker"})


@mpi
def test_without_pidfd_the_ends_are_polled(monkeypatch):
    """Kernels before 5.3 have no ``pidfd_open``: the forker polls the ranks instead."""
    def missing(pid):
        raise OSError(38, "Function not implemented")
    monkeypatch.setattr(os, "pidfd_open", missing)
    monkeypatch.setattr(signal, "signal", lambda *a: None)  # (this process is pytest's)
    monkeypatch.setattr(os, "environ", child_env())
    with exclusive():
        start = time.monotonic()
        code = forker_main(["-n", "2", sys.executable, "-c", MPI_JOB, "kill"])
    assert code == 128 + 9 and time.monotonic() - start < 20


CTRL_C = """
import sys, time
from replicate.runtime.communication.comm import world
comm = world()
sys.stdout.write(f"up {comm.rank}\\n")
sys.stdout.flush()
for i in range(600):
    comm.allgather_obj(i)
    time.sleep(0.1)
"""


@mpi
def test_ctrl_c_reaches_every_rank_once_and_ends_the_job(tmp_path):
    """Ctrl-C (SIGINT to the launcher's process group, as a terminal sends it): the ranks run in
    sessions of their own, as under hydra, and get it from the forker: they stop with their
    KeyboardInterrupt, and a job the user stopped is not restarted."""
    script = tmp_path / "ctrl_c.py"
    script.write_text(CTRL_C)
    with exclusive():
        proc = subprocess.Popen([sys.executable, "-m", "replicate.launch", "-n", "2",
                                 "--max-restarts", "1", str(script)], env=child_env(),
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                start_new_session=True)
        try:
            up = [proc.stdout.readline() for _ in range(2)]
            assert sorted(up) == ["up 0\n", "up 1\n"], up
            os.killpg(proc.pid, signal.SIGINT)
            out, err = proc.communicate(timeout=30)
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode != 0, err
    # (the first rank to abort ends the job: the other may be killed before it says so)
    assert any(f"rank {r}: KeyboardInterrupt" in err for r in range(2)), err
    assert "restart" not in err, err
