"""Model parallelism (logical devices) and micro-batches: where a process stands, and the step
that feeds micro-batches.

A replica may span ``Where.m`` logical devices (one process each) and cut its batch into
``Where.micro`` micro-batches. Its road is the one road of every step
(``replicate.compiler.compile_step(..., where=...)``):

1. each replica's batch is cut into M micro-batches along the first axis (``split_batch``), and
   ``fn`` is traced once per micro-batch as if each were a replica of its own
   (``micro_contexts``: ``rp.num_replicas()`` is R·M; collectives combine every micro-batch, so
   ``all_reduce(grads, "mean")`` is the gradient of the whole batch): k·M traced replicas, every
   op placed on a device (``graph/devices.py``);
2. the step passes (``graph/passes/step_passes.py``) that only such a step runs: the
   placement check (the replicas agree; a parameter on one device), the collective rewrite on
   the device's communicator, the GPipe order, and this device's part (transfers become
   send/recv, results reach every device; a Variable that lives on one device is fed and
   updated there only);
3. ``MicroBatchedStep`` runs it: it cuts the replicas' whole batches as they were traced, and
   its ``commit`` drops the other processes' copies of a Variable that lives on one device
   (``Variable.release``).

Every process compares the whole replica's placement (transfers, collectives and their devices,
with their lines) before anything is exchanged, so a process that placed an op elsewhere is an
error naming the lines on every process, not a hang.
"""

from __future__ import annotations

import dataclasses
from typing import NamedTuple

import numpy as np

from . import tree
from .errors import InputError, function_location
from .interop import from_foreign, is_foreign
from .step import CompiledStep


@dataclasses.dataclass(frozen=True)
class Where:
    """Where a process stands: logical ``device`` of ``m`` in replica group ``group`` of
    ``groups`` (the processes of one device, one per group, share ``device_comm``; the m
    processes of a group share ``replica_comm``), ``micro`` micro-batches per replica."""

    m: int = 1
    micro: int = 1
    device: int = 0
    group: int = 0
    groups: int = 1
    device_comm: str | None = None
    replica_comm: str | None = None


def split_batch(batch, micro: int, input_fn=None, replica: int = 0) -> list:
    """``batch`` (a nest) cut into ``micro`` nests along the first axis of every leaf."""
    if micro == 1:
        return [batch]
    leaves, treedef = tree.flatten(batch)
    parts = []
    for i, x in enumerate(leaves):
        if isinstance(x, (str, bytes)):
            parts.append([x] * micro)
            continue
        x = from_foreign(x) if is_foreign(x) else np.asarray(
            x.numpy() if hasattr(x, "numpy") else x)
        if x.ndim == 0 or x.shape[0] % micro:
            where = f" of input_fn {function_location(input_fn)}" if input_fn else ""
            raise InputError(
                f"micro_batches={micro} cuts every leaf of the batch{where} along its first axis, "
                f"but leaf {i} of replica {replica}'s batch has shape {list(x.shape)}: make the "
                f"batch a multiple of {micro} rows")
        b = x.shape[0] // micro
        parts.append([x[j * b:(j + 1) * b] for j in range(micro)])
    return [tree.unflatten(treedef, [p[j] for p in parts]) for j in range(micro)]


def micro_contexts(contexts, micro: int) -> list:
    """Each replica's context as ``micro`` replicas of their own (ids ``id * M + j``)."""
    if micro == 1:
        return list(contexts)
    return [dataclasses.replace(c, replica_id=c.replica_id * micro + j,
                                num_replicas=c.num_replicas * micro,
                                local_id=c.local_id * micro + j,
                                replicas_per_rank=c.replicas_per_rank * micro)
            for c in contexts for j in range(micro)]


class Home(NamedTuple):
    """Where a Variable lives (``Variable.home``): logical ``device`` of the replica whose
    processes share communicator ``comm``; ``where``: the same in words, for errors."""

    comm: str | None
    device: int
    where: str


class MicroBatchedStep(CompiledStep):
    """A compiled step fed the replicas' whole batches: ``run`` cuts each leaf into the
    micro-batches it was traced for. With logical devices ``commit`` writes this device's
    updates and drops this process's copy of each Variable that lives on another device."""

    def __init__(self, graph, executable, schedule, micro: int, where: Where = Where()):
        super().__init__(graph, executable, schedule)
        self.micro = micro
        self.where = w = where
        self.homes = [(var, Home(w.replica_comm, d, f"logical device {d} of replica group "
                                 f"{w.group} (rank {w.group * w.m + d})"))
                      for var, d in graph.meta.homes]

    def commit(self, values: list) -> None:
        super().commit(values)
        for var, home in self.homes:
            var.home = home
            if home.device != self.where.device:
                var.release(home.where)

    def run(self, leaves: list, keep_inputs: bool = False):
        M = self.micro
        if M > 1:
            k = self.graph.meta.replicas // M
            per = len(leaves) // k
            leaves = [x[j * (x.shape[0] // M):(j + 1) * (x.shape[0] // M)]
                      for r in range(k) for j in range(M) for x in leaves[r * per:(r + 1) * per]]
        return super().run(leaves, keep_inputs)


__all__ = ["Home", "MicroBatchedStep", "Where", "micro_contexts", "split_batch"]
