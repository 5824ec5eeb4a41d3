"""Logical devices: ``with rp.logical_device(i):`` runs the ops that follow on device i.

A replica may span m logical devices (``Replicator(logical_devices=m)``, one process each). While
a step is traced with a ``Placement`` on its trace, every op records where it runs
(``Node.placed``: its device, the traced replica, forward or backward):

* inside ``with rp.logical_device(i):`` on device i;
* outside any block, where most of its placed operands' bytes are (ties: the later device) — so
  an optimiser update runs where its gradient is; an op whose operands are all Variables and
  constants *floats* (device ``None``): every device that needs it computes it;
* a gradient runs where its op ran (autodiff calls ``gradient_of``), whatever block ``rp.grad``
  was called in;
* the batch lives on device 0: another device that reads a batch leaf receives it.

A value read on another device than the one that made it passes through a ``transfer``
placeholder (``src`` → ``dst``). Once every replica's and every device's subgraph exists, the
replicas' placements are compared (``passes/pipeline.py``) and ``passes/split_devices.py``
rewrites each transfer into a ``send`` on ``src`` and a ``recv`` on ``dst``.
The gradient of a transfer is the transfer the other way (``graph/vjp_rules.py``).

>>> import replicate as rp
>>> with rp.logical_device(0):   # one logical device outside a model-parallel Replicator: a no-op
...     pass
"""

from __future__ import annotations

import contextlib
import numbers
from typing import NamedTuple

import numpy as np

from ..errors import PlacementError, source_line, user_frame
from .aval import AVal
from .core import bind, current_trace
from .primitives import COLLECTIVE, declare
from .reference import IMPL


class Placed(NamedTuple):
    """Where a traced node runs: ``device`` (None: floating), ``replica`` (the traced replica or
    micro-batch that made it), ``backward`` (made by autodiff)."""

    device: int | None
    replica: int
    backward: bool


def _received(*token, shape, dtype, **_):
    return AVal(tuple(shape), np.dtype(dtype))


TOKEN = AVal((), np.dtype(np.uint8))  # what a send gives: an ordering handle, not data

# transfer: a placeholder (never run, rewritten per device); send/recv: what it becomes
declare("transfer", COLLECTIVE, lambda x, **_: x)
declare("send", COLLECTIVE, lambda x, *token, **_: TOKEN, differentiable=False, effect=True,
        exchange=True)
declare("recv", COLLECTIVE, _received, differentiable=False, effect=True, exchange=True)
IMPL["transfer"] = lambda x, **_: x  # (one process: a move between devices changes nothing)


class Placement:
    """The placement state of one trace: ``m`` logical devices, the block the user is in, the
    transfers made so far (one per value and destination)."""

    def __init__(self, m: int):
        self.m = m
        self.current: int | None = None
        self.backward = False
        self.differentiated: set = set()  # ids of the values rp.grad differentiated against
        self._moved: dict[tuple, object] = {}
        self._batch_ids: set = set()
        self._seen = (-1, -1)

    def place(self, trace, prim: str, inputs: tuple, attrs: dict):
        """``(Placed, inputs)`` for a node about to be recorded: its inputs from other devices
        replaced by transfers."""
        if prim == "transfer":
            return Placed(attrs["dst"], trace.replica, self.backward), inputs
        devices = [self.device_of(trace, x) for x in inputs]
        device = self.current if self.current is not None else _most_bytes(inputs, devices)
        if device is not None:
            inputs = tuple(x if d is None or d == device else self._transfer(trace, x, d, device)
                           for x, d in zip(inputs, devices))
        return Placed(device, trace.replica, self.backward), inputs

    def device_of(self, trace, x) -> int | None:
        if x.node is not None:
            placed = getattr(x.node, "placed", None)
            return None if placed is None else placed.device
        return 0 if self._is_batch(trace, x) else None  # a Variable: where its reader runs

    def _is_batch(self, trace, x) -> bool:
        seen = (len(trace.inputs), len(trace.variables))
        if self._seen != seen:  # (refreshed as batches and Variables become inputs)
            self._seen = seen
            var_ids = {trace.variable_input(v).id for v in trace.variables}
            self._batch_ids = {i.id for i in trace.inputs} - var_ids
        return x.id in self._batch_ids

    def _transfer(self, trace, x, src: int, dst: int):
        key = (x.id, dst)
        if key not in self._moved:
            self._moved[key] = bind("transfer", x, src=src, dst=dst)
        return self._moved[key]


def move(x, src: int, dst: int):
    """``x``, made on device ``src``, on device ``dst`` (the gradient of a transfer)."""
    trace = current_trace()
    return trace.placement._transfer(trace, x, src, dst)


def _most_bytes(inputs, devices) -> int | None:
    weight: dict[int, int] = {}
    for x, d in zip(inputs, devices):
        if d is not None:
            weight[d] = weight.get(d, 0) + x.size * x.dtype.itemsize
    if not weight:
        return None
    return max(weight, key=lambda d: (weight[d], d))


def _placement():
    trace = current_trace()
    return None if trace is None else trace.placement


class logical_device:  # noqa: N801 - used like a function: with rp.logical_device(i):
    """Run the ops of the block on logical device ``index`` of this replica (graph mode, inside
    ``step_fn`` of a ``Replicator(..., logical_devices=m)``: 0 <= index < m). A value used on
    another device is sent there, and its gradient comes back; Variables live on the device whose
    ops read them. Without model parallelism there is one logical device, 0.

    >>> import numpy as np, replicate as rp, replicate.numpy as rnp
    >>> def step_fn(x):
    ...     with rp.logical_device(0):  # (a Replicator with logical_devices=2 also takes 1)
    ...         h = rnp.tanh(x)
    ...     return (h * h).sum()  # outside a block: where its operand is, device 0
    >>> float(rp.function(step_fn)(np.zeros(3)))
    0.0
    """

    def __init__(self, index: int):
        where = source_line(user_frame())
        if isinstance(index, (bool, np.bool_)) or not isinstance(index, numbers.Integral):
            raise PlacementError(f"rp.logical_device({index!r}): the device index is an int "
                                 f"(at {where})")
        self.index, self.placement = int(index), _placement()
        m = 1 if self.placement is None else self.placement.m
        if 0 <= self.index < m:
            return
        if self.placement is None and current_trace() is None and self.index > 0:
            raise PlacementError(
                f"rp.logical_device({index}) outside a traced step (at {where}): logical "
                "devices place the ops of step_fn in graph mode (a Replicator with "
                "logical_devices=m > 1); Variables need no placement (they live where their ops "
                "run)")
        raise PlacementError(
            f"rp.logical_device({index}): this replica has {m} logical device(s), indices 0 to "
            f"{m - 1} (at {where}); "
            + ("spread a replica over m processes with Replicator(..., logical_devices=m)"
               if m == 1 else f"the Replicator was made with logical_devices={m}"))

    def __enter__(self):
        if self.placement is not None:
            self.previous, self.placement.current = self.placement.current, self.index
        return self

    def __exit__(self, *exc):
        if self.placement is not None:
            self.placement.current = self.previous
        return False


@contextlib.contextmanager
def backward_pass(targets=()):
    """Autodiff: while gradients are built, the user's block does not apply (each gradient goes
    where its op ran) and the nodes made are marked backward (the pipeline schedule reads it);
    ``targets``: what the gradients are of (a Variable among them is a parameter)."""
    placement = _placement()
    if placement is None:
        yield
        return
    placement.differentiated.update(x.id for x in targets)
    previous = placement.current, placement.backward
    placement.current, placement.backward = None, True
    try:
        yield
    finally:
        placement.current, placement.backward = previous


@contextlib.contextmanager
def gradient_of(node):
    """Autodiff: the gradient of ``node`` is computed on ``node``'s device."""
    placement = _placement()
    placed = getattr(node, "placed", None)
    if placement is None or placed is None:
        yield
        return
    previous, placement.current = placement.current, placed.device
    try:
        yield
    finally:
        placement.current = previous


__all__ = ["TOKEN", "Placed", "Placement", "backward_pass", "gradient_of", "logical_device",
           "move"]
