"""The reference table's rows for the point-to-point ops of model parallelism (``send``/``recv``).

``graph/passes/split_devices.py`` turns each value that crosses logical devices into a ``send``
on the process of its source device and a ``recv`` on the process of its destination, on the
communicator of the replica's processes (``comm=label``: its ranks are the devices). A send is
non-blocking (``Isend`` of a copy: the step may reuse the buffer at once); a receive blocks
until the value is there, watched by the stall watchdog like every other wait.
``WAITED[0]`` counts the seconds this process spent waiting in receives (the pipeline bubble:
``examples/pipeline.py``), ``SENT[0]`` the bytes it sent.
"""

from __future__ import annotations

import collections
import time

import numpy as np

from ...graph.reference import IMPL
from .comm import group

WAITED = [0.0]
SENT = [0]
_pending: collections.deque = collections.deque()  # (request, buffer) of sends in flight


def _reap() -> None:
    while _pending and _pending[0][0].Test():
        _pending.popleft()


def _send(x, *token, dst, comm):
    buffer = np.array(x, copy=True, order="C")
    SENT[0] += buffer.nbytes
    _pending.append((group(comm).isend(buffer, dst), buffer))
    _reap()
    return np.zeros((), np.uint8)


def _recv(*token, src, shape, dtype, comm):
    t0 = time.perf_counter()
    out = group(comm).recv(shape, dtype, src)
    WAITED[0] += time.perf_counter() - t0
    _reap()
    return out


IMPL.update(send=_send, recv=_recv)

__all__ = ["SENT", "WAITED"]
