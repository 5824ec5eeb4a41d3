"""The host's transport: MPI on NumPy arrays, and the same for a device backend's arrays copied
to the host and back.

A transport (``backends.base.Transport``) is how a process's exchanges run: ``allreduce``,
``allgather``, ``reduce_scatter``, ``broadcast``, and a bucket's ``start``/``wait``. Three
implement it — the host (here, over ``comm.py``'s fixed-order MPI collectives and the
communication thread of ``overlap.py``), NCCL and a CUDA-aware MPI (``device_collectives.py``)
— and every exchange node of a lowered graph calls it through one table
(``graph.collectives.EXCHANGES``): the reference table's rows (``host_rows.py``) with
``HOST``, a device backend's communication nodes (``backends/cupy_comm.py``) with the
transport ``gpu_transport.py`` chose for it.
"""

from __future__ import annotations

import numpy as np

from .comm import _CHUNK_BYTES, group
from .hierarchy import combine
from .overlap import comm_thread, reduce_parts, start_allreduce


def reduce_scatter(comm, x, op: str) -> np.ndarray:
    """This rank's chunk (of ``comm.size`` equal ones) of the rank-ordered combination of every
    rank's flat ``x``: the all-to-all half of ``comm.MPIComm._allreduce_split``, so bitwise that
    chunk of ``allreduce`` (whose every path combines in rank order). Each rank sends (n-1)/n
    of the bytes, in pieces of ``_CHUNK_BYTES``."""
    flat = np.ascontiguousarray(x).reshape(-1)
    n = comm.size
    if n == 1:
        return flat.copy()
    if flat.size % n:
        raise ValueError(f"reduce_scatter of {flat.size} elements over {n} ranks")
    rows, chunk = flat.reshape(n, -1), flat.size // n
    out = np.empty(chunk, x.dtype)
    step = max(1, _CHUNK_BYTES // max(1, x.itemsize * n))
    ident = comm._enter(f"reduce_scatter({op})", x)  # (the stall watchdog sees it)
    try:
        for lo in range(0, max(chunk, 1), step):
            send = np.ascontiguousarray(rows[:, lo:lo + step])
            recv = np.empty_like(send)
            count = send.shape[1] * x.itemsize  # (bytes to and from each rank)
            comm.comm.Alltoall([comm._bytes(send), count, comm.MPI.BYTE],
                               [comm._bytes(recv), count, comm.MPI.BYTE])
            out[lo:lo + step] = combine(recv, op)
        return out
    finally:
        comm._leave(ident)


class HostTransport:
    """MPI on NumPy arrays, over the communicator ``comm`` names (None: the replicas'
    communicator, the world or an ``ActorLearner``'s learners; else a group of processes of
    model parallelism), looked up at each call."""

    kind = "host"

    def allreduce(self, x, op: str, owned: bool = False, comm=None):
        """The rank-ordered reduction of ``x`` (a list: an unpacked bucket's parts, reduced
        over themselves, see ``overlap.reduce_parts``)."""
        if isinstance(x, list):
            return reduce_parts(group(comm), x, op)
        return group(comm).allreduce(x, op, owned)

    def allgather(self, x, comm=None):
        return group(comm).allgather(x)

    def reduce_scatter(self, x, op: str, comm=None):
        """This rank's chunk of the rank-ordered reduction of the flat ``x``."""
        return reduce_scatter(group(comm), x, op)

    def broadcast(self, x, root: int, comm=None):
        return group(comm).bcast(x, root)

    def start(self, x, op: str, owned: bool = False, comm=None, collective="allreduce",
              inline: bool = False):
        """A bucket's exchange on the communication thread (an all-reduce; a sharded step's
        reduce-scatter or all-gather): a handle for ``wait``. ``inline``: nothing computes
        before its wait, so it runs now on this thread if the communication thread is idle."""
        if collective == "reduce_scatter":
            return comm_thread(comm).submit(lambda c, x: reduce_scatter(c, x, op), x,
                                            kind="reduce_scatter", inline=inline)
        if collective == "allgather":
            return comm_thread(comm).submit(lambda c, x: c.allgather(x), x, kind="allgather",
                                            inline=inline)
        return start_allreduce(x, op, owned, comm, inline)

    def wait(self, handle):
        return handle.result()


HOST = HostTransport()


class HostStaged:
    """A device backend's exchanges through the host: each operand copied to the host, the
    host transport, the result copied back (every copy counted in ``device.transfers``)."""

    kind = "host"

    def __init__(self, device):
        self.device = device

    def allreduce(self, x, op: str, owned: bool = False, comm=None):
        return self.device.to_device(HOST.allreduce(self.device.to_host(x), op, owned, comm))

    def allgather(self, x, comm=None):
        return self.device.to_device(HOST.allgather(self.device.to_host(x), comm))

    def reduce_scatter(self, x, op: str, comm=None):
        return self.device.to_device(HOST.reduce_scatter(self.device.to_host(x), op, comm))

    def broadcast(self, x, root: int, comm=None):
        return self.device.to_device(HOST.broadcast(self.device.to_host(x), root, comm))

    def start(self, x, op: str, owned: bool = False, comm=None, collective="allreduce",
              inline: bool = False):
        return HOST.start(self.device.to_host(x), op, owned, comm, collective, inline)

    def wait(self, handle):
        return self.device.to_device(HOST.wait(handle))


__all__ = ["HOST", "HostStaged", "HostTransport", "reduce_scatter"]
