"""GPU collectives: which GPU a process uses, and how a device backend's processes communicate.

**Placement.** Under MPI a process takes GPU ``local rank % device count``, its local rank from
MPI's shared-memory split (``MPIComm.local_rank``); a single process keeps its current device.

**Transport** (chosen once per process, at the first communication of a device step — every rank
reaches it at the same node of the same schedule — from facts every rank gathers first, so all
choose alike). ``REPLICATE_TRANSPORT`` overrides the automatic choice:

* ``nccl``: ``cupy.cuda.nccl`` when every rank has its own GPU (NCCL refuses two ranks on one
  device, "Duplicate GPU detected"): the unique id broadcast over MPI, a stream of its own;
* ``cuda-aware-mpi``: MPI on device buffers, only where MPI says it is CUDA-aware
  (``MPIX_Query_cuda_support`` or the MPI's own switch in the environment; the PyPI MPICH wheel
  is not);
* ``host``: host-staged MPI (every operand copied to the host, the runtime's MPI collectives,
  the result copied back): ranks sharing a GPU, NCCL missing, or asked for.

The choice is logged (logger ``replicate``, and on stderr with ``REPLICATE_DEBUG=transport``)
and kept in ``CHOSEN``. A request that cannot be met is an error on every rank, never a silent
fallback.

**Reproducible.** Every transport reduces bitwise as the host path does (``comm.py``): each
rank's buffer is cut into one chunk per rank; an all-to-all hands rank r chunk r of every rank,
rank r combines them in rank order, and the combined chunks are gathered back. NCCL's own
``allReduce`` (whose order depends on its algorithm and the machine) is never used.
"""

from __future__ import annotations

import importlib
import logging
import os
import socket
import sys
import warnings
from dataclasses import dataclass

from ...backends.base import PLACEMENT, TRANSPORTS
from ...debug import debug_enabled
from ...errors import ReplicateError
from .comm import world
from .device_collectives import MPITransport, NcclTransport
from .transport import HostStaged

ENV = "REPLICATE_TRANSPORT"
KINDS = ("auto", "nccl", "cuda-aware-mpi", "host")
CHOSEN: dict = {}  # {"kind", "reason"} once chosen
LOG = logging.getLogger("replicate")
# what each MPI sets where it is built CUDA-aware and the user turned it on
_CUDA_AWARE_ENV = {"MPICH_GPU_SUPPORT_ENABLED": "1", "OMPI_MCA_opal_cuda_support": "true",
                   "MV2_USE_CUDA": "1", "PSM2_CUDA": "1"}


@dataclass(frozen=True)
class Facts:
    """What one rank knows of itself: its machine, its GPU, whether NCCL loads and whether its
    MPI is CUDA-aware."""

    host: str
    gpu: str
    nccl: bool
    cuda_aware: bool


def requested(environ=os.environ) -> str:
    value = environ.get(ENV, "auto").strip().lower() or "auto"
    if value not in KINDS:
        raise ReplicateError(f"{ENV}={value!r}: choose one of {', '.join(KINDS)}")
    return value


def choose(request: str, facts: list) -> tuple[str, str]:
    """``(transport, why)`` for ranks with ``facts`` (one per rank, in rank order); an error if
    ``request`` cannot be met. The same on every rank given the same facts.

    >>> choose("auto", [Facts("a", "0000:17:00.0", True, False), Facts("a", "0000:18:00.0",
    ...                                                                True, False)])[0]
    'nccl'
    """
    shared = _shared_gpus(facts)
    no_nccl = [r for r, f in enumerate(facts) if not f.nccl]
    aware = all(f.cuda_aware for f in facts)
    if request == "host":
        return "host", f"{ENV}=host"
    if request == "nccl":
        if no_nccl:
            raise ReplicateError(f"{ENV}=nccl, but NCCL does not load on rank(s) {no_nccl} "
                                 "(pip install nvidia-nccl-cu12, or -cu13)")
        if shared:
            raise ReplicateError(f"{ENV}=nccl, but {shared}: NCCL refuses two ranks on one GPU "
                                 "(\"Duplicate GPU detected\"). Give each rank its own GPU "
                                 f"(mpiexec -n <number of GPUs>), or use {ENV}=host "
                                 "(host-staged MPI)")
        return "nccl", f"{ENV}=nccl"
    if request == "cuda-aware-mpi":
        return "cuda-aware-mpi", f"{ENV}=cuda-aware-mpi" + (
            "" if aware else " (not detected: this MPI must be CUDA-aware, or it will fail)")
    if shared:
        return "host", f"{shared}: NCCL refuses two ranks on one GPU (\"Duplicate GPU " \
            "detected\"), so host-staged MPI"
    if not no_nccl:
        return "nccl", "each rank has its own GPU"
    if aware:
        return "cuda-aware-mpi", f"NCCL does not load on rank(s) {no_nccl}; MPI is CUDA-aware"
    return "host", f"NCCL does not load on rank(s) {no_nccl} (pip install nvidia-nccl-cu12, " \
        "or -cu13) and MPI is not CUDA-aware, so host-staged MPI"


def _shared_gpus(facts) -> str:
    """'ranks 0 and 1 share GPU ... on host ...' for the first GPU used twice, or ''."""
    seen: dict = {}
    for r, f in enumerate(facts):
        first = seen.setdefault((f.host, f.gpu), r)
        if first != r:
            return f"ranks {first} and {r} share GPU {f.gpu} on {f.host}"
    return ""


def cuda_aware_mpi(environ=os.environ) -> bool:
    """Whether this process's MPI says it carries device buffers (never assumed)."""
    query = getattr(sys.modules.get("mpi4py.MPI"), "Query_cuda_support", None)
    if query is not None:
        try:
            return bool(query())
        except Exception:  # noqa: BLE001 - an MPI without the extension
            pass
    return any(environ.get(k, "").lower() == v for k, v in _CUDA_AWARE_ENV.items())


def nccl_module():
    """CuPy's NCCL wrapper, or None where it or ``libnccl`` is missing."""
    with warnings.catch_warnings():  # CuPy warns when libnccl does not load: we say it better
        warnings.simplefilter("ignore")
        try:
            module = importlib.import_module("cupy.cuda.nccl")
        except ImportError:
            return None
    return module if getattr(module, "available", False) else None


def place(count: int) -> int | None:
    """This process's GPU under MPI: local rank % ``count``; None for a single process (it keeps
    the device it chose, ``cupy.cuda.Device(i).use()``, or CuPy's default)."""
    comm = world()
    if comm.size == 1:
        return None
    return comm.local_rank % max(1, count)


def for_device(device):
    """The transport of this process for a device backend (``HostStaged``: through the host),
    chosen once."""
    import cupy

    comm = world()
    nccl = nccl_module()
    facts = Facts(socket.gethostname(), cupy.cuda.Device().pci_bus_id, nccl is not None,
                  cuda_aware_mpi())
    everyone = comm.allgather_obj(facts) if comm.size > 1 else [facts]
    try:
        kind, why = choose(requested(), everyone)
    except ReplicateError as e:  # from the gathered facts: every rank raises this alike
        e.consistent = True
        raise
    CHOSEN.update(kind=kind, reason=why)
    message = f"rank {comm.rank}: GPU collectives over {kind} ({why})"
    LOG.info(message)
    if debug_enabled("transport"):
        print(f"[replicate] {message}", file=sys.stderr, flush=True)
    if kind == "host":
        return HostStaged(device)
    return NcclTransport(comm, cupy, nccl) if kind == "nccl" else MPITransport(comm, cupy)


TRANSPORTS["cupy"] = for_device
PLACEMENT["cupy"] = place

__all__ = ["CHOSEN", "ENV", "Facts", "choose", "cuda_aware_mpi", "for_device", "nccl_module",
           "place", "requested"]
