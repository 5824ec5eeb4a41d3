"""The launcher's command line: its own options, mpiexec's passed through (a hostfile naming
localhost, -ppn), ``-m module`` and ``--prefix-rank``."""

from __future__ import annotations

import os
import sys

import pytest

from conftest import child_env, have_mpi, report, run
from replicate.launch import NO_VALUE, command, parse


def test_parse_splits_the_launchers_options_mpiexecs_and_the_scripts():
    assert parse(["-n", "4", "-f", "hosts", "-ppn", "2", "--prefix-rank", "t.py", "--lr", "1"]) \
        == (4, None, True, ["-f", "hosts", "-ppn", "2"], "t.py", ["--lr", "1"])
    assert parse(["-m", "pkg.mod", "-n", "3"]) == (2, "pkg.mod", False, [], None, ["-n", "3"])
    assert parse(["--hosts=a,b", "-l", "s.py"]) == (2, None, False, ["--hosts=a,b", "-l"],
                                                    "s.py", [])
    assert parse(["-bind-to", "core", "--", "-weird-name.py"])[3:5] == (
        ["-bind-to", "core"], "-weird-name.py")
    assert "-l" in NO_VALUE


@pytest.mark.parametrize("argv,message", [
    (["-n", "0", "s.py"], "-n needs a number >= 1"),
    (["-n", "two", "s.py"], "-n needs a number >= 1"),
    (["-n", "2"], "a script \\(or -m module\\) is required"),
    (["-f"], "-f needs a value"),
])
def test_parse_errors(argv, message):
    with pytest.raises(SystemExit, match=message):
        parse(argv)


def test_command_puts_mpiexecs_options_before_python():
    cmd = command(2, "t.py", ["x"], None, ["-f", "hosts"])
    assert cmd[1:5] == ["-n", "2", "-f", "hosts"]
    assert cmd[5:] == [sys.executable, "-m", "replicate", "t.py", "x"]


PROGRAM = """import sys
import replicate as rp
print("rank", rp.process_index(), "of", rp.process_count(), "args", sys.argv[1:])
print("second line")
"""


@pytest.mark.mpi
@pytest.mark.parametrize("as_module", [False, True], ids=["script", "module"])
def test_a_hostfile_naming_localhost_and_prefixed_output(tmp_path, as_module):
    if not have_mpi():
        pytest.skip("needs mpi4py and mpiexec (mpich wheel)")
    (tmp_path / "hello_ranks.py").write_text(PROGRAM)
    (tmp_path / "hosts").write_text("localhost:2\n")
    target = ["-m", "hello_ranks"] if as_module else ["hello_ranks.py"]
    cmd = [sys.executable, "-m", "replicate.launch", "-n", "2", "-f", "hosts", "-ppn", "2",
           "--prefix-rank", *target, "--epochs", "3"]
    env = child_env()
    env["PYTHONPATH"] = str(tmp_path) + os.pathsep + env["PYTHONPATH"]  # (for -m hello_ranks)
    result = run(cmd, cwd=str(tmp_path), env=env)
    assert result.returncode == 0, report(result)
    for rank in (0, 1):
        assert f"[{rank}] rank {rank} of 2 args ['--epochs', '3']" in result.stdout, \
            report(result)
        assert f"[{rank}] second line" in result.stdout


def test_gpu_environment_keeps_what_the_user_set():
    """JAX on a GPU: no preallocation, deterministic ops — unless the user chose otherwise."""
    from replicate.launch import gpu_environment

    env = {}
    gpu_environment(env)
    assert env == {"XLA_PYTHON_CLIENT_PREALLOCATE": "false",
                   "XLA_FLAGS": "--xla_gpu_deterministic_ops=true"}
    env = {"XLA_PYTHON_CLIENT_PREALLOCATE": "true",
           "XLA_FLAGS": "--xla_gpu_deterministic_ops=false --xla_dump_to=/tmp/x"}
    gpu_environment(env)
    assert env["XLA_PYTHON_CLIENT_PREALLOCATE"] == "true"
    assert env["XLA_FLAGS"] == "--xla_gpu_deterministic_ops=false --xla_dump_to=/tmp/x"
    env = {"XLA_FLAGS": "--xla_dump_to=/tmp/x"}
    gpu_environment(env)
    assert env["XLA_FLAGS"] == "--xla_dump_to=/tmp/x --xla_gpu_deterministic_ops=true"


def test_a_ctrl_c_anywhere_in_the_watch_loop_is_the_users_stop(tmp_path):
    """The launcher's loop may take Ctrl-C in any call (here the job's poll), not only while it
    waits: the job was stopped by the user (not restarted), and no traceback escapes."""
    from replicate.launch import launcher

    class Job:  # the first poll is interrupted, then the job has ended with code 0
        calls, returncode = 0, 0

        def poll(self):
            Job.calls += 1
            if Job.calls == 1:
                raise KeyboardInterrupt
            return 0

    exits, stopped = launcher.Exits(str(tmp_path)), []
    try:
        assert launcher.supervise(Job(), str(tmp_path), 1, exits, stopped=stopped) == (0, None)
    finally:
        exits.close()
    assert stopped == [True] and Job.calls >= 2
