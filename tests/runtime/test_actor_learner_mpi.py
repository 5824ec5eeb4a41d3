"""``rp.ActorLearner`` across processes (issue 19), each case under ``mpiexec`` with a hard
timeout and no process left behind: actor processes feeding learners (2 processes: 1 + 1; 3
processes: 2 learners whose gradients are averaged + 1 actor process), every process learning
with its own actor thread (eager mode), a crashed actor with ``on_actor_failure="continue"``, a
slow actor, a learner run that ends first and is run again — and the cases that end the job: a
crashed actor (in an actor process, in a learner process), a failing learner, a stalled actor.

The program is tests/runtime/programs/actor_learner_mpi.py."""

from __future__ import annotations

import os
import re
import uuid

from conftest import PROGRAMS, assert_no_orphans, child_env, mpirun, needs_mpi, report

pytestmark = needs_mpi
PROGRAM = "actor_learner_mpi.py"
EXIT_WITHIN = 10.0


def marker(name):
    with open(os.path.join(PROGRAMS, PROGRAM)) as f:
        hits = [i for i, line in enumerate(f, 1) if line.rstrip().endswith(f"# MARK {name}")]
    assert len(hits) == 1, name
    return f"{PROGRAM}:{hits[0]}"


def launch(*args, n=2, **env):
    token = f"tok-{uuid.uuid4().hex}"
    result = mpirun(PROGRAM, *args, "--token", token, n=n, env=child_env(**env))
    assert_no_orphans(token)
    return result


def test_actor_processes_threads_continue_slow_and_a_second_run():
    result = launch("ok")
    text = report(result)
    assert result.returncode == 0, text
    for case in ("processes", "processes-second-run", "threads-eager", "continue", "slow"):
        assert f"OK {case}\n" in result.stdout, text
    assert "rank 0 finished" in result.stdout and "rank 1 finished" in result.stdout, text
    # the crashed actor (continue) is named once, by the learner, with its traceback
    warning = re.findall(r"actor 1 \(rank 1, thread 'replicate-actor-1'\) failed making "
                         r"trajectory 3", result.stderr)
    assert len(warning) == 1, text
    assert f"{PROGRAM}\", line" in result.stderr and "RuntimeError: injected failure" in \
        result.stderr and "carry on with the remaining 1 actor(s)" in result.stderr, text


def test_two_learner_processes_average_across_themselves_not_the_actor_process():
    result = launch("ok", "--only-processes", n=3)
    text = report(result)
    assert result.returncode == 0, text
    assert "OK processes\n" in result.stdout and "OK processes-second-run\n" in result.stdout, text
    assert "OK learners-agree (2 learner(s))" in result.stdout, text


def test_a_crashed_actor_process_ends_the_job_with_its_traceback():
    result = launch("crash")
    text = report(result)
    assert result.returncode != 0 and result.seconds < EXIT_WITHIN, text
    assert ("[replicate] rank 1: actor 1 (rank 1, thread 'replicate-actor-1') failed; "
            "aborting the job (on_actor_failure='abort')") in result.stderr, text
    assert "[rank 1] RuntimeError: injected failure in actor 1" in result.stderr, text
    assert marker("crash").split(":")[0] in result.stderr and "finished" not in result.stdout


def test_a_crashed_actor_thread_in_a_learner_process_ends_the_job():
    result = launch("crash-threads")
    text = report(result)
    assert result.returncode != 0 and result.seconds < EXIT_WITHIN, text
    assert re.search(r"\[replicate\] rank 1 failed at step \d+ \(input\); aborting the job",
                     result.stderr), text
    assert "ActorError: actor 1 (rank 1, thread 'replicate-actor-1') failed making trajectory " \
        "3" in result.stderr and "RuntimeError: injected failure in actor 1" in result.stderr, text


def test_a_failing_learner_ends_the_job():
    result = launch("learner-fails")
    text = report(result)
    assert result.returncode != 0 and result.seconds < EXIT_WITHIN, text
    assert "[replicate] rank 0 (a learner) failed at step 3; aborting the job" in result.stderr
    assert "[rank 0] RuntimeError: injected learner failure" in result.stderr, text
    assert "finished" not in result.stdout, text


def test_a_stalled_actor_is_reported_by_the_watchdog_with_its_line():
    result = launch("stall", REPLICATE_COLLECTIVE_TIMEOUT=1)
    text = report(result)
    assert result.returncode != 0 and result.seconds < EXIT_WITHIN, text
    assert re.search(r"rank 0: collective timed out: rank 0 waited [\d.]+ s \(limit 1 s, "
                     r"REPLICATE_COLLECTIVE_TIMEOUT\) in waiting for trajectories #\d+ on "
                     r"communicator 'actors'", result.stderr), text
    assert "ranks that have not arrived: [1]" in result.stderr, text
    assert f"actor 0 (rank 1, thread 'replicate-actor-0'): at {marker('actor-sleep')}" in \
        result.stderr, text
