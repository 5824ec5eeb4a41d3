"""NumPy's and the Array API's staples in ``replicate.numpy`` (issues 29 and 30): ``tril``,
``triu``, ``linspace``, ``meshgrid``, ``full_like``, ``empty``, ``eye(n, M, k)``,
``broadcast_arrays``, ``result_type``, ``can_cast``, ``split``, ``masked_fill``, ``concat``,
``permute_dims``, ``matrix_transpose``, ``vecdot``, ``astype(copy=)``, ``sort``/``argsort``
``descending=``, ``var``/``std`` ``correction=``: values and dtypes against NumPy in eager mode
and in graph mode on the numpy and jax backends, gradients against finite differences, and
the errors for bad input."""

from __future__ import annotations

import numpy as np
import pytest
from test_nn import numeric_grad  # central differences of a scalar loss

import replicate as rp
import replicate.numpy as rnp
from replicate.backends import available

MODES = ["direct", "eager", "graph-numpy"] + (["graph-jax"] if "jax" in available() else [])
DTYPES = ["bool", "int32", "int64", "float32", "float64"]


def _np(x):
    return np.asarray(x.numpy() if hasattr(x, "numpy") else x)


def run(fn, args, mode):
    """``fn(*args)`` (its outputs as NumPy arrays) in ``mode``."""
    if mode == "direct":
        out = fn(*[rnp.asarray(a) for a in args])
    elif mode == "eager":
        out = rp.function(fn, mode="eager")(*args)
    else:
        out = rp.function(fn, backend=mode.split("-", 1)[1])(*args)
    return [_np(o) for o in out] if isinstance(out, (list, tuple)) else _np(out)


def same(got, want):
    if isinstance(want, (list, tuple)):
        assert isinstance(got, list) and len(got) == len(want)
        for g, w in zip(got, want):
            same(g, w)
        return
    want = np.asarray(want)
    assert got.shape == want.shape and got.dtype == want.dtype, (got.shape, got.dtype,
                                                                  want.shape, want.dtype)
    np.testing.assert_allclose(got, want, rtol=1e-6 if want.dtype.kind == "f" else 0)


def sample(shape, dtype, seed=0):
    rng = np.random.default_rng(seed)
    if dtype == "bool":
        return rng.random(shape) > 0.5
    if np.dtype(dtype).kind == "i":
        return rng.integers(-5, 6, shape).astype(dtype)
    return rng.standard_normal(shape).astype(dtype)



def library_grad(fn, xs, cot, mode, wrt=0):
    """d sum(fn(*xs) * cot) / d xs[wrt] (``fn`` may return a list: the pieces' cotangents)."""
    def f(*args):
        out = fn(*args)
        outs, cots = (out, cot) if isinstance(out, (list, tuple)) else ([out], [cot])
        loss = sum(rnp.sum(o * c) for o, c in zip(outs, cots))
        return rp.grad(loss, args[wrt])

    if mode == "direct":
        mode = "eager"
    return run(f, xs, mode)


def np_loss(ref, cot):
    def loss(*xs):
        out = ref(*xs)
        outs, cots = (out, cot) if isinstance(out, (list, tuple)) else ([out], [cot])
        return sum(float(np.sum(o * c)) for o, c in zip(outs, cots))
    return loss


# ================================================================================================
# Values and dtypes against NumPy
# ================================================================================================
SHAPES_2D = [(3, 3), (2, 4), (4, 2), (2, 3, 4), (5,)]


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", SHAPES_2D, ids=str)
@pytest.mark.parametrize("k", [0, 1, -1, 5])
def test_tril_triu(mode, dtype, shape, k):
    x = sample(shape, dtype)
    same(run(lambda a: rnp.tril(a, k), [x], mode), np.tril(x, k))
    same(run(lambda a: rnp.triu(a, k=k), [x], mode), np.triu(x, k))


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("kw", [dict(start=0, stop=1, num=5), dict(start=2, stop=-3, num=7,
                                endpoint=False), dict(start=1, stop=10, num=1),
                                dict(start=0, stop=1, num=0),
                                dict(start=0.5, stop=2.5, num=4, dtype="float32"),
                                dict(start=0, stop=10, num=6, dtype="int64")], ids=str)
def test_linspace(mode, kw):
    want = np.linspace(**kw)
    if "dtype" not in kw:  # Python numbers: the default float, float32 (NumPy: float64)
        want = want.astype(np.float32)
    same(run(lambda a: a + rnp.linspace(**kw), [np.zeros((), want.dtype)], mode), want)


# every function that makes floats from Python numbers gives the default float, float32; what
# converts data keeps NumPy's dtype (replicate/numpy/__init__.py)
MADE = {"zeros": lambda: rnp.zeros(3), "ones": lambda: rnp.ones(3), "empty": lambda: rnp.empty(3),
        "eye": lambda: rnp.eye(2), "full": lambda: rnp.full(3, 0.5),
        "arange": lambda: rnp.arange(0, 1, 0.25), "arange-float-start": lambda: rnp.arange(2.0),
        "linspace": lambda: rnp.linspace(0, 1, 5),
        "linspace-floats": lambda: rnp.linspace(0.5, 2.5)}
KEPT = {"asarray": (lambda: rnp.asarray([0.5]), "float64"),
        "arange-int": (lambda: rnp.arange(3), "int64"),
        "arange-np-float64": (lambda: rnp.arange(np.float64(0), 1, 0.25), "float64"),
        "linspace-np-float64": (lambda: rnp.linspace(np.float64(0), 1, 5), "float64"),
        "linspace-float32-array": (lambda: rnp.linspace(rnp.asarray(np.float32(0)), 1, 5),
                                   "float32"),
        "full-np-float64": (lambda: rnp.full(3, np.float64(0.5)), "float64"),
        "full-int": (lambda: rnp.full(3, 2), "int64"), "full-bool": (lambda: rnp.full(3, True),
                                                                     "bool")}


@pytest.mark.parametrize("name", sorted(MADE))
def test_made_from_python_numbers_is_the_default_float(name):
    assert rnp.asarray(MADE[name]()).dtype == np.float32
    assert rp.function(MADE[name])().dtype == np.float32  # traced: the same constant


@pytest.mark.parametrize("name", sorted(KEPT))
def test_converted_data_keeps_numpys_dtype(name):
    fn, dtype = KEPT[name]
    assert rnp.asarray(fn()).dtype == np.dtype(dtype)


# where float32 would change the values beyond rounding — distinct ones made one (past 2**24) or
# a finite one made infinite — the default float is refused with a DTypeError, never a silently
# repeated or infinite value; float64 asked for gives NumPy's
REFUSED = {"arange-past-2**24": (lambda **kw: rnp.arange(0.0, 2e7, **kw), "both become"),
           "linspace-past-2**24": (lambda **kw: rnp.linspace(16777216, 16777220, 5, **kw),
                                   "both become"),
           "linspace-overflow": (lambda **kw: rnp.linspace(0, 1e39, 3, **kw), "becomes inf"),
           "full-overflow": (lambda **kw: rnp.full(2, 1e39, **kw), "becomes inf")}


@pytest.mark.parametrize("mode", ["eager", "graph"])
@pytest.mark.parametrize("name", sorted(REFUSED))
def test_float32_that_would_change_the_values_is_refused(name, mode):
    make, said = REFUSED[name]
    with pytest.raises(rp.DTypeError, match=f"{said}.*dtype=rnp.float64"):
        rp.function(lambda: make(), mode=mode)()
    want = {"arange-past-2**24": lambda: np.arange(0.0, 2e7),
            "linspace-past-2**24": lambda: np.linspace(16777216, 16777220, 5),
            "linspace-overflow": lambda: np.linspace(0, 1e39, 3),
            "full-overflow": lambda: np.full(2, 1e39)}[name]()
    np.testing.assert_array_equal(rp.function(lambda: make(dtype=rnp.float64), mode=mode)(), want)


@pytest.mark.parametrize("args", [(5,), (0, 1, 0.25), (2.0,), (-1.5, 2, 0.5), (1, 10, 3)], ids=str)
def test_arange_values_are_numpys(args):
    want = np.arange(*args)
    got = np.asarray(rnp.arange(*args))
    assert got.dtype == (np.float32 if want.dtype == np.float64 else want.dtype)
    np.testing.assert_array_equal(got, want.astype(got.dtype))


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("indexing", ["xy", "ij"])
@pytest.mark.parametrize("sparse", [False, True])
@pytest.mark.parametrize("n", [1, 2, 3])
def test_meshgrid(mode, indexing, sparse, n):
    xs = [sample((2,), "int32", 1), sample((3,), "float32", 2), sample((1, 4), "float64", 3)][:n]
    same(run(lambda *a: rnp.meshgrid(*a, indexing=indexing, sparse=sparse), xs, mode),
         list(np.meshgrid(*xs, indexing=indexing, sparse=sparse)))


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("fill", [2.7, 3, True, -1])
def test_full_like(mode, dtype, fill):
    x = sample((2, 3), dtype)
    same(run(lambda a: rnp.full_like(a, fill), [x], mode), np.full_like(x, fill))
    same(run(lambda a: rnp.full_like(a, fill, dtype="float64"), [x], mode),
         np.full_like(x, fill, dtype="float64"))


def test_full_like_of_a_traced_fill_value():
    x = np.zeros((2, 3), "float32")
    same(run(lambda a, v: rnp.full_like(a, v), [x, np.float64(1.5)], "graph-numpy"),
         np.full((2, 3), 1.5, "float32"))


def test_empty_eye():
    assert rnp.empty((2, 3)).dtype == np.float32 and not rnp.empty((2, 3)).numpy().any()
    same(_np(rnp.empty((0, 2), "int64")), np.empty((0, 2), "int64"))
    for n, m, k in [(3, None, 0), (2, 4, 1), (3, 2, 0), (4, 2, -1), (3, 3, 5), (0, 2, 0)]:
        same(_np(rnp.eye(n, m, k)), np.eye(n, m, k, dtype="float32"))
        same(_np(rnp.eye(n, M=m, k=k, dtype="int32")), np.eye(n, m, k, dtype="int32"))


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("shapes", [[(2, 1), (3,)], [(1,), (4, 1, 2), ()], [(2, 3)]], ids=str)
def test_broadcast_arrays(mode, shapes):
    xs = [sample(s, d) for s, d in zip(shapes, ["float32", "int64", "bool"])]
    same(run(lambda *a: rnp.broadcast_arrays(*a), xs, mode), list(np.broadcast_arrays(*xs)))


@pytest.mark.parametrize("args", [
    ("int8", 1), ("int32", "float32"), ("int32", np.float32, 1.0), ("bool", 3), (np.int64, "uint8"),
    ("float16", 1.0), ("bool",), (1.0,), (1,), ("int8", "uint8"), ("float32", 2**40)], ids=str)
def test_result_type(args):
    want = np.result_type(*args)
    assert rnp.result_type(*args) == want
    arrays = [rnp.asarray(np.zeros(1, a)) if not isinstance(a, (int, float)) else a for a in args]
    assert rnp.result_type(*arrays) == want


@pytest.mark.parametrize("pair", [("int32", "float64"), ("float64", "int32"), ("int64", "int8"),
                                  ("bool", "int8"), ("uint8", "int8"), ("float32", "float16")],
                         ids=str)
@pytest.mark.parametrize("casting", ["safe", "same_kind", "unsafe", "no", "equiv"])
def test_can_cast(pair, casting):
    a, b = pair
    assert rnp.can_cast(a, b, casting) is np.can_cast(a, b, casting)
    assert rnp.can_cast(rnp.zeros(2, a), b, casting=casting) is np.can_cast(a, b, casting)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("case", [((6,), 3, 0), ((6,), [1, 4], 0), ((2, 6), 2, 1),
                                  ((4, 3), [-1], 0), ((4, 3), [1, 1, 9], 0), ((3, 4), 1, -1),
                                  ((0, 3), 3, 1)], ids=str)
def test_split(mode, dtype, case):
    shape, sections, axis = case
    x = sample(shape, dtype)
    same(run(lambda a: rnp.split(a, sections, axis), [x], mode), np.split(x, sections, axis))


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("value", [0.5, 7, True, -np.inf])
@pytest.mark.parametrize("mshape", [(2, 3), (3,), (2, 1), ()], ids=str)
def test_masked_fill(mode, dtype, value, mshape):
    if dtype != "float32" and dtype != "float64" and value == -np.inf:
        return  # NumPy refuses -inf in an integer (and so does cast: undefined)
    x, mask = sample((2, 3), dtype), sample(mshape, "bool", 5)
    want = np.where(mask, np.asarray(value).astype(x.dtype), x)
    same(run(lambda a, m: rnp.masked_fill(a, m, value), [x, mask], mode), want)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("dtypes", [("int32", "float32"), ("bool", "int64"), ("float64",) * 2],
                         ids=str)
@pytest.mark.parametrize("axis", [0, 1, -1, None])
def test_concat(mode, dtypes, axis):
    xs = [sample((2, 3), dtypes[0]), sample((2, 3), dtypes[1], 1)]
    same(run(lambda *a: rnp.concat(list(a), axis=axis), xs, mode), np.concatenate(xs, axis))


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [(2, 3), (2, 3, 4), (1, 2, 3, 4)], ids=str)
def test_permute_dims_matrix_transpose(mode, dtype, shape):
    x = sample(shape, dtype)
    axes = tuple(reversed(range(x.ndim)))[1:] + (x.ndim - 1,)
    same(run(lambda a: rnp.permute_dims(a, axes), [x], mode), np.transpose(x, axes))
    same(run(rnp.matrix_transpose, [x], mode), np.matrix_transpose(x))


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("dtypes", [("float32",) * 2, ("float64", "float32"), ("int32",) * 2,
                                    ("int64", "int32"), ("bool",) * 2, ("int32", "float64")],
                         ids=str)
@pytest.mark.parametrize("shapes", [((3,), (3,), -1), ((2, 3), (3,), -1), ((4, 1, 3), (2, 3), -1),
                                    ((3, 2), (3, 2), 0), ((2, 3, 4), (2, 3, 4), -2)], ids=str)
def test_vecdot(mode, dtypes, shapes):
    s1, s2, axis = shapes
    a, b = sample(s1, dtypes[0], 1), sample(s2, dtypes[1], 2)
    same(run(lambda p, q: rnp.vecdot(p, q, axis=axis), [a, b], mode), np.vecdot(a, b, axis=axis))


def test_vecdot_integers_wrap_as_numpys():
    a = np.full(4, 2**30, "int32")
    same(_np(rnp.vecdot(a, np.full(4, 2, "int32"))), np.vecdot(a, np.full(4, 2, "int32")))


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("to", ["float32", "int8", "bool", "float64"])
def test_astype(mode, dtype, to):
    x = sample((2, 3), dtype)
    for copy in (True, False):
        same(run(lambda a: rnp.astype(a, to, copy=copy), [x], mode), x.astype(to, copy=copy))
        same(run(lambda a: a.astype(to, copy=copy), [x], mode), x.astype(to))
    same(run(lambda a: rnp.astype(a, to), [x], mode), x.astype(to))


def _descending_argsort_ref(x, axis):
    """The Array API's descending stable argsort: largest first, equal entries in order."""
    n = x.shape[axis]
    flipped = np.flip(x, axis)
    return (n - 1) - np.flip(np.argsort(flipped, axis=axis, kind="stable"), axis)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("dtype", ["bool", "int32", "float32", "float64"])
@pytest.mark.parametrize("axis", [-1, 0, None])
def test_sort_argsort_descending(mode, dtype, axis):
    x = sample((4, 6), dtype)
    if dtype.startswith("int"):
        x = x % 3  # many ties
    ref_x = x.ravel() if axis is None else x
    ax = 0 if axis is None else axis
    want_idx = _descending_argsort_ref(ref_x, ax)
    same(run(lambda a: rnp.argsort(a, axis=axis, descending=True), [x], mode), want_idx)
    same(run(lambda a: rnp.sort(a, axis=axis, descending=True), [x], mode),
         np.take_along_axis(ref_x, want_idx, ax))
    same(run(lambda a: rnp.argsort(a, axis=axis, descending=False), [x], mode),
         np.argsort(x, axis=axis, kind="stable"))


def test_descending_ties_keep_their_order_and_nans_come_first():
    x = np.array([1.0, np.nan, 3.0, 1.0, 3.0, -0.0, 0.0])
    assert rnp.argsort(x, descending=True).tolist() == [1, 2, 4, 0, 3, 5, 6]
    np.testing.assert_array_equal(_np(rnp.sort(x, descending=True)),
                                  [np.nan, 3, 3, 1, 1, -0.0, 0.0])
    assert np.signbit(_np(rnp.sort(x, descending=True))[5])


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("correction", [0, 1, 2.5, 7])
@pytest.mark.parametrize("axis", [None, 0, 1])
def test_var_std_correction(mode, correction, axis):
    x = sample((3, 4), "float64")
    with np.errstate(divide="ignore", invalid="ignore"):
        same(run(lambda a: rnp.var(a, axis, correction=correction), [x], mode),
             np.var(x, axis, correction=correction))
        same(run(lambda a: rnp.std(a, axis=axis, correction=correction), [x], mode),
             np.std(x, axis=axis, correction=correction))
        same(run(lambda a: a.var(axis, correction=correction), [x], mode),
             np.var(x, axis, ddof=correction))


# ================================================================================================
# Gradients against finite differences (float64, NumPy's reference)
# ================================================================================================
GRAD_CASES = {
    "tril": (lambda a: rnp.tril(a, 1), lambda a: np.tril(a, 1), [(3, 4)]),
    "triu": (lambda a: rnp.triu(a, -1), lambda a: np.triu(a, -1), [(2, 3, 3)]),
    "tril-1d": (rnp.tril, np.tril, [(3,)]),
    "split": (lambda a: rnp.split(a, [1, 3], axis=1), lambda a: np.split(a, [1, 3], axis=1),
              [(2, 5)]),
    "split-sections": (lambda a: rnp.split(a, 2), lambda a: np.split(a, 2), [(4, 2)]),
    "masked_fill": (lambda a, v: rnp.masked_fill(a, np.array([[True, False, True]]), v),
                    lambda a, v: np.where([[True, False, True]], v, a), [(2, 3), ()]),
    "vecdot": (lambda a, b: rnp.vecdot(a, b), lambda a, b: np.vecdot(a, b), [(2, 4), (4,)]),
    "vecdot-axis0": (lambda a, b: rnp.vecdot(a, b, axis=0), lambda a, b: np.vecdot(a, b, axis=0),
                     [(3, 2), (3, 2)]),
    "meshgrid": (lambda a, b: rnp.meshgrid(a, b), lambda a, b: np.meshgrid(a, b), [(2,), (3,)]),
    "sort-descending": (lambda a: rnp.sort(a, descending=True), lambda a: -np.sort(-a), [(2, 5)]),
    "full_like": (lambda a, v: rnp.full_like(a, v), lambda a, v: np.full_like(a, v) + 0 * a,
                  [(2, 2), ()]),
}


@pytest.mark.parametrize("mode", [m for m in MODES if m != "direct"])
@pytest.mark.parametrize("name", sorted(GRAD_CASES))
def test_gradient(mode, name):
    fn, ref, shapes = GRAD_CASES[name]
    xs = [sample(s, "float64", i + 3) for i, s in enumerate(shapes)]
    out = ref(*xs)
    rng = np.random.default_rng(9)
    cot = ([rng.standard_normal(np.shape(o)) for o in out] if isinstance(out, (list, tuple))
           else rng.standard_normal(np.shape(out)))
    for i in range(len(xs)):
        if name == "full_like" and i == 0:
            continue  # the shape's source: no gradient (zero), as NumPy's 0 * a
        want = numeric_grad(lambda v: np_loss(ref, cot)(*xs[:i], v, *xs[i + 1:]), xs[i])
        got = library_grad(fn, xs, cot, mode, wrt=i)
        assert got.shape == xs[i].shape and got.dtype == xs[i].dtype
        np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-8, err_msg=f"d/d input {i}")


def test_tril_triu_gradient_is_the_mask():
    x = rnp.asarray(np.ones((3, 3)))
    np.testing.assert_array_equal(_np(rp.grad(rnp.sum(rnp.tril(x)), x)), np.tril(np.ones((3, 3))))
    np.testing.assert_array_equal(_np(rp.grad(rnp.sum(rnp.triu(x, 1)), x)),
                                  np.triu(np.ones((3, 3)), 1))


# ================================================================================================
# Errors
# ================================================================================================
def test_errors():
    x = rnp.zeros((2, 3))
    with pytest.raises(rp.ShapeError):  # NumPy: an error too (TypeError)
        rnp.tril(rnp.asarray(1.0))
    with pytest.raises(rp.ReplicateError, match="int"):
        rnp.triu(x, 0.5)
    with pytest.raises(ValueError):  # NumPy's ValueError (ShapeError is one)
        rnp.split(rnp.arange(5), 2)
    with pytest.raises(rp.ShapeError):
        rnp.split(rnp.arange(5), 0)
    with pytest.raises(ValueError, match="indexing"):
        rnp.meshgrid(x, indexing="yx")
    with pytest.raises(ValueError):
        rnp.linspace(0, 1, -1)
    with pytest.raises(rp.ShapeError):
        rnp.broadcast_arrays(rnp.zeros(2), rnp.zeros(3))
    with pytest.raises(ValueError):
        rnp.broadcast_arrays(rnp.zeros(2), rnp.zeros(3))
    with pytest.raises(TypeError):  # NumPy 2: can_cast of a Python scalar
        rnp.can_cast(1, "int8")
    with pytest.raises(rp.DTypeError):
        rnp.can_cast(1.0, "float32")
    with pytest.raises(ValueError):
        rnp.can_cast("int8", "int16", casting="nope")
    with pytest.raises(rp.DTypeError):
        rnp.result_type()
    with pytest.raises(TypeError):
        rnp.result_type("complex64")
    with pytest.raises(rp.DTypeError):  # a bool mask, as PyTorch
        rnp.masked_fill(x, rnp.zeros((2, 3), "int32"), 1.0)
    with pytest.raises(rp.ShapeError):  # the mask broadcasts to x's shape, not beyond
        rnp.masked_fill(rnp.zeros(3), rnp.asarray([[True], [False]]), 1.0)
    with pytest.raises(rp.ShapeError):
        rnp.vecdot(rnp.zeros(3), rnp.zeros(4))
    with pytest.raises(rp.ShapeError):
        rnp.vecdot(rnp.zeros(3), rnp.asarray(1.0))
    with pytest.raises(rp.ShapeError):
        rnp.matrix_transpose(rnp.zeros(3))
    with pytest.raises(rp.ReplicateError):
        rnp.permute_dims(x, (0, 0))
    with pytest.raises(ValueError, match="simultaneously"):  # NumPy 2's
        rnp.var(x, ddof=1, correction=1)
    with pytest.raises(rp.DTypeError):
        rnp.astype(x, "complex64")
    with pytest.raises(rp.ReplicateError):
        rnp.eye(2.5)


def test_constants_refuse_traced_arguments():
    def step(a):
        return rnp.linspace(0, a, 3)

    with pytest.raises(rp.ReplicateError, match="known when the step is traced"):
        rp.function(step)(np.float64(1.0))
