"""The op harness (``tests/harness/ops.py``) in bfloat16 and float16.

Every harness case with a float input runs with its float inputs rounded to ``rp.bfloat16`` and
to ``rp.float16``: one case per op and variant (the cases that differ only in their shapes, in
float32 against float64 inputs, or in ``keepdims`` run once, with the largest inputs; so do the
window geometries of ``conv2d`` and the pools: see ``GEOMETRY``). Every op of ``test_ops`` with a
float input is here (``test_every_op_with_float_inputs_is_covered``); none is left out. Checked:

* forward, in graph mode on the NumPy backend, on the JAX backend (XLA's own bf16/f16 kernels),
  in eager mode, and on the CuPy backend where CuPy and a GPU are there: against the NumPy
  reference run in float32 on the same rounded inputs and rounded once to the low dtype. The
  result's dtype is the one ``replicate.dtypes`` promises: a float result that follows its inputs'
  precision is of the low dtype; an explicit float32 (a cast) stays float32 and a strong float64
  operand (``STRONG_FLOAT64``) gives float64; an integer operand makes float16 float64 (NumPy's
  rule) and keeps bfloat16 bfloat16 (JAX's rule); bool and integer results are exact;
* gradient, on the same backends: ``rp.grad`` of ``sum(out * cotangent)`` (the cotangent rounded
  to the output's dtype) has the input's low dtype and equals the float64 gradient of the
  reference at the rounded inputs (central differences, as in ``test_ops``).

Casts to the low dtypes (the harness casts to float32, float64, ints and bool only) have their own
test: round to nearest even, overflow, inf, nan, -0.0, subnormals, and their gradient.

The inputs are the harness's samples rounded, each moved on by a unit in the last place where
rounding made two distinct values equal or put one onto a constant the cases clip at: a tie
rounding made puts ``maximum``, ``clip`` or ``max_pool2d`` on a kink, where the gradient is a
convention, not the reference's derivative.

Tolerances, with u the unit roundoff (2**-8 for bfloat16, 2**-11 for float16) and
``cond = sum_i |d out / d x_i| |x_i|`` (from the float64 Jacobian of the reference: the sum of the
magnitudes of the terms, ``|a| @ |b|`` for a matmul, ``sum |x|`` for a sum):

* forward, a case whose graph has one rounding primitive (``exp``, ``matmul``, ``sum``, ...; data
  moves, ``abs``, ``maximum``, ``where`` and the like do not round): it computes in float32 and
  rounds once, so it is within one unit in the last place, ``3u |want|``, plus float32's own
  accumulation error, ``2**-22 cond``;
* forward, several rounding primitives (``mean``, ``var``, ``logsumexp``, ``softplus``,
  ``conv2d``, ...): each rounded intermediate moves the result by u times the magnitude of the
  terms it is made of: ``3u |want| + 2u cond``;
* gradient: computed in the low dtype, several roundings deep, from rounded forward values (the
  centred values of ``var``, the saved output of ``sigmoid``): ``4u (|want| + gcond)`` where
  ``gcond = sum_j |d out_j / d x_i| |cot_j|``, plus ``2u max(|want| + gcond)`` over the input
  (a norm-wise term: an element of a gradient that nearly cancels, ``x_i - mean`` in ``std``,
  carries the rounding error of the large terms it cancels).
"""

from __future__ import annotations

import builtins
import importlib.util
import re
import zlib

import numpy as np
import pytest
from harness.ops import CASES, Case, leaves, to_numpy

import replicate as rp
import replicate.numpy as rnp
from conftest import column
from replicate.backends import available
from replicate.dtypes import finfo, is_float
from replicate.graph.primitives import prims_where

F32, F64 = np.dtype(np.float32), np.dtype(np.float64)
LOW = {"bfloat16": rp.bfloat16, "float16": rp.float16}
HAVE_JAX = importlib.util.find_spec("jax") is not None
# cases whose float64 result comes from a float64 the case writes (not from an integer operand,
# which keeps bfloat16 bfloat16): their result is float64 whatever the inputs' precision
STRONG_FLOAT64 = {"numpy-scalar-is-strong", "ndarray-on-the-left", "to float64", "via float32"}
# primitives that never round: they move data (a cast that narrows excepted), or pick or negate
# one of their operands exactly
EXACT = prims_where(moves=True) | {
                 "pad", "neg", "abs", "sign", "maximum", "minimum", "select", "reduce_max",
                 "reduce_min", "argmax", "argmin", "eq", "ne", "lt", "le", "gt", "ge",
                 "logical_and", "logical_or", "logical_not", "isfinite"}


# the cupy backend: on a GPU, or on the CuPy stand-in (``tests/cupy_standin.py``), whose kernels
# run the NumPy reference rows: there the ids say ``cupy-standin``
HAVE_CUPY = "cupy" in available()
needs_cupy = pytest.mark.skipif(not HAVE_CUPY, reason="the cupy backend needs CuPy: a GPU, or "
                                "the CuPy stand-in (REPLICATE_CUPY_STANDIN=0 turned it off)")
RUNS = {"numpy": dict(mode="graph"), "eager": dict(mode="eager"), "jax": dict(backend="jax"),
        "cupy": dict(backend="cupy")}


# -- the cases ----------------------------------------------------------------------------------
def _has_float(c: Case) -> bool:
    return any(np.dtype(i.dtype).kind == "f" for i in c.inputs)


# ops whose cases differ in their window geometry (kernel, stride, padding, dilation) only: which
# elements a window holds is indexing, the same in every dtype (test_ops checks each geometry);
# one case of each runs here (their JAX compiles are the slowest of the table)
GEOMETRY = {"conv2d", "conv2d_input_grad", "conv2d_weight_grad", "max_pool2d", "avg_pool2d"}


def _variant(c: Case):
    """What tells a case from another besides its shapes, its float widths and ``keepdims``: the
    op, the inputs' kinds and domains, and the function (code, defaults and closure:
    ``axis_op`` makes one a case)."""
    kinds = tuple(("f" if np.dtype(i.dtype).kind == "f" else i.dtype, i.domain)
                  for i in c.inputs)
    fn = c.fn
    code = getattr(fn, "__code__", None)
    if c.op in GEOMETRY:
        how = ()
    elif code is None:
        how = ("object", id(fn))
    else:
        cells = tuple(re.sub(r"(, )?'keepdims': (True|False)", "", repr(cell.cell_contents))
                      for cell in fn.__closure__ or ())
        how = (code, repr(fn.__defaults__), cells)
    return c.op, kinds, how


def _pick() -> list[Case]:
    """One case a variant: the largest inputs (ties: by a hash of the id, so that both values
    of ``keepdims`` appear)."""
    groups: dict = {}
    for c in CASES:
        if _has_float(c):
            groups.setdefault(_variant(c), []).append(c)

    def rank(c):
        return builtins.sum(int(np.prod(i.shape)) for i in c.inputs), zlib.crc32(c.id.encode())

    return [max(cs, key=rank) for cs in groups.values()]


LOW_CASES = _pick()


def _differentiable(c: Case) -> bool:
    """As in ``test_ops``: the case allows it, and every output is a float."""
    if not c.grad:
        return False
    with np.errstate(all="ignore"):
        return all(np.asarray(o).dtype.kind == "f" for o in leaves(c.ref(*c.sample())))


GRAD_CASES = [c for c in LOW_CASES if _differentiable(c)]


# the constants the cases clip at or compare with: an input rounded onto one is on a kink
KINKS = {0.0, 0.5, -0.5, 0.3, -0.2, 1.0, 1.5, 2.0}


def low_inputs(c: Case, low) -> list[np.ndarray]:
    """The case's sample with its float inputs rounded to ``low``; where rounding made two
    distinct values equal, or put a value onto one of ``KINKS``, moved on by one unit in the
    last place (the gradient at a tie is a convention, not the reference's derivative)."""
    xs = c.sample()
    out = []
    source: dict = {}  # rounded value -> the value it was rounded from
    for x in xs:
        if x.dtype.kind != "f":
            out.append(x)
            continue
        r = x.astype(low)
        bits = r.reshape(-1).view(np.uint16)  # of r: moving a value along writes into r
        for e, v in enumerate(x.reshape(-1)):
            v = float(v)
            while np.isfinite(v):
                w = float(bits[e:e + 1].view(low)[0])
                if source.get(w, v) == v and (w not in KINKS or w == v):
                    source[w] = v
                    break
                bits[e] += 1  # the next value away from zero
        out.append(r)
    return out


# -- the reference ------------------------------------------------------------------------------
def _ref(c: Case, xs, float_dtype) -> list[np.ndarray]:
    args = [x.astype(float_dtype) if is_float(x.dtype) else x for x in xs]
    with np.errstate(all="ignore"):
        return [np.asarray(o) for o in leaves(c.ref(*args))]


class Expected:
    """What a case gives with its float inputs in ``low``: the inputs ``xs``, the outputs
    ``outs`` (values of the expected dtypes) and ``cond`` (per float output, the magnitude of its
    terms); for a differentiable case the rounded cotangents ``cots``, the float64 gradients
    ``grads`` and ``gcond`` (the magnitude of their terms)."""

    def __init__(self, c: Case, low):
        self.case, self.low = c, np.dtype(low)
        self.xs = low_inputs(c, low)
        r32, r64 = _ref(c, self.xs, F32), _ref(c, self.xs, F64)
        self.outs = [self._expect(c, a, b) for a, b in zip(r32, r64)]
        self.wrt = [i for i, x in enumerate(self.xs) if is_float(x.dtype)]
        floats = [k for k, o in enumerate(self.outs) if is_float(o.dtype)]
        finite = all(np.all(np.isfinite(self.xs[i].astype(F64))) for i in self.wrt)
        jac = self._jacobian(c, r64, floats) if finite and floats else None
        x64 = [np.abs(self.xs[i].astype(F64)).ravel() for i in self.wrt]
        self.cond = [None] * len(self.outs)
        for k in floats:
            # a NaN or infinite output is compared exactly: its derivative (NaN, as log2's of a
            # negative) leaves the other elements' conditioning as it is
            special = ~np.isfinite(self.outs[k].astype(F64)).reshape(-1, 1)
            rows = None if jac is None else [np.where(special, 0.0, j) for j in jac[k]]
            if rows is not None and all(np.all(np.isfinite(j)) for j in rows):
                self.cond[k] = builtins.sum(np.abs(j) @ x for j, x in zip(rows, x64)
                                            ).reshape(self.outs[k].shape)
        self.differentiable = _differentiable(c) and jac is not None
        if self.differentiable:
            rng = np.random.default_rng(zlib.crc32(("cot" + c.id).encode()))
            self.cots = [rng.standard_normal(o.shape).astype(o.dtype) for o in self.outs]
            ct64 = [ct.astype(F64).ravel() for ct in self.cots]
            self.grads, self.gcond = [], []
            for n, i in enumerate(self.wrt):
                g = builtins.sum(jac[k][n].T @ ct64[k] for k in floats)
                gc = builtins.sum(np.abs(jac[k][n]).T @ np.abs(ct64[k]) for k in floats)
                self.grads.append(np.reshape(g, self.xs[i].shape))
                self.gcond.append(np.reshape(gc, self.xs[i].shape))

    def _expect(self, c: Case, r32, r64):
        if r32.dtype.kind != "f":  # bool, int: exact
            return r32
        if r32.dtype == F32 and r64.dtype == F64:  # follows the inputs' precision
            return r32.astype(self.low)
        if r32.dtype == F32:  # an explicit float32
            return r32
        # float64 from float32 inputs: a float64 the case writes, or an integer operand
        if self.low == rp.bfloat16 and re.sub(r"#\d+$", "", c.label) not in STRONG_FLOAT64:
            return r32.astype(self.low)  # bfloat16 with an integer: bfloat16
        return r64  # float16 with an integer: float64, as NumPy

    def _jacobian(self, c: Case, r64, floats):
        """``jac[k][n]``: d out_k / d (float input n), of shape (out size, input size), by
        central differences of the float64 reference at the rounded inputs."""
        x64 = [x.astype(F64) if is_float(x.dtype) else x for x in self.xs]
        jac = {k: [np.zeros((r64[k].size, x64[i].size)) for i in self.wrt] for k in floats}
        for n, i in enumerate(self.wrt):
            for e in range(x64[i].size):
                plus, minus = list(x64), list(x64)
                plus[i], minus[i] = x64[i].copy(), x64[i].copy()
                plus[i].flat[e] += c.fd_eps
                minus[i].flat[e] -= c.fd_eps
                hi, lo = _ref(c, plus, F64), _ref(c, minus, F64)
                for k in floats:
                    with np.errstate(all="ignore"):
                        d = (hi[k].astype(F64) - lo[k].astype(F64)) / (2 * c.fd_eps)
                    jac[k][n][:, e] = d.ravel()
        return jac


_EXPECTED: dict = {}


def expected(c: Case, dtype: str) -> Expected:
    key = (c.id, dtype)
    if key not in _EXPECTED:
        _EXPECTED[key] = Expected(c, LOW[dtype])
    return _EXPECTED[key]


def _rounds(node) -> bool:
    if node.prim == "cast":  # a move, unless it narrows
        return node.out.aval.dtype.itemsize < node.inputs[0].aval.dtype.itemsize
    return node.prim not in EXACT


def roundings(c: Case, e: Expected) -> int:
    """How many primitives of the case's graph round (at the low inputs)."""
    return builtins.sum(1 for n in rp.function(c.fn).graph(*e.xs).nodes if _rounds(n))


# -- the library --------------------------------------------------------------------------------
_RESULTS: dict = {}  # (case id, dtype, where) -> (outputs or exception, gradients or exception)
_BATCHED: set = set()


def _program(items):
    """One function computing each ``(case, expected)`` of ``items``: its outputs, then for a
    differentiable one the gradients of ``sum(out * cot)``; and how to split its results."""
    def f(*args):
        results, at = [], 0
        for c, e in items:
            xs = args[at:at + len(e.xs)]
            at += len(e.xs)
            outs = list(leaves(c.fn(*xs)))
            results += outs
            if e.differentiable:
                loss = builtins.sum(rnp.sum(o * ct) for o, ct in zip(outs, e.cots))
                results += rp.grad(loss, [xs[i] for i in e.wrt])
        return results

    def split(results):
        at = 0
        for _, e in items:
            outs = results[at:at + len(e.outs)]
            at += len(e.outs)
            grads = None
            if e.differentiable:
                grads = results[at:at + len(e.wrt)]
                at += len(e.wrt)
            yield outs, grads

    return f, [x for _, e in items for x in e.xs], split


def _call(f, args, where):
    with np.errstate(all="ignore"):  # 1 / False and the like, as NumPy
        return [to_numpy(v) for v in rp.function(f, **RUNS[where])(*args)]


def _run_one(c: Case, dtype: str, where: str):
    e = expected(c, dtype)
    outs = grads = None
    if e.differentiable:
        f, args, split = _program([(c, e)])
        try:
            outs, grads = next(split(_call(f, args, where)))
        except Exception as err:  # noqa: BLE001 - reported by test_gradient
            grads = err
    if outs is None:
        try:
            outs = _call(lambda *xs: list(leaves(c.fn(*xs))), e.xs, where)
        except Exception as err:  # noqa: BLE001 - reported by test_forward
            outs = err
    return outs, grads


def _run_batch(op: str, where: str):
    """Every case of ``op`` in both dtypes in one program (JAX compiles are the cost of this
    file); on any error the cases run one by one instead."""
    _BATCHED.add((op, where))
    items = [(c, dtype) for c in LOW_CASES if c.op == op for dtype in LOW]
    f, args, split = _program([(c, expected(c, dtype)) for c, dtype in items])
    try:
        results = list(split(_call(f, args, where)))
    except Exception:  # noqa: BLE001 - _run_one finds which case and says what
        return
    for (c, dtype), result in zip(items, results):
        _RESULTS[(c.id, dtype, where)] = result


def library(c: Case, dtype: str, where: str):
    """``(outputs or the exception, gradients or the exception)`` of the case."""
    key = (c.id, dtype, where)
    if key not in _RESULTS and where == "jax" and (c.op, where) not in _BATCHED:
        _run_batch(c.op, where)
    if key not in _RESULTS:
        _RESULTS[key] = _run_one(c, dtype, where)
    return _RESULTS[key]


def _raise(value):
    if isinstance(value, BaseException):
        raise value
    return value


# -- tolerances ---------------------------------------------------------------------------------
def unit_roundoff(dtype) -> float:
    return float(finfo(dtype).eps) / 2


def tiny(dtype) -> float:
    return 2 * float(finfo(dtype).smallest_subnormal)


def forward_tolerance(e: Expected, k: int, rounds: int):
    out = e.outs[k]
    tol = 3 * unit_roundoff(out.dtype) * np.abs(out.astype(F64)) + tiny(out.dtype)
    if e.cond[k] is not None:
        tol = tol + (2 * unit_roundoff(e.low) if rounds > 1 else 2.0 ** -22) * e.cond[k]
    return tol


def gradient_tolerance(e: Expected, n: int):
    scale = np.abs(e.grads[n]) + e.gcond[n]
    peak = float(scale.max()) if scale.size else 0.0
    return unit_roundoff(e.low) * (4 * scale + 2 * peak) + tiny(e.low)


def check_close(actual, want, tol, what):
    actual, want = np.asarray(actual).astype(F64), np.asarray(want).astype(F64)
    special = ~np.isfinite(want)
    np.testing.assert_array_equal(actual[special], want[special], err_msg=what)
    with np.errstate(invalid="ignore"):  # inf - inf where both are inf: checked above
        err = np.abs(actual - want)
    tol = np.broadcast_to(tol, want.shape)
    bad = ~special & ~(err <= tol)
    if np.any(bad):
        rows = "\n".join(f"  at {tuple(int(v) for v in i)}: got {actual[tuple(i)]!r}, want "
                         f"{want[tuple(i)]!r}, |err| {err[tuple(i)]:.3g} > tol "
                         f"{tol[tuple(i)]:.3g}" for i in np.argwhere(bad)[:5])
        pytest.fail(f"{what}: {int(bad.sum())} of {bad.size} elements out of tolerance\n{rows}")


# -- known bugs (xfail, strict) -----------------------------------------------------------------
# (op or case id, dtype or None, where or None, "forward" or "gradient") -> what is wrong
BUGS: dict = {}


def marks(c: Case, dtype: str, where: str, check: str):
    for (name, d, w, what), reason in BUGS.items():
        if name in (c.op, c.id) and d in (None, dtype) and w in (None, where) and what == check:
            return [pytest.mark.xfail(strict=True, reason=reason)]
    return []


def params(cases, check: str, wheres, dtypes=tuple(LOW)) -> list:
    return [pytest.param(c, dtype, where, id=f"{c.id}-{dtype}-{column(where)}",
                         marks=marks(c, dtype, where, check))
            for c in cases for dtype in dtypes for where in wheres]


BACKENDS = ["numpy", "eager"] + (["jax"] if HAVE_JAX else [])


# -- the checks ---------------------------------------------------------------------------------
# float16 on the cupy backend: the GPU's float-to-half conversion (``cvt.rn.f16.f32``) makes
# every NaN the canonical one, its sign bit clear (seen on an H200; in docs/guides/gpu.md,
# modelled by the CuPy stand-in): the outputs that read a float16 NaN's sign bit
HALF_NAN_SIGN = {("signbit+copysign", "signs", 1)}


def _forward(c: Case, dtype: str, where: str):
    e = expected(c, dtype)
    outs = _raise(library(c, dtype, where)[0])
    rounds = roundings(c, e)
    assert len(outs) == len(e.outs)
    for k, (a, w) in enumerate(zip(outs, e.outs)):
        what = f"{c.id} in {dtype}, output {k}, {where}"
        if where.startswith("cupy") and dtype == "float16" and (c.op, c.label, k) in HALF_NAN_SIGN:
            w = np.zeros_like(w)  # the sign bit of a NaN: clear
        assert a.shape == w.shape, f"{what}: shape {a.shape} != {w.shape}"
        assert a.dtype == w.dtype, f"{what}: dtype {a.dtype} != {w.dtype}"
        if is_float(w.dtype):
            check_close(a, w, forward_tolerance(e, k, rounds), what)
        else:
            np.testing.assert_array_equal(a, w, err_msg=what)


def _gradient(c: Case, dtype: str, where: str):
    e = expected(c, dtype)
    assert e.differentiable, f"{c.id}: no float64 gradient in {dtype}"
    grads = _raise(library(c, dtype, where)[1])
    assert len(grads) == len(e.wrt)
    for n, (g, w) in enumerate(zip(grads, e.grads)):
        x = e.xs[e.wrt[n]]
        what = f"d/d input {e.wrt[n]} of {c.id} in {dtype}, {where}"
        assert g.shape == x.shape and g.dtype == x.dtype, \
            f"{what}: {g.shape} {g.dtype}, not the input's {x.shape} {x.dtype}"
        check_close(g, w, gradient_tolerance(e, n), what)


@pytest.mark.parametrize("c, dtype, where", params(LOW_CASES, "forward", BACKENDS))
def test_forward(c, dtype, where):
    _forward(c, dtype, where)


@pytest.mark.parametrize("c, dtype, where", params(GRAD_CASES, "gradient", BACKENDS))
def test_gradient(c, dtype, where):
    _gradient(c, dtype, where)


# float16 only: CuPy has no bfloat16 (the backend refuses it with a clear error)
@needs_cupy
@pytest.mark.parametrize("c, dtype, where",
                         params(LOW_CASES, "forward", ["cupy"], ("float16",)))
def test_cupy_forward(c, dtype, where):
    _forward(c, dtype, where)


@needs_cupy
@pytest.mark.parametrize("c, dtype, where",
                         params(GRAD_CASES, "gradient", ["cupy"], ("float16",)))
def test_cupy_gradient(c, dtype, where):
    _gradient(c, dtype, where)


def test_every_op_with_float_inputs_is_covered():
    ops = lambda cases: {part for c in cases for part in c.op.split("+")}  # noqa: E731
    assert ops(c for c in CASES if _has_float(c)) - ops(LOW_CASES) == set()
    assert ops(GRAD_CASES) >= ops(c for c in CASES if _has_float(c) and _differentiable(c))
    assert len(LOW_CASES) < len([c for c in CASES if _has_float(c)]) / 2  # one shape a variant
    axes = {re.sub(",keepdims=.*", "", c.label) for c in LOW_CASES if c.op == "sum"}
    assert axes >= {f"axis={a}" for a in (None, 0, 1, -1, (0, 1), (0, 2))}  # every axis


# -- casts to and between the low dtypes (the harness casts only to float32, float64, ints, bool) --
# round to nearest even at ties (exact in float32, so no source rounds twice), overflow to inf in
# float16 (65520 and up), inf, nan, -0.0, a float16 subnormal
CAST_VALUES = np.array([0.1, -3.3, 1 + 2**-8, 1 + 3 * 2**-8, 1 + 2**-11, 1 + 3 * 2**-11, 65519.0,
                        65520.0, 1e5, -np.inf, np.nan, -0.0, 3e-5, 2.5e38])


@pytest.mark.parametrize("where", BACKENDS)
@pytest.mark.parametrize("dst", list(LOW))
@pytest.mark.parametrize("src", ["float64", "float32", "bfloat16", "float16"])
def test_cast_to_a_low_dtype(src, dst, where):
    src, dst = np.dtype(LOW.get(src, src)), LOW[dst]
    with np.errstate(over="ignore"):
        x = CAST_VALUES.astype(src)
        want = x.astype(dst)
    cot = (np.arange(x.size) % 7 - 3).astype(dst)  # exact in every dtype

    def f(v):
        return rnp.cast(v, dst), v.astype(dst), rp.grad(rnp.sum(rnp.cast(v, dst) * cot), v)

    got = _call(f, [x], where)
    for y in got[:2]:
        assert y.dtype == dst
        np.testing.assert_array_equal(y.astype(F64), want.astype(F64))
        assert np.array_equal(np.signbit(y.astype(F64)), np.signbit(want.astype(F64)))
    assert got[2].dtype == src
    np.testing.assert_array_equal(got[2], cot.astype(src))


@pytest.mark.skipif(not HAVE_JAX, reason="jax not installed")
def test_jax_gather_beside_a_window_gradient():
    """Found batching this table on JAX (any dtype): a segment that gathers with an index array
    runs under checkify's index checks, whose scatter check failed on the index-free
    scatter_add of conv2d's window gradient ('attempt to get argmin of an empty sequence')."""

    def f(a, w, i):
        return a[0, 0, 0][i], rp.grad(rnp.sum(rnp.conv2d(a, w)), a)

    args = [np.ones((1, 1, 2, 2), rp.bfloat16), np.ones((1, 1, 1, 1), rp.bfloat16), np.array([0])]
    for got, want in zip(_call(f, args, "jax"), _call(f, args, "numpy")):
        assert got.dtype == want.dtype
        np.testing.assert_array_equal(got, want)
