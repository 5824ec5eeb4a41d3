"""What another user of the machine can reach of a job (issue 36): its listeners (read with
``ss``, tried as that user), its MPICH shared memory, the launcher's record folder."""

from __future__ import annotations

import os
import re
import select
import shutil
import signal
import socket
import subprocess
import sys
import time

import pytest

from conftest import MPIEXEC, PROGRAMS, child_env, exclusive, needs_mpi, report, run
from replicate.launch import launcher
from replicate.runtime.job import exposure, mpi_shm, status

OTHER = 65534  # nobody: the other user


def mpi(test):
    for mark in needs_mpi:
        test = mark(test)
    return test


as_root = pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("setpriv"),
                             reason="acting as another user needs root and setpriv")


def _as_other(code: str, *args) -> str:
    """Run Python ``code`` as the other user (the system's Python: the checkout may be closed
    to it); its output."""
    return subprocess.run(["setpriv", f"--reuid={OTHER}", f"--regid={OTHER}", "--clear-groups",
                           "/usr/bin/python3", "-c", code, *args], capture_output=True, text=True,
                          timeout=60).stdout


def _tree(root: int) -> set[int]:
    """``root`` and every process below it."""
    parents = {}
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/stat") as f:
                parents[int(pid)] = int(f.read().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
    found, grew = {root}, True
    while grew:
        more = {p for p, parent in parents.items() if parent in found} - found
        found |= more
        grew = bool(more)
    return found


def _listeners(pids: set[int]) -> list[tuple[str, int]]:
    """(address, port) of each TCP socket listening in one of ``pids`` (``ss -ltnp``)."""
    out = subprocess.run(["ss", "-ltnpH"], capture_output=True, text=True, check=True).stdout
    found = []
    for line in out.splitlines():
        if {int(p) for p in re.findall(r"pid=(\d+)", line)} & pids:
            address, port = line.split()[3].rsplit(":", 1)
            found.append((address.strip("[]"), int(port)))
    return found


CONNECT = """
import socket, sys
for host in sys.argv[2:]:
    s = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET)
    s.settimeout(1.0)
    try:
        s.connect((host, int(sys.argv[1])))
        s.sendall(b"x" * 12)
        print("connected", host)
    except OSError as e:
        print("refused", host, type(e).__name__)
"""


def _start(go, **extra):
    cmd = [sys.executable, "-m", "replicate.launch", "-n", "2", "exposure_mpi.py", "wait", go]
    return subprocess.Popen(cmd, cwd=PROGRAMS, env=child_env(**extra), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)


def _ready(proc, seen: list) -> list[str]:
    """The ranks' two ``ready`` lines; meanwhile, from the launch on, every TCP listener of
    the job's processes is added to ``seen``."""
    fd, text = proc.stdout.fileno(), b""  # (read from the descriptor: no buffer in between)
    deadline = time.monotonic() + 60
    while text.count(b"\n") < 2 and time.monotonic() < deadline and proc.poll() is None:
        seen.extend(x for x in _listeners(_tree(proc.pid)) if x not in seen)
        if select.select([fd], [], [], 0.01)[0]:
            text += os.read(fd, 4096)
    lines = text.decode().splitlines(keepends=True)
    return lines


@mpi
def test_a_one_machine_job_listens_on_nothing_from_its_start(tmp_path):
    """Before: hydra's mpiexec listened on every interface from its start (and until MPI was
    up nothing could close it: 12 bytes from anyone ended the job), and UCX listened on the
    machine's address. Now the launcher's own process manager starts a job on one machine: no
    process of the job holds a TCP listener at any point, start-up included."""
    go, seen = str(tmp_path / "go"), []
    with exclusive():
        proc = _start(go)
        try:
            ready = _ready(proc, seen)
            assert all(line.startswith("ready") for line in ready) and len(ready) == 2, ready
            seen.extend(x for x in _listeners(_tree(proc.pid)) if x not in seen)
            open(go, "w").close()
            out, err = proc.communicate(timeout=60)
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
    assert seen == [], f"the job listened on {seen}"
    assert proc.returncode == 0 and out.count("sum") == 2, (out, err)


@mpi
@as_root
def test_under_hydra_no_listener_accepts_another_user_once_mpi_is_up(tmp_path):
    """With hydra (``REPLICATE_PROCESS_MANAGER=hydra``, or a plain ``mpiexec``): its control
    port stays listed, but once MPI is up no listener of the job accepts another user."""
    go = str(tmp_path / "go")
    with exclusive():
        proc = _start(go, REPLICATE_PROCESS_MANAGER="hydra")
        try:
            ready = [proc.stdout.readline() for _ in range(2)]
            assert all(line.startswith("ready") for line in ready), ready
            found = _listeners(_tree(proc.pid))
            assert found, "the job holds no listener at all: hydra's was expected"
            hosts = {"127.0.0.1", socket.gethostbyname(socket.gethostname())}
            tried = []
            for address, port in found:
                targets = sorted(hosts) if address in ("0.0.0.0", "*", "::") else [address]
                tried.append((address, port, _as_other(CONNECT, str(port), *targets)))
            open(go, "w").close()
            out, err = proc.communicate(timeout=60)
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
    reached = [t for t in tried if "connected" in t[2]]
    assert not reached, f"another user connected to the job's listeners: {reached}"
    assert proc.returncode == 0 and out.count("sum") == 2, (out, err)


LEAKER = """
import socket, subprocess, sys
server = socket.create_server(("127.0.0.1", 0))
server.set_inheritable(True)
subprocess.run(sys.argv[1:], close_fds=False, check=True)
client = socket.create_connection(server.getsockname(), timeout=5)
server.settimeout(5)
server.accept()
print("still accepting")
"""


@mpi
def test_a_listener_leaked_by_whoever_started_mpiexec_is_left_alone(tmp_path):
    """Only mpiexec's own control port is closed, never a socket its parent let it inherit."""
    result = run([sys.executable, "-c", LEAKER, MPIEXEC, "-n", "2", sys.executable,
                  "exposure_mpi.py", "wait", str(tmp_path)])
    assert result.returncode == 0 and "still accepting" in result.stdout, report(result)


@mpi
@as_root
def test_shared_memory_made_by_another_user_stops_the_job_before_any_message():
    """Before: MPICH attached to the other user's file and the job ran on, its messages open
    to that user. Now every rank stops, naming the file and its owner."""
    result = run([MPIEXEC, "-n", "2", sys.executable, "exposure_mpi.py", "takeover", str(OTHER)])
    made = re.search(r"made (\S+)", result.stdout)
    if made and os.path.exists(made.group(1)):
        os.unlink(made.group(1))
    assert made, report(result)
    assert "exchanged" not in result.stdout, report(result)
    assert result.returncode != 0, report(result)
    assert f"belongs to uid {OTHER}" in result.stderr and made.group(1) in result.stderr, \
        report(result)


def test_check_own_names_each_wrong_file(tmp_path):
    name = f"/dev/shm/mpich_shm_test{os.getpid()}_0"
    with open(name, "wb") as f:
        f.write(b"\0" * 64)
    try:
        maps = tmp_path / "maps"
        inode = os.stat(name).st_ino
        maps.write_text(f"7f00-7f01 rw-s 00000000 00:1a {inode}   {name}\n"
                        "7f02-7f03 r--p 00000000 00:1a 12 /usr/lib/libc.so\n")
        os.chmod(name, 0o600)
        assert mpi_shm.check_own(str(maps), since=time.time() - 60) == []
        os.chmod(name, 0o666)
        assert "mode 666" in mpi_shm.check_own(str(maps), since=time.time() - 60)[0]
        os.chmod(name, 0o600)
        assert "older than this job" in mpi_shm.check_own(str(maps), since=time.time() + 60)[0]
        if os.geteuid() == 0:
            os.chown(name, OTHER, OTHER)
            assert f"belongs to uid {OTHER}" in mpi_shm.check_own(str(maps))[0]
        maps.write_text(f"7f00-7f01 rw-s 00000000 00:1a {inode}   {name} (deleted)\n")
        assert "was removed" in mpi_shm.check_own(str(maps))[0]
    finally:
        os.unlink(name)


def test_one_machine_jobs_leave_out_the_network_transports():
    env = {"PMI_SIZE": "2", "MPI_LOCALNRANKS": "2"}
    exposure.before_mpi(env)
    assert env["UCX_TLS"] == exposure.LOCAL_TLS
    env = {"PMI_SIZE": "4", "MPI_LOCALNRANKS": "2"}  # two machines: left as it is
    exposure.before_mpi(env)
    assert "UCX_TLS" not in env
    env = {"PMI_SIZE": "2", "MPI_LOCALNRANKS": "2", "UCX_TLS": "tcp"}  # the user's choice
    exposure.before_mpi(env)
    assert env["UCX_TLS"] == "tcp"
    exposure._inherited.clear()


def test_records_are_never_opened_through_a_link(tmp_path, monkeypatch):
    folder, target = tmp_path / "launch", tmp_path / "precious"
    folder.mkdir(mode=0o700)
    target.write_text("keep me")
    os.symlink(target, folder / "rank-0")
    monkeypatch.setenv(status.ENV, str(folder))
    monkeypatch.setattr(status, "_RECORD", None)
    assert status.open_record(0) is None
    assert target.read_text() == "keep me"
    os.unlink(folder / "rank-0")
    os.chmod(folder, 0o777)  # a folder others may write to: no record either
    assert status.open_record(0) is None and not os.path.exists(folder / "rank-0")
    assert status.read(str(folder)) == {}


@mpi
def test_the_folder_of_a_killed_launcher_goes_at_the_next_launch(tmp_path):
    go = str(tmp_path / "go")
    cmd = [sys.executable, "-m", "replicate.launch", "-n", "1", "exposure_mpi.py", "wait", go]
    with exclusive():
        proc = subprocess.Popen(cmd, cwd=PROGRAMS, env=child_env(), stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True, start_new_session=True)
        line = proc.stdout.readline().split()
        os.killpg(proc.pid, signal.SIGKILL)  # the launcher, mpiexec and the rank
        proc.communicate()
    assert line[:2] == ["ready", "0"], line
    folder = line[3]
    deadline = time.monotonic() + 10
    while os.path.exists(f"/proc/{line[2]}") and time.monotonic() < deadline:
        time.sleep(0.05)
    assert os.path.isdir(folder)
    held = subprocess.Popen([sys.executable, "-c", (  # a live launcher's folder stays
        "from replicate.launch import launcher; import time; "
        "print(launcher.make_folder()[0], flush=True); time.sleep(60)")],
        stdout=subprocess.PIPE, text=True, env=child_env())
    try:
        live = held.stdout.readline().strip()
        result = run([sys.executable, "-m", "replicate.launch", "-n", "1", "exposure_mpi.py",
                      "wait", str(tmp_path)], check=True)
        assert not os.path.exists(folder), report(result)
        assert os.path.isdir(live)
    finally:
        held.kill()
        held.wait()
    assert launcher.remove_dead_folders() and not os.path.exists(live)
