"""Collectives on device arrays (CuPy), for a device backend's communication nodes
(``replicate/backends/cupy_comm.py``): over NCCL, or over a CUDA-aware MPI — two transports
(``backends.base.Transport``: ``allreduce``, ``allgather``, ``broadcast``, ``start``, ``wait``)
beside the host's (``transport.py``). Which one a process uses is chosen in ``gpu_transport.py``.

Reductions are fixed-order and bitwise those of the host path (``comm.py``): the flat buffer,
padded to ``ranks x chunk`` elements, goes through an all-to-all (rank r receives chunk r of
every rank), rank r combines its ``ranks`` chunks in rank order (``a0 op a1 op ...``, one
elementwise op at a time, as ``hierarchy.combine``), and the combined chunks are all-gathered.
Everything travels as bytes, so every dtype (bool, float16) goes as it is.

NCCL runs on a stream of its own: before a collective that stream waits for an event recorded
after the kernels that made its operand, and the kernels that read its result wait for an event
recorded after it — the host never waits. A bucket's ``start`` returns a :class:`Pending` at
once (its arrays kept alive until ``wait``), so the reduction overlaps the rest of the backward
pass. A CUDA-aware MPI is not stream-aware: the operand's stream is synchronised
first, and the call returns when it is done.

The stall watchdog (``watchdog.py``) sees every collective as it sees an MPI one: numbered on
the transport's own communicator label (``nccl``, ``cuda-aware-mpi``), with its step and
operand, in flight from when it is entered until its event is done on the device (a call that
blocks the host, the stand-in's NCCL or a CUDA-aware MPI, until it returns): a rank that never
joins it is named, and the job ends, after the timeout.
"""

from __future__ import annotations

from threading import get_ident
from time import monotonic

from ...errors import ReplicateError
from ..job.watchdog import TRACKER, Call, device_calls


class Pending:
    """A collective in flight: ``value`` once ``event`` has happened; ``keep`` holds the
    arrays the transfer still reads or writes."""

    __slots__ = ("value", "event", "keep")

    def __init__(self, value, event, keep=()):
        self.value, self.event, self.keep = value, event, keep


class _Done:
    done = True


_DONE = _Done()


class _Transport:
    """A device transport (``backends.base.Transport``). Its communicator spans the world's
    processes: ``comm`` (a group's label, model parallelism) is not looked at."""

    kind = "?"

    def __init__(self, comm, cupy):
        self.cp, self.size, self.rank = cupy, comm.size, comm.rank
        self.ufuncs = {"sum": cupy.add, "max": cupy.maximum, "min": cupy.minimum}
        self.label, self.seq = self.kind, 0  # the watchdog's view: calls entered, every rank
        TRACKER.comms[self.label] = self
        self._last_event = None

    def allreduce(self, x, op: str, owned: bool = False, comm=None):
        return self._watched(f"allreduce({op})", x, lambda: self.wait(self._allreduce(x, op)))

    def start(self, x, op: str, owned: bool = False, comm=None,
              collective: str = "allreduce", inline: bool = False) -> Pending:
        """A bucket's exchange (all-reduce; a sharded step's reduce-scatter or all-gather),
        started now on the device's stream and waited for where it is read (``inline`` changes
        nothing: no thread of ours runs it)."""
        if collective == "allgather":
            return self._watched("allgather (bucket)", x, lambda: self._gather(x))
        pending = self._watched(f"{collective}({op}) (bucket)", x,
                                lambda: self._allreduce(x, op))
        if collective == "reduce_scatter":  # (this rank's chunk of the whole reduction)
            chunk = x.size // self.size
            pending.value = pending.value.reshape(-1)[self.rank * chunk:(self.rank + 1) * chunk]
        return pending

    def allgather(self, x, comm=None):
        return self._watched("allgather", x, lambda: self.wait(self._gather(x)))

    def reduce_scatter(self, x, op: str, comm=None):
        """This rank's chunk of the flat ``x`` reduced: the whole all-reduce, then the chunk
        (bitwise the host's; the device path does not save the gather half yet)."""
        chunk = x.size // self.size
        return self.allreduce(x, op).reshape(-1)[self.rank * chunk:(self.rank + 1) * chunk]

    def broadcast(self, x, root: int, comm=None):
        return self._watched(f"broadcast(root={root})", x, lambda: self.wait(
            self._broadcast(self.cp.array(x, copy=True, order="C"), root)))

    def _watched(self, op: str, x, run):
        """``run()``, one collective as the watchdog sees it: numbered on this transport's
        label, in flight until its event is done on the device."""
        device_calls()  # drop the finished ones
        seq, self.seq = self.seq, self.seq + 1
        entry = [Call(self.label, seq, op, x, TRACKER.step, TRACKER.phase, get_ident(),
                      monotonic()), None]
        TRACKER.device[(self.label, seq)] = entry
        self._last_event = None
        out = run()
        # done when its event is (None: it blocked the host until it was done)
        entry[1] = (out.event if isinstance(out, Pending) else self._last_event) or _DONE
        return out

    def _allreduce(self, x, op: str) -> Pending:
        cp, n = self.cp, self.size
        if op not in self.ufuncs:
            raise ReplicateError(f"internal error: reduction {op!r} on device buffers")
        flat = cp.ascontiguousarray(x).reshape(-1)
        chunk = -(-flat.size // n)
        send = flat
        if flat.size != n * chunk:  # padded: every rank's chunk has one size
            send = cp.zeros(n * chunk, x.dtype)
            send[:flat.size] = flat
        out = cp.empty(n * chunk, x.dtype)

        def combine(recv):
            part = recv[0].copy()
            for row in recv[1:]:
                self.ufuncs[op](part, row, out=part)
            return part
        pending = self._reduce(send, out, chunk, combine)
        pending.value = out[:flat.size].reshape(x.shape)
        return pending

    def _gather(self, x) -> Pending:
        x = self.cp.ascontiguousarray(x).reshape(x.shape)  # (it makes a 0-d array 1-d)
        out = self.cp.empty((self.size,) + x.shape, x.dtype)
        return self._allgather(x, out)

    def wait(self, pending: Pending):
        self._last_event = pending.event
        if pending.event is not None:  # the reading kernels wait on the device, not the host
            self.cp.cuda.get_current_stream().wait_event(pending.event)
        return pending.value



class NcclTransport(_Transport):
    """NCCL send/recv (the all-to-all) and all-gather, on the transport's own stream."""

    kind = "nccl"

    def __init__(self, comm, cupy, nccl):
        super().__init__(comm, cupy)
        self.nccl = nccl
        uid = comm.bcast_obj(nccl.get_unique_id() if comm.rank == 0 else None, 0)
        device = cupy.cuda.Device()
        try:
            self.comm = nccl.NcclCommunicator(comm.size, uid, comm.rank)
        except nccl.NcclError as e:
            raise ReplicateError(
                f"NCCL did not start on rank {comm.rank} (GPU {device.id}, "
                f"{device.pci_bus_id}): {e}. Two ranks on one GPU are refused (\"Duplicate GPU "
                "detected\"); REPLICATE_TRANSPORT=host uses host-staged MPI instead") from None
        self.stream = cupy.cuda.Stream(non_blocking=True)
        self.u8 = nccl.NCCL_UINT8

    def _after_operands(self):
        self.stream.wait_event(self.cp.cuda.get_current_stream().record())

    def _reduce(self, send, out, chunk, combine) -> Pending:
        cp, n, nbytes = self.cp, self.size, chunk * send.itemsize
        self._after_operands()
        with self.stream:
            recv = cp.empty((n, chunk), send.dtype)
            self.nccl.groupStart()
            for peer in range(n):
                self.comm.send(send.data.ptr + peer * nbytes, nbytes, self.u8, peer,
                               self.stream.ptr)
                self.comm.recv(recv.data.ptr + peer * nbytes, nbytes, self.u8, peer,
                               self.stream.ptr)
            self.nccl.groupEnd()
            part = combine(recv)
            self.comm.allGather(part.data.ptr, out.data.ptr, nbytes, self.u8, self.stream.ptr)
            event = self.stream.record()
        return Pending(out, event, (send, recv, part))

    def _allgather(self, x, out) -> Pending:
        self._after_operands()
        self.comm.allGather(x.data.ptr, out.data.ptr, x.nbytes, self.u8, self.stream.ptr)
        return Pending(out, self.stream.record(), (x,))

    def _broadcast(self, buf, root) -> Pending:
        self._after_operands()
        self.comm.bcast(buf.data.ptr, buf.nbytes, self.u8, root, self.stream.ptr)
        return Pending(buf, self.stream.record())


class MPITransport(_Transport):
    """A CUDA-aware MPI on device buffers (mpi4py hands it their device pointers)."""

    kind = "cuda-aware-mpi"

    def __init__(self, comm, cupy):
        super().__init__(comm, cupy)
        self.mpi, self.comm = comm.MPI, comm.comm.Dup()
        self.memory = getattr(comm.MPI, "buffer", None) or comm.MPI.memory

    def _bytes(self, x):  # the device address: a CUDA-aware MPI reads device memory there
        return [self.memory.fromaddress(x.data.ptr, x.nbytes), self.mpi.BYTE]

    def _ready(self):  # MPI does not wait for the stream's kernels: the host does
        self.cp.cuda.get_current_stream().synchronize()

    def _reduce(self, send, out, chunk, combine) -> Pending:
        recv = self.cp.empty((self.size, chunk), send.dtype)
        self._ready()
        self.comm.Alltoall(self._bytes(send), self._bytes(recv))
        part = combine(recv)
        self._ready()
        self.comm.Allgather(self._bytes(part), self._bytes(out))
        return Pending(out, None)

    def _allgather(self, x, out) -> Pending:
        self._ready()
        self.comm.Allgather(self._bytes(x), self._bytes(out))
        return Pending(out, None)

    def _broadcast(self, buf, root) -> Pending:
        self._ready()
        self.comm.Bcast(self._bytes(buf), root=root)
        return Pending(buf, None)


__all__ = ["MPITransport", "NcclTransport", "Pending"]
