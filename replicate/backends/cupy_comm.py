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
  the host, the host row (``IMPL``: the runtime's fixed-order MPI collectives) runs, the result
  is copied back; each copy counted in ``DEVICE.transfers``.

Every transport reduces in rank order, bitwise as the host path (see the transport's module).
"""

from __future__ import annotations

from ..graph.reference import IMPL
from .base import TRANSPORTS

_TRANSPORT: list = []  # [transport or None], once chosen


def transport(device):
    """The process's transport for ``device`` (None: host-staged), chosen on first use."""
    if not _TRANSPORT:
        choose = TRANSPORTS.get("cupy")
        _TRANSPORT.append(choose(device) if choose is not None else None)
    return _TRANSPORT[0]


def comm_fn(node, device):
    """The function running communication node ``node`` of a lowered graph."""
    prim, attrs = node.prim, node.attrs

    def run(*xs):
        carrier = transport(device)
        if carrier is not None:
            return carrier.run(prim, xs, attrs)
        if prim == "comm_wait":  # the handle's bucket, reduced on the communication thread
            return device.to_device(IMPL[prim](xs[0], **attrs))
        value = IMPL[prim](*[device.to_host(x) for x in xs], **attrs)
        return value if prim == "comm_start" else device.to_device(value)
    return run


__all__ = ["comm_fn", "transport"]
