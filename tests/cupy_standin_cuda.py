"""The CUDA side of the CuPy stand-in (``cupy_standin.py``): ``cupy.cuda``'s devices, streams and
events, and ``cupy.cuda.nccl``, for machines without a GPU.

* devices: ``REPLICATE_STANDIN_DEVICES`` of them (default 1), each with its PCI bus id;
  ``Device(i).use()`` makes ``i`` current (``runtime.getDevice()``);
* streams and events keep CuPy's names and signatures and are synchronous (work is done when
  enqueued: the order the backend sets with events is not exercised, only its calls);
* ``nccl``: CuPy's NCCL wrapper (``cupy_backends/cuda/libs/nccl.pyx``) — ``get_unique_id``,
  ``groupStart``/``groupEnd``, ``NcclCommunicator(ndev, commId, rank)`` with ``bcast``,
  ``broadcast``, ``allGather``, ``allReduce``, ``send``, ``recv`` on device pointers, its
  ``NCCL_*`` constants and ``NcclError`` — carried by MPI between the processes of the
  launch (a communicator spans every process, NCCL rank = MPI rank; anything else raises). Like
  NCCL, an init with two ranks on one device fails: "Duplicate GPU detected" on stderr and
  ``NcclError`` (NCCL_ERROR_INVALID_USAGE) on every rank. Send/recv outside a group run at once
  (NCCL would deadlock where they would).
"""

from __future__ import annotations

import ctypes
import os
import socket
import sys
import types

import numpy as np


class _State:
    device = 0


STATE = _State()


def device_count() -> int:
    return int(os.environ.get("REPLICATE_STANDIN_DEVICES", "1"))


class Device:
    def __init__(self, device=None):
        self.id = STATE.device if device is None else int(getattr(device, "id", device))
        if not 0 <= self.id < device_count():
            raise RuntimeError("cudaErrorInvalidDevice: invalid device ordinal")
        self._saved = []

    @property
    def pci_bus_id(self) -> str:
        return f"0000:{0x17 + self.id:02X}:00.0"

    def use(self):
        STATE.device = self.id

    def synchronize(self):
        pass

    def __enter__(self):
        self._saved.append(STATE.device)
        self.use()
        return self

    def __exit__(self, *exc):
        STATE.device = self._saved.pop()


class Event:
    def __init__(self, block=False, disable_timing=False, interprocess=False):
        self.done = True

    def record(self, stream=None):
        pass

    def synchronize(self):
        pass


class Stream:
    _current: list = []

    def __init__(self, null=False, non_blocking=False, ptds=False, priority=None):
        self.ptr = 0 if null else id(self)
        self.device_id = STATE.device

    def record(self, event=None):
        return event or Event()

    def wait_event(self, event):
        pass

    def synchronize(self):
        pass

    def use(self):
        Stream._current[:] = [self]
        return self

    def __enter__(self):
        Stream._current.append(self)
        return self

    def __exit__(self, *exc):
        Stream._current.pop()


_NULL = Stream(null=True)


def get_current_stream(device_id=-1):
    return Stream._current[-1] if Stream._current else _NULL


# -- NCCL ---------------------------------------------------------------------------------------
NCCL_INT8, NCCL_UINT8, NCCL_INT32, NCCL_UINT32, NCCL_INT64, NCCL_UINT64 = 0, 1, 2, 3, 4, 5
NCCL_FLOAT16, NCCL_FLOAT32, NCCL_FLOAT64 = 6, 7, 8
NCCL_SUM, NCCL_PROD, NCCL_MAX, NCCL_MIN = 0, 1, 2, 3
_BYTES = {0: 1, 1: 1, 2: 4, 3: 4, 4: 8, 5: 8, 6: 2, 7: 4, 8: 8}
_DTYPES = {0: np.int8, 1: np.uint8, 2: np.int32, 3: np.uint32, 4: np.int64, 5: np.uint64,
           6: np.float16, 7: np.float32, 8: np.float64}
_ERRORS = {5: ("NCCL_ERROR_INVALID_USAGE",
               "invalid usage (run with NCCL_DEBUG=WARN for details)")}


class NcclError(RuntimeError):
    def __init__(self, status):
        self.status = status
        name, text = _ERRORS.get(status, ("NCCL_ERROR_INTERNAL_ERROR", "internal error"))
        super().__init__(f"{name}: {text}")


def get_version() -> int:
    return 22703


def get_unique_id() -> tuple:
    return tuple(int(b) for b in np.frombuffer(os.urandom(128), np.int8))


_GROUP: list = []  # None when no group is open, else the queued (comm, op, args)


def groupStart():  # noqa: N802 - CuPy's name
    _GROUP.append([])


def groupEnd():  # noqa: N802
    ops = _GROUP.pop()
    requests = []
    for comm, op, buf, peer in ops:
        method = comm._mpi.Isend if op == "send" else comm._mpi.Irecv
        requests.append(method(buf, dest=peer) if op == "send" else method(buf, source=peer))
    for r in requests:
        r.Wait()


def _memory(ptr, count, datatype) -> np.ndarray:
    n = count * _BYTES[datatype]
    return np.ctypeslib.as_array((ctypes.c_uint8 * n).from_address(ptr)) if n else \
        np.zeros(0, np.uint8)


class NcclCommunicator:
    def __init__(self, ndev, commId, rank):
        from mpi4py import MPI

        assert len(commId) == 128
        world = MPI.COMM_WORLD
        if ndev != world.Get_size() or rank != world.Get_rank():
            raise NotImplementedError("the NCCL stand-in spans every MPI process, NCCL rank = "
                                      "MPI rank")
        self._mpi = world.Dup()
        self._device = STATE.device
        seen = self._mpi.allgather((tuple(commId), socket.gethostname(), self._device))
        if len({s[0] for s in seen}) != 1:
            raise NcclError(5)
        places = [s[1:] for s in seen]
        for r, place in enumerate(places):
            first = places.index(place)
            if first != r:
                print(f"{socket.gethostname()}: NCCL WARN Duplicate GPU detected : rank {r} "
                      f"and rank {first} both on CUDA device {Device(place[1]).pci_bus_id}",
                      file=sys.stderr, flush=True)
                raise NcclError(5)
        self._rank, self._size = rank, ndev

    def device_id(self):
        return self._device

    def rank_id(self):
        return self._rank

    def size(self):
        return self._size

    def destroy(self):
        pass

    def abort(self):
        pass

    def check_async_error(self):
        pass

    def bcast(self, buff, count, datatype, root, stream):
        self._mpi.Bcast(_memory(buff, count, datatype), root=root)

    def broadcast(self, sendbuff, recvbuff, count, datatype, root, stream):
        if self._rank == root and sendbuff != recvbuff:
            _memory(recvbuff, count, datatype)[...] = _memory(sendbuff, count, datatype)
        self.bcast(recvbuff, count, datatype, root, stream)

    def allGather(self, sendbuf, recvbuf, count, datatype, stream):  # noqa: N802
        self._mpi.Allgather(_memory(sendbuf, count, datatype),
                            _memory(recvbuf, count * self._size, datatype))

    def allReduce(self, sendbuf, recvbuf, count, datatype, op, stream):  # noqa: N802
        from mpi4py import MPI

        send = _memory(sendbuf, count, datatype).view(_DTYPES[datatype])
        recv = _memory(recvbuf, count, datatype).view(_DTYPES[datatype])
        ops = {NCCL_SUM: MPI.SUM, NCCL_PROD: MPI.PROD, NCCL_MAX: MPI.MAX, NCCL_MIN: MPI.MIN}
        self._mpi.Allreduce(send.copy(), recv, op=ops[op])

    def _p2p(self, op, ptr, count, datatype, peer):
        buf = _memory(ptr, count, datatype)
        if _GROUP:
            _GROUP[-1].append((self, op, buf, peer))
        elif op == "send":
            self._mpi.Send(buf, dest=peer)
        else:
            self._mpi.Recv(buf, source=peer)

    def send(self, sendbuf, count, datatype, peer, stream):
        self._p2p("send", sendbuf, count, datatype, peer)

    def recv(self, recvbuf, count, datatype, peer, stream):
        self._p2p("recv", recvbuf, count, datatype, peer)


def _nccl_module():
    module = types.ModuleType("cupy.cuda.nccl", "the NCCL stand-in (tests/cupy_standin_cuda.py)")
    names = ["NcclError", "NcclCommunicator", "get_unique_id", "get_version", "groupStart",
             "groupEnd"] + [n for n in globals() if n.startswith("NCCL_")]
    for name in names:
        setattr(module, name, globals()[name])
    module.available = True
    return module


def make_cuda():
    """The ``cupy.cuda`` namespace and its ``nccl`` module."""
    runtime = types.SimpleNamespace(getDeviceCount=device_count, getDevice=lambda: STATE.device)
    nccl = _nccl_module()
    cuda = types.SimpleNamespace(runtime=runtime, Device=Device, Stream=Stream, Event=Event,
                                 get_current_stream=get_current_stream, nccl=nccl)
    return cuda, nccl
