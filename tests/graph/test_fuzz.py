"""Property-based tests: random shapes, dtypes and arguments thrown at the ops (``replicate.numpy``,
eager) and at the tracer (``rp.function``, graph mode, with and without ``rp.grad``).

The property: a call either succeeds in both modes with the same result — dtype, shape, values
within the dtype's tolerance, NaN in the same places — or raises the library's own
``ReplicateError`` (a subclass: ``ShapeError``, ``TracerConversionError``, ...) of the same class in
both. Nothing else escapes: no IndexError, ValueError, AxisError or AssertionError from inside.

Values that only exist when a compiled step runs (a traced index out of range, a traced
integer array as a negative integer power) fail at run time as in NumPy, so the fuzzer does not
draw them; the same values given concretely are library errors.

Python-level misuse — an argument of the wrong Python type, such as a float where an axis (an
int) is expected, or the wrong number of arguments — may raise ``TypeError``, as it does in NumPy;
``test_wrong_python_types`` holds the library to that (TypeError or ReplicateError, nothing else).
"""

from __future__ import annotations

import os
import warnings

import numpy as np
import pytest

hypothesis = pytest.importorskip("hypothesis")
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

import replicate as rp  # noqa: E402
import replicate.numpy as rnp  # noqa: E402
from replicate import tree  # noqa: E402
from replicate.dtypes import is_supported  # noqa: E402

# A fixed, quick sample by default; REPLICATE_FUZZ_EXAMPLES=2000 explores afresh (random seeds).
EXAMPLES = int(os.environ.get("REPLICATE_FUZZ_EXAMPLES", "0"))
SETTINGS = settings(max_examples=EXAMPLES or 60, deadline=None, derandomize=not EXAMPLES,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much,
                                           HealthCheck.data_too_large], database=None)
SUPPORTED = ["float16", "float32", "float64", "int32", "int64", "uint32", "bool"]
OTHER = ["int8", "uint8", "int16", "uint64", "complex64"]  # not the library's: must be refused
DTYPES = st.sampled_from(SUPPORTED + OTHER)

shapes = st.lists(st.integers(0, 4), min_size=0, max_size=4).map(tuple)
axes = st.one_of(st.none(), st.integers(-5, 5), st.lists(st.integers(-5, 5), max_size=3)
                 .map(tuple))


@st.composite
def arrays(draw, shape=None, dtype=None):
    shape = draw(shapes) if shape is None else shape
    dtype = draw(DTYPES if dtype is None else st.just(dtype) if isinstance(dtype, str) else dtype)
    dtype = np.dtype(dtype)
    size = int(np.prod(shape, dtype=np.int64))
    values = draw(st.lists(st.floats(-3, 3, allow_nan=False), min_size=size, max_size=size))
    return np.array(values, np.float64).reshape(shape).astype(dtype)


UNARY = ["abs", "negative", "exp", "log", "sqrt", "tanh", "sin", "cos", "sign", "square",
         "sigmoid", "softplus", "expm1", "log1p", "rsqrt", "reciprocal", "logical_not",
         "isfinite", "stop_gradient", "ravel", "squeeze", "transpose"]
BINARY = ["add", "subtract", "multiply", "divide", "true_divide", "maximum", "minimum", "power",
          "floor_divide", "equal", "less", "greater_equal", "logical_and", "logical_or",
          "matmul", "dot"]
REDUCE = ["sum", "mean", "max", "min", "prod", "var", "std", "logsumexp", "argmax", "argmin"]


def library_only(call):
    """Run ``call()``; return its result, or None if it raised a ReplicateError. Anything else
    fails the test."""
    out = outcome(call)
    return None if isinstance(out, rp.ReplicateError) else out


def outcome(call):
    """``call()``'s result, or the ReplicateError it raised; anything else fails the test."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # NumPy's overflow and invalid-value notes
            with np.errstate(all="ignore"):
                return call()
    except rp.ReplicateError as e:
        return e


# how close eager and traced results must be, by dtype: the two modes run the same NumPy rows,
# but graph mode may fuse, fold constants and reorder a little (one rounding apart per op)
TOLERANCE = {"float16": (2e-3, 1e-3), "float32": (2e-6, 1e-6), "float64": (1e-12, 1e-13)}


def assert_same_values(eager, traced):
    """The same dtype and shape; floats equal within their dtype's tolerance, NaN and infinities
    in the same places; everything else exactly equal."""
    e, t = np.asarray(eager), np.asarray(traced)
    assert (e.shape, e.dtype) == (t.shape, t.dtype), (e.shape, e.dtype, t.shape, t.dtype)
    rtol, atol = TOLERANCE.get(e.dtype.name, (0, 0))
    np.testing.assert_allclose(t, e, rtol=rtol, atol=atol, equal_nan=True, strict=True,
                               err_msg="traced (actual) against eager (desired)")


def refused_argument(args) -> bool:
    """An argument of a dtype the library does not take (complex, int8, ...)."""
    return any(isinstance(a, np.ndarray) and not is_supported(a.dtype) for a in args)


def both_modes(fn, *args):
    """``fn(*args)`` eager, then traced by ``rp.function``: the same values (``assert_same_values``)
    or the same library error in both. Returns the two results (None, None on an error)."""
    eager = outcome(lambda: fn(*args))
    traced = outcome(lambda: rp.function(fn)(*args))
    failed = [isinstance(x, rp.ReplicateError) for x in (eager, traced)]
    if any(failed):
        said = f"eager: {type(eager).__name__}: {eager}\ntraced: {type(traced).__name__}: {traced}"
        if refused_argument(args):
            # traced mode refuses the argument before anything runs; eager mode may meet
            # another mistake of the same call first (clip's bounds that do not broadcast)
            assert all(failed) and isinstance(traced, rp.DTypeError), said
        else:
            assert type(eager) is type(traced), said
        return None, None
    (leaves_e, tree_e), (leaves_t, tree_t) = (tree.flatten(x) for x in (eager, traced))
    assert tree_e == tree_t, (tree_e, tree_t)
    for e, t in zip(leaves_e, leaves_t):
        assert_same_values(e, t)
    return eager, traced


@SETTINGS
@given(st.sampled_from(UNARY), arrays())
def test_unary_ops(name, x):
    both_modes(getattr(rnp, name), x)


@SETTINGS
@given(st.sampled_from(BINARY), arrays(), arrays())
def test_binary_ops(name, a, b):
    if name == "power" and b.dtype.kind in "iu":
        both_modes(lambda x: rnp.power(x, b), a)  # the negative exponents: concrete
        b = np.abs(b)
    both_modes(getattr(rnp, name), a, b)


@SETTINGS
@given(st.sampled_from(BINARY), arrays(), st.one_of(st.integers(-3, 3), st.floats(-2, 2),
                                                     st.booleans()))
def test_binary_ops_with_python_scalars(name, a, s):
    both_modes(lambda x: getattr(rnp, name)(x, s), a)
    if name == "power" and a.dtype.kind in "iu":
        a = np.abs(a)  # not a traced negative integer power
    both_modes(lambda x: getattr(rnp, name)(s, x), a)


@SETTINGS
@given(st.sampled_from(REDUCE), arrays(), axes, st.booleans())
def test_reductions(name, x, axis, keepdims):
    fn = getattr(rnp, name)
    if name in ("argmax", "argmin") and isinstance(axis, tuple):
        axis = axis[0] if axis else None
    both_modes(lambda v: fn(v, axis=axis, keepdims=keepdims), x)


@SETTINGS
@given(arrays(), st.lists(st.integers(-1, 6), max_size=4).map(tuple))
def test_reshape(x, shape):
    both_modes(lambda v: rnp.reshape(v, shape), x)


@SETTINGS
@given(arrays(), st.lists(st.integers(-5, 5), max_size=5).map(tuple))
def test_transpose_with_axes(x, perm):
    both_modes(lambda v: rnp.transpose(v, perm), x)


@SETTINGS
@given(arrays(), st.integers(-5, 5), st.integers(-5, 5))
def test_swap_move_expand_squeeze(x, a, b):
    both_modes(lambda v: rnp.swapaxes(v, a, b), x)
    both_modes(lambda v: rnp.moveaxis(v, a, b), x)
    both_modes(lambda v: rnp.expand_dims(v, a), x)
    both_modes(lambda v: rnp.squeeze(v, a), x)


@SETTINGS
@given(arrays(), shapes)
def test_broadcast_to(x, shape):
    both_modes(lambda v: rnp.broadcast_to(v, shape), x)


@SETTINGS
@given(st.lists(arrays(), min_size=1, max_size=3), st.integers(-4, 4))
def test_concatenate_and_stack(xs, axis):
    both_modes(lambda *v: rnp.concatenate(list(v), axis=axis), *xs)
    both_modes(lambda *v: rnp.stack(list(v), axis=axis), *xs)


@SETTINGS
@given(arrays(), st.integers(1, 4), st.integers(-3, 3))
def test_split(x, sections, axis):
    both_modes(lambda v: rnp.split(v, sections, axis=axis), x)


@SETTINGS
@given(arrays(), st.lists(st.tuples(st.integers(0, 2), st.integers(0, 2)), max_size=4))
def test_pad(x, widths):
    both_modes(lambda v: rnp.pad(v, widths), x)


index_items = st.one_of(
    st.integers(-5, 5), st.none(), st.just(Ellipsis),
    st.builds(slice, st.one_of(st.none(), st.integers(-5, 5)),
              st.one_of(st.none(), st.integers(-5, 5)),
              st.one_of(st.none(), st.integers(-3, 3).filter(bool))),
    st.lists(st.integers(-4, 4), min_size=1, max_size=3).map(np.array),
)


@SETTINGS
@given(arrays(), st.lists(index_items, max_size=4).map(tuple))
def test_getitem(x, key):
    both_modes(lambda v: rnp.asarray(v)[key], x)


@SETTINGS
@given(arrays(), st.lists(st.integers(-4, 4), max_size=4).map(np.array),
       st.one_of(st.none(), st.integers(-3, 3)))
def test_take_and_one_hot(x, idx, axis):
    both_modes(lambda v: rnp.take(v, idx, axis=axis), x)
    both_modes(lambda: rnp.one_hot(idx, 5))


@SETTINGS
@given(arrays(), arrays(), arrays())
def test_where_and_clip(c, a, b):
    both_modes(rnp.where, c, a, b)
    both_modes(rnp.clip, a, b, c)


@SETTINGS
@given(st.sampled_from(SUPPORTED + OTHER), st.sampled_from(SUPPORTED + OTHER), arrays())
def test_casts(src, dst, x):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # NumPy's own casts of complex and out-of-range values
        x = x.astype(src)
    both_modes(lambda v: rnp.cast(v, dst), x)


@SETTINGS
@given(arrays(shape=None), arrays(shape=None), st.sampled_from(["ij,jk->ik", "i,i->", "ij->ji",
                                                                "bij,bjk->bik", "ii->i"]))
def test_einsum(a, b, spec):
    operands = (a, b) if "," in spec else (a,)
    both_modes(lambda *v: rnp.einsum(spec, *v), *operands)


@SETTINGS
@given(st.lists(st.integers(0, 5), min_size=4, max_size=4), st.lists(st.integers(0, 4),
       min_size=4, max_size=4), st.integers(1, 3), st.integers(0, 2))
def test_conv_and_pool(xs, ws, stride, padding):
    x = np.ones(xs, np.float32)
    w = np.ones(ws, np.float32)
    both_modes(lambda a, b: rnp.conv2d(a, b, stride=stride, padding=padding), x, w)
    both_modes(lambda a: rnp.max_pool2d(a, max(1, ws[2]), stride=stride, padding=padding), x)
    both_modes(lambda a: rnp.avg_pool2d(a, max(1, ws[2]), stride=stride, padding=padding), x)


# -- gradients through random programs ---------------------------------------------------------
GRAD_UNARY = ["exp", "tanh", "sin", "sigmoid", "square", "abs", "softplus", "sqrt", "log"]


@SETTINGS
@given(st.lists(st.sampled_from(GRAD_UNARY + ["sum0", "mean-1", "T", "reshape", "bcast"]),
                min_size=1, max_size=5), arrays(dtype=st.sampled_from(["float32", "float64"])))
def test_grad_of_random_chains(chain, x):
    def fn(v):
        h = v = rnp.asarray(v)  # eager: the gradient is taken with respect to an Array
        for op in chain:
            if op == "sum0":
                h = rnp.sum(h, axis=0)
            elif op == "mean-1":
                h = rnp.mean(h, axis=-1)
            elif op == "T":
                h = h.T
            elif op == "reshape":
                h = rnp.reshape(h, (-1,))
            elif op == "bcast":
                h = rnp.broadcast_to(h, (2,) + tuple(h.shape))
            else:
                h = getattr(rnp, op)(h)
        return rp.grad(rnp.sum(h), v)

    eager, traced = both_modes(fn, x)
    if eager is not None:
        assert np.asarray(eager).shape == x.shape


# -- the tracer: Python control flow on traced values, and odd arguments --------------------------
@SETTINGS
@given(arrays(), st.sampled_from(["bool", "int", "float", "index", "len", "iter", "array"]))
def test_traced_values_used_as_python_values(x, how):
    def fn(v):
        s = rnp.sum(v)
        if how == "bool":
            return s if s > 0 else -s
        if how == "int":
            return rnp.ones(int(s))
        if how == "float":
            return float(s) + v
        if how == "index":
            return v.reshape(-1)[rnp.argmax(v.reshape(-1))] if v.size else s
        if how == "len":
            return rnp.ones(len(v)) if v.ndim else s
        if how == "iter":
            return [r for r in v] if v.ndim else s
        return np.asarray(s)

    try:
        with warnings.catch_warnings(), np.errstate(all="ignore"):
            warnings.simplefilter("ignore")
            rp.function(fn)(x)
    except rp.ReplicateError:
        pass


@SETTINGS
@given(st.one_of(st.text(max_size=3), st.none(), st.just(object()), st.just([1, [2, 3]]),
                 st.just({1, 2}), st.just(np.array([object()])), st.complex_numbers(
                     allow_nan=False, allow_infinity=False)))
def test_odd_arguments_to_a_traced_function(arg):
    library_only(lambda: rp.function(lambda v: rnp.sum(rnp.asarray(v)))(arg))
    library_only(lambda: rnp.add(arg, 1.0))


@SETTINGS
@given(st.one_of(st.floats(-3, 3), st.text(max_size=2), st.just([1.5]), st.just((0, "a"))))
def test_wrong_python_types(bad):
    """Values that only exist when a compiled step runs (a traced index out of range, a traced
integer array as a negative integer power) fail at run time as in NumPy, so the fuzzer does not
draw them; the same values given concretely are library errors.

Python-level misuse may be a TypeError (as in NumPy) or a ReplicateError; nothing else."""
    x = np.ones((2, 3), np.float32)
    for call in (lambda: rnp.sum(x, axis=bad), lambda: rnp.reshape(x, bad),
                 lambda: rnp.transpose(x, bad), lambda: rnp.expand_dims(x, bad),
                 lambda: rnp.ones(bad), lambda: rnp.cast(x, bad), lambda: rnp.split(x, bad)):
        try:
            library_only(call)
        except TypeError:
            pass
