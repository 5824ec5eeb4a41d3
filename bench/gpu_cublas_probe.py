"""What cuBLAS allows under a CUDA-graph capture through CuPy, and what a GEMM's call costs on the
host (issue 31): facts the cupy backend's direct cuBLAS road (``replicate/backends/cublas.py``)
is built on, measured on the GPU machine.

    python3 bench/gpu_cublas_probe.py

Prints, for float32 (256, 512) @ (512, 512): the host time of ``cupy.matmul`` per call and of a
direct ``cublasSgemm_v2`` through ctypes on CuPy's own libcublas; whether CuPy's wrapper refuses
during a capture; whether a direct GEMM on a handle bound to the capturing stream (before the
capture, with a workspace of our own) is captured and replays to the right values; and the
replay of a captured chain of 300 small kernels against running them.
"""

from __future__ import annotations

import ctypes
import time

import cupy
import numpy as np
from cupy_backends.cuda.libs import cublas as cb


def library_path() -> str:
    with open("/proc/self/maps") as f:
        for line in f:
            if "libcublas.so" in line and "Lt" not in line:
                return line.split()[-1]
    raise RuntimeError("libcublas not mapped")


def main() -> None:
    try:
        handle = cupy.cuda.device.get_cublas_handle()
        print("cupy", cupy.__version__, "cuBLAS", cb.getVersion(handle))
    except Exception as e:  # noqa: BLE001
        print("cupy", cupy.__version__, "cuBLAS version unknown:", e)
    path = library_path()
    print("libcublas:", path)
    lib = ctypes.CDLL(path)
    sgemm = lib.cublasSgemm_v2
    sgemm.restype = ctypes.c_int
    sgemm.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_int,
                      ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int,
                      ctypes.c_void_p, ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p,
                      ctypes.c_int]
    set_stream = lib.cublasSetStream_v2
    set_stream.argtypes = [ctypes.c_void_p, ctypes.c_void_p]
    set_ws = lib.cublasSetWorkspace_v2
    set_ws.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t]
    h = cb.create()
    m, k, n = 256, 512, 512
    a = cupy.random.rand(m, k, dtype=cupy.float32)
    b = cupy.random.rand(k, n, dtype=cupy.float32)
    c = cupy.empty((m, n), cupy.float32)
    one, zero = ctypes.c_float(1.0), ctypes.c_float(0.0)
    ws = cupy.empty(32 << 20, cupy.uint8)

    def direct(out):  # row-major out = a @ b as column-major out^T = b^T a^T
        return sgemm(h, 0, 0, n, m, k, ctypes.byref(one), b.data.ptr, n, a.data.ptr, k,
                     ctypes.byref(zero), out.data.ptr, n)

    stream = cupy.cuda.get_current_stream()
    print("set stream", set_stream(h, stream.ptr), "workspace", set_ws(h, ws.data.ptr, ws.nbytes))
    for name, fn in (("cupy.matmul", lambda: cupy.matmul(a, b)), ("direct sgemm",
                                                                 lambda: direct(c))):
        for _ in range(50):
            fn()
        stream.synchronize()
        t0 = time.perf_counter()
        for _ in range(2000):
            fn()
        host = (time.perf_counter() - t0) / 2000
        stream.synchronize()
        total = (time.perf_counter() - t0) / 2000
        print(f"{name:14s} host {host * 1e6:7.1f} us/call, with the device {total * 1e6:7.1f}")
    direct(c)
    ref = cupy.matmul(a, b)
    print("direct == cupy.matmul bitwise:", bool((c == ref).all()),
          "max abs diff", float(abs(c - ref).max()))

    s = cupy.cuda.Stream(non_blocking=True)
    pool = cupy.cuda.MemoryPool()
    with s:
        s.begin_capture()
        try:
            cupy.matmul(a, b)
            print("cupy.matmul during capture: allowed")
        except Exception as e:  # noqa: BLE001
            print("cupy.matmul during capture:", type(e).__name__, e)
        try:
            s.end_capture()
        except Exception as e:  # noqa: BLE001
            print("end_capture after it:", type(e).__name__, e)

    print("set stream (outside)", set_stream(h, s.ptr), "workspace",
          set_ws(h, ws.data.ptr, ws.nbytes))
    out = cupy.zeros((m, n), cupy.float32)
    with cupy.cuda.using_allocator(pool.malloc), s:
        s.begin_capture()
        st = direct(out)
        y = out * 2.0 + 1.0
        try:
            st2 = set_stream(h, s.ptr)
        except Exception as e:  # noqa: BLE001
            st2 = repr(e)
        g = s.end_capture()
    print("direct sgemm in capture status", st, "; cublasSetStream during capture status", st2)
    out[...] = 0
    stream.synchronize()
    g.launch(stream=stream)
    stream.synchronize()
    print("replay right:", bool(cupy.allclose(out, ref)), bool(cupy.allclose(y, ref * 2 + 1)))
    a[...] = cupy.random.rand(m, k, dtype=cupy.float32)
    g.launch(stream=stream)
    stream.synchronize()
    print("replay reads new inputs:", bool(cupy.allclose(out, cupy.matmul(a, b))))

    x = cupy.ones(1024, cupy.float32)
    kern = cupy.ElementwiseKernel("float32 x", "float32 y", "y = x * 1.0001f + 0.5f", "probe_k")
    ys = [cupy.empty_like(x) for _ in range(300)]

    def chain():
        v = x
        for yy in ys:
            kern(v, yy)
            v = yy
    chain()
    set_stream(h, stream.ptr)
    stream.synchronize()
    t0 = time.perf_counter()
    for _ in range(20):
        chain()
    stream.synchronize()
    run = (time.perf_counter() - t0) / 20
    s2 = cupy.cuda.Stream(non_blocking=True)
    with s2:
        s2.begin_capture()
        chain()
        g2 = s2.end_capture()
    g2.launch(stream=stream)
    stream.synchronize()
    t0 = time.perf_counter()
    for _ in range(20):
        g2.launch(stream=stream)
    stream.synchronize()
    rep = (time.perf_counter() - t0) / 20
    print(f"300 small kernels: run {run * 1e3:.3f} ms, replay {rep * 1e3:.3f} ms")
    print("probe done", np.__version__)


if __name__ == "__main__":
    main()
