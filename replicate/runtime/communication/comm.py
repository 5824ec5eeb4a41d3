"""The cross-process communicator: mpi4py when launched under MPI, a one-process stand-in otherwise.

Reductions give, on every rank, bitwise the result of combining every rank's buffer in rank order,
whatever the buffer's size or how it is cut into buckets, so a run is reproducible:

* small buffers (< 4096 elements per rank) are gathered whole and combined in rank order;
* with two processes a sum is MPI's own ``Allreduce`` (each element is one addition ``a + b``,
  which is the same in either order), in pieces of ``_CHUNK_BYTES`` (MPICH's shared-memory path
  is markedly faster on pieces of a few MB than on one message of 100 MB);
* otherwise an all-to-all hands every rank one slice of every rank's buffer, combined in rank
  order and gathered back (a ring all-reduce's traffic), also in pieces of ``_CHUNK_BYTES``;
* with several hosts of several ranks each, the two-level path of ``hierarchy.py``: within each
  host, then one buffer per host along a chain of the hosts, in the same order.
"""

from __future__ import annotations

import os
import re
import sys
import time
from threading import get_ident
from time import monotonic

import numpy as np
from threadpoolctl import threadpool_info, threadpool_limits

from ..job import exposure, hooks, mpi_shm, startup, status, watchdog
from ..job.watchdog import TRACKER, Call
from .hierarchy import Levels, combine, settings

_SPLIT_MIN = 4096  # elements per rank below which gathering whole buffers is cheaper
_CHUNK_BYTES = 4 << 20  # large reductions go in pieces of this size
_NATIVE_DTYPES = {np.dtype(t) for t in ("float32", "float64", "int32", "int64")}
def launched_by_mpi() -> bool:
    keys = ("PMI_RANK", "PMI_SIZE", "OMPI_COMM_WORLD_SIZE", "HYDRA_CONTROL_FD", "PMIX_RANK")
    return any(k in os.environ for k in keys)


class SelfComm:
    """One process, no MPI."""

    rank, size, label = 0, 1, "self"
    local_rank, local_size = 0, 1

    def split(self, color: int, label: str, key: int | None = None):
        return self

    def allgather(self, x: np.ndarray) -> np.ndarray:
        return np.asarray(x)[None]

    def allreduce(self, x: np.ndarray, op: str, inplace: bool = False) -> np.ndarray:
        return np.asarray(x)

    def bcast(self, x: np.ndarray, root: int = 0) -> np.ndarray:
        return np.asarray(x)

    def allgather_obj(self, obj):
        return [obj]

    def dup(self):
        return self

    def bcast_obj(self, obj, root=0):
        return obj

    def abort(self, code: int = 1):
        status.set_state(status.FAILED, code)
        sys.stdout.flush()
        sys.stderr.flush()
        hooks.real_exit(code)


class MPIComm:
    """mpi4py's COMM_WORLD (or a given communicator) with fixed-order reductions.

    Every call that waits for other processes records itself with the stall watchdog
    (``watchdog.TRACKER``) while it waits; see ``replicate/runtime/job/watchdog.py``."""

    def __init__(self, comm=None, label: str = "world"):
        from mpi4py import MPI

        self.MPI = MPI
        self.comm = comm or MPI.COMM_WORLD
        self.rank, self.size = self.comm.Get_rank(), self.comm.Get_size()
        self.label = label
        self.local_rank, self.local_size = 0, 1  # among this machine's ranks (``shared_split``)
        self.levels = None  # the hosts' two levels, when the reductions use them (``hierarchy``)
        self.seq = 0  # cross-process calls entered on this communicator (same on every rank)
        self._dups = 0
        TRACKER.comms[label] = self

    # -- watchdog bookkeeping (a few attribute writes per call) ---------------------------------
    def _enter(self, op, operand=None) -> int:
        seq, ident = self.seq, get_ident()
        self.seq = seq + 1
        TRACKER.inflight[ident] = Call(self.label, seq, op, operand, TRACKER.step, TRACKER.phase,
                                       ident, monotonic())
        return ident

    @staticmethod
    def _leave(ident):
        TRACKER.inflight.pop(ident, None)

    @staticmethod
    def _bytes(x: np.ndarray) -> np.ndarray:
        return np.ascontiguousarray(x).reshape(-1).view(np.uint8)

    # -- the calls ------------------------------------------------------------------------------
    def allgather(self, x: np.ndarray) -> np.ndarray:
        x = np.asarray(x, order="C")  # (not ascontiguousarray: it makes a 0-d array 1-d)
        ident = self._enter("allgather", x)
        try:
            return self._allgather(x)
        finally:
            self._leave(ident)

    def _allgather(self, x):
        out = np.empty((self.size,) + x.shape, x.dtype)
        self.comm.Allgather(self._bytes(x), self._bytes(out))
        return out

    def allreduce(self, x: np.ndarray, op: str, inplace: bool = False) -> np.ndarray:
        """The rank-ordered combination of every rank's ``x``. ``inplace``: ``x`` is a scratch
        buffer the caller gives up (a gradient bucket), so large results may be written over it
        instead of into fresh memory (ignored for read-only or non-contiguous arrays)."""
        inplace = inplace and x.flags.writeable and x.flags.c_contiguous
        x = np.asarray(x, order="C")  # (a 0-d value stays 0-d)
        ident = self._enter(f"allreduce({op})", x)
        try:
            if x.size < self.size * _SPLIT_MIN:
                return combine(self._allgather(x), op)
            if self.levels is not None and settings().two_level:
                return self._chunked(x, self.levels.allreduce, op, inplace,
                                     settings().local_chunk_bytes)
            if self.size == 2 and op == "sum" and x.dtype in _NATIVE_DTYPES:
                # (max/min stay on the split path: MPI_MAX with a NaN depends on operand order)
                return self._chunked(x, self._allreduce_native, op, inplace)
            return self._chunked(x, self._allreduce_split, op, inplace)
        finally:
            self._leave(ident)

    @staticmethod
    def _chunked(x: np.ndarray, reduce, op: str, inplace: bool = False, chunk=None):
        """``reduce`` over pieces of at most ``chunk`` bytes (default ``_CHUNK_BYTES``; into
        ``x`` itself if ``inplace``)."""
        flat = x.reshape(-1)
        out = flat if inplace else np.empty_like(flat)
        step = max(1, (chunk or _CHUNK_BYTES) // x.itemsize)
        for lo in range(0, flat.size, step):
            reduce(flat[lo:lo + step], op, out[lo:lo + step])
        return out.reshape(x.shape)

    def _allreduce_native(self, x: np.ndarray, op: str, out: np.ndarray) -> None:
        """MPI's Allreduce (two processes, sum: exactly ``a + b`` per element)."""
        if np.may_share_memory(x, out):  # (then they are the same piece)
            self.comm.Allreduce(self.MPI.IN_PLACE, x, op=self.MPI.SUM)
        else:
            self.comm.Allreduce(x, out, op=self.MPI.SUM)

    def _allreduce_split(self, x: np.ndarray, op: str, out: np.ndarray) -> None:
        """Bandwidth-optimal and still fixed-order: every rank receives one chunk of every rank's
        buffer (an all-to-all), combines the chunks in rank order, and the combined chunks are
        gathered back. Each rank moves 2 (n-1)/n of the bytes, like a ring all-reduce, and the
        result is bitwise the one of combining the full gathered buffers in rank order."""
        n, item = self.size, x.itemsize
        flat = x.reshape(-1)
        bounds = np.linspace(0, flat.size, n + 1).astype(np.int64)
        counts = np.diff(bounds)
        mine = int(counts[self.rank])
        recv = np.empty((n, mine), x.dtype)
        self.comm.Alltoallv(
            [self._bytes(flat), (counts * item).tolist(), (bounds[:-1] * item).tolist(),
             self.MPI.BYTE],
            [self._bytes(recv), [mine * item] * n, [i * mine * item for i in range(n)],
             self.MPI.BYTE])
        part = combine(recv, op)  # (x may be out: everything was read by the all-to-all)
        self.comm.Allgatherv([self._bytes(part), self.MPI.BYTE],
                             [self._bytes(out), (counts * item).tolist(),
                              (bounds[:-1] * item).tolist(), self.MPI.BYTE])

    def bcast(self, x: np.ndarray, root: int = 0) -> np.ndarray:
        x = np.array(x, copy=True, order="C")
        ident = self._enter(f"bcast(root={root})", x)
        try:
            self.comm.Bcast(self._bytes(x), root=root)
        finally:
            self._leave(ident)
        return x

    def allgather_obj(self, obj):
        ident = self._enter("allgather_obj", type(obj).__name__)
        try:
            return self.comm.allgather(obj)
        finally:
            self._leave(ident)

    def bcast_obj(self, obj, root=0):
        ident = self._enter(f"bcast_obj(root={root})", type(obj).__name__)
        try:
            return self.comm.bcast(obj, root=root)
        finally:
            self._leave(ident)

    def meet(self, timeout: float) -> bool:
        """Wait until every rank has come here, or ``timeout`` seconds (a non-blocking barrier,
        polled, so a rank that never comes cannot hang this one). True if all came."""
        request = self.comm.Ibarrier()
        deadline = monotonic() + timeout
        while not request.Test():
            if monotonic() > deadline:
                return False
            time.sleep(0.001)
        return True

    def dup(self):
        """A communicator of the same processes whose traffic cannot mix with this one's (for
        a communication thread). Its calls are watched like this one's, under the label
        ``"<label>.dup<n>"`` (the n-th dup of this communicator, the same on every rank)."""
        ident = self._enter("dup")
        try:
            comm = self.comm.Dup()
        finally:
            self._leave(ident)
        self._dups += 1
        dup = MPIComm(comm, f"{self.label}.dup{self._dups}")
        dup.levels = self.levels and self.levels.dup()
        return dup

    def shared_split(self) -> None:
        """Set ``local_rank``/``local_size``: this rank among the ranks on its machine (MPI's
        shared-memory split; a GPU process takes GPU ``local_rank % device count``), and the
        hosts' ``levels`` where the two-level reduction applies."""
        self.local_rank, self.local_size, self.levels = Levels.find(self.MPI, self.comm)

    def isend(self, x: np.ndarray, dest: int):
        """Start sending ``x`` (C-contiguous, kept alive by the caller until the request is
        done) to rank ``dest``; returns the MPI request."""
        return self.comm.Isend(self._bytes(x), dest=dest)

    def recv(self, shape, dtype, source: int) -> np.ndarray:
        """Receive an array from rank ``source`` (messages between two ranks arrive in the order
        they were sent)."""
        out = np.empty(shape, dtype)
        ident = self._enter(f"recv(from rank {source})", out)
        try:
            self.comm.Recv(self._bytes(out), source=source)
        finally:
            self._leave(ident)
        return out

    def split(self, color: int, label: str, key: int | None = None):
        """The processes that pass the same ``color`` as one communicator (ranked by ``key``,
        default as here), labelled ``label`` for the watchdog, which also learns its members
        (world ranks). Called by every process of this one."""
        ident = self._enter("split")
        try:
            comm = self.comm.Split(int(color), self.rank if key is None else key)
            colors = self.comm.allgather(int(color))
        finally:
            self._leave(ident)
        members = [r for r, c in enumerate(colors) if c == color]
        TRACKER.members[label] = set(members)
        return MPIComm(comm, label)

    def abort(self, code: int = 1):
        status.set_state(status.FAILED, code)  # (for the launcher: this rank said why)
        mpi_shm.unlink_mapped()  # (MPICH's files in /dev/shm: only MPI_Finalize removes them)
        sys.stdout.flush()
        sys.stderr.flush()
        time.sleep(0.5)  # let mpiexec forward this rank's last words before the abort kills all
        self.comm.Abort(code)
        hooks.real_exit(code)  # MPI_Abort may return: this rank must not go on running user code


_world = None
_groups: dict = {}  # label -> communicator of a group of processes (model parallelism)


def group(label: str | None = None):
    """The communicator a compiled step's exchange names (``comm=label``; None: replicas())."""
    return replicas() if label is None else _groups[label]


def add_group(comm) -> None:
    _groups[comm.label] = comm


def world():
    """The process-wide communicator (created on first use; under an MPI launcher already by
    ``import replicate``; ``job/exposure.py``: what MPI exposes, around ``MPI_Init``). With more
    than one process: the hooks that end the job when this rank fails or leaves (``job/hooks``),
    the stall watchdog and the BLAS thread share."""
    global _world
    if _world is None:
        _world = SelfComm()
        if launched_by_mpi():
            exposure.before_mpi()
            waiting = startup.watch()  # (a plain mpiexec: a bounded wait in MPI_Init)
            try:
                comm = MPIComm()
            except ImportError as e:
                raise ImportError("launched under MPI but mpi4py is missing: "
                                  "pip install 'replicate[mpi]'") from e
            finally:
                waiting.done()
            exposure.after_mpi()
            if comm.size > 1:
                comm.shared_split()
                _world = comm
                hooks.install(comm)
                limit_blas_threads(comm.size)
                watchdog.start(comm)
        hooks.install(_world)  # (one process: only os._exit is noted, for the launcher)
    return _world


_replicas: list = []  # the communicator of the processes that run replicas, when not the world


def replicas():
    """The communicator the compiled steps' and eager steps' collectives use: the world, or
    while an ``ActorLearner``'s learners run, the learners' own (actor processes take no part)."""
    return _replicas[-1] if _replicas else world()


class replicas_on:  # noqa: N801 - a context manager, named as a function
    """``with replicas_on(comm):`` the steps' collectives run on ``comm``."""

    def __init__(self, comm):
        self.comm = comm

    def __enter__(self):
        _replicas.append(self.comm)
        return self.comm

    def __exit__(self, *exc):
        _replicas.remove(self.comm)


# The variables each BLAS reads for its thread count (its own first, then OpenMP's): a library is
# left as the user set it only when one of *its* variables is set (OpenBLAS ignores
# MKL_NUM_THREADS, so ``MKL_NUM_THREADS=1`` must not stop NumPy's OpenBLAS being limited).
BLAS_THREAD_VARIABLES = {
    "openblas": ("OPENBLAS_NUM_THREADS", "GOTO_NUM_THREADS", "OPENBLAS_DEFAULT_NUM_THREADS",
                 "OMP_NUM_THREADS"),
    "mkl": ("MKL_NUM_THREADS", "MKL_DOMAIN_NUM_THREADS", "OMP_NUM_THREADS"),
    "blis": ("BLIS_NUM_THREADS", "BLIS_JC_NT", "BLIS_PC_NT", "BLIS_IC_NT", "BLIS_JR_NT",
             "BLIS_IR_NT", "OMP_NUM_THREADS"),
}
_OTHER_BLAS = ("OMP_NUM_THREADS",)  # a BLAS threadpoolctl knows but this table does not


def _chosen(value) -> bool:
    """A thread-count variable the library reads: it starts with a positive integer (an empty
    or zero value is ignored by the libraries, so it is no choice)."""
    digits = re.match(r"\s*(\d+)", value or "")
    return bool(digits) and int(digits.group(1)) > 0


def blas_thread_limits(info: list[dict], environ, share: int) -> dict[str, int]:
    """{filepath: threads} for each loaded BLAS to limit to this process's ``share`` of the cores.

    ``info``: ``threadpoolctl.threadpool_info()``; a BLAS (``user_api == "blas"``) is left alone
    when a variable it reads (``BLAS_THREAD_VARIABLES``) is set in ``environ``, or when it already
    uses at most ``share`` threads; OpenMP runtimes (``user_api == "openmp"``) are left alone.

    >>> lib = {"user_api": "blas", "internal_api": "openblas", "filepath": "o.so", "num_threads": 8}
    >>> blas_thread_limits([lib], {"MKL_NUM_THREADS": "1"}, 2)
    {'o.so': 2}
    >>> blas_thread_limits([lib], {"OMP_NUM_THREADS": "8"}, 2)
    {}
    """
    share = max(1, int(share))
    limits = {}
    for lib in info:
        if lib.get("user_api") != "blas":
            continue
        variables = BLAS_THREAD_VARIABLES.get(lib.get("internal_api"), _OTHER_BLAS)
        if any(_chosen(environ.get(v)) for v in variables):
            continue
        if (lib.get("num_threads") or 0) > share:
            limits[lib["filepath"]] = share
    return limits


def limit_blas_threads(size: int | None = None) -> dict[str, int]:
    """Give each process on a machine its share of the cores for each BLAS the user left unset.

    Several processes each running a BLAS with one thread per core oversubscribe the machine and
    can run tens of times slower; ``replicate.launch`` sets the environment, and this catches a
    plain ``mpiexec`` start where NumPy was already imported. Each loaded BLAS is judged on its own
    (``blas_thread_limits``). Returns the limits applied ({filepath: threads})."""
    local = int(os.environ.get("MPI_LOCALNRANKS", "0") or 0) or size or world().size
    share = max(1, (os.cpu_count() or 1) // local)
    limits = blas_thread_limits(threadpool_info(), os.environ, share)
    if limits:
        threadpool_limits(limits=limits)
    return limits
