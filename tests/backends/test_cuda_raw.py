"""The raw kernels of map-only fused groups (``replicate/backends/cuda_raw.py``, issue 31): which
operand layouts a raw kernel reads linearly (``mode``), the kernel's own C compiled for the host
and run on broadcast operands (g++ with ``cuda_host_shim.h``: its index arithmetic, not only its
syntax), and the cupy backend choosing it, or CuPy's ``ElementwiseKernel`` where it cannot,
against NumPy — reading the backend's own launch record, so the same tests run on a GPU.

On the CuPy stand-in the raw kernel runs through its addresses (``tests/cupy_standin_raw.py``):
a view passed as a pointer gives the elements a GPU would read; its strictness is checked last.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import types

import cupy_standin
import numpy as np
import pytest

import replicate as rp
import replicate.numpy as rnp
from replicate.backends import available, cuda_raw
from replicate.backends.cuda_codegen import generate
from replicate.backends.cuda_launches import LAUNCHES
from replicate.graph.core import Array, Node
from replicate.graph.fused import FUSED, run_body
from replicate.graph.passes import PIPELINE
from replicate.graph.passes.fusion import _body

SHIM = os.path.join(os.path.dirname(os.path.abspath(__file__)), "cuda_host_shim.h")
FULL, SCALAR, MOD, DIV, BLOCK = (cuda_raw.FULL, cuda_raw.SCALAR, cuda_raw.MOD, cuda_raw.DIV,
                                 cuda_raw.BLOCK)


def _x(shape, contiguous=True):
    return types.SimpleNamespace(shape=shape, ndim=len(shape), size=int(np.prod(shape)),
                                 flags=types.SimpleNamespace(c_contiguous=contiguous))


@pytest.mark.parametrize("shape,out,want", [
    ((2, 3, 4), (2, 3, 4), (FULL,)),
    ((), (2, 3, 4), (SCALAR,)),
    ((1, 1), (2, 3, 4), (SCALAR,)),
    ((4,), (2, 3, 4), (MOD, 4)),                 # a bias: i % 4
    ((2, 3, 1), (2, 3, 4), (DIV, 4)),            # a row statistic: i / 4
    ((3, 1), (2, 3, 4), (BLOCK, 3, 4)),          # (i / 4) % 3
    ((3, 1), (1, 3, 4), (DIV, 4)),               # the same with nothing before: i / 4
    ((1, 3, 4), (2, 3, 4), (MOD, 12)),
    ((1, 3, 4), (1, 3, 4), (FULL,)),
    ((3, 4), (1, 3, 4), (FULL,)),                # only axes of size 1 differ
    ((2, 1, 4), (2, 3, 4), None),                # a broadcast axis inside the run
    ((5,), (2, 3, 4), None),                     # not broadcastable
], ids=lambda v: str(v))
def test_which_operands_are_read_linearly(shape, out, want):
    assert cuda_raw.mode(_x(shape), out) == want


def test_a_view_that_is_not_c_ordered_is_not_read_linearly():
    assert cuda_raw.mode(_x((3, 4), contiguous=False), (3, 4)) is None
    assert cuda_raw.mode(_x((1,), contiguous=False), (3, 4)) == (SCALAR,)  # one element
    assert cuda_raw.modes([_x((3, 4)), _x((3, 4), contiguous=False)], (3, 4)) is None


def _spec(fn, *args):
    """The generated elementwise kernel of ``fn``'s ops as one fused group, and its body."""
    graph = rp.function(fn, options={"disable": set(PIPELINE)}).graph(*args)
    members = [n for n in graph.nodes if n.prim != "const"]
    body, externals = _body(members)
    node = Node(FUSED, tuple(externals), {"body": body})
    node.out = Array(members[-1].out.aval, node=node)
    assert all(x.id in {g.id for g in graph.inputs} for x in externals)
    order = {x.id: k for k, x in enumerate(graph.inputs)}
    return generate(node, {}, "k_raw"), body, [args[order[x.id]] for x in externals]


@pytest.mark.skipif(shutil.which("g++") is None,
                    reason="no C++ compiler (g++) installed: the host check needs one")
def test_the_raw_kernels_index_arithmetic_on_the_host(tmp_path):
    """Operands (B, T, C), (C,), (B, T, 1), (T, 1) and a scalar: FULL, MOD, DIV, BLOCK and
    SCALAR, each read as the C reads it, against NumPy's broadcast."""
    rng = np.random.default_rng(0)
    shapes = [(2, 3, 5), (5,), (2, 3, 1), (3, 1), ()]
    xs = [rng.standard_normal(s).astype(np.float32) for s in shapes]
    spec, body, ordered = _spec(lambda a, b, c, d, e: (a * b - c) * d + e, *xs)
    out_shape = (2, 3, 5)
    how = tuple(cuda_raw.mode(_x(x.shape), out_shape) for x in ordered)
    assert sorted(h[0] for h in how) == sorted([FULL, MOD, DIV, BLOCK, SCALAR])
    n = 30
    source = cuda_raw.raw_source(spec, how, n, head="", name="k")
    ints = [str(v) for v in cuda_raw.args(how, n, np)]
    inputs = "".join(
        f"  static const float x{k}[] = {{{', '.join(repr(float(v)) for v in x.reshape(-1))}}};\n"
        for k, x in enumerate(ordered))
    call = ", ".join([f"x{k}" for k in range(len(ordered))] + ["out"] + ints)
    (tmp_path / "raw.cpp").write_text(
        f'#include "{SHIM}"\n{source}\nint main() {{\n{inputs}  float out[{n}];\n'
        f"  k({call});\n  std::fwrite(out, sizeof(float), {n}, stdout);\n  return 0;\n}}\n")
    built = subprocess.run(["g++", "-std=c++17", "-O0", "-w", "-o", "raw", "raw.cpp"],
                           cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert built.returncode == 0, built.stderr[-3000:]
    ran = subprocess.run(["./raw"], cwd=tmp_path, capture_output=True, timeout=60)
    got = np.frombuffer(ran.stdout, np.float32).reshape(out_shape)
    want = np.asarray(run_body(body, *ordered), np.float32)
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)


# -- the cupy backend ------------------------------------------------------------------------------
needs_cupy = pytest.mark.skipif("cupy" not in available(), reason=(
    "the cupy backend is not available: no GPU, and the CuPy stand-in is off "
    "(REPLICATE_CUPY_STANDIN=0)"))


def _launched(f, *args):
    with LAUNCHES.recording() as seen:
        out = f(*args)
    import cupy
    return cupy.asnumpy(out), sorted(k[0] for k in seen.signatures)


@needs_cupy
@pytest.mark.parametrize("shapes", [
    [(4, 6, 8), (8,), (4, 6, 1), (6, 1), ()],
    [(64,), (64,), (), ()],
    [(3, 1, 5), (1, 7, 1), (), ()],   # a broadcast both ways: not one block, CuPy's kernel
], ids=["blocks", "flat", "two-way broadcast"])
def test_the_backend_runs_a_raw_kernel_where_it_can(shapes):
    rng = np.random.default_rng(1)
    xs = [rng.standard_normal(s).astype(np.float32) for s in shapes]

    def fn(a, b, c, d):
        return rnp.tanh(a * b - c) * d + 0.5

    args = xs[:4] if len(xs) >= 4 else xs
    f = rp.function(fn, backend="cupy")
    got, kinds = _launched(f, *args)
    want = np.tanh(args[0] * args[1] - args[2]) * args[3] + np.float32(0.5)
    np.testing.assert_allclose(got, want, rtol=2e-6, atol=2e-6)
    linear = all(cuda_raw.mode(_x(x.shape), want.shape) for x in args)
    assert kinds == (["raw"] if linear else ["elementwise"]), kinds


@needs_cupy
def test_a_transposed_device_operand_goes_to_cupys_kernel():
    import cupy

    a = np.arange(12, dtype=np.float32).reshape(3, 4)
    f = rp.function(lambda x, y: rnp.exp(x) * y, backend="cupy")
    t = cupy.asarray(a.T.copy()).T  # a (3, 4) view of a (4, 3) array: not C-ordered
    got, kinds = _launched(f, t, np.ones((3, 4), np.float32))
    np.testing.assert_allclose(got, np.exp(a), rtol=1e-6)
    assert kinds == ["elementwise"]
    got, kinds = _launched(f, cupy.asarray(a), np.ones((3, 4), np.float32))
    np.testing.assert_allclose(got, np.exp(a), rtol=1e-6)
    assert kinds == ["raw"]


# -- the stand-in's RawKernel is at least as strict as CuPy's ------------------------------------
def _standin_kernel():
    if not cupy_standin.ACTIVE:
        pytest.skip("a GPU is here: these check the CuPy stand-in's RawKernel, not CuPy's")
    import cupy

    spec, _, _ = _spec(lambda a, b: a * b, np.ones(8, np.float32), np.ones(8, np.float32))
    how = ((FULL,), (FULL,))
    source = cuda_raw.raw_source(spec, how, 8)
    return cupy, cupy.RawKernel(source, "k_raw_raw"), source


def test_the_standin_rawkernel_refuses_what_a_gpu_would_misread():
    cupy, kernel, source = _standin_kernel()
    a, b = cupy.ones(8, cupy.float32), cupy.ones(8, cupy.float32)
    out = cupy.empty(8, cupy.float32)
    kernel((1,), (8,), (a, b, out, np.uint32(8)))
    assert np.array_equal(cupy.asnumpy(out), np.ones(8, np.float32))
    with pytest.raises(TypeError, match="numpy.uint32"):
        kernel((1,), (8,), (a, b, out, 8))  # a Python int: another width
    with pytest.raises(TypeError, match="float32"):
        kernel((1,), (8,), (a, cupy.ones(8, cupy.float64), out, np.uint32(8)))
    with pytest.raises(RuntimeError, match="not in a live device array"):
        kernel((1,), (8,), (a[:4], b, out, np.uint32(8)))  # 8 elements read from 4
    with pytest.raises(RuntimeError, match="named symbol"):
        cupy.RawKernel(source, "another_name")
    with pytest.raises(NotImplementedError):
        cupy.RawKernel('extern "C" __global__ void k() {}', "k")
    strided = cupy.asarray(np.arange(16, dtype=np.float32))[::2]  # the GPU reads 0..7
    kernel((1,), (8,), (strided, b, out, np.uint32(8)))
    assert np.array_equal(cupy.asnumpy(out), np.arange(8, dtype=np.float32))


@needs_cupy
def test_one_kernel_per_reading_not_per_first_shape():
    """(T, 1) against (1, T, C) reads ``i / r``; against (2, T, C) ``(i / r) % m``, with the
    same m and r: each call gets the reading its shapes need, whichever came first."""
    rng = np.random.default_rng(2)
    col = rng.standard_normal((3, 1)).astype(np.float32)
    f = rp.function(lambda a, b: rnp.exp(a) * b, backend="cupy")
    for batch in (1, 2, 1):
        x = rng.standard_normal((batch, 3, 4)).astype(np.float32)
        got, kinds = _launched(f, col, x)
        np.testing.assert_allclose(got, np.exp(col) * x, rtol=1e-6)
        assert kinds == ["raw"]
