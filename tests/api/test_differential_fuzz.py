"""A differential fuzzer: random ops, dtypes, shapes and values, each result compared with NumPy's
(values and dtype) in every mode — eager, graph on the NumPy backend, graph on JAX, and
constant-folded (the compiler computes a step whose inputs are constants) — and each float64
gradient with central finite differences of the NumPy reference (eager and graph).

Per op, Hypothesis draws the dtypes, shapes and values, derandomized and few
(``REPLICATE_FUZZ_EXAMPLES=50`` explores afresh), so the run stays short; ``tests/test_fuzz.py``
checks the other property (a call either works or raises the library's own error).
"""

from __future__ import annotations

import importlib.util
import os

import numpy as np
import pytest

hypothesis = pytest.importorskip("hypothesis")
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

import replicate as rp  # noqa: E402
import replicate.numpy as rnp  # noqa: E402

EXAMPLES = int(os.environ.get("REPLICATE_FUZZ_EXAMPLES", "0"))


def _settings(n):
    return settings(max_examples=EXAMPLES or n, deadline=None, derandomize=not EXAMPLES,
                    database=None, suppress_health_check=list(HealthCheck))


MODES = ["eager", "numpy", "folded"] + (["jax"] if importlib.util.find_spec("jax") else [])
DTYPES = ["bool", "int8", "uint8", "int32", "int64", "float16", "float32", "float64"]
# name -> (arity, differentiable); the function is rnp's and np's of that name
OPS = {
    **{n: (1, True) for n in ("exp", "log", "sqrt", "tanh", "sin", "cos", "tan", "arcsinh",
                              "arctan", "log2", "log10", "log1p", "expm1", "abs", "negative",
                              "square", "sinh")},
    **{n: (1, False) for n in ("sign", "floor", "ceil", "trunc", "round", "logical_not",
                               "isfinite", "isnan", "invert", "signbit")},
    **{n: (2, True) for n in ("add", "subtract", "multiply", "divide", "maximum", "minimum",
                              "arctan2", "logaddexp", "power", "copysign", "hypot")},
    **{n: (2, False) for n in ("floor_divide", "mod", "equal", "less", "greater_equal",
                               "logical_and", "logical_xor", "bitwise_and", "left_shift")},
    **{n: (1, True) for n in ("sum", "mean", "prod", "max", "var", "std", "cumsum", "sort")},
}
REDUCTIONS = {"sum", "mean", "prod", "max", "var", "std", "cumsum", "sort"}

shapes = st.lists(st.integers(1, 3), min_size=0, max_size=3).map(tuple)


@st.composite
def operands(draw, name, float64_only=False):
    arity, _ = OPS[name]
    dtype = "float64" if float64_only else draw(st.sampled_from(DTYPES))
    shape = draw(shapes)
    # the second operand broadcasts: the same shape, its trailing part, or 1s
    other = draw(st.sampled_from([shape, shape[1:], tuple(1 for _ in shape)]))
    low = 0.5 if float64_only else -4.0
    args = []
    for s in ([shape, other][:arity]):
        size = int(np.prod(s, dtype=np.int64))
        vals = draw(st.lists(st.floats(low, 4.0, allow_nan=False, width=32), min_size=size,
                             max_size=size))
        a = np.array(vals, np.float64).reshape(s)
        if np.dtype(dtype).kind != "f":
            a = np.round(a)
        args.append(a.astype(dtype))
    return args


def _reference(name, args):
    fn = getattr(np, name)
    with np.errstate(all="ignore"):
        if name in ("sum", "mean", "prod", "max", "var", "std"):
            return fn(args[0], axis=-1) if args[0].ndim else fn(args[0])
        if name in ("cumsum", "sort"):
            return fn(args[0], axis=-1) if args[0].ndim else None
        return fn(*args)


def _ours(name, args):
    fn = getattr(rnp, name)
    if name in REDUCTIONS:
        return fn(args[0], axis=-1) if args[0].ndim else fn(args[0])
    return fn(*args)


def _tolerance(dtype, mode):
    return {"float16": 2e-3, "float32": 2e-5}.get(np.dtype(dtype).name, 1e-12 if mode != "jax"
                                                  else 1e-10)


def _run(name, args, mode):
    with np.errstate(all="ignore"):
        if mode == "eager":
            return np.asarray(_ours(name, [rnp.asarray(a) for a in args]))
        if mode == "folded":
            return np.asarray(rp.function(lambda: _ours(name, [rnp.asarray(a) for a in args]))())
        return np.asarray(rp.function(lambda *xs: _ours(name, xs), backend=mode)(*args))


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("name", sorted(OPS))
@_settings(4)
@given(data=st.data())
def test_values_and_dtypes_are_numpys(name, mode, data):
    args = data.draw(operands(name))
    try:
        want = _reference(name, args)
    except (TypeError, ValueError):  # NumPy refuses it (bitwise ops of floats, ...)
        return
    if want is None or np.asarray(want).dtype.kind not in "biuf" or (
            name == "power" and np.asarray(args[1]).dtype.kind in "iu"
            and (np.asarray(args[1]) < 0).any()):
        return
    want = np.asarray(want)
    if name == "round" and args[0].dtype == np.bool_:
        want = args[0]  # deliberate: rnp.round keeps bools (tests/test_numpy_dtypes.py)
    got = _run(name, args, mode)
    assert got.dtype == want.dtype and got.shape == want.shape, (name, got.dtype, want.dtype)
    if want.dtype.kind == "f":
        tol = _tolerance(want.dtype, mode)
        np.testing.assert_allclose(got.astype(np.float64), want.astype(np.float64), rtol=tol,
                                   atol=tol, equal_nan=True, err_msg=f"{name} {mode}")
    else:
        np.testing.assert_array_equal(got, want, err_msg=f"{name} {mode}")


def _finite_differences(name, args, cot, eps=1e-6):
    grads = []
    for i, a in enumerate(args):
        g = np.zeros_like(a)
        for j in np.ndindex(a.shape):
            up, down = [x.copy() for x in args], [x.copy() for x in args]
            up[i][j] += eps
            down[i][j] -= eps
            g[j] = (np.sum(_reference(name, up) * cot) - np.sum(_reference(name, down) * cot)) \
                / (2 * eps)
        grads.append(g)
    return grads


@pytest.mark.parametrize("mode", ["eager", "graph"])
@pytest.mark.parametrize("name", sorted(n for n, (_, grad) in OPS.items() if grad))
@_settings(2)
@given(data=st.data())
def test_gradients_match_finite_differences(name, mode, data):
    args = data.draw(operands(name, float64_only=True))
    want = _reference(name, args)
    values = np.concatenate([a.reshape(-1) for a in args])
    if want is None or name in ("maximum", "minimum", "max", "sort") and np.unique(
            values).size < values.size:  # a tie: no derivative (the two sides differ)
        return
    cot = np.linspace(-1.0, 1.5, np.asarray(want).size).reshape(np.shape(want))

    def loss(*xs):
        return rp.grad(rnp.sum(_ours(name, xs) * cot), list(xs))

    got = rp.function(loss, mode=mode)(*args)
    for g, w in zip(got, _finite_differences(name, args, cot)):
        np.testing.assert_allclose(np.asarray(g), w, rtol=1e-5, atol=1e-6, err_msg=name)
