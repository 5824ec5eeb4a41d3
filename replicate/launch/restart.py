"""Automatic restart (``python -m replicate.launch --max-restarts N``): after a failed attempt
the job runs again, at most N times; the script resumes from its newest good checkpoint
(``Replicator.restore(pattern, state, missing_ok=True)``), so a job restarted after a fault ends
where an uninterrupted one would. Each restart is logged with its cause (the rank, its host, its
step, the failure's line). A failure that repeats at the same step with the same line is a bug,
not a fault: the launcher stops instead of using up the restarts. A job ended by the user
(Ctrl-C, SIGTERM to the launcher) is not restarted.

The ranks see ``REPLICATE_RESTART`` (0 on the first attempt, then 1, 2, ...)."""

from __future__ import annotations

import sys

from .ending import PREFIX

ENV = "REPLICATE_RESTART"


def take_number(mpi_args: list[str], option: str, default: int, least: int = 0):
    """(``option N`` from ``mpi_args``, default ``default``; mpiexec's options without it): the
    launcher's own numeric options (``--max-restarts``, ``--min-procs``) among mpiexec's."""
    out, value, i = [], default, 0
    while i < len(mpi_args):
        arg = mpi_args[i]
        if arg == option or arg.startswith(option + "="):
            text = arg.split("=", 1)[1] if "=" in arg else (
                mpi_args[i + 1] if i + 1 < len(mpi_args) else "")
            if not text.isdigit() or int(text) < least:
                raise SystemExit(f"replicate.launch: {option} needs a number >= {least}, got "
                                 f"{text!r}")
            value = int(text)
            i += 1 if "=" in arg else 2
            continue
        out.append(arg)
        i += 1
    return value, out


def take_options(mpi_args: list[str]) -> tuple[int, list[str]]:
    """(max restarts, mpiexec's options without the launcher's ``--max-restarts N``)."""
    return take_number(mpi_args, "--max-restarts", 0)


def describe(cause: dict | None) -> str:
    if cause is None:
        return "the job failed (no rank's record says which ended it)"
    if isinstance(cause["rank"], list) and cause["host"]:
        return (f"the job failed on another host: ranks {cause['rank']} on {cause['host']} "
                "ended without a report (killed by a signal, or exit() below Python), and "
                "which rank ended first is not known across hosts")
    if isinstance(cause["rank"], list):
        return (f"the job failed on another host: ranks {cause['rank']} left no record here "
                "(their host did not answer; their own lines above say why)")
    step = "before its first step" if cause["step"] is None else f"at step {cause['step']}"
    why = cause["why"] or "it ended without a report (killed by a signal, or exit() below Python)"
    return f"rank {cause['rank']} on {cause['host'] or '?'} failed {step}: {why}"


def run(attempt_fn, max_restarts: int, interrupted) -> int:
    """Call ``attempt_fn(attempt) -> (exit code, cause)`` until it succeeds, the restarts are
    used up, the same failure repeats, or ``interrupted()`` says the user ended the job."""
    previous = None
    for attempt in range(max_restarts + 1):
        code, cause = attempt_fn(attempt)
        if code == 0 or attempt == max_restarts or interrupted():
            return code
        same = (cause["step"], cause["why"]) if cause and cause["why"] else None
        if same is not None and same == previous:
            print(f"{PREFIX} {describe(cause)} — the same failure at the same step as the last "
                  "attempt: a bug, not a fault; not restarting", file=sys.stderr, flush=True)
            return code
        previous = same
        print(f"{PREFIX} restart {attempt + 1} of {max_restarts}: {describe(cause)}; starting "
              "the job again", file=sys.stderr, flush=True)
    return code
