"""The host's transport: MPI on NumPy arrays, and the same for a device backend's arrays copied
to the host and back.

A transport (``backends.base.Transport``) is how a process's exchanges run: ``allreduce``,
``allgather``, ``broadcast``, and a bucket's ``start``/``wait``. Three implement it — the host
(here, over ``comm.py``'s fixed-order MPI collectives and the communication thread of
``overlap.py``), NCCL and a CUDA-aware MPI (``device_collectives.py``) — and every exchange node
of a lowered graph calls it through one table (``graph.collectives.EXCHANGES``): the reference
table's rows (``host_rows.py``) with ``HOST``, a device backend's communication nodes
(``backends/cupy_comm.py``) with the transport ``gpu_transport.py`` chose for it.
"""

from __future__ import annotations

from .comm import group
from .overlap import reduce_parts, start_allreduce


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

    def broadcast(self, x, root: int, comm=None):
        return group(comm).bcast(x, root)

    def start(self, x, op: str, owned: bool = False, comm=None):
        """A bucket's all-reduce on the communication thread: a handle for ``wait``."""
        return start_allreduce(x, op, owned, comm)

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

    def broadcast(self, x, root: int, comm=None):
        return self.device.to_device(HOST.broadcast(self.device.to_host(x), root, comm))

    def start(self, x, op: str, owned: bool = False, comm=None):
        return HOST.start(self.device.to_host(x), op, owned, comm)

    def wait(self, handle):
        return self.device.to_device(HOST.wait(handle))


__all__ = ["HOST", "HostStaged", "HostTransport"]
