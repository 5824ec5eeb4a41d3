"""The generated CUDA, compiled for the host with g++ and run against NumPy on edge values.

Nothing here hand-copies an expression: every kernel is what ``cuda_codegen.generate`` makes of a
fused group (its ``standalone_source``, the ``PREAMBLE`` helpers included), built the way the
CuPy backend builds one (``_group``: the ops of a traced graph in one group, its scalar
constants inlined as literals), so a change to the generator changes what is checked.
``cuda_host_shim.h`` makes the CUDA host C++: empty ``__device__``/``__global__``, a grid of one
thread, CUDA's math names as the standard library's (float overloads included), CuPy's
``float16`` as a real IEEE half rounded to nearest even, ``CUDART_INF``/``CUDART_NAN``.

What is checked, in one g++ compile of one file:

* every fusible primitive (``prims_where(fuse="map")`` and ``fuse="reduce"``), in every dtype
  its shape rule takes (float16, float32, float64, int32, int64, bool; casts from each of
  those to each of them and to int8 and uint8), on arrays of edge values (NaN, ±0, ±inf,
  float32 denormals, ±max, ±the smallest normal, integer limits, 1, -1 and a few ordinary
  values), binary ops on every pair, reductions on every pair;
* constants as the generator emits them: each edge value as a literal operand of every unary
  op and of every binary op (either side), and as a value of its own (the literal's round
  trip); ``(--2.5f)``, which NVRTC rejects, was such a literal.

The reference is ``replicate/graph/reference.py`` (``run_body``: the group interpreted node by
node with the NumPy table). Results compare bitwise (NaN-ness, the sign of zero, every integer),
except for the transcendental functions (a few ulps: CUDA's and glibc's libraries are not
NumPy's). Not compared: a float cast to an integer type it does not fit (NaN, ±inf, out of
range: undefined in C, and documented as undefined here), and an integer to a negative
integer power (the kernel sets its error flag, and NumPy raises: ``test_cuda_codegen.py``).

The one tolerated GPU difference: CuPy compiles every kernel with ``-ftz=true``
(``cupy/cuda/compiler.py``, ``_compile_with_cache_cuda``), so float32 denormals are 0 on the
GPU — a denormal operand reads as 0 and a denormal result is written as 0 (float64 and float16
keep theirs). The float32 kernels run here the same way (the x86 FTZ and DAZ bits set around
them), and their reference sees the same: denormal float32 inputs and constants flushed to ±0,
denormal float32 results flushed to ±0. A denormal intermediate is flushed on the GPU too,
which the reference cannot follow: a float32 transcendental result may differ from it by at most
the smallest normal (``logaddexp(-100, 1.2e-38)``: ``log1p(exp(-100))`` is a denormal).
"""

from __future__ import annotations

import inspect
import os
import shutil
import subprocess

import numpy as np
import pytest

import replicate as rp
from replicate.backends.cuda_codegen import CTYPE, ctype, generate, standalone_source
from replicate.errors import ReplicateError
from replicate.graph.core import Array, Node, bind, concrete
from replicate.graph.fused import FUSED, run_body
from replicate.graph.passes import PIPELINE
from replicate.graph.passes.fusion import _body
from replicate.graph.primitives import REGISTRY, prims_where

pytestmark = pytest.mark.skipif(shutil.which("g++") is None,
                                reason="no C++ compiler (g++) installed: the host check of "
                                       "the generated CUDA needs one")
SHIM = os.path.join(os.path.dirname(os.path.abspath(__file__)), "cuda_host_shim.h")
F16, F32, F64, I32, I64, BOOL = (np.dtype(t) for t in ("float16", "float32", "float64",
                                                       "int32", "int64", "bool"))
DTYPES = (F16, F32, F64, I32, I64, BOOL)
TARGETS = DTYPES + (np.dtype(np.int8), np.dtype(np.uint8))  # what a cast may make
# ops whose CUDA and glibc results may differ from NumPy's by a few ulps
TRANSCENDENTAL = {"exp", "log", "log1p", "expm1", "rsqrt", "tanh", "sin", "cos", "logistic",
                  "erf", "pow", "tan", "sinh", "cosh", "arcsin", "arccos", "arctan", "arcsinh",
                  "arccosh", "arctanh", "log2", "log10", "arctan2", "logaddexp"}
ULPS = {F16: 1, F32: 4, F64: 4}
ATTRS = {"cast": "dtype", "broadcast_to": "shape", "reduce_sum": "axes", "reduce_prod": "axes",
         "reduce_max": "axes", "reduce_min": "axes"}


def _edges(dtype) -> np.ndarray:
    """The edge values of ``dtype``."""
    if dtype == BOOL:
        return np.array([False, True])
    if dtype.kind == "i":
        i = np.iinfo(dtype)
        return np.array([i.min, i.min + 1, -100, -7, -2, -1, 0, 1, 2, 3, 7, 100, i.max - 1,
                         i.max], dtype)
    f, f32 = np.finfo(dtype), np.finfo(np.float32)
    values = [np.nan, -np.nan, 0.0, -0.0, np.inf, -np.inf, 1.0, -1.0, 0.5, -2.5, 3.0, 100.0, -100.0,
              -88.8, 88.8, 1e4, f.max, -f.max, f.smallest_normal, -f.smallest_normal,
              f.smallest_subnormal, -f.smallest_subnormal]
    if dtype != F16:
        values += [float(f32.smallest_subnormal), float(-f32.smallest_subnormal),
                   float(np.nextafter(f32.smallest_normal, 0)), 1e10]
    if dtype == F64:
        values += [1e300, -1e300, 1e-300, 3e9, -3e9, 1e19, -720.0]
    return np.array(values, dtype)


def _arity(prim) -> int:
    params = inspect.signature(REGISTRY[prim].shape_rule).parameters.values()
    return sum(p.kind == p.POSITIONAL_OR_KEYWORD and p.name != ATTRS.get(prim) for p in params)


def _pairs(dtype):
    x, y = np.meshgrid(_edges(dtype), _edges(dtype))
    return x.reshape(-1), y.reshape(-1)


def _const(value, dtype):
    return concrete(np.asarray(value, dtype))


class Case:
    """One fused group: its kernel, its inputs and NumPy's result."""

    def __init__(self, label, fn, args, keep=None):
        graph = rp.function(fn, options={"disable": set(PIPELINE)}).graph(*args)
        members = [n for n in graph.nodes if n.prim != "const"]
        body, externals = _body(members)
        node = Node(FUSED, tuple(externals), {"body": body})
        node.out = Array(members[-1].out.aval, node=node)
        given = dict(zip((x.id for x in graph.inputs), args))
        values = [given[x.id] if x.id in given else np.asarray(x.node.attrs["value"], x.dtype)
                  for x in externals]
        consts = {i: v for i, (x, v) in enumerate(zip(externals, values))
                  if x.id not in given and x.size == 1}
        self.label, self.prims = label, {n.prim for n in members}
        dtypes = {x.dtype for x in body.graph.inputs} | {n.out.dtype for n in members}
        self.ftz = F32 in dtypes
        if self.ftz:  # the GPU reads a float32 denormal as 0 (CuPy's -ftz=true)
            values = [_flush(v) for v in values]
            consts = {i: _flush(v) for i, v in consts.items()}
        self.spec = generate(node, consts, f"k_{label}")
        with np.errstate(all="ignore"):
            want = run_body(body, *values)
        self.want = _flush(want) if self.ftz else want
        self.keep = keep  # which results are compared (None: all)
        shape = self.spec.red_shape if self.spec.kind == "reduction" else self.spec.out_shape
        self.inputs = [np.ascontiguousarray(np.broadcast_to(values[i], shape))
                       for i in self.spec.params]
        self.in_types = [ctype(externals[i].dtype) for i in self.spec.params]

    def call(self) -> str:
        """The C++ block of ``main`` that runs this case's kernel."""
        spec, lines = self.spec, [f"{{ set_ftz({'true' if self.ftz else 'false'});"]
        args = [f"(const {t}*)load<{t}>(in, {x.size})" for t, x in zip(self.in_types,
                                                                     self.inputs)]
        out_t, n = ctype(self.want.dtype), self.want.size
        lines.append(f"  {out_t}* out_p = ({out_t}*)std::malloc(sizeof({out_t}) * {n});")
        for k, a in enumerate(args):
            lines.append(f"  const {self.in_types[k]}* a{k} = {a};")
        err = ["&err"] if spec.flag else []
        fn = f"{spec.name}_ns::{spec.name}"
        if spec.kind == "elementwise":
            call = [f"a{k}" for k in range(len(args))] + err + ["out_p", str(n)]
            lines.append(f"  int err = 0; {fn}({', '.join(call)});")
        else:
            m = spec.red_shape[-1]
            call = [f"a{k} + r * {m}" for k in range(len(args))] + err + ["out_p + r", str(m)]
            lines.append(f"  int err = 0; for (long long r = 0; r < {n}; ++r) "
                         f"{fn}({', '.join(call)});")
        lines.append(f"  (void)err; std::fwrite(out_p, sizeof({out_t}), {n}, out); }}")
        return "\n".join(lines)

    def source(self) -> str:
        body = "\n".join(ln for ln in standalone_source(self.spec).splitlines()
                         if not ln.startswith("#include"))  # the shim stands for them
        return f"namespace {self.spec.name}_ns {{\n{body}\n}}"


def _flush(v):
    """float32 denormals to ±0 (CuPy's -ftz=true); anything else as it is."""
    v = np.asarray(v)
    if v.dtype != F32:
        return v
    tiny = np.abs(v) < np.finfo(np.float32).smallest_normal
    return np.where(tiny, np.copysign(np.float32(0), v), v).astype(F32)


def _array_cases():
    """Every fusible primitive, in every dtype its shape rule takes, on edge values."""
    cases = []
    for prim in sorted(prims_where(fuse="map") | prims_where(fuse="reduce")):
        arity = _arity(prim)
        for dtype in DTYPES:
            label = f"{prim}_{dtype.name}"
            if prim == "cast":
                for target in TARGETS:
                    x = _edges(dtype)
                    keep = _fits(x, target)
                    cases.append(Case(f"{label}_to_{target.name}", lambda a, t=target:
                                      bind("cast", a, dtype=t), (x,), keep))
                continue
            try:
                if prim in ("reduce_sum", "reduce_prod", "reduce_max", "reduce_min"):
                    x = np.stack(_pairs(dtype), axis=1)
                    cases.append(Case(label, lambda a, p=prim: bind(p, a, axes=(1,)), (x,)))
                elif prim == "broadcast_to":
                    x = _edges(dtype)
                    cases.append(Case(label, lambda a: bind("broadcast_to", a,
                                                            shape=(2,) + a.shape), (x,)))
                elif prim == "select":
                    a, b = _pairs(dtype)
                    c = np.arange(a.size) % 3 == 0
                    cases.append(Case(label, lambda *v: bind("select", *v), (c, a, b)))
                elif arity == 1:
                    cases.append(Case(label, lambda a, p=prim: bind(p, a), (_edges(dtype),)))
                else:
                    a, b = _pairs(dtype)
                    if prim == "pow" and dtype.kind == "i":  # NumPy raises on b < 0
                        a, b = a[b >= 0], b[b >= 0]
                    cases.append(Case(label, lambda u, v, p=prim: bind(p, u, v), (a, b)))
            except ReplicateError:  # the shape rule does not take this dtype
                continue
    return cases


def _fits(x, target):
    """Which of ``x`` C converts to ``target`` with a defined value (NumPy's too)."""
    if x.dtype.kind != "f" or target.kind not in "iu":
        return None
    info = np.iinfo(target)
    with np.errstate(invalid="ignore"):
        t = np.trunc(x.astype(np.float64))
        return np.isfinite(t) & (t >= info.min) & (t <= info.max)


def _chain(k, term, values, dtype):
    """``term(c)`` for the constant ``values[k]`` of each element (a select per value)."""
    out = term(_const(values[0], dtype))
    for j in range(1, len(values)):
        out = bind("select", bind("eq", k, _const(j, I32)), term(_const(values[j], dtype)), out)
    return out


def _constant_cases():
    """Each edge value as a literal: alone, under every unary op, either side of every binary op.
    Element i of a kernel reads the constant of index ``k[i]`` (a chain of selects)."""
    cases = []
    unary = [p for p in sorted(prims_where(fuse="map")) if _arity(p) == 1 and p not in ATTRS]
    binary = [p for p in sorted(prims_where(fuse="map")) if _arity(p) == 2]
    for dtype in DTYPES:
        values = _edges(dtype)
        k = np.arange(values.size, dtype=np.int32)
        cases.append(Case(f"const_{dtype.name}", lambda i, vs=values, d=dtype:
                          _chain(i, lambda c: c, vs, d), (k,)))
        for prim in unary:
            try:
                cases.append(Case(f"const_{prim}_{dtype.name}", lambda i, p=prim, vs=values,
                                  d=dtype: _chain(i, lambda c: bind(p, c), vs, d), (k,)))
            except ReplicateError:
                continue
        for prim in binary:
            vs = values[values >= 0] if prim == "pow" and dtype.kind == "i" else values
            kk_p = np.repeat(np.arange(vs.size, dtype=np.int32), values.size)
            x_p = np.tile(values, vs.size)
            for side in ("right", "left"):
                def term(c, a, p=prim, s=side):
                    return bind(p, a, c) if s == "right" else bind(p, c, a)
                if prim == "pow" and dtype.kind == "i" and side == "left":
                    x_p_side, kk_side = x_p[x_p >= 0], kk_p[x_p >= 0]
                else:
                    x_p_side, kk_side = x_p, kk_p
                try:
                    cases.append(Case(f"const_{prim}_{side}_{dtype.name}",
                                      lambda a, i, t=term, vs=vs, d=dtype:
                                      _chain(i, lambda c: t(c, a), vs, d), (x_p_side, kk_side)))
                except ReplicateError:
                    break
    return cases


def _compare(case, got) -> str | None:
    """None, or what differs between ``got`` and NumPy's result."""
    want = case.want.reshape(-1)
    got = _flush(got) if case.ftz else got
    keep = np.ones(want.size, bool) if case.keep is None else case.keep.reshape(-1)
    if want.dtype.kind != "f":
        bad = keep & (got != want)
    else:
        bits = {2: np.int16, 4: np.int32, 8: np.int64}[want.dtype.itemsize]
        nan_w, nan_g = np.isnan(want), np.isnan(got)
        same = (want.view(bits) == got.view(bits)) | (nan_w & nan_g)
        if case.prims & TRANSCENDENTAL:
            ulps = np.abs(_ordered(want, bits) - _ordered(got, bits))
            same |= ~nan_w & ~nan_g & (ulps <= ULPS[want.dtype]) & (
                np.signbit(want) == np.signbit(got))
            if case.ftz:  # a denormal intermediate flushed to 0 (logaddexp's log1p(exp(-100)))
                with np.errstate(invalid="ignore", over="ignore"):
                    tiny = np.abs(got.astype(np.float64) - want.astype(np.float64))
                same |= np.isfinite(want) & (tiny <= np.finfo(F32).smallest_normal)
        bad = keep & ~same
    if not bad.any():
        return None
    i = np.flatnonzero(bad)[:6]
    ins = "; ".join(f"in: {x.reshape(-1)[i % x.size].tolist()}" for x in case.inputs)
    return (f"{case.label}: {bad.sum()} of {want.size} differ: got {got[i].tolist()}, "
            f"NumPy {want[i].tolist()} ({ins})")


def _ordered(v, bits):
    """Floats as integers in the floats' order (adjacent floats differ by 1)."""
    i = v.view(bits).astype(np.int64)
    return np.where(i < 0, np.iinfo(bits).min - i, i)


@pytest.fixture(scope="module")
def host_run(tmp_path_factory):
    """Every case compiled into one program, run once: (cases, [result per case])."""
    cases = _array_cases() + _constant_cases()
    tmp = tmp_path_factory.mktemp("cuda_host")
    source = "\n".join([f'#include "{SHIM}"', *(c.source() for c in cases),
                        "int main(int argc, char** argv) {",
                        '  FILE* in = std::fopen(argv[1], "rb");',
                        '  FILE* out = std::fopen(argv[2], "wb");',
                        *(c.call() for c in cases),
                        "  std::fclose(out); return 0; }"])
    (tmp / "host.cpp").write_text(source)
    with open(tmp / "in.bin", "wb") as f:
        for c in cases:
            for x in c.inputs:
                f.write(x.tobytes())
    # -fwrapv: signed overflow wraps, as on the GPU (and in NumPy); -O0: no folding at compile
    # time, which would not see the FTZ/DAZ bits
    built = subprocess.run(["g++", "-std=c++17", "-O0", "-fwrapv", "-ffp-contract=off",
                            "-w", "-o", "host", "host.cpp"], cwd=tmp, capture_output=True,
                           text=True, timeout=300)
    assert built.returncode == 0, built.stderr[-5000:]
    ran = subprocess.run(["./host", "in.bin", "out.bin"], cwd=tmp, capture_output=True,
                         text=True, timeout=120)
    assert ran.returncode == 0, ran.stderr
    raw, results = (tmp / "out.bin").read_bytes(), []
    offset = 0
    for c in cases:
        n = c.want.size * c.want.dtype.itemsize
        results.append(np.frombuffer(raw[offset:offset + n], c.want.dtype))
        offset += n
    assert offset == len(raw)
    return cases, results


def test_generated_cuda_gives_numpys_values_on_edge_values(host_run):
    cases, results = host_run
    bad = [r for c, g in zip(cases, results) if (r := _compare(c, g)) is not None]
    assert bad == [], "\n".join(bad)


def test_every_fusible_primitive_and_dtype_is_run(host_run):
    """The sweep misses no primitive, no dtype a primitive takes, no cast target."""
    cases, _ = host_run
    run = {c.label for c in cases}
    fusible = prims_where(fuse="map") | prims_where(fuse="reduce")
    assert {p for c in cases for p in c.prims} >= fusible
    for dtype in DTYPES:
        assert f"add_{dtype.name}" in run and f"const_{dtype.name}" in run
        assert {f"cast_{dtype.name}_to_{t.name}" for t in TARGETS} <= run
    for prim in fusible - {"cast"}:
        takes = {"_logical": ("bool",), "_logical_not": ("bool",),  # bools only; invert: ints
                 "_unary_integer": ("int32", "int64"), "_shift": ("int32", "int64"),
                 "_bitwise": ("int32", "int64", "bool")}.get(
            REGISTRY[prim].shape_rule.__name__, ("float16", "float32", "float64"))
        assert {f"{prim}_{d}" for d in takes} <= run, prim
    assert set(CTYPE) - {"uint32"} <= {t.name for t in TARGETS}  # no uint32 values in graphs


def _signature(case):
    """How the CuPy stand-in records a launch of ``case``'s kernel (``cupy_nvrtc`` reads it)."""
    spec = case.spec
    ins = tuple(np.dtype(p.split()[-2]) for p in spec.in_params.split(", "))
    if spec.kind == "elementwise":
        return ("elementwise", spec.key, (ins, (case.want.dtype,)), (1,) * (len(ins) + 1))
    return ("reduction", spec.key, ins, 2, (1,), "simple")


def test_every_literal_compiles_with_nvrtc(host_run):
    """The literals the host check ran are what NVRTC takes: each edge value of each dtype as a
    constant, alone and under every unary op, built by CuPy's own kernel machinery and compiled
    with NVRTC for sm_90 with CuPy's options (``cupy_nvrtc``). NVRTC rejected the ``(--2.5f)``
    that ``neg``, ``abs`` or the logistic of a negative float32 constant made. (The binary ops'
    literals sit between parentheses of their own; ``test_cupy_kernels.py`` compiles every
    primitive's kernel on arrays.)"""
    import cupy_nvrtc

    reason = cupy_nvrtc.missing()
    if reason:
        pytest.skip(reason)
    cases, _ = host_run
    unary = [c for c in cases if c.label.startswith("const_") and
             c.label.rsplit("_", 2)[-2] not in ("left", "right")]
    launches = {_signature(c): c.spec for c in unary}
    n, failures = cupy_nvrtc.compile_all(launches)
    assert failures == [], "\n\n".join(f"{label}:\n{log[:2000]}" for label, log, _ in failures)
    assert n == len(launches)
