"""The cupy backend's products on cuBLAS directly (``replicate/backends/cuda_blas.py``, issue 31):
every layout a step makes (transposed views, batches that broadcast, vectors, strided and
reversed operands, ``out=``) and two-operand ``einsum`` contractions against NumPy, the road
each product took (``cuda_blas.GEMMS``, the backend's own record), and a product captured in a
CUDA graph and replayed on new values.

Without a GPU these run on the CuPy stand-in, whose cuBLAS (``tests/cupy_standin_blas.py``)
computes from the raw pointers, leading dimensions and strides the backend passes, and refuses
what libcublas would get wrong (a pointer outside live memory, a leading dimension too small,
another stream than the current one); on a GPU (``bench/gpu_check.sh``) the same tests run on
libcublas. The tests of the stand-in's own strictness say so and skip on a GPU.
"""

from __future__ import annotations

import ctypes

import cupy_standin
import numpy as np
import pytest

from replicate.backends import available

pytestmark = pytest.mark.skipif("cupy" not in available(), reason=(
    "the cupy backend is not available: no GPU, and the CuPy stand-in is off "
    "(REPLICATE_CUPY_STANDIN=0)"))


@pytest.fixture(scope="module")
def cp():
    import cupy

    from replicate.backends import cupy_backend  # noqa: F401 - places the process on its GPU
    return cupy


def _blas():
    from replicate.backends import cuda_blas
    return cuda_blas


RNG = np.random.default_rng(0)


def _r(*shape, dtype=np.float32):
    return RNG.standard_normal(shape).astype(dtype)


# (name, a, b, how each is viewed on the device before the product)
CASES = [
    ("2d", _r(5, 3), _r(3, 4), None, None),
    ("a.T", _r(3, 5), _r(3, 4), "T", None),
    ("b.T", _r(5, 3), _r(4, 3), None, "T"),
    ("a.T b.T", _r(3, 5), _r(4, 3), "T", "T"),
    ("rows @ matrix", _r(2, 3, 5, 6), _r(6, 4), None, None),
    ("matrix @ batch", _r(5, 6), _r(3, 6, 4), None, None),
    ("batch @ batch", _r(3, 5, 6), _r(3, 6, 4), None, None),
    ("broadcast batches", _r(2, 1, 5, 6), _r(1, 3, 6, 4), None, None),
    ("attention scores", _r(2, 3, 7, 4), _r(2, 3, 7, 4), None, "swap"),
    ("vector @ matrix", _r(6), _r(6, 4), None, None),
    ("matrix @ vector", _r(5, 6), _r(6), None, None),
    ("vector @ batch", _r(6), _r(2, 6, 3), None, None),
    ("strided columns", _r(5, 12), _r(6, 4), "every-2nd-col", None),
    ("reversed rows", _r(5, 6), _r(6, 4), None, "flip"),
    ("one by one", _r(1, 1), _r(1, 1), None, None),
    ("row @ column", _r(1, 6), _r(6, 1), None, None),
    ("column slice", _r(6, 5), _r(1, 4), "col", None),
    ("float64", _r(3, 5, 6, dtype=np.float64), _r(6, 2, dtype=np.float64), None, None),
]


def _view(cp, x, how):
    d = cp.asarray(x)
    if how == "T":
        return d.T, x.T
    if how == "swap":
        return cp.swapaxes(d, -1, -2), np.swapaxes(x, -1, -2)
    if how == "every-2nd-col":
        return d[:, ::2], x[:, ::2]
    if how == "flip":
        return d[::-1], x[::-1]
    if how == "col":
        return d[:, 1:2], x[:, 1:2]
    return d, x


@pytest.mark.parametrize("name,a,b,how_a,how_b", CASES, ids=[c[0] for c in CASES])
def test_products_match_numpy_in_every_layout(cp, name, a, b, how_a, how_b):
    blas = _blas()
    da, ha = _view(cp, a, how_a)
    db, hb = _view(cp, b, how_b)
    before = dict(blas.GEMMS)
    got = blas.matmul(cp, da, db)
    want = np.matmul(ha, hb)
    assert got.shape == want.shape and got.dtype == want.dtype
    tol = 1e-5 if a.dtype == np.float32 else 1e-12
    np.testing.assert_allclose(cp.asnumpy(got), want, rtol=tol, atol=tol)
    assert blas.GEMMS["direct"] == before["direct"] + 1, (before, blas.GEMMS)
    assert blas.GEMMS["cupy"] == before["cupy"]


def test_out_is_written_contiguous_or_not(cp):
    blas = _blas()
    a, b = _r(4, 5, 6), _r(6, 3)
    out = cp.zeros((4, 5, 3), cp.float32)
    assert blas.matmul(cp, cp.asarray(a), cp.asarray(b), out=out) is out
    np.testing.assert_allclose(cp.asnumpy(out), a @ b, rtol=1e-5, atol=1e-5)
    big = cp.zeros((4, 5, 6), cp.float32)
    part = big[:, :, ::2]  # not contiguous: the product is copied in
    assert blas.matmul(cp, cp.asarray(a), cp.asarray(b), out=part) is part
    np.testing.assert_allclose(cp.asnumpy(big)[:, :, ::2], a @ b, rtol=1e-5, atol=1e-5)
    assert not cp.asnumpy(big)[:, :, 1::2].any()


def test_an_out_that_is_an_operand_gets_numpys_result(cp):
    blas = _blas()
    a, b = _r(4, 4), _r(4, 4)
    da = cp.asarray(a)
    assert blas.matmul(cp, da, cp.asarray(b), out=da) is da  # a @= b
    np.testing.assert_allclose(cp.asnumpy(da), a @ b, rtol=1e-5, atol=1e-5)
    db = cp.asarray(b)
    blas.matmul(cp, cp.asarray(a), db, out=db)
    np.testing.assert_allclose(cp.asnumpy(db), a @ b, rtol=1e-5, atol=1e-5)


def test_integers_and_empty_products_go_to_cupy(cp):
    blas = _blas()
    before = dict(blas.GEMMS)
    a, b = RNG.integers(-9, 9, (3, 4)), RNG.integers(-9, 9, (4, 2))
    assert np.array_equal(cp.asnumpy(blas.matmul(cp, cp.asarray(a), cp.asarray(b))), a @ b)
    e = blas.matmul(cp, cp.zeros((3, 0), cp.float32), cp.zeros((0, 2), cp.float32))
    assert np.array_equal(cp.asnumpy(e), np.zeros((3, 2), np.float32))
    assert blas.GEMMS == {"direct": before["direct"], "cupy": before["cupy"] + 2}


def test_a_core_dimension_mismatch_is_numpys_error(cp):
    with pytest.raises(ValueError, match="mismatch in its core dimension"):
        _blas().matmul(cp, cp.zeros((3, 4), cp.float32), cp.zeros((5, 2), cp.float32))


EINSUMS = [
    ("ij,jk->ik", (5, 3), (3, 4)),
    ("ij,kj->ik", (5, 3), (4, 3)),
    ("bij,bjk->bik", (2, 5, 3), (2, 3, 4)),
    ("bhqd,bhkd->bhqk", (2, 3, 5, 4), (2, 3, 6, 4)),   # attention scores
    ("bhqk,bhkd->bqhd", (2, 3, 5, 6), (2, 3, 6, 4)),   # the result's axes reordered
    ("i,i->", (7,), (7,)),
    ("i,j->ij", (3,), (4,)),                            # an outer product: nothing contracted
    ("ijk,ik->j", (3, 4, 5), (3, 5)),
    ("ij,jk->k", (5, 3), (3, 4)),                      # "i" only in the first: summed first
    ("abc,cd->abd", (2, 3, 4), (4, 5)),
    ("ji,jk->ki", (3, 5), (3, 4)),
]


@pytest.mark.parametrize("subscripts,sa,sb", EINSUMS, ids=[e[0] for e in EINSUMS])
def test_two_operand_einsums_are_one_product(cp, subscripts, sa, sb):
    blas = _blas()
    a, b = _r(*sa, dtype=np.float64), _r(*sb, dtype=np.float64)
    before = dict(blas.GEMMS)
    got = blas.einsum(cp, subscripts, cp.asarray(a), cp.asarray(b))
    want = np.einsum(subscripts, a, b)
    assert got.shape == want.shape
    np.testing.assert_allclose(cp.asnumpy(got), want, rtol=1e-12, atol=1e-12)
    assert blas.GEMMS["direct"] == before["direct"] + 1 and blas.GEMMS["cupy"] == before["cupy"]


def test_other_einsums_go_to_cupy(cp):
    blas = _blas()
    a, b, c = _r(3, 4), _r(4, 5), _r(5, 2)
    got = blas.einsum(cp, "ij,jk,kl->il", *(cp.asarray(v) for v in (a, b, c)))
    np.testing.assert_allclose(cp.asnumpy(got), a @ b @ c, rtol=1e-5, atol=1e-5)
    got = blas.einsum(cp, "ij->j", cp.asarray(a))
    np.testing.assert_allclose(cp.asnumpy(got), a.sum(0), rtol=1e-6)


def test_a_product_is_captured_and_replayed_on_new_values(cp):
    blas = _blas()
    a, b = cp.asarray(_r(8, 16)), cp.asarray(_r(16, 8))
    stream, pool = cp.cuda.Stream(non_blocking=True), cp.cuda.MemoryPool()
    blas.bind(cp, stream)
    with cp.cuda.using_allocator(pool.malloc), stream:
        stream.begin_capture()
        c = blas.matmul(cp, a, b.T.T) * 2.0 + blas.matmul(cp, a[:4], b[:, :3])[0, 0]
        graph = stream.end_capture()
    current = cp.cuda.get_current_stream()
    for _ in range(2):
        ha, hb = _r(8, 16), _r(16, 8)
        a[...] = cp.asarray(ha)
        b[...] = cp.asarray(hb)
        graph.launch(stream=current)
        current.synchronize()
        np.testing.assert_allclose(cp.asnumpy(c), (ha @ hb) * 2 + (ha[:4] @ hb[:, :3])[0, 0],
                                   rtol=1e-5, atol=1e-5)
    assert blas.matmul(cp, a, b).shape == (8, 8)  # (back on the current stream)


# -- the stand-in's cuBLAS is at least as strict as libcublas ----------------------------------
def _standin():
    if not cupy_standin.ACTIVE:
        pytest.skip("a GPU is here: these check the CuPy stand-in's cuBLAS, not libcublas")
    import cupy_standin_blas
    return cupy_standin_blas.LIBRARY


def _gemm(lib, cp, handle, m=2, n=2, k=2, ld=2, alpha=None, size=4, c=None):
    a, b = cp.zeros(size, cp.float32), cp.zeros(size, cp.float32)
    c = cp.zeros(size, cp.float32) if c is None else c(a)
    one = alpha if alpha is not None else ctypes.c_float(1.0)
    return lib.cublasSgemmStridedBatched(handle, 0, 0, m, n, k, ctypes.byref(one), a.data.ptr,
                                         ld, 0, b.data.ptr, ld, 0,
                                         ctypes.byref(ctypes.c_float(0.0)), c.data.ptr, ld, 0, 1)


def test_the_standin_cublas_refuses_what_libcublas_gets_wrong(cp):
    lib = _standin()
    blas = _blas()
    handle = ctypes.c_void_p()
    assert lib.cublasCreate_v2(ctypes.byref(handle)) == 0
    h = handle.value
    lib.cublasSetStream_v2(h, cp.cuda.get_current_stream().ptr)
    assert _gemm(lib, cp, h) == 0
    assert _gemm(lib, cp, h, ld=1) == 7  # a leading dimension below the rows
    assert _gemm(lib, cp, 12345) == 1  # no such handle
    with pytest.raises(TypeError, match="c_float"):
        _gemm(lib, cp, h, alpha=ctypes.c_double(1.0))
    with pytest.raises(RuntimeError, match="not in a live device array"):
        _gemm(lib, cp, h, m=3, n=3, k=3, ld=3)  # 9 floats read from a buffer of 4
    with pytest.raises(ctypes.ArgumentError):
        _gemm(lib, cp, h, m=2.0)
    with pytest.raises(RuntimeError, match="overlaps"):
        _gemm(lib, cp, h, c=lambda a: a)  # C is A: undefined
    other = cp.cuda.Stream(non_blocking=True)
    with other, pytest.raises(RuntimeError, match="not the current stream"):
        _gemm(lib, cp, h)
    raw = blas.CublasError  # (the backend turns a status into its error)
    assert issubclass(raw, RuntimeError)


def test_the_standin_cublas_refuses_a_capture_without_a_workspace(cp):
    lib = _standin()
    handle = ctypes.c_void_p()
    lib.cublasCreate_v2(ctypes.byref(handle))
    stream, pool = cp.cuda.Stream(non_blocking=True), cp.cuda.MemoryPool()
    lib.cublasSetStream_v2(handle.value, stream.ptr)  # (drops any workspace)
    with cp.cuda.using_allocator(pool.malloc), stream:
        stream.begin_capture()
        try:
            with pytest.raises(RuntimeError, match="without a workspace"):
                _gemm(lib, cp, handle.value)
        finally:
            stream.end_capture()


def test_the_library_is_cupys_cuda_major_when_pytorch_mapped_another():
    from replicate.backends.cuda_blas import pick_library

    torch12 = "/opt/venv/site-packages/nvidia/cublas/lib/libcublas.so.12"
    cuda13 = "/usr/local/cuda-13.0/targets/x86_64-linux/lib/libcublas.so.13.1.0.3"
    assert pick_library({torch12, cuda13}, 13) == cuda13
    assert pick_library({torch12, cuda13}, 12) == torch12
    assert pick_library({cuda13}, 12) == cuda13  # (none of that major: the one there is)
    assert pick_library(set(), 13) is None
