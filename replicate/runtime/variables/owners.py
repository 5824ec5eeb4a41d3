"""Model parallelism: the Variables that live on one logical device, and the sync points where
every process of the replica gets their current value.

A Variable the step updates on one logical device and reads nowhere else (a parameter, its
optimiser state: ``graph/passes/pipeline.py``'s ``homes``) lives there: its update is neither
sent to the replica's other devices nor fed to their parts of the step, and after each step
their processes drop their copy (``MicroBatchedStep.commit``: ``Variable.release``; reading it
there is then an ``rp.PlacementError`` naming the Variable and its device, never a stale value).
So the parameters' memory is split across the devices, and no step sends updated state.

``gather`` is the sync point: every process of each replica group calls it at the same place
(the end of ``Replicator.run``, ``rp.checkpoint.save``), and each one that holds no value of a
Variable gets its device's current value — one ``allgather`` of a Python object per replica
group, which every process makes once whatever it holds, so no process can wait for another
that does not come. ``release`` drops the copies again (a checkpoint taken in the middle of a
run keeps the memory split).
"""

from __future__ import annotations

from ...errors import ReplicateError
from ..communication.comm import group


def gather(variables, only: str | None = None, forget: bool = False) -> list:
    """Give every process of each replica the current value of each of ``variables`` that
    lives on one of its devices; returns those this process held no value of (now loaded).
    Collective: every process of the replica calls it with the same Variables, in order.
    ``only``: the label of one replica group's communicator (a Replicator's own: the Variables
    another one placed are not its business); ``forget``: the Variables are one value everywhere
    again (the end of a run): drop their ``home``, so a later sync point (a checkpoint written by
    another Replicator, on other processes) does not look for them."""
    placed = [v for v in variables if getattr(v, "home", None) is not None
              and v.home.comm is not None and only in (None, v.home.comm)]
    loaded = []
    for label in sorted({v.home.comm for v in placed}):
        comm, mine = group(label), [v for v in placed if v.home.comm == label]
        names = [v.name for v in mine]
        sent = {i: v.value for i, v in enumerate(mine) if v.home.device == comm.rank}
        everyone = comm.allgather_obj((names, sent))
        if any(n != names for n, _ in everyone):
            error = ReplicateError(
                f"the processes of replica group {label!r} gather different Variables (those "
                "that live on one logical device) at the same sync point:\n" + "\n".join(
                    f"  logical device {d}: {n}" for d, (n, _) in enumerate(everyone)))
            error.consistent = True  # (every process saw every list)
            raise error
        for i, v in enumerate(mine):
            if v.released is not None:
                v.load(everyone[v.home.device][1][i])
                loaded.append(v)
    if forget:
        for v in placed:
            v.home = None
    return loaded


def release(variables) -> None:
    """Drop this process's copy of each of ``variables`` again (``gather`` loaded them)."""
    for v in variables:
        v.release(v.home.where)


__all__ = ["gather", "release"]
