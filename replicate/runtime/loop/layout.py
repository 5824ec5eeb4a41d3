"""Where each process stands: data parallelism over replica groups, model parallelism inside.

``Replicator(..., logical_devices=m, micro_batches=M)``: the n processes form R/k = n/m
*replica groups* of m consecutive ranks; rank p is logical device ``p % m`` of group ``p // m``
and holds that device's part of its k replicas. Two communicators are split from the world
(once per m, at construction, after the ranks agreed on their configuration):

* the *device group* (one process per replica group, the same device): the collectives of the
  ops placed on that device — the gradient all-reduce of the Variables that live there — and
  the gathering of the step's outputs (every process holds every output at the end of a step);
* the *replica group* (the m devices of one replica): the sends and receives between devices.

Each replica runs ``input_fn`` on every one of its processes (with the same context: the
same batches); the step reads the batch on device 0 and sends on what other devices use.
"""

from __future__ import annotations

import numbers

from ...compiler import compile_step
from ...context import ReplicaContext
from ...errors import ReplicateError
from ...model_parallel import Where
from ...sharding import reshard
from ..checks import nan_check
from ..communication.comm import add_group, group
from ..variables import owners

_SPLITS: dict = {}  # m -> (device group, replica group) of this process


def _count(value, name: str) -> int:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 1:
        raise ReplicateError(f"{name} must be an int >= 1, got {value!r}")
    return int(value)


def per_rank(num_replicas, replicas_per_rank, num_ranks: int, logical_devices=1) -> int:
    """The replicas each process runs: ``replicas_per_rank`` (default 1), or the global
    ``num_replicas`` R spread over the processes there are — R/n each (n/m replica groups with
    logical devices). A job given R runs the same computation on any process count that divides
    it (the same replicas, each with its own data and randomness): a restart on fewer or more
    processes continues it."""
    if num_replicas is None:
        return 1 if replicas_per_rank is None else replicas_per_rank
    r = _count(num_replicas, "num_replicas")
    groups = num_ranks // _count(logical_devices, "logical_devices")
    if groups < 1 or r % groups:
        fits = [n for n in range(1, r + 1) if r % n == 0]
        raise ReplicateError(
            f"num_replicas={r} cannot be spread evenly over {groups} replica group(s) of this "
            f"job's {num_ranks} process(es): launch a number of processes (x logical_devices) "
            f"that divides it: {fits}")
    if replicas_per_rank is not None and replicas_per_rank != r // groups:
        raise ReplicateError(
            f"num_replicas={r} over {groups} replica group(s) is {r // groups} per process, but "
            f"replicas_per_rank={replicas_per_rank!r}: give one of the two")
    return r // groups


class Layout:
    """This process's place: ``device`` of ``m``, replica ``group`` of ``groups``, its contexts
    and communicators, and how its step is compiled."""

    def __init__(self, comm, k: int, logical_devices=1, micro_batches=1, mode="graph"):
        m = _count(logical_devices, "logical_devices")
        micro = _count(micro_batches, "micro_batches")
        if mode == "eager" and k != 1:
            raise ReplicateError(
                "eager mode runs one replica per process (ChainerMN-style); use "
                "replicas_per_rank=1 and more processes (mpiexec -n N), or graph mode for "
                "several replicas per process")
        if mode == "eager" and (m > 1 or micro > 1):
            raise ReplicateError(
                f"logical_devices={m}, micro_batches={micro}: model parallelism and micro-batches "
                "run in graph mode only (mode='graph'); eager mode runs one replica per process")
        if comm.size % m:
            raise ReplicateError(
                f"logical_devices={m} does not divide the {comm.size} process(es): a replica "
                f"spans {m} processes (one per logical device), so launch a multiple of {m}")
        self.comm, self.k, self.m, self.micro = comm, k, m, micro
        self.group, self.device = divmod(comm.rank, m)
        self.groups = comm.size // m
        self.num_replicas = self.groups * k
        self.outputs_comm = comm
        self.where = Where(m, micro, self.device, self.group, self.groups)

    def world_rank(self, r: int) -> int:
        """The world rank of process ``r`` of ``outputs_comm`` (this device's group)."""
        return r * self.m + self.device if self.m > 1 else r

    def contexts(self) -> list:
        """Each local replica's context (the same on the m processes of a replica)."""
        k = self.k
        return [ReplicaContext(self.group * k + r, self.num_replicas, self.comm.rank,
                               self.comm.size, r, k) for r in range(k)]

    def connect(self) -> None:
        """Split the device and replica groups' communicators (every rank, at construction),
        and cut the sharded optimiser state for this process's data-parallel group (its
        device's processes: ``sharding.reshard``)."""
        reshard(self.comm, self.groups, self.group)
        if self.m == 1:
            return
        if self.m not in _SPLITS:
            m, d, g = self.m, self.device, self.group
            device = self.comm.split(d, f"device{d}.of{m}", key=g)
            replica = self.comm.split(g, f"replica{g}.of{m}", key=d)
            add_group(device)
            add_group(replica)
            _SPLITS[self.m] = device, replica
        device, replica = _SPLITS[self.m]
        self.outputs_comm = device
        self.where = Where(self.m, self.micro, self.device, self.group, self.groups,
                           device.label if self.groups > 1 else None, replica.label)

    def non_finite_updates(self, updates) -> list:
        """``nan_check.non_finite_updates`` of the updates this process made; with logical
        devices each device makes its own Variables' updates, so the replica's processes share
        what they found (one small exchange, with ``check_finite`` only)."""
        bad = nan_check.non_finite_updates(updates)
        if self.m > 1:
            found = group(self.where.replica_comm).allgather_obj(bad)
            bad = list(dict.fromkeys(b for lines in found for b in lines))
        return bad

    def gather(self, variables) -> None:
        """The end of a run: each process of the replica gets the current value of the
        Variables that live on its other devices (``owners.gather``)."""
        if self.m > 1:
            owners.gather(variables, self.where.replica_comm, forget=True)

    def compile_step(self, step_fn, batches, contexts, backend, options, input_fn=None):
        return compile_step(step_fn, batches, contexts, backend=backend, options=options,
                            num_ranks=self.comm.size, rank=self.comm.rank, where=self.where,
                            input_fn=input_fn)


__all__ = ["Layout", "per_rank"]
