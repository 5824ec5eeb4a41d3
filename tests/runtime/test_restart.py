"""Jobs that survive (issue 34): ``python -m replicate.launch --max-restarts N`` runs a failed job
again and the script resumes from its newest checkpoint, ending bitwise where an uninterrupted run
ends; a failure that repeats at the same step is not restarted; ``Replicator(num_replicas=R)``
continues a job on another number of processes with the same replicas, data and updates.

The program is tests/runtime/programs/faults_resume.py (``--auto``, ``--kill-at``, ``--raise-at``,
``--num-replicas``)."""

from __future__ import annotations

import random

import numpy as np
import pytest

from conftest import exclusive, load_both, mpirun, needs_mpi, report
from replicate.errors import ReplicateError
from replicate.launch import restart
from replicate.launch.ending import culprit
from replicate.runtime.job import status
from replicate.runtime.loop.layout import per_rank

STEPS = 20
def _mpi(fn):
    for mark in reversed(needs_mpi):
        fn = mark(fn)
    return fn


def _program(out, ck, *extra):
    return ["faults_resume.py", str(out), "--steps", str(STEPS), "--ckpt", str(ck), "--every",
            "3", "--auto", *map(str, extra)]


def _assert_bitwise(a, b):
    assert set(a) == set(b)
    for key in a:
        if key == "_losses":  # (a resumed run's history starts at its checkpoint)
            continue
        assert a[key].tobytes() == b[key].tobytes(), key


@_mpi
@pytest.mark.parametrize("mode", ["graph", "eager"])
def test_kill_9_at_a_random_step_is_restarted_and_ends_bitwise_equal(tmp_path, mode):
    """SIGKILL of rank 1 after a random step on the first attempt: the launcher logs the
    restart with its cause, the job resumes from the newest checkpoint and exits 0 with the
    parameters (and optimiser state) of a run that was never interrupted."""
    step = random.Random().randint(2, STEPS - 2)  # (printed in the failure message)
    with exclusive():
        full = mpirun(*_program(tmp_path / "full.npz", tmp_path / "a" / "s-{step:03d}.npz",
                                "--mode", mode), check=True)
        job = mpirun("--max-restarts", "2", *_program(
            tmp_path / "job.npz", tmp_path / "b" / "s-{step:03d}.npz", "--mode", mode,
            "--kill-at", step, "--victim", 1), launcher=True)
    text = f"killed after step {step}\n{report(job)}"
    assert job.returncode == 0, text
    assert ("[replicate.launch] restart 1 of 2: rank 1 on " in job.stderr
            and f"failed at step {step}: it ended without a report (killed by a signal"
            in job.stderr), text
    assert job.stderr.count("restart ") == 1 and job.stdout.count("attempt 1") == 2, text
    assert f"rank 0 resumed at step {step - step % 3}" in job.stdout, text
    _assert_bitwise(load_both(str(tmp_path / "job.npz")), load_both(str(tmp_path / "full.npz")))
    assert full.returncode == 0


@_mpi
def test_the_same_failure_at_the_same_step_is_a_bug_and_is_not_restarted(tmp_path):
    with exclusive():
        job = mpirun("--max-restarts", "3", *_program(
            tmp_path / "job.npz", tmp_path / "s-{step:03d}.npz", "--raise-at", 5), launcher=True)
    text = report(job)
    assert job.returncode != 0, text
    assert "restart 1 of 3: rank 1 on " in job.stderr and \
        "failed at step 5: ValueError: boom at step 5; starting the job again" in job.stderr, text
    assert "ValueError: boom at step 5 — the same failure at the same step as the last " \
        "attempt: a bug, not a fault; not restarting" in job.stderr, text
    assert job.stdout.count(" attempt ") == 4, text  # two attempts of two ranks


@_mpi
def test_without_max_restarts_a_failed_job_is_not_run_again(tmp_path):
    with exclusive():
        job = mpirun(*_program(tmp_path / "job.npz", tmp_path / "s-{step:03d}.npz",
                               "--kill-at", 4), launcher=True)
    assert job.returncode != 0 and "restart" not in job.stderr, report(job)
    assert job.stdout.count(" attempt 0") == 2 and " attempt 1" not in job.stdout, report(job)


@_mpi
@pytest.mark.parametrize("before,after", [(2, 1), (1, 2)])
def test_num_replicas_continues_on_another_process_count_with_the_same_math(
        tmp_path, before, after):
    """R = 4 replicas: 12 steps on ``before`` processes, checkpointed, then the rest on
    ``after`` processes (4/n replicas each): the same replicas, data order and updates as an
    uninterrupted run on 2 processes, to 1e-12 (the sums meet in another order)."""
    ck = tmp_path / "s-{step:03d}.npz"
    args = ["--num-replicas", "4", "--every", "12"]
    with exclusive():
        mpirun("faults_resume.py", str(tmp_path / "full.npz"), "--steps", str(STEPS), *args,
               check=True)
        first = mpirun("faults_resume.py", str(tmp_path / "first.npz"), "--steps", "12",
                       "--ckpt", str(ck), *args, n=before, check=True)
        second = mpirun("faults_resume.py", str(tmp_path / "second.npz"), "--steps", str(STEPS),
                        "--ckpt", str(ck), "--auto", *args, n=after, check=True)
    assert "resumed at step 12" in second.stdout, report(second)
    full = load_both(str(tmp_path / "full.npz"))
    got = load_both(str(tmp_path / "second.npz")) if after > 1 else \
        dict(np.load(str(tmp_path / "second.npz")))
    assert first.returncode == 0
    for key in full:
        if key == "_losses":
            continue
        np.testing.assert_allclose(got[key], full[key], rtol=0, atol=1e-12, err_msg=key)
    differ = [k for k in full if k != "_losses" and got[k].tobytes() != full[k].tobytes()]
    print(f"{before} -> {after} processes: {len(differ)} of {len(full) - 1} arrays differ in "
          "their last bits")


# -- no processes --------------------------------------------------------------------------------
def test_num_replicas_spreads_over_the_processes_or_says_why_not():
    assert per_rank(None, None, 3) == 1 and per_rank(None, 2, 3) == 2
    assert per_rank(8, None, 4) == 2 and per_rank(8, 2, 4) == 2 and per_rank(8, None, 4, 2) == 4
    with pytest.raises(ReplicateError, match=r"num_replicas=6 cannot be spread evenly over 4 "
                                             r"replica group.*\[1, 2, 3, 6\]"):
        per_rank(6, None, 4)
    with pytest.raises(ReplicateError, match="is 2 per process, but replicas_per_rank=3"):
        per_rank(4, 3, 2)
    with pytest.raises(ReplicateError, match="num_replicas must be an int >= 1"):
        per_rank(0, None, 1)


def test_the_restart_loop_stops_at_success_repeats_limits_and_the_user(capsys):
    def attempts(*outcomes):
        calls = []

        def attempt(n):
            calls.append(n)
            return outcomes[n]
        return attempt, calls

    fault = {"rank": 1, "host": "h2", "step": 7, "why": ""}
    bug = {"rank": 0, "host": "h1", "step": 5, "why": "ValueError: boom"}
    fn, calls = attempts((1, fault), (0, None))
    assert restart.run(fn, 3, lambda: False) == 0 and calls == [0, 1]
    assert "restart 1 of 3: rank 1 on h2 failed at step 7: it ended without a report" in \
        capsys.readouterr().err
    fn, calls = attempts((1, bug), (1, bug), (0, None))
    assert restart.run(fn, 3, lambda: False) == 1 and calls == [0, 1]
    assert "a bug, not a fault; not restarting" in capsys.readouterr().err
    fn, calls = attempts((1, fault), (1, fault), (1, fault))  # a fault may repeat: restarted
    assert restart.run(fn, 2, lambda: False) == 1 and calls == [0, 1, 2]
    fn, calls = attempts((1, fault), (0, None))
    assert restart.run(fn, 3, lambda: True) == 1 and calls == [0]  # the user ended it
    fn, calls = attempts((1, None), (0, None))
    assert restart.run(fn, 1, lambda: False) == 0 and calls == [0, 1]
    assert "no rank's record says which ended it" in capsys.readouterr().err
    assert restart.take_options(["-f", "h", "--max-restarts", "3", "-ppn", "2"]) == (
        3, ["-f", "h", "-ppn", "2"])
    assert restart.take_options(["--max-restarts=1"]) == (1, [])
    with pytest.raises(SystemExit, match="--max-restarts needs a number"):
        restart.take_options(["--max-restarts", "x"])


def test_the_culprit_is_the_rank_that_said_why_else_the_one_that_ended_first():
    def rec(state, step, why="", host="h"):
        return {"pid": 1, "state": state, "code": 0, "step": step, "host": host, "why": why}

    records = {0: rec(status.RUNNING, 4), 1: rec(status.FAILED, 3, "KeyError: 'x'", "b")}
    assert culprit(records) == {"rank": 1, "host": "b", "step": 3, "why": "KeyError: 'x'"}
    records = {0: rec(status.RUNNING, 4), 1: rec(status.RUNNING, 3), 2: rec(status.DONE, 9)}
    assert culprit(records, first=0, here="h")["rank"] == 0
    assert culprit(records, together=[0, 1], here="h")["rank"] == 1  # behind the others
    assert culprit(records, here="h") is None
    # rank 1 ran on host b: the order seen on h says nothing about it; its step does
    records[1] = rec(status.RUNNING, 3, host="b")
    assert culprit(records, first=0, here="h")["rank"] == 1
    records[1] = rec(status.RUNNING, 4, host="b")  # not behind: the other host's ranks, unsure
    assert culprit(records, first=0, here="h") == {"rank": [1], "host": "b", "step": None,
                                                   "why": ""}
    assert restart.describe(culprit(records, first=0, here="h")).startswith(
        "the job failed on another host: ranks [1] on b ended without a report")


def test_hosts_ranks_per_host_and_the_hosts_left_out(tmp_path):
    from replicate.launch import hosts

    assert hosts.placement(4, [("a", None), ("b", None)]) == {"a": 2, "b": 2}
    assert hosts.placement(5, [("a", 2), ("b", 1)]) == {"a": 4, "b": 1}  # hydra's order
    assert hosts.placement(3, [("a", None), ("b", None)], ppn=2) == {"a": 2, "b": 1}
    hostfile = tmp_path / "hosts"
    hostfile.write_text("# the cluster\na:2\nb:2  # spare\n\n")
    assert hosts.hosts_of(["-f", str(hostfile), "-l"]) == ([("a", 2), ("b", 2)], None)
    assert hosts.ranks_per_host(4, ["-f", str(hostfile)]) == 2
    assert hosts.ranks_per_host(4, ["--hosts=a,b,c,d"]) == 1
    assert hosts.ranks_per_host(4, ["-ppn", "3"]) == 3 and hosts.ranks_per_host(4, []) == 4
    assert hosts.without(["-l", "--hosts", "a,b:2,c", "-bind-to", "core"], {"b"}, "") == [
        "-l", "--hosts", "a,c", "-bind-to", "core"]
    args = hosts.without(["-f", str(hostfile)], {"a"}, str(tmp_path))
    assert args[0] == "-f" and open(args[1]).read() == "b:2\n"
    assert restart.take_number(["-l", "--min-procs", "2"], "--min-procs", 4, 1) == (2, ["-l"])
    assert restart.take_number(["-l"], "--min-procs", 4, 1) == (4, ["-l"])
    with pytest.raises(SystemExit, match="--min-procs needs a number >= 1, got '0'"):
        restart.take_number(["--min-procs=0"], "--min-procs", 4, 1)
    # a launcher program that reaches host a and not b (as hydra's ssh would be called)
    shim = tmp_path / "shim"
    shim.write_text('#!/bin/sh\nwhile [ "${1#-}" != "$1" ]; do shift; done\n'
                    '[ "$1" = a ] && exit 0; exit 255\n')
    shim.chmod(0o755)
    env = {"PATH": "/usr/bin:/bin", "HYDRA_LAUNCHER_EXEC": str(shim)}
    n, args, message = hosts.shrink(4, ["-f", str(hostfile)], env, 2, str(tmp_path))
    assert n == 2 and open(args[1]).read() == "a:2\n", message
    assert message == "host(s) b do not answer: left out; the job goes on with 2 of 4 " \
        "processes (--min-procs 2)"
    n, _, message = hosts.shrink(4, ["-f", str(hostfile)], env, 3, str(tmp_path))
    assert n == 0 and "fewer than --min-procs 3: not restarting" in message
    assert hosts.shrink(4, ["--hosts", "a,a"], env, 1, "") is None  # every host answers
    assert hosts.shrink(4, [], env, 1, "") is None  # no host named: nothing to probe
    assert hosts.shrink(4, ["--hosts", "a,b"], dict(env, HYDRA_LAUNCHER="slurm"), 1, "") is None


@pytest.mark.parametrize("host,kept", [("b", "a:1\nc:1\n"), ("c", "a:1\nb:1\n"),
                                       ("", "a:1\nc:1\n")])
def test_a_host_whose_rank_ended_two_attempts_is_left_out_by_the_launcher(
        tmp_path, monkeypatch, capsys, host, kept):
    """The launcher's count of failing hosts reaches ``hosts.shrink`` (no processes: the
    attempts are stand-ins, each ending with rank 1 killed at another step). The host counted
    is where the rank's record says it ran (``c``: not where hydra's placement puts rank 1), or
    the placement's when the record names none."""
    from replicate.launch import launcher

    hostfile = tmp_path / "hosts"
    hostfile.write_text("a:1\nb:1\nc:1\n")
    shim = tmp_path / "shim"
    shim.write_text("#!/bin/sh\nexit 0\n")
    shim.chmod(0o755)
    monkeypatch.setenv("HYDRA_LAUNCHER_EXEC", str(shim))
    seen = []

    def attempt(cmd, env, n, stopped, mpi_args=()):
        seen.append((n, open(mpi_args[1]).read() if mpi_args else ""))
        # rank 1 (host b) killed at a different step each time: a fault, not a bug
        return 1, {"rank": 1, "host": host, "step": len(seen), "why": ""}

    monkeypatch.setattr(launcher, "_attempt", attempt)
    monkeypatch.setattr(launcher, "find_mpiexec", lambda: "mpiexec")
    code = launcher.main(["-n", "3", "-f", str(hostfile), "--max-restarts", "2", "--min-procs",
                          "2", "x.py"])
    assert code == 1
    assert [n for n, _ in seen] == [3, 3, 2] and seen[2][1] == kept, seen
    assert f"host(s) {host or 'b'} had ranks end two attempts: left out" in \
        capsys.readouterr().err


def test_the_launcher_shares_blas_threads_by_the_ranks_on_one_host():
    import os

    from replicate.launch import hosts, share_threads

    env = {}
    share_threads(env, hosts.ranks_per_host(8, ["--hosts", ",".join("abcdefgh")]))
    assert env["OMP_NUM_THREADS"] == str(os.cpu_count() or 1)  # one rank on each host
    env = {}
    share_threads(env, hosts.ranks_per_host(8, []))
    assert env["OMP_NUM_THREADS"] == str(max(1, (os.cpu_count() or 1) // 8))


def test_a_rank_on_another_host_is_named_not_the_one_here_that_mpiexec_ended():
    def rec(state, step):
        return {"pid": 1, "state": state, "code": 0, "step": step, "host": "h0", "why": ""}

    cause = culprit({0: rec(status.RUNNING, 7)}, first=0, n=2, here="h0")
    assert cause["rank"] == [1]
    assert restart.describe(cause).startswith("the job failed on another host: ranks [1]")
    said = {0: dict(rec(status.FAILED, 7), why="ValueError: x")}
    assert culprit(said, first=0, n=2, here="h0")["rank"] == 0  # it said why itself
    # rank 1's record fetched from its host (``launch/remote.py``): its own line names it
    fetched = {**said, 1: dict(rec(status.FAILED, 7), host="h1", why="KeyError: 'w'")}
    fetched[0] = rec(status.RUNNING, 7)
    assert culprit(fetched, first=0, n=2, here="h0") == {
        "rank": 1, "host": "h1", "step": 7, "why": "KeyError: 'w'"}


@_mpi
def test_a_plain_mpiexec_does_not_hang_when_a_rank_fails_before_importing_replicate():
    """``mpiexec -n 2 python script.py`` (no bootstrap, no launcher), rank 1 exits before its
    ``import replicate``: rank 0's wait in MPI's start-up is bounded, it names rank 1 and says
    how to run the script instead; a job whose ranks all arrive leaves nothing behind."""
    import glob
    import sys

    from conftest import MPIEXEC, child_env, run

    before = set(glob.glob("/tmp/replicate-startup-*"))
    with exclusive():
        failed = run([MPIEXEC, "-n", "2", sys.executable, "startup_plain.py", "fail"],
                     env=child_env(REPLICATE_STARTUP_TIMEOUT=3), timeout=60)
        fine = run([MPIEXEC, "-n", "2", sys.executable, "startup_plain.py"],
                   env=child_env(REPLICATE_STARTUP_TIMEOUT=3), timeout=60, check=True)
    assert failed.returncode != 0 and failed.seconds < 30, report(failed)
    assert "[replicate] rank 0: MPI start-up has waited 3 s for the other ranks " \
        "(REPLICATE_STARTUP_TIMEOUT); ranks [1] never reached it on this host" in \
        failed.stderr, report(failed)
    assert "python -m replicate script.py" in failed.stderr, report(failed)
    assert "rank 0 up" in fine.stdout and "rank 1 up" in fine.stdout, report(fine)
    assert "MPI start-up has waited" not in fine.stderr, report(fine)
    assert set(glob.glob("/tmp/replicate-startup-*")) <= before  # no mark left


def test_the_startup_timeout_is_read_from_the_environment():
    from replicate.runtime.job import startup

    assert startup.timeout({}) == startup.DEFAULT == 120.0
    assert startup.timeout({"REPLICATE_STARTUP_TIMEOUT": "0"}) == 0.0
    assert startup.timeout({"REPLICATE_STARTUP_TIMEOUT": " 2.5 "}) == 2.5
    for bad in ("soon", "-1", "nan"):
        with pytest.raises(ReplicateError, match="REPLICATE_STARTUP_TIMEOUT=.*seconds >= 0"):
            startup.timeout({"REPLICATE_STARTUP_TIMEOUT": bad})


def test_the_host_silence_bound_is_read_from_the_environment():
    from replicate.runtime.job import heartbeat

    assert heartbeat.silence({}) == heartbeat.DEFAULT == 30.0
    assert heartbeat.silence({"REPLICATE_HOST_SILENCE": "0"}) == 0.0
    for bad in ("later", "-2", "nan"):
        with pytest.raises(ReplicateError, match="REPLICATE_HOST_SILENCE=.*seconds >= 0"):
            heartbeat.silence({"REPLICATE_HOST_SILENCE": bad})


def test_a_host_whose_ranks_ended_two_attempts_is_left_out_where_allowed(tmp_path):
    from replicate.launch import hosts

    hostfile = tmp_path / "hosts"
    hostfile.write_text("a:2\nb:2\nc:2\n")
    args = ["-f", str(hostfile)]
    assert hosts.rank_hosts(6, args) == ["a", "a", "b", "b", "c", "c"]
    assert hosts.rank_hosts(4, ["--hosts", "a,b"]) == ["a", "b", "a", "b"]
    shim = tmp_path / "shim"  # every host answers
    shim.write_text("#!/bin/sh\nexit 0\n")
    shim.chmod(0o755)
    env = {"PATH": "/usr/bin:/bin", "HYDRA_LAUNCHER_EXEC": str(shim)}
    n, args2, message = hosts.shrink(6, args, env, 4, str(tmp_path), failing=["b"])
    assert n == 4 and open(args2[1]).read() == "a:2\nc:2\n"
    assert message == "host(s) b had ranks end two attempts: left out; the job goes on with 4 " \
        "of 6 processes (--min-procs 4)"
    # not below --min-procs for a host that still answers: it stays (a fault may pass)
    assert hosts.shrink(6, args, env, 6, str(tmp_path), failing=["b"]) is None
