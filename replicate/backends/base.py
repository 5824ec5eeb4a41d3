"""The backend contract.

A backend is a module with

* ``name``: str;
* ``passes``: the optimisation passes it wants, by name (``replicate.compiler.PIPELINE``);
  ``replicate.compiler`` runs them, in pipeline order, before lowering;
* ``lower(graph) -> Executable`` (or a plain ``run`` callable), where
  ``run(inputs: list of host arrays) -> list of host arrays`` (anything ``np.asarray`` accepts),
  one per ``graph.inputs`` / ``graph.outputs``;
* optionally ``fusion_accepts(members) -> bool``: whether it runs a group the fusion pass would
  form as one kernel (without it, every group is accepted).

A backend whose arrays live in device memory (``cupy``) gives its ``Executable`` a ``device``
(a :class:`Device`): then ``exe.run`` takes host or device arrays and returns device arrays,
and the step keeps the variables on the device between calls (``replicate/step.py``), moving
only the batches in and the results out; ``exe(inputs)`` still returns host arrays. A backend
that can copy a batch to its device ahead of the step gives its ``Executable`` a ``stage``:
``stage(leaves) -> Staged``, called on the input prefetch thread (``runtime/inputs/staging.py``).

Nodes whose primitive is flagged ``host`` (communication) run on the host through the reference
table ``replicate.graph.reference.IMPL`` (a device backend may carry them on the device instead,
through a transport from ``TRANSPORTS``); a backend hands them host arrays (a value passed
between two host nodes may be a handle, not an array: pass it through untouched).
"""

from __future__ import annotations

import threading
from typing import Protocol

import numpy as np

from ..errors import source_line
from ..graph.primitives import REGISTRY, SOURCE
from ..interop import from_foreign, is_foreign


class Transport(Protocol):
    """How a process's exchanges run: the host's MPI, NCCL or a CUDA-aware MPI, each reducing
    in rank order, bitwise alike. An exchange node calls it through
    ``graph.collectives.EXCHANGES``. ``comm``: the label of a group of processes (model
    parallelism), None for the replicas' communicator; ``owned``: the operand is a scratch
    buffer the transport may write over (a gradient bucket)."""

    kind: str  # "host", "nccl", "cuda-aware-mpi"

    def allreduce(self, x, op: str, owned: bool = False, comm=None): ...

    def allgather(self, x, comm=None): ...  # (processes, *x.shape)

    def reduce_scatter(self, x, op: str, comm=None): ...  # this rank's chunk of flat x reduced

    def broadcast(self, x, root: int, comm=None): ...

    # a bucket's exchange started (``collective``: allreduce, reduce_scatter or allgather);
    # ``inline``: nothing computes before its wait, so a transport may run it now, on the
    # caller's thread, where that keeps the exchanges' order (``overlap.CommThread.submit``)
    def start(self, x, op: str, owned: bool = False, comm=None, collective="allreduce",
              inline: bool = False): ...

    def wait(self, handle): ...  # the result of ``start``


# Device backends' cross-process transports, by backend name: ``fn(device) -> Transport`` (on
# the device, or host-staged). The runtime, which owns the communicator, registers them
# (``replicate/runtime/communication/gpu_transport.py``); a backend asks when it first
# communicates.
TRANSPORTS: dict = {}
# Where a device backend's process runs (``fn(device_count) -> device index``), registered by the
# runtime: ``local rank % device count`` under MPI.
PLACEMENT: dict = {}
DEVICES: list = []  # every Device made in this process (``device_of`` looks through them)


class Device:
    """The memory of a device backend: what is a device array, the two copies, and the count of
    bytes copied each way (``transfers``: ``{"to_device": bytes, "to_host": bytes}``, since the
    process started; a step's share is the difference around it).

    Subclasses define ``is_array``, ``_upload`` and ``_download``; ``finite`` (one reduction on
    the device, one flag read) and ``pack`` are optional speed-ups."""

    name = "device"

    def __init__(self):
        self.transfers = {"to_device": 0, "to_host": 0}
        self._count = threading.Lock()  # (a prefetch thread copies batches up too)
        DEVICES.append(self)

    def is_array(self, x) -> bool:
        raise NotImplementedError

    def to_device(self, x):
        """``x`` on the device: a device array passes through; anything else is copied up."""
        if self.is_array(x):
            return x
        x = self._from_foreign(x)
        if self.is_array(x):
            return x
        x = np.asarray(x)
        with self._count:
            self.transfers["to_device"] += x.nbytes
        return self._upload(x)

    def to_host(self, x):
        """``x`` as a NumPy array: a device array is copied down; anything else passes."""
        if not self.is_array(x):
            return x
        with self._count:
            self.transfers["to_host"] += x.nbytes
        return self._download(x)

    def to_host_many(self, xs: list) -> list:
        """Several device arrays copied down (one copy where the backend can pack them)."""
        return [self.to_host(x) for x in xs]

    def finite(self, x) -> bool:
        return bool(np.isfinite(self.to_host(x)).all())

    def _from_foreign(self, x):
        """Another library's array: on this device without a copy where it can (DLPack), else
        its values on the host."""
        return from_foreign(x) if is_foreign(x) else x

    def _upload(self, x):
        raise NotImplementedError

    def _download(self, x):
        raise NotImplementedError


class Staged:
    """Batch leaves copied to the device ahead of their step (on the prefetch thread).

    The step's thread calls ``take()`` (its stream waits for the copies, then it gets the
    device leaves) and, once the step has been launched, ``release()`` (the copies' memory may
    then be reused, after what the step's stream has queued so far)."""

    def __init__(self, leaves: list, wait=None, release=None):
        self.leaves, self._wait, self._release = leaves, wait, release

    def take(self) -> list:
        if self._wait is not None:
            self._wait()
            self._wait = None
        return self.leaves

    def release(self) -> None:
        if self._release is not None:
            self._release()
            self._release = None
        self.leaves = None


def device_of(x):
    """The :class:`Device` whose array ``x`` is, or None (a host value)."""
    for device in DEVICES:
        if device.is_array(x):
            return device
    return None


class Executable:
    """A compiled graph: ``exe(inputs) -> outputs`` (lists of host arrays).

    ``graph`` is the optimised graph the backend lowered; ``kernels`` lists what the backend
    launches per call (one entry per fused group or library call), for inspection and tests;
    ``device``: a device backend's :class:`Device` (then ``run`` returns device arrays), or
    None."""

    def __init__(self, graph, run, kernels=(), device=None, stage=None):
        self.graph = graph
        self.run = run
        self.kernels = list(kernels)
        self.device = device
        self.stage = stage  # leaves -> Staged, on the prefetch thread; None: not staged

    def __call__(self, inputs):
        outs = self.run(inputs)
        return outs if self.device is None else self.device.to_host_many(outs)


def kernel_name(node) -> str:
    """A node's name as a kernel: its primitive, a fused group with the ops inside."""
    return "fused[" + ",".join(node.attrs["body"].prims) + "]" if node.prim == "fused" \
        else node.prim


def profile_label(node):
    """``(name, kind, line)`` of a node for the profiler (None: no work of its own — a
    constant, an alias); kind: compute, communication or wait."""
    spec = REGISTRY[node.prim]
    if spec.kind == SOURCE or spec.alias:
        return None
    kind = "wait" if node.prim == "comm_wait" else "communication" if spec.exchange else \
        "compute"
    return kernel_name(node), kind, source_line(node.where) if node.where else ""


def profiled_bytes(kind, values) -> dict:
    """The profiler's ``bytes`` of a communication event (nothing for other kinds)."""
    if kind != "communication":
        return {}
    return {"bytes": int(sum(getattr(x, "nbytes", 0) for x in values))}
