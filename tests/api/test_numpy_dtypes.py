"""The op namespace gives NumPy's dtypes and values, the class closed (issue 30).

* The table: every elementwise function of ``replicate.numpy`` (the modules ``_elementwise``,
  whose ``__all__`` is computed, so a new op is in the table without an edit, ``_bitwise`` and
  ``_signs``;
  and every
  elementwise primitive of the registry must be reached by one of them), for every input
  dtype (bool, int8, uint8, int32, int64, float16, float32, float64), gives NumPy's result
  dtype and values — or refuses where NumPy refuses — in eager mode, in graph mode on the
  numpy, jax and cupy (the stand-in without a GPU) backends, and constant-folded. Where the
  project deliberately differs, ``DIFFERS`` says so and why.
* The single fixes: ``~`` (bitwise not of integers, not ``logical_not``), ``&``/``|``/``^``/
  ``<<``/``>>`` NumPy's bitwise ops (shifts by any count), ``full``'s dtype from its fill value,
  a 0-d boolean index.
"""

from __future__ import annotations

import inspect
import math
import warnings

import numpy as np
import pytest

import replicate as rp
import replicate.numpy as rnp
from replicate.backends import available
from replicate.graph.primitives import REGISTRY
from replicate.numpy import _bitwise, _elementwise, _signs

DTYPES = ["bool", "int8", "uint8", "int32", "int64", "float16", "float32", "float64"]
FLOATS = ("float16", "float32", "float64")

# three operands per dtype; the second has no negative integers (an integer to a negative
# integer power raises, in NumPy when it runs, here already when traced) and holds a 0
VALUES = {
    "bool": ([False, True, True, False, True, False], [True, False, True, True, False, False],
             [True, True, False, False, True, False]),
    "signed": ([-3, -1, 0, 1, 2, 5], [1, 2, 0, 3, 1, 2], [3, 1, 2, 5, 0, 2]),
    "unsigned": ([0, 1, 2, 3, 5, 7], [1, 2, 0, 3, 1, 2], [3, 1, 2, 5, 0, 2]),
    "float": ([-2.5, -1.0, -0.0, 0.5, 1.0, 3.0], [0.5, 2.0, 0.0, -1.5, 1.0, 3.0],
              [3.0, 1.0, 2.5, 5.0, -0.0, 2.0]),
}


def operands(dtype) -> list[np.ndarray]:
    kind = {"b": "bool", "i": "signed", "u": "unsigned", "f": "float"}[np.dtype(dtype).kind]
    return [np.array(v, dtype) for v in VALUES[kind]]


def _as_float64(fn):
    """A reference for an op NumPy lacks: ``fn`` computed in float64, in the dtype NumPy's float
    ufuncs (``np.exp``) give the input."""
    return lambda x: np.asarray(fn(x.astype(np.float64))).astype(np.exp(x).dtype)


# NumPy has no function of these names; their references
REFERENCES = {
    "erf": _as_float64(np.vectorize(math.erf, otypes=[np.float64])),
    "rsqrt": _as_float64(lambda x: 1.0 / np.sqrt(x)),
    "sigmoid": _as_float64(lambda x: 1.0 / (1.0 + np.exp(-x))),
    "softplus": _as_float64(lambda x: np.logaddexp(0.0, x)),
    "stop_gradient": lambda x: x,
}
ARITY = {"clip": 3}  # (x, lo, hi): its bounds are optional in the signature
EXTRA = {"astype": ("float32",)}  # arguments after the arrays, the same for both

# Where the project deliberately differs from NumPy: (function, input dtype) -> why. "values":
# the dtype is NumPy's, some values are not; "refused": an error where NumPy gives a value;
# anything else: the dtype differs.
DIFFERS = {
    ("round", "bool"): "kept bool, as floor and ceil (NumPy's rint makes bools float16); "
                       "documented in rnp.round",
    **{("reciprocal", i): "values: 1 / 0 is 0, the project's integer division by 0 (NumPy's "
                          "is the most negative integer here, 0 for 8-bit integers: the "
                          "platform's); documented in rnp.reciprocal"
       for i in ("int32", "int64")},
}


def functions() -> dict:
    """name -> (rnp function, NumPy reference, number of array operands)."""
    table = {}
    for name in [*_elementwise.__all__, *_bitwise.__all__, *_signs.__all__]:
        fn = getattr(rnp, name)
        required = [p for p in inspect.signature(fn).parameters.values()
                    if p.default is inspect.Parameter.empty]
        arity = ARITY.get(name, len(required) - len(EXTRA.get(name, ())))
        table[name] = (fn, REFERENCES.get(name) or getattr(np, name), arity)
    return table


FUNCTIONS = functions()


def call_each(args, library: bool) -> dict:
    """name -> result (a tuple of arrays) or the exception it raised, for every function."""
    out = {}
    for name, (fn, ref, arity) in FUNCTIONS.items():
        try:
            out[name] = (fn if library else ref)(*args[:arity], *EXTRA.get(name, ()))
        except Exception as e:  # noqa: BLE001 - recorded, then compared with NumPy's
            out[name] = e
    return out


def numpy_results(dtype) -> dict:
    with warnings.catch_warnings(), np.errstate(all="ignore"):
        warnings.simplefilter("ignore")
        return call_each(operands(dtype), library=False)


def library_results(dtype, mode) -> dict:
    """Every function's result as NumPy arrays (or its exception), run in ``mode``: "eager",
    "folded" (graph mode on constants: the constant-folding pass computes it) or "graph-<backend>"
    (one compiled step holding every function that traced)."""
    args = operands(dtype)
    with warnings.catch_warnings(), np.errstate(all="ignore"):
        warnings.simplefilter("ignore")
        if mode == "eager":
            got = call_each([rnp.asarray(a) for a in args], library=True)
            return {k: v if isinstance(v, Exception) else np.asarray(v) for k, v in got.items()}
        errors = {}

        def step(*xs):
            got = call_each([rnp.asarray(a) for a in (xs or args)], library=True)
            errors.update({k: v for k, v in got.items() if isinstance(v, Exception)})
            return {k: v for k, v in got.items() if not isinstance(v, Exception)}

        if mode == "folded":
            values = rp.function(step)()
        else:
            values = rp.function(step, backend=mode.split("-", 1)[1])(*args)
    return {**{k: np.asarray(v) for k, v in values.items()}, **errors}


def tolerance(dtype) -> dict:
    return {"float16": dict(rtol=2e-3, atol=1e-3), "float32": dict(rtol=1e-5, atol=1e-6),
            "float64": dict(rtol=1e-10, atol=1e-12)}.get(np.dtype(dtype).name,
                                                         dict(rtol=0, atol=0))


def differences(dtype, mode) -> list[str]:
    """One line per function whose dtype, value or refusal differs from NumPy's (and is not an
    entry of ``DIFFERS``)."""
    want, got = numpy_results(dtype), library_results(dtype, mode)
    problems = []
    for name in FUNCTIONS:
        w, g = want[name], got[name]
        why = DIFFERS.get((name, dtype), "")
        if why and not why.startswith("values"):
            continue
        if isinstance(w, Exception) or isinstance(g, Exception):
            if isinstance(w, Exception) != isinstance(g, Exception):
                problems.append(f"{name}({dtype}): NumPy {w!r:.80}, rnp {g!r:.80}")
            continue
        w = np.asarray(w)
        if g.dtype != w.dtype or g.shape != w.shape:
            problems.append(f"{name}({dtype}): {g.dtype}{list(g.shape)}, NumPy's "
                            f"{w.dtype}{list(w.shape)}")
        elif why:
            continue
        elif not np.allclose(g, w, equal_nan=True, **tolerance(w.dtype)):
            problems.append(f"{name}({dtype}): {g.tolist()}, NumPy's {w.tolist()}")
    return problems


def _backend(name):
    return pytest.param(f"graph-{name}", marks=pytest.mark.skipif(
        name not in available(), reason=f"the {name} backend is not available"))


MODES = ["eager", "folded", _backend("numpy"), _backend("jax"), _backend("cupy")]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("mode", MODES)
def test_every_elementwise_function_gives_numpys_dtype_and_values(mode, dtype):
    assert differences(dtype, mode) == []


def test_the_table_reaches_every_elementwise_primitive():
    """A new elementwise primitive is in the table through its rnp function: each one is bound
    by some function of the table on some dtype (seen on eager mode's tape)."""
    reached = set()
    with warnings.catch_warnings(), np.errstate(all="ignore"):
        warnings.simplefilter("ignore")
        for dtype in DTYPES:
            reached |= primitives_bound(dtype)
    elementwise = {name for name, p in REGISTRY.items() if p.elementwise}
    assert elementwise - reached == set()


def primitives_bound(dtype) -> set:
    """The primitives the table's functions bind on operands of ``dtype``."""
    reached = set()
    args = [rnp.asarray(a) for a in operands(dtype)]
    for name, (fn, _, arity) in FUNCTIONS.items():
        try:
            out = fn(*args[:arity], *EXTRA.get(name, ()))
        except Exception:  # noqa: BLE001 - refused for this dtype
            continue
        reached |= {n.prim for n in tape(out)}
    return reached


def tape(out) -> list:
    """The nodes of an eager result's tape."""
    seen, stack, nodes = set(), [out], []
    while stack:
        node = stack.pop().node
        if node is None or id(node) in seen:
            continue
        seen.add(id(node))
        nodes.append(node)
        stack.extend(node.inputs)
    return nodes


def test_the_exceptions_are_still_exceptions():
    """Every entry of ``DIFFERS`` still differs in eager mode (a fixed one must leave the
    table)."""
    for name, dtype in DIFFERS:
        want, got = numpy_results(dtype)[name], library_results(dtype, "eager")[name]
        same = not isinstance(got, Exception) and np.asarray(got).dtype == np.asarray(want).dtype
        if DIFFERS[name, dtype].startswith("values"):
            same = same and np.array_equal(got, want)
        assert not same, f"{name}({dtype}) matches NumPy now: remove it from DIFFERS"


@pytest.mark.parametrize("mode", MODES)
def test_invert_is_bitwise_not_of_integers_and_logical_not_of_bools(mode):
    """``~`` was ``logical_not``: ``~[0, 6]`` gave ``[1, 0]`` (NumPy ``[-1, -7]``)."""
    ints, bools = np.array([0, 6, -128], np.int8), np.array([True, False])
    fn = lambda a, b: (~a, ~b, ~rnp.cast(a, "uint8"), rnp.invert(a))  # noqa: E731
    if mode == "eager":
        got = fn(rnp.asarray(ints), rnp.asarray(bools))
    elif mode == "folded":
        got = rp.function(lambda: fn(rnp.asarray(ints), rnp.asarray(bools)))()
    else:
        got = rp.function(fn, backend=mode.split("-", 1)[1])(ints, bools)
    want = (~ints, ~bools, ~ints.astype(np.uint8), ~ints)
    for g, w in zip(got, want):
        g = np.asarray(g)
        assert g.dtype == w.dtype and np.array_equal(g, w), (g, w)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("dtype", ["int8", "uint8", "int32", "int64"])
def test_bitwise_ops_and_shifts_by_any_count_are_numpys(mode, dtype):
    """``&``, ``|``, ``^``, ``<<``, ``>>`` (and reflected) were refused on integers. Shifts are
    NumPy's at every count: by the width or more, or by a negative count, every bit is shifted out
    (0, or -1 for a right shift of a negative number), where C's shift is undefined."""
    info = np.iinfo(dtype)
    edges = np.array(sorted(v for v in {info.min, info.min + 1, -7, -1, 0, 1, 2, 7, info.max}
                            if info.min <= v <= info.max), dtype)
    counts = np.array([c for c in (-100, -9, -1, 0, 1, 7, 8, 9, 15, 16, 31, 32, 33, 63, 64, 65,
                                   100) if info.min <= c <= info.max], dtype)
    a, b = (v.reshape(-1) for v in np.meshgrid(edges, counts))
    c = np.resize(edges[::-1], a.size)
    def fn(a, b, c, xp=rnp):
        return (a & c, a | c, a ^ c, a << b, a >> b, xp.bitwise_and(a, 6), 5 & a, 5 | a, 5 ^ a,
                3 << b, 100 >> b, a << 1, c >> 2, xp.bitwise_left_shift(a, b),
                xp.bitwise_right_shift(a, b), xp.left_shift(c, b), xp.right_shift(c, b))

    if mode == "eager":
        got = fn(*map(rnp.asarray, (a, b, c)))
    elif mode == "folded":
        got = rp.function(lambda: fn(*map(rnp.asarray, (a, b, c))))()
    else:
        got = rp.function(fn, backend=mode.split("-", 1)[1])(a, b, c)
    want = fn(a, b, c, xp=np)
    for k, (g, w) in enumerate(zip(got, want)):
        g = np.asarray(g)
        assert g.dtype == w.dtype and np.array_equal(g, w), (k, g, w)


@pytest.mark.parametrize("mode", MODES)
def test_bitwise_ops_of_bools_are_logical_and_shifts_make_them_int8(mode):
    """``&``/``|``/``^`` of bools are the logical ops (bool); shifts of bools are int8 (NumPy);
    a bool with an integer promotes as NumPy."""
    p, q = np.array([True, True, False, False]), np.array([True, False, True, False])
    n = np.array([3, -1, 0, 7], np.int8)
    def fn(p, q, n, xp=rnp):
        return p & q, p | q, p ^ q, p << q, p >> q, p & n, q | 2, xp.bitwise_xor(p, True), True ^ p

    if mode == "eager":
        got = fn(*map(rnp.asarray, (p, q, n)))
    elif mode == "folded":
        got = rp.function(lambda: fn(*map(rnp.asarray, (p, q, n))))()
    else:
        got = rp.function(fn, backend=mode.split("-", 1)[1])(p, q, n)
    want = fn(p, q, n, xp=np)
    for k, (g, w) in enumerate(zip(got, want)):
        g = np.asarray(g)
        assert g.dtype == w.dtype and np.array_equal(g, w), (k, g, w)


def test_bitwise_ops_of_floats_are_refused():
    f, i = rnp.asarray([1.0, 2.0]), rnp.asarray([1, 2])
    for op in (lambda: f & i, lambda: i | 1.5, lambda: f << 1, lambda: rnp.right_shift(i, f)):
        with pytest.raises(rp.DTypeError, match="needs integers or bools"):
            op()
    assert rnp.logical_and(i, rnp.asarray([0, 3])).tolist() == [False, True]


@pytest.mark.parametrize("fill, dtype", [(True, "bool"), (16777217, "int64"), (0.5, "float32"),
                                         (np.float64(0.1), "float64"), (np.int8(3), "int8")])
def test_full_takes_its_dtype_from_the_fill_value(fill, dtype):
    """``full`` was float32 whatever the fill: 16777217 became 16777216.0, True 1.0."""
    x = rnp.full((2,), fill)
    assert x.dtype == dtype and x.tolist() == np.full((2,), fill, dtype).tolist()
    assert rnp.full((2,), 3, "float64").dtype == np.float64
    assert rnp.zeros(2).dtype == rnp.ones(2).dtype == rnp.eye(2).dtype == np.float32


@pytest.mark.parametrize("mode", ["graph", "eager"])
def test_a_0d_boolean_index_adds_an_axis_of_length_1_or_0(mode):
    """``Array(False)[Array(False)]`` crashed with NumPy's "Calling nonzero on 0d arrays"."""
    x = np.arange(6).reshape(2, 3)
    keys = [(np.True_,), (np.False_,), (Ellipsis, np.False_), (slice(None), np.True_),
            (None, np.False_, slice(1, None)), (True,)]
    for key in keys:
        got = rp.function(lambda v, k=key: v[tuple(
            rnp.asarray(i) if isinstance(i, np.bool_) else i for i in k)], mode=mode)(x)
        assert np.asarray(got).shape == x[key].shape and np.array_equal(got, x[key]), key
    assert rnp.asarray(False)[rnp.asarray(False)].shape == (0,)
    with pytest.raises(rp.ReplicateError, match="0-d boolean index beside"):
        rnp.asarray(x)[0, rnp.asarray(True)]
