"""The ranks agree on what a compiled step will exchange before it exchanges anything.

Every rank compiles its own step; each compiled signature has a cross-process *schedule* (the
exchanges as written, ``replicate.compiler.collective_schedule``). When a rank compiles, every
rank compares schedules (``check_schedules``); afterwards each step's start-of-step header
carries the schedule's fingerprint (``Schedules.fingerprint``), and when a rank compiles anew
(its batches changed shape) or the ranks' fingerprints differ, every rank compares schedules at
that step (``Schedules.recheck``) instead of one rank's check meeting another's step. A graph-mode
``rp.function`` whose collectives span the processes (called in an eager step) has no step
start: each of its calls carries the fingerprint in a header of its own (``on_every_call``).
"""

from __future__ import annotations

from ...compiler import fingerprint
from ...errors import (
    CollectiveMismatchError,
    class_name,
    error_of_class,
    innermost_user_line,
    source_line,
    user_frame,
)
from ...graph.passes.bucket_plan import TRACED_DIFFERENTLY
from ...graph.passes.bucketing import WITHIN
from .agree import FUNCTION, agree


class Schedules:
    """What this rank compiled: per cache key, its schedule, fingerprint and compile step."""

    def __init__(self, comm):
        self.comm = comm
        self.by_key: dict = {}
        self.recheck = False  # compare schedules at this step (see ``after_step_start``)

    def fingerprint(self, key) -> int:
        """The fingerprint sent in the step header (0: not compiled yet)."""
        entry = self.by_key.get(key)
        return 0 if entry is None else entry[1]

    def after_step_start(self, prints: set) -> None:
        """``prints``: every rank's fingerprint for this step."""
        self.recheck = 0 in prints or len(prints) > 1

    def compiled(self, key, schedule, error, about, step) -> None:
        """Compare a fresh compile (or its ``error``) with every rank's; remember it."""
        check_schedules(self.comm, schedule, error, about)
        fp = int(fingerprint(_every_rank(schedule))[:15], 16) or 1
        self.by_key[key] = (schedule, fp, step)

    def reused(self, key, describe) -> None:
        """Running a step compiled before: compare schedules if this step asks for it
        (``describe(compiled_at)`` says what this rank runs)."""
        if self.recheck:
            schedule, _, compiled_at = self.by_key[key]
            check_schedules(self.comm, schedule, None, describe(compiled_at))


def check_schedules(comm, schedule, error, about=None):
    """Every rank compares its collective schedule (and compile status) before communicating.

    ``about``: ``(batch signature, when compiled, input_fn)`` of this rank; the signatures are
    named in the error when the ranks' differ (say, one rank's batches changed shape and it
    compiled anew). A rank whose compile failed raises its ``error``; every other rank raises an
    error of the same class (``CollectiveMismatchError``, ``ShapeError``, ...) that names it:
    ``rank R failed to compile the step: <its message>``."""
    if comm.size == 1:
        if error is not None:
            raise error
        return
    mine = (None if error is None else (class_name(error), _with_user_line(error)),
            fingerprint(_every_rank(schedule)), schedule, about)
    everyone = comm.allgather_obj(mine)
    # From here on every rank reaches the same verdict from the same data: the errors are
    # ``consistent`` (raised on every rank, so each can report it; no abort is needed).
    if error is not None:
        error.consistent = True
        raise error
    failed = [(r, e) for r, (e, _, _, _) in enumerate(everyone) if e is not None]
    if failed:  # the failing rank's error, with its type (a CollectiveMismatchError stays one)
        r, (name, msg) = failed[0]
        raise _consistent(error_of_class(name, f"rank {r} failed to compile the step: {msg}"))
    abouts = [a for _, _, _, a in everyone]
    batches = ""
    if all(abouts) and len({a[0] for a in abouts}) > 1:
        batches = f"\nThe ranks' batches differ ({abouts[0][2]}):\n" + "\n".join(
            f"  rank {r}: {a[0]} ({a[1]})" for r, a in enumerate(abouts))
    if len({fp for _, fp, _, _ in everyone}) > 1:
        _first_difference(dict(enumerate(_every_rank(s) for _, _, s, _ in everyone)), batches)
    groups: dict = {}  # rows only one communicator's processes compare, by its label
    for r, (_, _, s, _) in enumerate(everyone):
        for label, rows in _within_groups(s).items():
            groups.setdefault(label, {})[r] = rows
    for label, by_rank in sorted(groups.items()):
        if len({repr([t for t, _ in rows]) for rows in by_rank.values()}) > 1:
            _first_difference(by_rank, batches, f" of communicator {label}")


def _every_rank(schedule) -> list:
    """The rows every rank compares (not those of one communicator's processes only)."""
    return [row for row in schedule if not row[0].startswith(WITHIN)]


def _within_groups(schedule) -> dict:
    """{communicator label: its rows}: what only that communicator's processes compare (a
    model-parallel device group's buckets: ``graph/passes/bucketing.py``)."""
    out: dict = {}
    for text, where in schedule:
        if text.startswith(WITHIN):
            label, rest = text[len(WITHIN):].split(": ", 1)
            out.setdefault(label, []).append((rest, where))
    return out


def _first_difference(by_rank: dict, batches: str, among: str = ""):
    """Raise the error naming the first row where ``by_rank``'s schedules differ."""
    for i in range(max(len(s) for s in by_rank.values())):
        column = {r: s[i] if i < len(s) else ("<none>", "-") for r, s in by_rank.items()}
        if len({c[0] for c in column.values()}) > 1:
            lines = "\n".join(f"  rank {r}: {c[0]} at {c[1]}" for r, c in column.items())
            hint = TRACED_DIFFERENTLY if any("bucket " in c[0] for c in column.values()) else ""
            raise _consistent(CollectiveMismatchError(
                f"processes disagree about cross-process collective #{i}{among}:\n{lines}"
                f"{batches}{hint}"))
    raise _consistent(CollectiveMismatchError(
        f"processes disagree about their collective schedule{among}{batches}"))


def on_every_call(comm, schedule, what: str):
    """What every call of a compiled ``rp.function`` (``what``) runs first, where its
    collectives span ``comm``'s processes: one tagged header with its schedule's fingerprint;
    where the ranks' differ, they compare schedules and raise naming the first collective that
    differs. None where there is nothing to agree on (one process, no exchange)."""
    if comm.size == 1 or not schedule:
        return None
    fp = int(fingerprint(_every_rank(schedule))[:15], 16) or 1

    def agree_on_call():
        agree(comm, FUNCTION, fp, describe=lambda: (
            f"a call of rp.function {what} at {source_line(user_frame())}"),
            differ=lambda: check_schedules(comm, schedule, None))
    return agree_on_call


def _with_user_line(error) -> str:
    """The message of a compile error, naming the user's line where it does not yet (as the
    failing rank's own report will), for the other ranks' report."""
    text, where = str(error), innermost_user_line(error.__traceback__)
    if where and where.split(":")[0] + ":" not in text:
        text += f"\n  at {where}"
    return text


def _consistent(error):
    error.consistent = True
    return error



__all__ = ["Schedules", "check_schedules", "on_every_call"]
