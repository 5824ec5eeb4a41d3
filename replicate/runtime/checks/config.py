"""Every rank constructs its ``Replicator`` alike: compared in one small exchange.

Processes configured differently fail later in confusing ways — a different
``replicas_per_rank`` looks like input running out, a different ``outputs=`` silently returns
different histories, graph mode against eager ends in an MPI error. So at construction the ranks
exchange a fixed-size header holding a hash of their configuration (``agree``); only when the
hashes differ do they exchange the configurations themselves, and every rank raises the same
``ConfigMismatchError`` naming each field that differs and every rank's value. A rank that is
doing something else at that moment (restoring a checkpoint, running a step) meets the
construction as a ``CollectiveMismatchError`` naming both calls.

The fields: mode, backend (and how it sends a gradient bucket: a JAX process whose step is cut
into segments, on a GPU or an older JAX, sends it packed, one running the step as one program
sends its parts), replicas per rank, logical devices, micro-batches, outputs, compile
options, check_finite, check_sync, the collective timeout, and the Variables alive in the process
(count, shapes and dtypes in creation order; ``local=True`` ones are each process's own and left
out).
"""

from __future__ import annotations

import dataclasses
import gc
from dataclasses import dataclass

from ...errors import ConfigMismatchError, source_line, user_frame
from ...state import live_variables
from ..communication.agree import CONFIG, agree, digest
from ..job import watchdog


@dataclass(frozen=True)
class Settings:
    """A ``Replicator``'s configuration, fixed at its construction (its arguments, checked)."""

    mode: str
    backend: object
    replicas_per_rank: int
    logical_devices: int
    micro_batches: int
    outputs: str
    options: object
    check_finite: bool
    check_sync: bool | int
    collective_timeout: float | None  # (None: the process's current one)


def fields(settings: Settings) -> dict:
    """``settings`` as plain values that print alike in every process."""
    options = dataclasses.asdict(settings.options)
    options["disable"] = sorted(options["disable"])
    backend = settings.backend
    return {
        "mode": settings.mode,
        "backend": backend.name,
        # how this process's backend sends a gradient bucket (the JAX backend: as its parts,
        # or packed where its step is cut into segments): the exchanges differ
        "bucket_exchange": getattr(backend, "bucket_exchange", lambda: "packed")(),
        "replicas_per_rank": settings.replicas_per_rank,
        "logical_devices": settings.logical_devices,
        "micro_batches": settings.micro_batches,
        "outputs": settings.outputs,
        "options": options,
        "check_finite": settings.check_finite,
        "check_sync": settings.check_sync,
        "collective_timeout": (watchdog.current_timeout() if settings.collective_timeout is None
                               else settings.collective_timeout),
        "variables": [(tuple(v.shape), str(v.dtype)) for v in _shared_variables()],
    }


def _shared_variables() -> list:
    return [v for v in live_variables() if not v.local]


def agree_config(comm, settings: Settings) -> None:
    """Compare ``settings`` across the ranks of ``comm``; raise ``ConfigMismatchError`` on every
    rank when they differ."""
    if comm.size == 1:
        return
    mine = fields(settings)
    where = source_line(user_frame())
    agree(comm, CONFIG, digest(repr(mine)),
          describe=lambda: f"constructing a Replicator at {where}",
          differ=lambda: _differ(comm, settings, mine, where))


def _differ(comm, settings, mine, where) -> None:
    everyone = comm.allgather_obj(_with_names(mine))
    differing = [name for name in mine if len({repr(f[name]) for f in everyone}) > 1]
    if differing == ["variables"]:  # garbage not yet collected on some rank? look again
        gc.collect()
        mine = fields(settings)
        everyone = comm.allgather_obj(_with_names(mine))
        differing = [name for name in mine if len({repr(f[name]) for f in everyone}) > 1]
        if not differing:
            return
    lines = []
    for name in differing:
        if name == "variables":
            lines.append(_variables_line(everyone))
            continue
        if isinstance(mine[name], dict):  # options: only the entries that differ
            for key in mine[name]:
                if len({repr(f[name].get(key)) for f in everyone}) > 1:
                    values = ", ".join(f"rank {r}: {f[name].get(key)!r}"
                                       for r, f in enumerate(everyone))
                    lines.append(f"  {name}.{key}: {values}")
            continue
        values = ", ".join(f"rank {r}: {f[name]!r}" for r, f in enumerate(everyone))
        lines.append(f"  {name}: {values}")
    error = ConfigMismatchError(
        f"the ranks constructed their Replicator differently (at {where}):\n"
        + "\n".join(lines) + "\nEvery rank must construct it with the same arguments and the "
        "same model (a Variable that is each process's own takes rp.Variable(..., "
        "local=True)).")
    error.consistent = True  # every rank raises it
    raise error


def _with_names(mine) -> dict:
    """The fields, with each variable's name and creation line for the report."""
    named = dict(mine)
    named["names"] = [(v.name, v.created_at) for v in _shared_variables()]
    return named


def _variables_line(everyone) -> str:
    counts = ", ".join(f"rank {r}: {len(f['variables'])}" for r, f in enumerate(everyone))
    line = f"  variables (number of Variables alive in the process; {counts})"
    lists = [f["variables"] for f in everyone]
    for i in range(max(len(v) for v in lists)):
        column = [v[i] if i < len(v) else None for v in lists]
        if len(set(column)) == 1:
            continue
        line += f": the first that differs is #{i}:"
        for r, f in enumerate(everyone):
            if i >= len(f["variables"]):
                line += f"\n    rank {r}: none (it has only {len(f['variables'])})"
                continue
            (shape, dtype), (name, created) = f["variables"][i], f["names"][i]
            line += f"\n    rank {r}: {name!r} {dtype}{list(shape)} created at {created}"
        break
    return line


__all__ = ["Settings", "agree_config", "fields"]
