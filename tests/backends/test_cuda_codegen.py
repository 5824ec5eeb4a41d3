"""CUDA code generation for fused groups, tested without a GPU.

The generated pieces are checked structurally, and — where a CUDA toolkit is installed — compiled
with ``nvcc`` for real (``standalone_source`` wraps each kernel in a complete translation unit).
Running them needs CuPy and an NVIDIA GPU: those tests skip cleanly here and run on a GPU machine
(see docs/concepts/compiler.md, "Backends").
"""

from __future__ import annotations

import shutil
import subprocess

import numpy as np
import pytest

import replicate as rp
import replicate.numpy as rnp
from replicate.backends import available
from replicate.backends.cuda_codegen import CUDA, REDUCE, generate, literal, standalone_source
from replicate.graph.fused import FUSIBLE_REDUCTIONS, FUSIBLE_STRUCTURAL
from replicate.graph.primitives import ELEMENTWISE, REGISTRY


def _fused_nodes(fn, *args):
    graph = rp.function(fn).executable(*args).graph
    producer = {n.out.id: n for n in graph.nodes}
    out = []
    for n in graph.nodes:
        if n.prim == "fused":
            consts = {i: producer[x.id].attrs["value"] for i, x in enumerate(n.inputs)
                      if x.id in producer and producer[x.id].prim == "const" and x.size == 1}
            out.append((n, consts))
    return out


def _spec(fn, *args, name="k"):
    (node, consts), = _fused_nodes(fn, *args)
    return generate(node, consts, name)


def test_every_fusible_primitive_has_a_cuda_rule():
    fusible = [p for p, spec in REGISTRY.items() if spec.kind == ELEMENTWISE]
    assert [p for p in fusible + list(FUSIBLE_STRUCTURAL) if p not in CUDA] == []
    assert sorted(REDUCE) == sorted(FUSIBLE_REDUCTIONS)
    assert [p for p in CUDA if p not in REGISTRY] == []


def test_eight_op_chain_is_one_elementwise_kernel():
    spec = _spec(lambda x: rnp.tanh(x * 1.7 + 0.3) * rnp.sigmoid(x) - rnp.exp(-0.5 * x),
                 np.ones(16, np.float32))
    assert spec.kind == "elementwise"
    # CuPy reads parameter types as NumPy dtype names ("float" would be float64); C in the body
    assert spec.in_params == "float32 in0" and spec.out_params == "float32 out0"
    assert "const float v0 = " in spec.operation
    lines = spec.operation.splitlines()
    assert len(lines) == 9 and lines[-1].startswith("out0 = ")
    assert "1.7000000476837158f" in spec.operation  # constants inlined as float literals
    for fn in ("tanh(", "exp("):
        assert fn in spec.operation


def test_reduction_kernel_has_prologue_and_epilogue():
    spec = _spec(lambda x: rnp.sqrt((x * x).sum(axis=1)) + 1.0, np.ones((4, 3)))
    assert spec.kind == "reduction" and spec.axes == (1,) and spec.red_shape == (4, 3)
    assert spec.reduce_expr == "a + b" and spec.identity == "0"
    assert spec.map_expr == "k_map(in0)" and spec.post_map_expr == "out0 = k_post(a)"
    assert "(in0 * in0)" in spec.preamble and "sqrt(a)" in spec.preamble
    assert spec.reduce_type == "double" and spec.in_params == "float64 in0"
    assert "typedef double type_in0_raw;" in spec.preamble  # CuPy's CUB path reads them
    assert "typedef double type_out0_raw;" in spec.preamble


def test_kernels_are_keyed_by_structure_and_dtype():
    a = _spec(lambda x: rnp.tanh(x) * 2.0, np.ones(3, np.float32))
    b = _spec(lambda x: rnp.tanh(x) * 2.0, np.ones(7, np.float32))
    c = _spec(lambda x: rnp.tanh(x) * 2.0, np.ones(3))
    assert a.key == b.key  # shapes are CuPy's business: one compiled kernel serves both
    assert a.key != c.key


def test_epilogue_with_a_runtime_scalar_is_refused():
    # s is a traced scalar, not a constant: the ReductionKernel epilogue cannot read it
    nodes = _fused_nodes(lambda x, s: (x * x).sum() * s, np.ones(4), np.float64(2.0))
    (node, consts), = nodes
    with pytest.raises(NotImplementedError):
        generate(node, consts, "k")


def test_literals():
    assert literal(np.float32(1.5), np.float32) == "1.5f"
    # NVRTC has no INFINITY/NAN: CuPy's math_constants.h names them
    assert literal(np.nan, np.float64) == "CUDART_NAN"
    assert literal(-np.inf, np.float32) == "(-CUDART_INF_F)"
    assert literal(np.inf, np.float16) == "((float16)CUDART_INF_F)"
    assert REDUCE["reduce_max"][1](np.dtype(np.float32)) == "(-CUDART_INF_F)"
    assert literal(True, bool) == "true"
    assert literal(-3, np.int64) == "((long long)-3)"
    assert REDUCE["reduce_max"][1](np.dtype(np.int64)) == \
        "((long long)(-9223372036854775807) - 1)"


PROGRAMS = [
    (lambda x: rnp.tanh(x * 1.7 + 0.3) * rnp.sigmoid(x) - rnp.exp(-0.5 * x), np.float32),
    (lambda x: rnp.where(x > 0, rnp.log1p(rnp.abs(x)), rnp.expm1(x)) ** 2.0, np.float64),
    (lambda x: rnp.sqrt(rnp.maximum(x, 0.1)) / rnp.minimum(x, 3.0) + rnp.rsqrt(x * x + 1),
     np.float32),
    (lambda x: rnp.sqrt((x * x).sum(axis=1)) + 1.0, np.float64),
    (lambda x: rnp.max(rnp.abs(x) - 1, axis=0) * 2, np.int64),
    (lambda x: rnp.min(rnp.sin(x) * rnp.cos(x), axis=0) - 1.0, np.float32),
    (lambda x: (x // 3 + rnp.sign(x)).prod(axis=0), np.int32),
    (lambda x: rnp.cast(rnp.logical_and(x > 0.5, rnp.logical_not(x > 2.0)), np.float32).sum(),
     np.float32),
    # issue 16: rounding, NumPy's mod (the divisor's sign) and erf
    (lambda x: rnp.mod(x, 1.5) + rnp.floor(x) * rnp.ceil(x) - rnp.round(x * 0.5) + rnp.erf(x),
     np.float32),
    (lambda x: rnp.erf(rnp.mod(x, -2.5)) * rnp.round(x * 0.25), np.float64),
    (lambda x: (x % 3 + rnp.mod(x, -4)).sum(axis=0), np.int64),
]


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc (CUDA toolkit) not installed")
def test_generated_sources_compile_with_nvcc(tmp_path):
    sources = []
    for i, (fn, dtype) in enumerate(PROGRAMS):
        x = (np.arange(12).reshape(4, 3) - 5).astype(dtype)
        for j, (node, consts) in enumerate(_fused_nodes(fn, x)):
            spec = generate(node, consts, f"k{i}_{j}")
            sources.append(standalone_source(spec))
    assert len(sources) >= len(PROGRAMS)
    for k, src in enumerate(sources):
        (tmp_path / f"k{k}.cu").write_text(src)
    result = subprocess.run(["nvcc", "-ptx", "-arch=sm_80", *[f"k{k}.cu" for k in
                                                             range(len(sources))]],
                            cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr + "\n".join(sources)


needs_gpu = pytest.mark.skipif("cupy" not in available(),
                               reason="needs CuPy and an NVIDIA GPU")


@needs_gpu
@pytest.mark.parametrize("k", range(len(PROGRAMS)))
def test_cupy_backend_runs_generated_kernels(k):
    fn, dtype = PROGRAMS[k]
    x = (np.arange(12).reshape(4, 3) - 5).astype(dtype)
    ref = rp.function(fn)(x)
    got = rp.function(fn, backend="cupy")(x)
    tol = 1e-5 if dtype == np.float32 else 1e-12
    np.testing.assert_allclose(got, ref, rtol=tol, atol=tol)


def test_a_bfloat16_step_is_refused_by_the_cupy_backend_with_a_clear_error():
    """CuPy has no bfloat16 arrays: the backend says so before CuPy fails somewhere inside."""
    import replicate as rp
    import replicate.numpy as rnp
    from replicate.backends.cuda_codegen import refuse_bfloat16

    graph = rp.function(lambda x: rnp.exp(x) * 2.0).graph(np.ones(3, rp.bfloat16))
    with pytest.raises(rp.DTypeError, match="CuPy has no bfloat16.*JAX backend"):
        refuse_bfloat16(graph)
    refuse_bfloat16(rp.function(lambda x: rnp.exp(x)).graph(np.ones(3, np.float16)))  # fine


@pytest.mark.skipif(shutil.which("g++") is None, reason="no C++ compiler (g++) installed")
def test_integer_helpers_give_numpys_values(tmp_path):
    """The C the kernels call for integer ``//``, ``%`` and ``**`` (``cuda_ops.PREAMBLE``),
    compiled for the host and run on every pair of edge values: NumPy's results where C leaves
    the value undefined (x // 0 and x % 0 are 0, the most negative // -1 wraps), and a negative
    exponent sets the error flag where NumPy raises."""
    from replicate.backends.cuda_ops import PREAMBLE

    rows, want = [], []
    for t, dtype in (("int", np.int32), ("long long", np.int64)):
        info = np.iinfo(dtype)
        edge = np.array([info.min, info.min + 1, -7, -2, -1, 0, 1, 2, 3, 7, info.max], dtype)
        a, b = (v.reshape(-1) for v in np.meshgrid(edge, edge))
        small = (b > -5) & (b < 5)  # powers: small exponents (the products wrap, in C as in NumPy)
        with np.errstate(all="ignore"):
            pw = np.power(a[small], np.abs(b[small]))
            want += [(int(v), 0) for v in np.floor_divide(a, b)]
            want += [(int(v), 0) for v in np.remainder(a, b)]
        want += [(0, 1) if e < 0 else (int(v), 0) for v, e in zip(pw, b[small])]
        for name, (x, y) in (("_floordiv", (a, b)), ("_imod", (a, b)),
                             ("_ipow", (a[small], b[small]))):
            call = f"{name}<{t}>(x[i], y[i], &e)" if name == "_ipow" else f"{name}(x[i], y[i])"
            rows.append(f"{{ const {t} x[] = {{{', '.join(f'({t}){v}LL' for v in x)}}};\n"
                        f"  const {t} y[] = {{{', '.join(f'({t}){v}LL' for v in y)}}};\n"
                        f"  for (int i = 0; i < {len(x)}; ++i) {{ int e = 0; {t} r = {call};\n"
                        f"    printf(\"%lld %d\\n\", (long long)r, e); }} }}")
    source = ("#include <cmath>\n#include <cstdio>\n#define __device__\n" + PREAMBLE +
              "int main() {\n" + "\n".join(rows) + "\nreturn 0; }\n")
    (tmp_path / "h.cpp").write_text(source)
    built = subprocess.run(["g++", "-O1", "-fwrapv", "-o", "h", "h.cpp"], cwd=tmp_path,
                           capture_output=True, text=True, timeout=120)
    assert built.returncode == 0, built.stderr
    got = subprocess.run(["./h"], cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert got.returncode == 0, got.stderr  # no SIGFPE: x // 0 and MIN // -1 never divide
    assert [tuple(map(int, ln.split())) for ln in got.stdout.splitlines()] == want
