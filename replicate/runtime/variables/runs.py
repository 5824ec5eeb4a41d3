"""The run a checkpoint belongs to: one run id per ``{step}`` pattern's training run.

Every file ``rp.callbacks.Checkpoint`` writes names its run (``info["run"]``, 16 hex digits),
chosen at the run's first save and kept by every later save and every restart that continues
the run. So two jobs given one pattern cannot mix: a job's first save under a pattern that
already holds another run's files is refused (``CheckpointError``) unless the job continues that
run — it restored from one of its files (``Replicator.restore``/``rp.checkpoint.restore``), or
names it (``Checkpoint(..., run=ID)``) — and rotation deletes only its own run's files.
While a job saves under a pattern, its rank 0 holds a lock file beside the files
(``.<name>.lock``, holding the run id): a second live job on the same pattern is refused even
when it restored the same run.
"""

from __future__ import annotations

import fcntl
import glob
import os
import re
import secrets

from ...errors import CheckpointError, ReplicateError
from .archive import read_info

_locks: dict[str, int] = {}  # {lock file: its descriptor}, held until the process ends
_continued: dict[str, str | None] = {}  # {absolute path: run id} of the files restored here


def new_id() -> str:
    return secrets.token_hex(8)


def restored(path: str, run) -> None:
    """Note that this process continues the run of checkpoint ``path`` (called by ``restore``;
    ``run`` None: a file from before run ids, whose run goes on under a new id)."""
    _continued[os.path.abspath(path)] = run if isinstance(run, str) else None


def step_files(pattern: str) -> list[tuple[int, str]]:
    """The files a ``{step}`` pattern (``"ck/step-{step:06d}.npz"``) names, newest first."""
    m = re.search(r"\{step(:[^}]*)?\}", pattern)
    if not m:
        return [(0, pattern)] if os.path.exists(pattern) else []
    head, tail = pattern[:m.start()], pattern[m.end():]
    if "{" in head + tail:
        raise ReplicateError(f"checkpoint pattern {pattern!r}: only {{step}} may be a field")
    regex = re.compile(re.escape(head) + r"(\d+)" + re.escape(tail) + "$")
    found = []
    for path in glob.glob(glob.escape(head) + "*" + glob.escape(tail)):
        hit = regex.match(path)
        if hit:
            found.append((int(hit.group(1)), path))
    return sorted(found, reverse=True)


def run_of(path: str):
    """The run id ``path`` names; None for a file from before run ids or one that cannot be
    read."""
    try:
        return read_info(path).get("run")
    except CheckpointError:
        return None


def lock_file(pattern: str) -> str:
    """The lock file of a pattern: ``ck/step-{step}.npz`` -> ``ck/.step-run.npz.lock``."""
    m = re.search(r"\{step(:[^}]*)?\}", pattern)
    base = pattern if m is None else pattern[:m.start()] + "run" + pattern[m.end():]
    return os.path.join(os.path.dirname(os.path.abspath(base)), f".{os.path.basename(base)}.lock")


def claim(pattern: str, run: str | None = None) -> str:
    """The run id for saving under ``pattern`` (rank 0, at a run's first save), with the
    pattern's lock: ``run`` if given, the run of the pattern's file this process restored, a
    new one if the pattern names no file; otherwise a ``CheckpointError`` naming the runs
    found, or the live job that holds the lock."""
    if run is not None and not (isinstance(run, str) and re.fullmatch(r"[0-9a-f]{1,64}", run)):
        raise ReplicateError(f"Checkpoint: run must be a run id (hex digits), got {run!r}")
    fd = _lock(pattern)
    run = run or _which(pattern)
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"{run} {os.getpid()}\n".encode(), 0)
    return run


def _lock(pattern: str) -> int:
    path = lock_file(pattern)
    if path in _locks:
        return _locks[path]
    try:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
    except OSError as e:  # (a file where the folder should be, no permission, a link planted)
        raise CheckpointError(f"cannot save checkpoints under {pattern!r}: its lock file "
                              f"{path!r}: {e.strerror or e}") from None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        held = os.pread(fd, 200, 0).decode(errors="replace").split()
        os.close(fd)
        raise CheckpointError(
            f"checkpoint pattern {pattern!r} is in use by another live job (run "
            f"{held[0] if held else '?'}, pid {held[1] if len(held) > 1 else '?'}, lock "
            f"{path!r}); two jobs saving under one pattern would delete each other's files: "
            "give this job its own pattern") from None
    _locks[path] = fd
    return fd


def _which(pattern: str) -> str:
    files = step_files(pattern)
    mine = [os.path.abspath(path) for _, path in files if os.path.abspath(path) in _continued]
    if mine:
        return _continued[mine[0]] or new_id()
    if not files:
        return new_id()
    runs = {run_of(path) for _, path in files}
    named = ", ".join(sorted("(none)" if r is None else r for r in runs))
    raise CheckpointError(
        f"checkpoint pattern {pattern!r} already holds {len(files)} file(s) of another run "
        f"(run ids: {named}); this job would mix its checkpoints with them. To continue that "
        "run, restore from it first (Replicator.restore(pattern, state)) or pass "
        "Checkpoint(..., run=ID); otherwise give this job its own pattern.")


def remove_own(path: str, run: str) -> bool:
    """Delete ``path`` if it is a plain file of run ``run`` (never another run's file, nor what
    a link points to); whether it was deleted."""
    try:
        if os.path.islink(path) or not os.path.isfile(path) or run_of(path) != run:
            return False
        os.unlink(path)
    except OSError:
        return False
    return True


__all__ = ["claim", "new_id", "restored", "remove_own", "run_of", "step_files"]
