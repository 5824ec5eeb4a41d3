"""The CuPy backend's communication nodes (``mpi_*``, a bucket's ``comm_start``/``comm_wait``).

Each runs through the process's transport, chosen once, at the first communication (every rank
reaches it at the same node: the ranks agreed on the schedule first), by the runtime
(``TRANSPORTS["cupy"]``, ``replicate/runtime/communication/gpu_transport.py``):

* ``nccl`` (each rank has its own GPU): on the device, on the transport's own stream, ordered
  after the kernels that made the operand by an event and before the kernels that read the
  result by another — no host synchronisation; a bucket's ``comm_start`` only enqueues it, so it
  overlaps the rest of the backward pass;
* ``cuda-aware-mpi`` (only where MPI says it is): MPI on device buffers;
* host-staged MPI (ranks sharing a GPU, NCCL missing, or one process): the operand is copied to
  the host, the host's transport (the runtime's fixed-order MPI collectives) runs, the result
  is copied back; each copy counted in ``DEVICE.transfers``.

Every transport reduces in rank order, bitwise as the host path (see the transport's module),
and each is called alike: ``EXCHANGES[prim](transport, *operands, **attrs)``.
"""

from __future__ import annotations

from ..graph.collectives import EXCHANGES
from ..graph.reference import IMPL
from .base import TRANSPORTS

_TRANSPORT: list = []  # [the transport], once chosen


def transport(device):
    """The process's transport for ``device`` (a ``base.Transport``), chosen on first use."""
    if not _TRANSPORT:
        _TRANSPORT.append(TRANSPORTS["cupy"](device))
    return _TRANSPORT[0]


def comm_fn(node, device):
    """The function running communication node ``node`` of a lowered graph."""
    attrs = node.attrs
    call = EXCHANGES.get(node.prim)
    if call is None:  # model parallelism's point-to-point rows (transfer, send, recv): the host's
        row = IMPL[node.prim]
        return lambda *xs: device.to_device(row(*[device.to_host(x) for x in xs], **attrs))
    return lambda *xs: call(transport(device), *xs, **attrs)


__all__ = ["comm_fn", "transport"]
