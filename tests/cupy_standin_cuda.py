"""The CUDA side of the CuPy stand-in (``cupy_standin.py``): ``cupy.cuda``'s devices, streams and
events, and ``cupy.cuda.nccl``, for machines without a GPU — as strict as CuPy 14 where the
backend relies on it, since every place it is more permissive is a place a GPU run fails first.

* devices: ``REPLICATE_STANDIN_DEVICES`` of them (default 1), each with its PCI bus id. The
  current device is per host thread, as CUDA's and CuPy's: a new thread starts on device 0,
  whatever another thread chose; ``Device(i).use()`` (returning None) and ``with Device(i)``
  change the calling thread's only (``runtime.getDevice()``);
* streams remember the device they were made on (``device_id``; -1 for the null stream) and, as
  CuPy's, refuse to be made current (``use()``, ``with``) on another device ("does not match
  with the current device"). The current stream is per thread and per device
  (``get_current_stream(device_id=-1)``: the null stream until one is made current), with
  CuPy's bookkeeping of ``with`` blocks;
* events remember the device current when they were made; recording one on a stream of another
  device fails as ``cudaEventRecord`` does (the CUDA programming guide, "Stream and Event
  Behavior": ``cudaErrorInvalidResourceHandle``, a ``RuntimeError`` as CuPy's) — so
  ``stream.record()`` (a new event) fails on a thread whose current device is not the stream's;
  a stream may wait for an event of any device, as in CUDA. Streams and events run their work
  when enqueued (the order the backend sets with events is not exercised, only its calls);
* ``nccl``: CuPy's NCCL wrapper (``cupy_backends/cuda/libs/nccl``) — ``get_unique_id`` (128
  ``bytes``; a tuple before CuPy 14), ``groupStart``/``groupEnd``,
  ``NcclCommunicator(int ndev, bytes commId, int rank, config=None)`` with ``bcast``,
  ``broadcast``, ``allGather``, ``allReduce``, ``send``, ``recv`` taking integers only (device
  pointers, ``size_t`` counts, datatypes, ops, ``intptr_t stream``: a ``Stream``'s ``.ptr``,
  never the object), its ``NCCL_*`` constants and ``NcclError`` — carried by MPI between the
  processes of the launch (a communicator spans every process, NCCL rank = MPI rank; anything
  else raises). An argument of the wrong type raises Cython's ``TypeError``; an unknown datatype
  NCCL's invalid argument; a stream of another device than the communicator's an unhandled CUDA
  error. Like NCCL, an init with two ranks on one device fails: "Duplicate GPU detected" on
  stderr and ``NcclError`` (NCCL_ERROR_INVALID_USAGE) on every rank. Send/recv outside a group
  run at once (NCCL would deadlock where they would).
"""

from __future__ import annotations

import ctypes
import operator
import os
import socket
import sys
import threading
import types
import weakref

import cupy_standin_graph as _G
import numpy as np


class _State(threading.local):
    """Per host thread, as in CUDA: the current device (0 in a new thread) and CuPy's current
    streams (``cupy/cuda/stream.pyx``'s ``_ThreadLocal``): one per device, a stack per device
    for ``with stream`` and the devices of the open ``with`` blocks."""

    device = 0

    def __init__(self):
        self.current: dict = {}  # device -> its current stream (the null stream if absent)
        self.stacks: dict = {}  # device -> streams of the open ``with`` blocks (null first)
        self.with_devices: list = []  # the device of each open ``with stream`` block


STATE = _State()


def device_count() -> int:
    return int(os.environ.get("REPLICATE_STANDIN_DEVICES", "1"))


def _invalid_handle():
    return RuntimeError("cudaErrorInvalidResourceHandle: invalid resource handle")


class Device:
    def __init__(self, device=None):
        self.id = STATE.device if device is None else operator.index(getattr(device, "id",
                                                                             device))
        if not 0 <= self.id < device_count():
            raise RuntimeError("cudaErrorInvalidDevice: invalid device ordinal")
        self._saved = []

    @property
    def pci_bus_id(self) -> str:
        return f"0000:{0x17 + self.id:02X}:00.0"

    def use(self):
        """Make this device current on the calling thread; returns the device (CuPy 14.2 on an
        H200 did: ``Device(0).use()`` is ``<CUDA Device 0>``)."""
        STATE.device = self.id
        return self

    def synchronize(self):
        _G.refuse("cudaDeviceSynchronize")

    def __enter__(self):
        self._saved.append(STATE.device)
        self.use()
        return self

    def __exit__(self, *exc):
        STATE.device = self._saved.pop()


class Event:
    def __init__(self, block=False, disable_timing=False, interprocess=False):
        if interprocess and not disable_timing:
            raise ValueError("Timing must be disabled for interprocess events")
        self.ptr = id(self)
        self.device_id = STATE.device  # (CUDA's event lives in the current device's context)
        self.captured = None  # the stream whose capture recorded it

    @property
    def done(self) -> bool:
        if self.captured is not None:
            _G.refuse("a query of an event recorded in a capture", self.captured)
        return True

    def record(self, stream=None):
        """``cudaEventRecord`` on ``stream`` (a ``Stream``: its ``.ptr`` is read), else on the
        calling thread's current stream."""
        stream = get_current_stream() if stream is None else stream
        if _stream_device(stream.ptr) != self.device_id:
            raise _invalid_handle()
        self.captured = stream if _G.is_capturing(stream) else None

    def synchronize(self):
        if self.captured is not None:
            _G.refuse("a synchronisation with an event recorded in a capture", self.captured)


_STREAMS: weakref.WeakValueDictionary = weakref.WeakValueDictionary()  # ptr -> its Stream


def _stream_device(ptr: int) -> int:
    """The device a stream pointer belongs to: the null stream is the current device's."""
    stream = _STREAMS.get(ptr)
    return STATE.device if stream is None or stream.device_id == -1 else stream.device_id


def _check_stream_device(device_id: int) -> int:
    """CuPy's ``check_stream_device_match``: the stream's device, which must be current."""
    current = STATE.device
    if device_id not in (-1, current):
        raise RuntimeError(f"The device that the stream is created on ({device_id}) does not "
                           f"match with the current device ({current})")
    return current


class Stream:
    null = None  # the null stream (CuPy's singleton), set below

    def __init__(self, null=False, non_blocking=False, ptds=False, priority=None):
        if null or ptds:
            self.ptr, self.device_id = (0 if null else 2), -1  # (2: cudaStreamPerThread)
        else:
            self.ptr, self.device_id = id(self), STATE.device
            _STREAMS[self.ptr] = self

    def __eq__(self, other):
        return isinstance(other, Stream) and self.ptr == other.ptr

    def __hash__(self):
        return self.ptr

    def __repr__(self):
        return f"<Stream {self.ptr} (device {self.device_id})>"

    @property
    def done(self) -> bool:
        _G.refuse("a query of a capturing stream", self)
        return True

    def record(self, event=None):
        event = Event() if event is None else event
        if _stream_device(self.ptr) != event.device_id:
            raise _invalid_handle()
        event.captured = self if _G.is_capturing(self) else None
        return event

    def begin_capture(self, mode=None):
        _G.begin_capture(self, mode)

    def end_capture(self):
        return _G.end_capture(self)

    def is_capturing(self) -> bool:
        return _G.is_capturing(self)

    def wait_event(self, event):
        """``cudaStreamWaitEvent(self.ptr, event.ptr)``: an event of any device (CUDA allows
        it)."""
        event.ptr  # noqa: B018 - read as CuPy reads it: anything else raises AttributeError

    def synchronize(self):
        _G.refuse("a synchronisation of a capturing stream", self)

    def use(self):
        device = _check_stream_device(self.device_id)
        STATE.current[device] = self
        return self

    def __enter__(self):
        device = _check_stream_device(self.device_id)
        STATE.stacks.setdefault(device, [Stream.null]).append(self)
        STATE.with_devices.append(device)
        STATE.current[device] = self
        return self

    def __exit__(self, *exc):
        device = STATE.with_devices.pop()
        stack = STATE.stacks[device]
        stack.pop()
        STATE.current[device] = stack[-1]


Stream.null = Stream(null=True)


def get_current_stream(device_id=-1):
    """The calling thread's current stream on ``device_id`` (-1: its current device)."""
    device_id = operator.index(device_id)
    return STATE.current.get(STATE.device if device_id == -1 else device_id, Stream.null)


# -- NCCL ---------------------------------------------------------------------------------------
NCCL_INT8, NCCL_UINT8, NCCL_INT32, NCCL_UINT32, NCCL_INT64, NCCL_UINT64 = 0, 1, 2, 3, 4, 5
NCCL_FLOAT16, NCCL_FLOAT32, NCCL_FLOAT64 = 6, 7, 8
NCCL_SUM, NCCL_PROD, NCCL_MAX, NCCL_MIN = 0, 1, 2, 3
_BYTES = {0: 1, 1: 1, 2: 4, 3: 4, 4: 8, 5: 8, 6: 2, 7: 4, 8: 8}
_DTYPES = {0: np.int8, 1: np.uint8, 2: np.int32, 3: np.uint32, 4: np.int64, 5: np.uint64,
           6: np.float16, 7: np.float32, 8: np.float64}
_ERRORS = {1: ("NCCL_ERROR_UNHANDLED_CUDA_ERROR",
               "unhandled cuda error (run with NCCL_DEBUG=INFO for details)"),
           4: ("NCCL_ERROR_INVALID_ARGUMENT",
               "invalid argument (run with NCCL_DEBUG=WARN for details)"),
           5: ("NCCL_ERROR_INVALID_USAGE",
               "invalid usage (run with NCCL_DEBUG=WARN for details)")}


class NcclError(RuntimeError):
    def __init__(self, status):
        self.status = status
        name, text = _ERRORS.get(status, ("NCCL_ERROR_INTERNAL_ERROR", "internal error"))
        super().__init__(f"{name}: {text}")


def get_version() -> int:
    return 22703


def get_unique_id() -> bytes:
    """CuPy 14's: the ``ncclUniqueId`` as 128 bytes (a tuple of ints before CuPy 14)."""
    return os.urandom(128)


def _ints(*values) -> list:
    """Cython's conversion of arguments declared ``int``, ``intptr_t`` or ``size_t``: anything
    but an integer (a ``Stream`` object for ``intptr_t stream``, a float) is a ``TypeError``."""
    return [operator.index(v) for v in values]


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
    """``NcclCommunicator(int ndev, bytes commId, int rank, NcclConfig config=None)``."""

    def __init__(self, ndev, commId, rank, config=None):  # noqa: N803 - CuPy's name
        if type(commId) is not bytes:  # (Cython's exact check of an argument typed ``bytes``)
            raise TypeError(f"Argument 'commId' has incorrect type (expected bytes, got "
                            f"{type(commId).__name__})")
        ndev, rank = _ints(ndev, rank)
        assert len(commId) == 128
        from mpi4py import MPI

        world = MPI.COMM_WORLD
        if ndev != world.Get_size() or rank != world.Get_rank():
            raise NotImplementedError("the NCCL stand-in spans every MPI process, NCCL rank = "
                                      "MPI rank")
        self._mpi = world.Dup()
        self._device = STATE.device
        seen = self._mpi.allgather((commId, socket.gethostname(), self._device))
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

    def _args(self, ptrs, count, datatype, stream, *others):
        """The arguments converted as Cython converts ``intptr_t``/``size_t``/``int``; the
        datatype one NCCL knows; the stream on this communicator's device (NCCL's kernels run
        there: another device's stream is a CUDA error)."""
        ptrs, (count, datatype, stream), others = _ints(*ptrs), _ints(count, datatype, stream), \
            _ints(*others)
        if count < 0:
            raise OverflowError("can't convert negative value to size_t")
        if datatype not in _BYTES:
            raise NcclError(4)
        if _stream_device(stream) != self._device:
            raise NcclError(1)
        return ptrs, count, datatype, others

    def bcast(self, buff, count, datatype, root, stream):
        (buff,), count, datatype, (root,) = self._args([buff], count, datatype, stream, root)
        self._mpi.Bcast(_memory(buff, count, datatype), root=root)

    def broadcast(self, sendbuff, recvbuff, count, datatype, root, stream):
        (sendbuff, recvbuff), count, datatype, (root,) = self._args(
            [sendbuff, recvbuff], count, datatype, stream, root)
        if self._rank == root and sendbuff != recvbuff:
            _memory(recvbuff, count, datatype)[...] = _memory(sendbuff, count, datatype)
        self.bcast(recvbuff, count, datatype, root, stream)

    def allGather(self, sendbuf, recvbuf, count, datatype, stream):  # noqa: N802
        (sendbuf, recvbuf), count, datatype, _ = self._args([sendbuf, recvbuf], count,
                                                            datatype, stream)
        self._mpi.Allgather(_memory(sendbuf, count, datatype),
                            _memory(recvbuf, count * self._size, datatype))

    def allReduce(self, sendbuf, recvbuf, count, datatype, op, stream):  # noqa: N802
        from mpi4py import MPI

        (sendbuf, recvbuf), count, datatype, (op,) = self._args([sendbuf, recvbuf], count,
                                                                 datatype, stream, op)
        ops = {NCCL_SUM: MPI.SUM, NCCL_PROD: MPI.PROD, NCCL_MAX: MPI.MAX, NCCL_MIN: MPI.MIN}
        if op not in ops:
            raise NcclError(4)
        send = _memory(sendbuf, count, datatype).view(_DTYPES[datatype])
        recv = _memory(recvbuf, count, datatype).view(_DTYPES[datatype])
        self._mpi.Allreduce(send.copy(), recv, op=ops[op])

    def _p2p(self, op, ptr, count, datatype, peer, stream):
        (ptr,), count, datatype, (peer,) = self._args([ptr], count, datatype, stream, peer)
        buf = _memory(ptr, count, datatype)
        if _GROUP:
            _GROUP[-1].append((self, op, buf, peer))
        elif op == "send":
            self._mpi.Send(buf, dest=peer)
        else:
            self._mpi.Recv(buf, source=peer)

    def send(self, sendbuf, count, datatype, peer, stream):
        self._p2p("send", sendbuf, count, datatype, peer, stream)

    def recv(self, recvbuf, count, datatype, peer, stream):
        self._p2p("recv", recvbuf, count, datatype, peer, stream)


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
    runtime = types.SimpleNamespace(getDeviceCount=device_count, getDevice=lambda: STATE.device,
                                    CUDARuntimeError=_G.CUDARuntimeError, **_G.MODES)
    nccl = _nccl_module()
    graph = types.SimpleNamespace(Graph=_G.Graph)
    cuda = types.SimpleNamespace(runtime=runtime, Device=Device, Stream=Stream, Event=Event,
                                 get_current_stream=get_current_stream, nccl=nccl, graph=graph,
                                 MemoryPool=_G.MemoryPool, using_allocator=_G.using_allocator,
                                 set_allocator=_G.set_allocator, get_allocator=_G.get_allocator)
    return cuda, nccl
