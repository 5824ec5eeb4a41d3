"""Matrix products on cuBLAS directly, for the cupy backend (issue 31).

``cupy.matmul`` goes through CuPy's cuBLAS wrappers, which refuse to run while a stream captures
a CUDA graph (``cublas.setStream`` raises ``NotImplementedError``; CuPy 14, cupy/cupy#6290), so
no step with a matmul could be replayed, and each call costs about 26 µs of host time (H200,
``bench/gpu_cublas_probe.py``). Here a step's products call ``cublas{S,D}gemmStridedBatched`` of
the libcublas CuPy itself loaded, through ``ctypes``, on a handle of our own:

* the handle is ours (one per device and thread, as CuPy's), so nothing else sets its stream:
  it is bound to the current stream when that changes (``cublasSetStream_v2``) and given a
  workspace of ours (``cublasSetWorkspace_v2``, 32 MiB, kept for the process even when its
  thread ends), so a capture allocates nothing and a replayed graph's GEMMs write memory that
  stays theirs; cuBLAS captures its kernels like any other work of the stream (the probe:
  captured, replayed, right);
* row-major ``C = A @ B`` is the column-major ``Cᵀ = Bᵀ Aᵀ``: an operand that is C-ordered in
  its last two axes is passed as is, one that is their transpose (a ``.T`` view) with the
  transposed op; anything else (negative or odd strides) is made contiguous first;
* batch axes broadcast as NumPy's: an operand whose batch axes collapse to one stride (0 for a
  broadcast one) is used in place, else broadcast and made contiguous; ``(..., m, k) @ (k, n)``
  with C-ordered rows is one GEMM of ``prod(...) * m`` rows;
* float32 and float64 only, computed as CuPy computes them (no TF32: the handle's default math
  mode); everything else (integers, complex, an empty product) goes to ``cupy.matmul``.

Where the library cannot be found (no libcublas mapped in the process), every product goes to
``cupy.matmul``. ``open_library`` is where the library comes from (the tests' CuPy stand-in puts
its own host-memory cuBLAS there).
"""

from __future__ import annotations

import ctypes
import math
import threading

import numpy as np

WORKSPACE = 32 << 20  # bytes: cuBLAS's recommendation for Hopper
_N, _T = 0, 1  # CUBLAS_OP_N, CUBLAS_OP_T
_SCALAR = {np.dtype(np.float32): ctypes.c_float, np.dtype(np.float64): ctypes.c_double}
_GEMM = {np.dtype(np.float32): "cublasSgemmStridedBatched",
         np.dtype(np.float64): "cublasDgemmStridedBatched"}
_P, _I, _L = ctypes.c_void_p, ctypes.c_int, ctypes.c_longlong
_SIGNATURES = {
    "cublasCreate_v2": [ctypes.POINTER(ctypes.c_void_p)],
    "cublasSetStream_v2": [_P, _P],
    "cublasSetWorkspace_v2": [_P, _P, ctypes.c_size_t],
    **{name: [_P, _I, _I, _I, _I, _I, _P, _P, _I, _L, _P, _I, _L, _P, _P, _I, _L, _I]
       for name in _GEMM.values()},
}


def open_library():
    """The libcublas this process already loaded for CuPy, as a ``ctypes.CDLL``, or None: the
    one of CuPy's CUDA major version (PyTorch may have mapped another beside it)."""
    try:
        import cupy
        from cupy_backends.cuda.libs import cublas  # noqa: F401 - loads libcublas
        major = cupy.cuda.runtime.runtimeGetVersion() // 1000
        with open("/proc/self/maps") as f:
            paths = {line.split()[-1] for line in f if "/libcublas.so" in line}
    except (ImportError, OSError, AttributeError):
        return None
    path = pick_library(paths, major)
    return ctypes.CDLL(path) if path else None


def pick_library(paths, major: int):
    """Of the mapped libcublas ``paths``, the one of CUDA ``major`` (else the first), or None."""
    mine = sorted(p for p in paths if f"/libcublas.so.{major}" in p) or sorted(paths)
    return mine[0] if mine else None


class CublasError(RuntimeError):
    pass


class _Device:
    """One device's handle, the stream it is bound to and its workspace."""

    def __init__(self, cp, lib):
        self.lib, self.stream = lib, None
        handle = ctypes.c_void_p()
        _check(lib.cublasCreate_v2(ctypes.byref(handle)), "cublasCreate_v2")
        self.handle = handle.value
        self.workspace = cp.empty(WORKSPACE, cp.uint8)

    def bind(self, stream_ptr: int) -> None:
        """The handle's work on ``stream_ptr`` from now on (cuBLAS resets the workspace to its
        own pool when the stream is set: ours is set again)."""
        if self.stream != stream_ptr:
            _check(self.lib.cublasSetStream_v2(self.handle, stream_ptr), "cublasSetStream_v2")
            _check(self.lib.cublasSetWorkspace_v2(self.handle, self.workspace.data.ptr,
                                                  WORKSPACE), "cublasSetWorkspace_v2")
            self.stream = stream_ptr


def _check(status: int, what: str) -> None:
    if status != 0:
        raise CublasError(f"{what} failed with cuBLAS status {status}")


_LIB: list = []  # [library or None], opened once
_HANDLES = threading.local()  # .devices: {device: _Device}, per thread (as CuPy's handles are)
_KEPT: list = []  # every _Device made: a captured graph may use its workspace after its thread
GEMMS = {"direct": 0, "cupy": 0}  # products made each way (the backend's own record)


def _library():
    if not _LIB:
        lib = open_library()
        if lib is not None:
            for name, argtypes in _SIGNATURES.items():
                fn = getattr(lib, name)
                fn.argtypes, fn.restype = argtypes, ctypes.c_int
        _LIB.append(lib)
    return _LIB[0]


def available() -> bool:
    """Whether products go to cuBLAS directly (else through ``cupy.matmul``)."""
    return _library() is not None


def _device(cp):
    lib = _library()
    if lib is None:
        return None
    devices = getattr(_HANDLES, "devices", None)
    if devices is None:
        devices = _HANDLES.devices = {}
    key = cp.cuda.runtime.getDevice()
    if key not in devices:
        devices[key] = _Device(cp, lib)
        _KEPT.append(devices[key])
    return devices[key]


def bind(cp, stream) -> None:
    """Bind this device's handle to ``stream`` now (before a capture on it: nothing of cuBLAS's
    own setup is then recorded)."""
    dev = _device(cp)
    if dev is not None:
        dev.bind(stream.ptr)


def _layout(x):
    """(op, ld) of the last two axes of ``x`` as cuBLAS reads them, or None: C-ordered rows are
    the column-major transpose (op N on the swapped product), a ``.T`` view op T."""
    rows, cols = x.shape[-2:]
    item = x.itemsize
    sr, sc = x.strides[-2:]
    if sr % item or sc % item:
        return None
    sr, sc = sr // item, sc // item
    if (sc == 1 or cols == 1) and (sr >= max(1, cols) or rows == 1):
        return _N, sr if rows > 1 else max(1, cols)
    if (sr == 1 or rows == 1) and (sc >= max(1, rows) or cols == 1):
        return _T, sc if cols > 1 else max(1, rows)
    return None


def _batch_stride(x, batch):
    """The one stride (in elements) of ``x``'s batch axes broadcast to ``batch``, or None."""
    lead = x.ndim - 2
    shape = (1,) * (len(batch) - lead) + tuple(x.shape[:lead])
    strides = (0,) * (len(batch) - lead) + tuple(x.strides[:lead])
    dims = [(b, 0 if s == 1 else st) for b, s, st in zip(batch, shape, strides) if b != 1]
    if not dims:
        return 0
    if any(st % x.itemsize for _, st in dims):
        return None
    inner = dims[-1][1]
    expect = inner
    for size, st in reversed(dims):
        if st != expect:
            return None
        expect = st * size
    if inner < 0:
        return None
    return inner // x.itemsize


def _operand(cp, x, batch):
    """``(x, op, ld, stride)``: ``x`` as cuBLAS can read it, copied when it must be."""
    lay, stride = _layout(x), _batch_stride(x, batch)
    if lay is None or stride is None:
        x = cp.ascontiguousarray(cp.broadcast_to(x, tuple(batch) + x.shape[-2:]))
        lay, stride = _layout(x), _batch_stride(x, batch)
    return x, lay[0], lay[1], stride


def matmul(cp, a, b, out=None):
    """``cupy.matmul(a, b, out=out)`` through cuBLAS directly where it can (module docstring)."""
    dev = _device(cp)
    if (dev is None or a.dtype != b.dtype or a.dtype not in _GEMM or a.ndim == 0 or b.ndim == 0
            or 0 in a.shape or 0 in b.shape):
        GEMMS["cupy"] += 1
        return cp.matmul(a, b) if out is None else cp.matmul(a, b, out=out)
    va, vb = (a[None, :] if a.ndim == 1 else a), (b[:, None] if b.ndim == 1 else b)
    (m, k), (k2, n) = va.shape[-2:], vb.shape[-2:]
    if k != k2:
        raise ValueError(f"matmul: Input operand 1 has a mismatch in its core dimension 0 "
                         f"(size {k2} is different from {k})")
    batch = tuple(np.broadcast_shapes(va.shape[:-2], vb.shape[:-2]))
    shape = batch + (m, n)
    final = shape[:-2] + ((m,) if a.ndim > 1 else ()) + ((n,) if b.ndim > 1 else ())
    if out is not None and (out.shape != final or out.dtype != a.dtype
                            or cp.may_share_memory(out, a) or cp.may_share_memory(out, b)):
        result = matmul(cp, a, b)  # (cuBLAS would read what it already wrote)
        cp.copyto(out, result)
        return out
    count = math.prod(batch)
    if (vb.ndim == 2 and va.ndim > 2 and _layout(va) == (_N, k)
            and _batch_stride(va, batch) == m * k):
        va, count, m = va.reshape(count * m, k), 1, count * m  # one GEMM of every row
    va, opa, lda, sa = _operand(cp, va, batch if va.ndim > 2 else ())
    vb, opb, ldb, sb = _operand(cp, vb, batch if vb.ndim > 2 else ())
    c = out if out is not None and out.flags.c_contiguous else cp.empty(shape, a.dtype)
    scalar = _SCALAR[np.dtype(a.dtype)]
    one, zero = scalar(1.0), scalar(0.0)
    dev.bind(cp.cuda.get_current_stream().ptr)
    _check(getattr(dev.lib, _GEMM[np.dtype(a.dtype)])(
        dev.handle, opb, opa, n, m, k, ctypes.byref(one), vb.data.ptr, ldb, sb,
        va.data.ptr, lda, sa, ctypes.byref(zero), c.data.ptr, n, m * n, count),
        _GEMM[np.dtype(a.dtype)])
    GEMMS["direct"] += 1
    if out is None:
        return c.reshape(final)
    if c is not out:
        cp.copyto(out, c.reshape(final))
    return out


def einsum(cp, subscripts: str, *xs):
    """``cupy.einsum(subscripts, *xs)``; a two-operand contraction as one ``matmul`` here: the
    operands' axes ordered (batch, free, contracted) and (batch, contracted, free) — transposed
    views, which ``matmul`` passes to cuBLAS with the transposed op or copies — an axis that only
    one operand has and the result lacks summed first, the product's axes put in the result's
    order. (Another summation order than ``cupy.einsum``'s: the same values within rounding.)"""
    lhs, out = subscripts.replace(" ", "").split("->")
    terms = lhs.split(",")
    if len(xs) != 2 or len(terms) != 2 or any(len(set(t)) != len(t) for t in terms + [out]):
        return cp.einsum(subscripts, *xs)
    (ta, tb), (a, b) = terms, xs
    if a.dtype != b.dtype or a.dtype not in _GEMM:
        return cp.einsum(subscripts, *xs)
    a, ta = _sum_alone(a, ta, tb + out)
    b, tb = _sum_alone(b, tb, ta + out)
    batch = [c for c in ta if c in tb and c in out]
    summed = [c for c in ta if c in tb and c not in out]
    free_a = [c for c in ta if c not in tb]
    free_b = [c for c in tb if c not in ta]
    size = dict(zip(ta, a.shape)) | dict(zip(tb, b.shape))
    a2 = a.transpose([ta.index(c) for c in batch + free_a + summed])
    b2 = b.transpose([tb.index(c) for c in batch + summed + free_b])
    dims = [math.prod(size[c] for c in group) for group in (batch, free_a, summed, free_b)]
    a2 = a2.reshape(dims[0], dims[1], dims[2])
    b2 = b2.reshape(dims[0], dims[2], dims[3])
    product = matmul(cp, a2, b2).reshape([size[c] for c in batch + free_a + free_b])
    order = batch + free_a + free_b
    return product.transpose([order.index(c) for c in out])


def _sum_alone(x, term, others):
    """``x`` summed over the axes whose letter no other term (nor the result) has."""
    alone = tuple(k for k, c in enumerate(term) if c not in others)
    if not alone:
        return x, term
    return x.sum(axis=alone), "".join(c for c in term if c in others)


__all__ = ["GEMMS", "CublasError", "WORKSPACE", "available", "bind", "einsum", "matmul",
           "open_library", "pick_library"]
