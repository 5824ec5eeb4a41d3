"""Stream capture, CUDA graphs and memory pools of the CuPy stand-in (``cupy_standin.py``) — at
least as strict as CUDA and CuPy 14, so a capture that would fail or give wrong values on a GPU
fails here first:

* ``Stream.begin_capture(mode=None)`` / ``end_capture()`` (a ``Graph``) / ``is_capturing()``; the
  legacy null stream cannot capture; one capture is open at a time (the stand-in's limit);
* while a stream captures, the capturing thread's device work is **recorded, not run**: every
  kernel, copy between device arrays, cuBLAS call or array operation that makes or writes a
  device array becomes a step of the graph, run (in order) by each ``Graph.launch``; the arrays
  made during the capture hold garbage (NaN, or the bytes 0xA5) when it ends, until a launch
  writes them; a write into an array made before the capture waits for a launch too. (Shapes
  come from running the operation once at capture, on the values then present.)
* during a capture CuPy refuses a copy to the host (``get``, ``asnumpy``, ``bool()``/``int()``/
  ``float()``, ``item``, ``tolist``) and a copy up from host memory (``asarray`` of a NumPy
  array, ``set``) before it calls CUDA: ``RuntimeError`` ("the current stream is capturing"), the
  capture still valid; CUDA refuses ``synchronize`` of the stream, its events or the device, and
  a query of the stream: each raises ``CUDARuntimeError``
  (``cudaErrorStreamCaptureUnsupported``) and invalidates the capture, whose ``end_capture`` then
  raises ``cudaErrorStreamCaptureInvalidated`` (ending it: the stream captures no more). Work of
  the capturing thread on another stream than the capturing one is refused too (on the legacy
  stream CUDA refuses it; on another stream it would run at once, outside the graph);
* an operation the stand-in cannot record (an in-place method it does not model) is refused
  during a capture rather than run at the wrong time;
* memory pools: ``cupy.cuda.MemoryPool``, ``using_allocator`` (per thread), ``set_allocator``,
  ``get_allocator``, ``cupy.get_default_memory_pool()``. An array made during a capture must come
  from a pool other than the default one (stricter than CuPy, which allows it: a block the
  graph writes would go back to the shared pool and be handed to anything), and a pool that
  served a capture belongs to its graph: allocating from it outside a capture is refused.
"""

from __future__ import annotations

import contextlib
import threading

import numpy as np

UNSUPPORTED, INVALIDATED, IMPLICIT, ILLEGAL = 900, 901, 904, 401
_NAMES = {UNSUPPORTED: ("cudaErrorStreamCaptureUnsupported",
                        "operation not permitted when stream is capturing"),
          INVALIDATED: ("cudaErrorStreamCaptureInvalidated",
                        "operation failed due to a previous error during capture"),
          IMPLICIT: ("cudaErrorStreamCaptureImplicit", "operation would make the legacy stream "
                     "depend on a capturing blocking stream"),
          ILLEGAL: ("cudaErrorIllegalState", "the stream is not capturing")}
MODES = {"streamCaptureModeGlobal": 0, "streamCaptureModeThreadLocal": 1,
         "streamCaptureModeRelaxed": 2}


class CUDARuntimeError(RuntimeError):
    """As ``cupy_backends.cuda.api.runtime.CUDARuntimeError``: ``status`` and CUDA's text."""

    def __init__(self, status, detail=""):
        self.status = status
        name, text = _NAMES[status]
        super().__init__(f"{name}: {text}" + (f" (CuPy stand-in: {detail})" if detail else ""))


class _Capture:
    def __init__(self, stream, mode):
        self.stream, self.mode, self.thread = stream, mode, threading.current_thread()
        self.ops: list = []        # the graph's steps, in order
        self.born: list = []       # NumPy buffers made during the capture
        self.born_ids: set = set()
        self.pools: set = set()
        self.invalid = None        # why the capture is invalidated, or None


CAPTURE: list = []  # [the open capture]
REPLAYING = False  # a graph's launch is running its steps


def capturing():
    """The open capture when the calling thread is the one capturing, else None."""
    cap = CAPTURE[0] if CAPTURE else None
    return cap if cap is not None and cap.thread is threading.current_thread() else None


def _current_stream():
    import cupy_standin_cuda
    return cupy_standin_cuda.get_current_stream()


def _enter(cap, what):
    if cap.invalid is not None:
        raise CUDARuntimeError(INVALIDATED, f"{what} after {cap.invalid}")
    if _current_stream() != cap.stream:
        cap.invalid = f"{what} on another stream"
        raise CUDARuntimeError(IMPLICIT, f"{what} on stream {_current_stream()!r} while "
                               f"{cap.stream!r} captures on this thread")


def refuse(what, stream=None):
    """A synchronous operation (a copy to or from the host, a synchronisation): CUDA's error
    while the calling thread (or ``stream``) captures; the capture is invalidated."""
    cap = CAPTURE[0] if CAPTURE else None
    if cap is None or (stream is None and cap.thread is not threading.current_thread()) or (
            stream is not None and stream != cap.stream):
        return
    cap.invalid = cap.invalid or what
    raise CUDARuntimeError(UNSUPPORTED, f"{what} during stream capture")


def refuse_copy(what):
    """A copy between host and device memory through CuPy (``get``, ``set``, ``asarray`` of host
    memory, ``bool()``...): CuPy's own ``RuntimeError`` while the calling thread captures, raised
    before CUDA is called, so the capture stays valid (``cupy/cuda/memory.pyx``, CuPy 14)."""
    if capturing() is not None:
        raise RuntimeError("the current stream is capturing, so synchronous API calls are "
                           f"disallowed (CuPy stand-in: {what})")


# CuPy's own calls into CUDA's libraries refuse a capturing stream: ``cublas.setStream`` (and
# cuRAND's, cuSOLVER's, cuSPARSE's) raise NotImplementedError while the stream captures
# (``cupy_backends/cuda/libs/cublas.pyx``, CuPy 14 and 15.0.0a1; cupy/cupy#6290). The capture is
# not invalidated: the Python call fails before anything is queued.
LIBRARY_CALLS = frozenset(["matmul", "dot", "vdot", "inner", "tensordot", "einsum", "kron"])


def refuse_library(name):
    """``name`` calls cuBLAS or cuSOLVER: refused, as CuPy refuses it, while this thread
    captures."""
    if capturing() is not None and (name in LIBRARY_CALLS or name.startswith("linalg.")):
        raise NotImplementedError(f"calling cuBLAS API during stream capture is currently "
                                  f"unsupported (cupy.{name}; the CuPy stand-in refuses it as "
                                  "CuPy does)")


def refuse_unrecordable(what):
    cap = capturing()
    if cap is not None:
        cap.invalid = cap.invalid or what
        raise NotImplementedError(f"CuPy stand-in: {what} cannot be recorded in a stream "
                                  "capture (refused rather than run outside the graph)")


def _root(a):
    while getattr(a, "base", None) is not None:
        a = a.base
    return a


def _arrays(x, out):
    if isinstance(x, np.ndarray):
        out.append(x)
    elif isinstance(x, (list, tuple)):
        for v in x:
            _arrays(v, out)
    elif isinstance(x, dict):
        for v in x.values():
            _arrays(v, out)
    return out


def _poison(a):
    if a.dtype.kind in "fc":
        a[...] = np.nan
    elif a.size:
        a[...] = np.frombuffer(b"\xa5" * a.dtype.itemsize, a.dtype)[0]


# -- memory pools ---------------------------------------------------------------------------------
class MemoryPool:
    """CuPy's pool, as far as the backend uses it: ``malloc`` (the allocator a pool gives
    ``using_allocator``), the byte counts and ``free_all_blocks``. ``graph``: it served a
    capture, so its blocks belong to that graph."""

    def __init__(self, allocator=None):
        self.graph = False

    def malloc(self, size):
        raise NotImplementedError("CuPy stand-in: no raw device memory (arrays only)")

    def used_bytes(self):
        return 0

    def total_bytes(self):
        return 0

    def free_all_blocks(self, stream=None):
        pass


DEFAULT_POOL = MemoryPool()


class _Allocator(threading.local):
    current = None  # this thread's ``using_allocator``, None: the process's


_ALLOCATOR = _Allocator()
_PROCESS = [DEFAULT_POOL.malloc]


def get_allocator():
    return _ALLOCATOR.current or _PROCESS[0]


def set_allocator(allocator=None):
    _PROCESS[0] = allocator or DEFAULT_POOL.malloc


@contextlib.contextmanager
def using_allocator(allocator=None):
    saved = _ALLOCATOR.current
    _ALLOCATOR.current = allocator or DEFAULT_POOL.malloc
    try:
        yield
    finally:
        _ALLOCATOR.current = saved


def get_default_memory_pool():
    return DEFAULT_POOL


def _pool():
    return getattr(get_allocator(), "__self__", None)


def _allocate(cap):
    """An array made now: from a private pool during a capture, never from a graph's outside."""
    pool = _pool()
    if cap is None:
        if pool is not None and pool.graph:
            raise RuntimeError("CuPy stand-in: an allocation outside a capture from a memory "
                               "pool that served one (its blocks belong to a CUDA graph)")
        return
    if not isinstance(pool, MemoryPool) or pool is DEFAULT_POOL:
        cap.invalid = cap.invalid or "an allocation from the default memory pool"
        raise RuntimeError("CuPy stand-in: an allocation during stream capture from the default "
                           "memory pool (its blocks would be handed to others while the graph "
                           "still writes them): capture under using_allocator(a private "
                           "MemoryPool().malloc)")
    pool.graph = True
    cap.pools.add(pool)


# -- recording ------------------------------------------------------------------------------------
def value_op(compute, operands, alloc_only=False):
    """``compute()``: an operation's NumPy result (an array, a tuple of them, a scalar) from the
    current values of its ``operands`` (anything holding NumPy arrays). Outside a capture it
    runs; during one it runs (for the shapes), and what it made is recorded as a step of the
    graph (``alloc_only``: an ``empty``, which runs nothing); a view of an operand is not."""
    cap = capturing()
    if cap is None:
        if _ALLOCATOR.current is not None or _PROCESS[0] is not DEFAULT_POOL.malloc:
            _allocate(None)
        return compute()
    _enter(cap, "an array operation")
    result = compute()
    if result is None:
        refuse_unrecordable("an operation that returns nothing (it writes an operand)")
    single = not isinstance(result, (tuple, list))
    values = [result] if single else list(result)
    roots = {id(_root(a)) for a in _arrays(operands, [])}
    fresh = []
    for i, r in enumerate(values):
        if isinstance(r, np.generic):
            r = values[i] = np.asarray(r)
        if not isinstance(r, np.ndarray) or id(_root(r)) in roots:
            continue  # a host value (a shape), or a view of an operand: no work of its own
        _allocate(cap)
        if r.base is not None or not r.flags.writeable:
            r = values[i] = np.array(r, copy=True)
        cap.born.append(r)
        cap.born_ids.add(id(r))
        fresh.append((i, r))
    if fresh and not alloc_only:
        def step():
            out = compute()
            outs = [out] if single else list(out)
            for i, r in fresh:
                np.copyto(r, np.asarray(outs[i]), casting="unsafe")
        cap.ops.append(step)
    return values[0] if single else type(result)(values) if not hasattr(result, "_fields") \
        else type(result)(*values)


def mutation(targets, action):
    """``action()`` writes the NumPy arrays ``targets``. During a capture it is a step of the
    graph, run now too when every target was made in the capture (else at a launch only)."""
    cap = capturing()
    if cap is None:
        return action()
    _enter(cap, "a write into a device array")
    cap.ops.append(action)
    if all(id(_root(t)) in cap.born_ids for t in targets):
        return action()
    return None


# -- capture and graphs ---------------------------------------------------------------------------
def begin_capture(stream, mode=None):
    mode = MODES["streamCaptureModeRelaxed"] if mode is None else mode
    if mode not in MODES.values():
        raise ValueError(f"unknown stream capture mode {mode!r}")
    if stream.ptr == 0:
        raise CUDARuntimeError(UNSUPPORTED, "the legacy null stream cannot capture")
    if CAPTURE:
        raise NotImplementedError("CuPy stand-in: one stream capture at a time")
    CAPTURE.append(_Capture(stream, mode))


def is_capturing(stream) -> bool:
    return bool(CAPTURE) and CAPTURE[0].stream == stream


def end_capture(stream):
    if not is_capturing(stream):
        raise CUDARuntimeError(ILLEGAL, f"end_capture on {stream!r}")
    cap = CAPTURE.pop()
    if cap.invalid is not None:
        raise CUDARuntimeError(INVALIDATED, cap.invalid)
    for a in cap.born:  # what the capture made holds garbage until a launch
        _poison(a)
    return Graph(cap.ops, cap.born, cap.pools)


class Graph:
    """``cupy.cuda.graph.Graph``: ``launch(stream=None)`` runs the captured steps in order."""

    def __init__(self, ops, born, pools):
        self._ops, self._born, self._pools = ops, born, pools

    def launch(self, stream=None):
        if capturing() is not None:
            raise NotImplementedError("CuPy stand-in: a graph launched into a capture")
        if stream is not None:
            stream.ptr  # noqa: B018 - a Stream, as CuPy reads it
        global REPLAYING
        REPLAYING = True
        try:
            for op in self._ops:
                op()
        finally:
            REPLAYING = False

    def upload(self, stream=None):
        pass


__all__ = ["CUDARuntimeError", "Graph", "MemoryPool", "begin_capture", "capturing",
           "end_capture", "get_allocator", "get_default_memory_pool", "is_capturing",
           "mutation", "refuse", "refuse_copy", "refuse_unrecordable", "set_allocator",
           "using_allocator", "value_op"]
