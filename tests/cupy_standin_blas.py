"""The cuBLAS of the CuPy stand-in (``cupy_standin.py``): the functions ``replicate/backends/
cuda_blas.py`` calls through ``ctypes`` on the libcublas CuPy loaded, run on the stand-in's
device arrays (host memory: a pointer is a host address) and at least as strict as libcublas:

* a function must be called as ctypes calls a declared one: ``argtypes`` and ``restype``
  (``c_int``, the status) set, each argument acceptable to its ctypes type (an ``int`` in range
  for ``c_int``/``c_longlong``/``c_size_t``, an address or ``byref`` for a pointer), or
  ``ctypes.ArgumentError``;
* statuses as cuBLAS returns them: an unknown handle ``CUBLAS_STATUS_NOT_INITIALIZED`` (1), a
  bad op, a negative size, a leading dimension below the rows it must hold
  ``CUBLAS_STATUS_INVALID_VALUE`` (7);
* memory: each operand's whole extent (``ld``, batch stride and count) must lie in a live device
  array whose pointer was taken (``.data.ptr``), the workspace too: else the GPU's "illegal
  address" (``RuntimeError``) rather than a read of someone else's memory;
* ``alpha``/``beta`` by reference to the GEMM's own scalar type (``c_float`` for ``S``,
  ``c_double`` for ``D``; cuBLAS would read another type's bytes), read when called (host
  pointer mode; a capture keeps the values);
* streams: a GEMM runs on the stream its handle was set to, so one called while another stream
  is current (real cuBLAS would run it there, outside the order or the capture of the current
  one) is refused; ``cublasSetStream_v2`` drops the workspace set before (cuBLAS resets it to its
  own pool), and a GEMM captured without a workspace of the caller's is refused (cuBLAS would
  allocate during the capture);
* C may not overlap A or B (cuBLAS reads what it has already written: an undefined result);
* during a capture the GEMM is recorded as a step of the graph (run at each launch), run now
  too only when its output was made in the capture (as ``cupy_standin_graph.mutation``).
"""

from __future__ import annotations

import ctypes
import itertools
import weakref

import numpy as np

try:
    from numpy.lib.array_utils import byte_bounds
except ImportError:  # NumPy 1
    from numpy import byte_bounds

import cupy_standin_graph as _G

NOT_INITIALIZED, INVALID_VALUE = 1, 7
_LIVE: dict = {}  # address -> (weakref of the array, low, high)
_HANDLES: dict = {}  # handle -> {"stream": int, "workspace": (address, size) or None}
_NEXT = itertools.count(0x5000)


def register(a: np.ndarray) -> int:
    """``a``'s memory is readable by the stand-in's cuBLAS while ``a`` lives; its address."""
    low, high = byte_bounds(a)
    if len(_LIVE) > 4096:  # forget the dead
        for key in [key for key, (ref, _, _) in _LIVE.items() if ref() is None]:
            del _LIVE[key]
    if a.size:
        _LIVE[low] = (weakref.ref(a), low, high)
    return a.ctypes.data


def _owner(low: int, high: int, what: str):
    for ref, lo, hi in list(_LIVE.values()):
        arr = ref()
        if arr is None:
            _LIVE.pop(lo, None)
        elif lo <= low and high <= hi:
            return arr
    raise RuntimeError(f"CuPy stand-in cuBLAS: {what} [{low:#x}, {high:#x}) is not in a live "
                       "device array (on a GPU: an illegal memory access)")


def _view(ptr, dtype, rows, cols, ld, stride, count, what):
    """The column-major ``rows x cols`` matrices at ``ptr`` (``ld``, ``stride`` elements apart,
    ``count`` of them) as a (count, rows, cols) NumPy view, and the array that owns them."""
    item = np.dtype(dtype).itemsize
    extent = ((count - 1) * stride if count else 0) + (cols - 1) * ld + rows
    owner = _owner(ptr, ptr + max(extent, 0) * item, what)
    buf = np.frombuffer((ctypes.c_char * (max(extent, 1) * item)).from_address(ptr), dtype)
    view = np.lib.stride_tricks.as_strided(buf, (count, rows, cols),
                                           (stride * item, item, ld * item))
    return view, owner


def _arg(argtype, value, k, name):
    bad = None
    if argtype in (ctypes.c_int, ctypes.c_longlong, ctypes.c_size_t):
        bits, signed = ctypes.sizeof(argtype) * 8, argtype is not ctypes.c_size_t
        lo, hi = (-(1 << (bits - 1)), 1 << (bits - 1)) if signed else (0, 1 << bits)
        if not isinstance(value, int) or isinstance(value, bool) or not lo <= value < hi:
            bad = f"{value!r} for {argtype.__name__}"
    elif argtype is ctypes.c_void_p or getattr(argtype, "_type_", None) is not None:
        ok = value is None or type(value).__name__ == "CArgObject" or (
            isinstance(value, int) and 0 <= value < 1 << 64)
        bad = None if ok else f"{value!r} for a pointer"
    if bad is not None:
        raise ctypes.ArgumentError(f"argument {k + 1}: {name}: wrong type ({bad})")
    return value


def _scalar(ref, ctype, name):
    obj = getattr(ref, "_obj", None)
    if type(obj) is not ctype:
        raise TypeError(f"CuPy stand-in cuBLAS: {name} must be a reference to {ctype.__name__} "
                        f"(cuBLAS reads its bytes as that type), got {obj!r}")
    return obj.value


class _Function:
    def __init__(self, name, impl):
        self.name, self.impl, self.argtypes, self.restype = name, impl, None, None

    def __call__(self, *args):
        if self.argtypes is None or self.restype is not ctypes.c_int:
            raise TypeError(f"CuPy stand-in cuBLAS: {self.name} called without argtypes and "
                            "restype = c_int (ctypes would pass and read C ints)")
        if len(args) != len(self.argtypes):
            raise TypeError(f"this function takes {len(self.argtypes)} arguments "
                            f"({len(args)} given)")
        return self.impl(*[_arg(t, v, k, self.name)
                           for k, (t, v) in enumerate(zip(self.argtypes, args))])


def _create(out):
    target = getattr(out, "_obj", out)
    if not isinstance(target, ctypes.c_void_p):
        raise TypeError("cublasCreate_v2 takes a reference to a c_void_p")
    target.value = next(_NEXT)
    _HANDLES[target.value] = {"stream": 0, "workspace": None}
    return 0


def _set_stream(handle, stream):
    if handle not in _HANDLES:
        return NOT_INITIALIZED
    _HANDLES[handle].update(stream=stream or 0, workspace=None)  # back to cuBLAS's own pool
    return 0


def _set_workspace(handle, ptr, size):
    if handle not in _HANDLES:
        return NOT_INITIALIZED
    _owner(ptr, ptr + size, "the workspace")
    _HANDLES[handle]["workspace"] = (ptr, size)
    return 0


def _gemm(dtype, ctype):
    def gemm(handle, transa, transb, m, n, k, alpha, a, lda, stride_a, b, ldb, stride_b, beta,
             c, ldc, stride_c, count):
        state = _HANDLES.get(handle)
        if state is None:
            return NOT_INITIALIZED
        if transa not in (0, 1, 2) or transb not in (0, 1, 2) or min(m, n, k, count) < 0:
            return INVALID_VALUE
        rows_a, cols_a = (m, k) if transa == 0 else (k, m)
        rows_b, cols_b = (k, n) if transb == 0 else (n, k)
        if lda < max(1, rows_a) or ldb < max(1, rows_b) or ldc < max(1, m):
            return INVALID_VALUE
        al, be = _scalar(alpha, ctype, "alpha"), _scalar(beta, ctype, "beta")
        import cupy_standin_cuda
        current = cupy_standin_cuda.get_current_stream().ptr
        if state["stream"] != current:
            raise RuntimeError(f"CuPy stand-in cuBLAS: the handle runs its work on stream "
                               f"{state['stream']:#x}, not the current stream {current:#x} (out "
                               "of the current stream's order, or outside its capture)")
        cap = _G.capturing()
        if cap is not None and state["workspace"] is None:
            raise RuntimeError("CuPy stand-in cuBLAS: a GEMM captured without a workspace set "
                               "since the stream (cuBLAS would allocate its own in the capture)")
        if m == 0 or n == 0 or count == 0:
            return 0
        va, _ = _view(a, dtype, rows_a, cols_a, lda, stride_a, count, "A")
        vb, _ = _view(b, dtype, rows_b, cols_b, ldb, stride_b, count, "B")
        vc, out = _view(c, dtype, m, n, ldc, stride_c, count, "C")
        if np.shares_memory(vc, va) or np.shares_memory(vc, vb):
            raise RuntimeError("CuPy stand-in cuBLAS: C overlaps A or B (cuBLAS's result is "
                               "undefined: it reads what it has already written)")
        opa = va if transa == 0 else va.transpose(0, 2, 1)
        opb = vb if transb == 0 else vb.transpose(0, 2, 1)
        keep = (va, vb, vc)

        def run():
            product = np.matmul(opa, opb).astype(dtype)
            result = dtype(al) * product if al != 1 else product
            if be != 0:
                result = result + dtype(be) * vc
            for i in range(count):  # (stride 0 batches of C: the last write wins, as on a GPU)
                vc[i] = result[i]
            return keep
        if cap is None:
            run()
            return 0
        _G.mutation([out], run)  # (raises when another stream is current)
        return 0
    return gemm


class Library:
    """What ``ctypes.CDLL(libcublas)`` gives ``cuda_blas``: attributes by function name."""

    def __init__(self):
        self._functions = {
            "cublasCreate_v2": _create, "cublasSetStream_v2": _set_stream,
            "cublasSetWorkspace_v2": _set_workspace,
            "cublasSgemmStridedBatched": _gemm(np.float32, ctypes.c_float),
            "cublasDgemmStridedBatched": _gemm(np.float64, ctypes.c_double)}
        self._made: dict = {}

    def __getattr__(self, name):
        if name.startswith("_") or name not in self._functions:
            raise AttributeError(f"undefined symbol: {name}")
        if name not in self._made:
            self._made[name] = _Function(name, self._functions[name])
        return self._made[name]


LIBRARY = Library()


def open_library():
    return LIBRARY


__all__ = ["LIBRARY", "Library", "open_library", "register"]
