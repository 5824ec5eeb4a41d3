"""Tagged exchanges: the processes agree on *what* they are about to exchange before they do.

Every cross-process exchange the runtime starts on its own in eager mode (the per-step input
check, an eager collective, the first read of a Variable, the gathering of ``step_fn``'s outputs)
and the per-step input check of graph mode begin with :func:`agree`: one ``allgather`` of a small
fixed-size header ``int64[4] = [tag | kind, digest, a, b]``. Whatever each rank is doing, the
headers always pair up (same size, same format), so a rank that calls a collective its peers do
not call meets their next exchange *as a mismatch*, not as bytes of another message misread (an
MPI error, a garbage size, a hang). Since every rank then holds every header, every rank reaches
the same verdict: on a difference they exchange a description of what each is doing (one more
exchange, which they all make) and each raises ``CollectiveMismatchError`` naming every rank's
call and source line.
"""

from __future__ import annotations

import functools
import hashlib

import numpy as np

from ...errors import CollectiveMismatchError

_TAG = 0x5245504C << 8  # "REPL": a header is recognisable as one
STEP, COLLECTIVE, SYNC, OUTPUTS, CONFIG, SAVE, RESTORE, VERIFY, HOST, FUNCTION = range(1, 11)
KIND_NAMES = {STEP: "step start", COLLECTIVE: "collective", SYNC: "variable sync",
              OUTPUTS: "step outputs", CONFIG: "Replicator construction",
              SAVE: "checkpoint save", RESTORE: "checkpoint restore",
              VERIFY: "variable comparison", HOST: "host exchange", FUNCTION: "rp.function call"}


@functools.lru_cache(maxsize=4096)
def digest(text: str) -> int:
    """A stable (not per-process salted) positive int64 hash of ``text``; never 0."""
    value = int.from_bytes(hashlib.blake2b(text.encode(), digest_size=8).digest(), "little")
    return (value >> 1) or 1


def agree(comm, kind: int, key: int = 0, a: int = 0, b: int = 0, *, describe,
          differ=None) -> list:
    """Exchange the header ``[kind, key, a, b]`` with every rank; return the gathered rows
    (a list of ``[kind, key, a, b]`` per rank; ``a`` and ``b`` are free payload, e.g. the input
    counts of a step).

    When the ranks' ``kind`` or ``key`` differ, every rank calls ``describe()`` (a line saying
    what this rank is doing, with the user's source line), the descriptions are exchanged and
    ``CollectiveMismatchError`` is raised on every rank. ``differ``: when every rank makes the
    same kind of call but the keys differ, every rank calls ``differ()`` instead (it exchanges
    what it needs to say how, and raises; if it returns, the call goes on)."""
    header = np.array([_TAG | kind, key, a, b], np.int64)
    rows = comm.allgather(header).tolist()  # (Python compares 2 x 4 ints faster than NumPy)
    tag, key = rows[0][0], rows[0][1]
    if all(row[0] == tag and row[1] == key for row in rows):
        return rows
    if differ is not None and all(row[0] == tag for row in rows):
        differ()
        return rows
    _mismatch(comm, rows, describe)
    raise AssertionError("unreachable")


def _mismatch(comm, rows, describe):
    mine = describe()
    everyone = comm.allgather_obj(mine)
    kinds = [r[0] ^ _TAG for r in rows]
    lines = "\n".join(f"  rank {r}: {text}" for r, text in enumerate(everyone))
    if any(k not in KIND_NAMES for k in kinds):  # cannot happen: every exchange is tagged
        lines += f"\n  (headers: {rows})"
    if COLLECTIVE in kinds:
        head = "processes disagree about an eager collective"
    else:
        head = "processes disagree about their next cross-process exchange"
    error = CollectiveMismatchError(
        f"{head}:\n{lines}\nEvery process must call the same collectives, with the same shapes "
        "and dtypes, in the same order (a collective called on some processes only pairs up with "
        "another one's next exchange).")
    error.consistent = True  # every rank raises it
    raise error


__all__ = ["agree", "digest", "STEP", "COLLECTIVE", "SYNC", "OUTPUTS", "CONFIG", "SAVE",
           "RESTORE", "VERIFY", "HOST", "FUNCTION"]
