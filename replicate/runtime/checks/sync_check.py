"""Do the ranks still hold the same variables? A cheap fingerprint, compared across ranks.

Every rank starts from rank 0's variables (the Replicator broadcasts them on first use) and
applies the same update each step, so the copies stay identical — unless the step updates a
variable from data that was never combined across ranks (say, an optimiser without
``rp.wrap_optimizer``). Graph mode refuses such a step when it compiles (the divergence check,
``replicate.compiler.check_divergence``); what no compiler can see (a Python branch on the rank,
eager mode, a NumPy call on the host) is found here: a fingerprint per variable (sums of its
bytes as 64-bit words, with its shape and dtype) is exchanged — one small object per rank — and
compared.

When: at every checkpoint (before it is written: a checkpoint never holds one rank's copy of
diverged state), at the end of ``Replicator.run``, and every N steps with
``Replicator(check_sync=N)``. ``check_sync=False`` turns it off; a ``Variable(local=True)`` is
each process's own and is never compared. With model parallelism a Variable that lives on one
logical device is compared among the processes holding it (that device of every replica group;
at the end of ``run`` and at checkpoints every process holds it again).

Sharded optimiser state (``wrap_optimizer(shard=True)``) is held once: each process its own
slice, which no other process holds (the replicas of a process share one array), so a slice has
no copy to be compared with. Each is checked where it lives instead: it must be this process's
slice of the whole for this many processes (its layout: the process count and this rank, the
shape and dtype every process names) with its padding zero (with model parallelism the state
is cut over each device's group of n/m processes: process p holds slice p // m). The parameters
stay whole on every process and are compared as before. (A parameter changed on one process
only is mixed into every process's copy by the next step's all-gather — each process's slice of
the new value is computed from its own copy — so a check before that step sees it, one after
may not: ``check_sync=1`` compares at every step.)
"""

from __future__ import annotations

import zlib

import numpy as np

from ...errors import DivergenceError, source_line, user_frame
from ..communication.agree import VERIFY, agree


def fingerprint(value) -> tuple:
    """Equal values give equal fingerprints on every rank (NaN included: the bytes are compared,
    not the numbers): the wrapping sum and the XOR of the bytes as 64-bit words (memory speed,
    about 0.5 ms for 20 MiB), with a CRC-32 of the shape, the dtype and the last bytes."""
    a = np.ascontiguousarray(value)
    raw = a.reshape(-1).view(np.uint8)
    whole = raw.size - raw.size % 8
    words = raw[:whole].view(np.uint64)
    with np.errstate(over="ignore"):
        total = int(words.sum(dtype=np.uint64)) if whole else 0
    mixed = int(np.bitwise_xor.reduce(words)) if whole else 0
    return total, mixed, zlib.crc32(raw[whole:].tobytes(), zlib.crc32(
        f"{a.dtype.str}{a.shape}".encode()))


def shared(variables) -> list:
    """The variables every rank must hold identically (``local=True`` ones are left out)."""
    return [v for v in variables if getattr(v, "shared", True)]


def verify(comm, variables, step: int, when: str) -> None:
    """Raise ``DivergenceError`` on every rank if the ranks' copies of ``variables`` differ
    (``when``: what is happening, for the message). One ``allgather`` of a few integers."""
    if comm.size == 1:
        return
    where = source_line(user_frame())
    agree(comm, VERIFY, describe=lambda: f"comparing the ranks' variables ({when}) at {where}")
    sliced = [v for v in variables if getattr(v, "shard", None) is not None]
    variables = shared(variables)
    # (model parallelism: a Variable that lives on another device is compared among the
    # processes that hold it — its device in every replica group — not here)
    mine = (tuple(v.name for v in variables) + tuple(v.name for v in sliced),
            tuple(None if getattr(v, "released", None) else fingerprint(v.value)
                  for v in variables), [_slice_fault(v, comm) for v in sliced])
    everyone = comm.allgather_obj(mine)
    for r, (_, _, faults) in enumerate(everyone):  # (every process raises the same error)
        for var, fault in zip(sliced, faults):
            if fault:
                error = DivergenceError(
                    f"step {step}, {when}: rank {r}'s slice of the sharded variable "
                    f"{var.name!r} ({var.dtype}{list(var.shape)}) {fault}. Each process must "
                    "hold its own slice for the processes running (wrap_optimizer(shard=True) "
                    "cuts it; a checkpoint restores it); assign a sharded variable its whole "
                    "value (Variable.assign slices it), never a slice.")
                error.consistent = True
                raise error
    everyone = [(names, prints) for names, prints, _ in everyone]
    names = {names for names, _ in everyone}
    if len(names) > 1:
        error = DivergenceError(
            f"step {step}, {when}: the ranks compare different sets of variables:\n"
            + "\n".join(f"  rank {r}: {list(n)}" for r, (n, _) in enumerate(everyone)))
        error.consistent = True
        raise error
    prints = [p for _, p in everyone]
    for i, var in enumerate(variables):
        column = [p[i] for p in prints]
        held = [p for p in column if p is not None]
        if len(set(held)) <= 1:
            continue
        first = column.index(held[0])
        differ = [r for r, p in enumerate(column) if p is not None and p != held[0]]
        others = sum(len({p[j] for p in prints} - {None}) > 1
                     for j in range(len(variables))) - 1
        error = DivergenceError(
            f"step {step}, {when}: the ranks hold different values of variable {var.name!r} "
            f"({var.dtype}{list(var.shape)}): rank(s) {differ} differ from rank {first}"
            + (f" (and {others} more variable(s) differ)" if others else "") + ".\n"
            "Every rank must apply the same update to it. An update from per-rank data needs a "
            "collective first — rp.wrap_optimizer(opt) or rp.all_reduce(grads, 'mean') — or, if "
            "each process should keep its own value, create it with rp.Variable(..., "
            "local=True).")
        error.consistent = True
        raise error


def _slice_fault(var, comm) -> str:
    """What is wrong with this process's slice of a sharded variable ('' if nothing)."""
    lay, value = var.shard, np.asarray(var.value)
    # (model parallelism: cut over one device's processes, n = size / m; process p of the
    # job holds slice p // m — Layout: group, device = divmod(rank, m))
    m = comm.size // lay.n if comm.size % lay.n == 0 else 0
    if not m or lay.rank != comm.rank // m:
        return (f"is process {lay.rank}'s of {lay.n}, held by process {comm.rank} of "
                f"{comm.size}" + (f" (which holds slice {comm.rank // m} of its device's group "
                                  f"of {lay.n})" if m > 1 else ""))
    if value.shape != (lay.chunk,) or value.dtype != var.dtype:
        return f"is {value.dtype}{list(value.shape)}, not {var.dtype}[{lay.chunk}]"
    if np.any(value[lay.valid:] != 0):
        return f"holds nonzero padding (elements {lay.valid}: of {lay.chunk})"
    return ""


__all__ = ["fingerprint", "shared", "verify"]
