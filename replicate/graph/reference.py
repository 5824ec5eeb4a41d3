"""The reference implementation of every primitive, written once for any NumPy-like array module.

``ROWS`` maps a primitive to ``row(xp) -> rule``: given an array module (``numpy``,
``jax.numpy``) it returns the function computing the primitive with that module. ``IMPL`` is the
NumPy table built from the rows: the reference semantics of the IR, used by eager mode, by the
NumPy backend and wherever a graph is interpreted value by value. The JAX backend builds its
table from the same rows (``jax_impl.py``) and overrides only where JAX must be told to match
NumPy (full-precision matmuls, a stable sigmoid, a functional scatter).

Communication primitives have no row here: their implementations need the communicator and are
registered into ``IMPL`` by ``replicate/runtime/communication/host_rows.py``.

>>> import numpy as np
>>> IMPL["div"](np.array([7, -7]), np.array([2, 2])).tolist()
[3, -4]
"""

from __future__ import annotations

import functools

import numpy as np

from ..dtypes import LOW_PRECISION
from . import attention, conv, linalg
from .index_bounds import check_nonnegative
from .primitives import REGISTRY, RuleTable, index_tuple, parse_einsum
from .special import erf as _erf_np


def _same(fn):
    """A row for an op every array module spells the same way: ``xp.<fn>``."""
    return lambda xp: getattr(xp, fn)


def _div(xp):
    def div(a, b):
        if xp.issubdtype(xp.result_type(a), xp.floating):
            return xp.true_divide(a, b)
        return xp.floor_divide(a, b)
    return div


def floor_divide_of(xp, a, b):
    """NumPy's float ``floor_divide`` (``npy_floor_divide``, ``npy_divmod``) in array module
    ``xp``, step for step: ``x // 0`` is ``x / 0``; otherwise ``(a - fmod(a, b)) / b``, one less
    where the remainder's sign is not the divisor's, snapped to the nearest integer (a NaN stays,
    so ``inf // 2`` is NaN); a zero quotient has the sign of ``a / b``. (``jnp.floor_divide``
    gives NaN for ``x // 0`` and +0 for ``-0.0 // 1``; CuPy's floors ``a / b``.)"""
    quotient = a / b
    mod = xp.fmod(a, b)
    div = (a - mod) / b
    div = xp.where((mod != 0) & ((b < 0) != (mod < 0)), div - 1, div)
    snapped = xp.floor(div)
    snapped = xp.where(div - snapped > 0.5, snapped + 1, snapped)
    snapped = xp.where(div == 0, xp.copysign(xp.zeros_like(div), quotient), snapped)
    return xp.where(b == 0, quotient, snapped)


def _floor_divide(xp):
    if xp is np:
        return np.floor_divide  # the definition itself
    return lambda a, b: floor_divide_of(xp, a, b)


def stack_folds(a, b) -> bool:
    """Whether ``a @ b`` is a stack of rows times one matrix whose leading axes fold into one
    without a copy: then it is one BLAS call over all the rows (NumPy's matmul makes one call
    per stack entry)."""
    return b.ndim == 2 and a.ndim > 2 and a.size > 0 and all(
        a.strides[i] == a.strides[i + 1] * a.shape[i + 1] for i in range(a.ndim - 2))


def _matmul_np(a, b):
    if stack_folds(a, b):
        return np.matmul(a.reshape(-1, a.shape[-1]), b).reshape(a.shape[:-1] + b.shape[-1:])
    return np.matmul(a, b)


def _logistic_np(x, out=None):
    """1 / (1 + exp(-x)), stable for large |x| and exact in both tails: with e = exp(-|x|), the
    value is exp(min(x, 0)) / (1 + e), i.e. 1 / (1 + e) for x >= 0 and e / (1 + e) for x < 0,
    computed branch-free with two temporaries (``out``: where to write)."""
    x = np.asarray(x)
    if out is None:
        out = np.empty(x.shape, np.result_type(x.dtype, np.float16))
    d = np.empty(x.shape, out.dtype)
    np.absolute(x, out=d)
    np.negative(d, out=d)
    np.exp(d, out=d)
    np.add(d, 1, out=d)
    np.minimum(x, 0, out=out)
    np.exp(out, out=out)
    np.divide(out, d, out=out)
    return out


def _getitem(x, *idx, index):
    """``x[index]``; a negative index of an array marked ``NONNEGATIVE`` raises (a class label,
    an embedding id), which NumPy's indexing counts from the end."""
    x = np.asarray(x)
    if idx:  # (slices alone: nothing to check)
        check_nonnegative(x.shape, index, idx)
    return x[index_tuple(index, idx)]


def _scatter_add_np(g, *idx, index, shape):
    out = np.zeros(shape, g.dtype)
    ix = index_tuple(index, idx)
    if idx:
        np.add.at(out, ix, g)
    else:
        out[ix] = g
    return out


# -- counter-based random numbers: a murmur3-style mix of (key, counter), uint32 throughout ------
def _fmix(xp, h):
    u32 = xp.uint32
    h = h ^ (h >> u32(16))
    h = h * u32(0x85EBCA6B)
    h = h ^ (h >> u32(13))
    h = h * u32(0xC2B2AE35)
    return h ^ (h >> u32(16))


def random_bits(xp, key, size: int, stream: int):
    """``size`` uint32 hash values of (key, counter) in array module ``xp`` — the same bits in
    every module, so every backend draws the same random numbers."""
    u32 = xp.uint32
    key = xp.asarray(key).astype(u32)
    k0, k1 = key[0], key[1]
    c = xp.arange(size, dtype=u32)
    h = _fmix(xp, c * u32(0x9E3779B9) + k0 + u32((stream * 0x632BE5AB) & 0xFFFFFFFF))
    h = _fmix(xp, h ^ k1)
    return _fmix(xp, h + (k0 ^ u32(0x5BD1E995)))


def _random_bits(xp):
    def run(key, shape, dtype, stream=0):
        with np.errstate(over="ignore"):  # uint32 arithmetic wraps by design
            bits = random_bits(xp, key, int(np.prod(shape, dtype=np.int64)), stream)
        return bits.reshape(shape)
    return run


def uniform_bits(dtype) -> int:
    """How many random bits a uniform of ``dtype`` is made of: 24 (k * 2**-24 is exact in
    float32; float64 takes the same 24), and its significand's for float16 (11) and bfloat16
    (8) — more would round up to 1.0, outside ``[0, 1)``."""
    return _UNIFORM_BITS.get(np.dtype(dtype), 24)


_UNIFORM_BITS = {np.dtype(np.float16): 11, np.dtype(LOW_PRECISION[1]): 8}


def _random_uniform(xp):
    bits_of = _random_bits(xp)

    def run(key, shape, dtype, bits=None):  # (bits: a widened float16/bfloat16 draw's)
        n = uniform_bits(dtype) if bits is None else bits  # (k * 2**-n: exact in ``dtype``)
        bits = bits_of(key, shape, np.uint32, 2)
        work = xp.float64 if np.dtype(dtype) == np.float64 else xp.float32
        return ((bits >> xp.uint32(32 - n)).astype(work) * work(1.0 / (1 << n))).astype(dtype)
    return run


def _einsum_np(*xs, subscripts):
    return np.einsum(subscripts, *xs, optimize=_einsum_path(subscripts, *(x.shape for x in xs)))


@functools.lru_cache(maxsize=1024)
def _einsum_path(subscripts, *shapes):
    """The contraction order (through BLAS where it can: a convolution's einsum is a GEMM, several
    times faster than einsum's own loops), found once per subscripts and shapes."""
    dummies = [np.broadcast_to(np.zeros((), np.float32), s) for s in shapes]
    return np.einsum_path(subscripts, *dummies, optimize="greedy")[0]


def _cumsum(xp):
    def cumsum(x, axis, reverse=False):
        if reverse:
            return xp.flip(xp.cumsum(xp.flip(x, axis), axis=axis), axis)
        return xp.cumsum(x, axis=axis)
    return cumsum


def _top_k_np(x, k):
    """The indices of the k largest entries along the last axis, largest first, equal entries in
    index order, NaNs largest (as ``jax.lax.top_k``): a stable sort of the reversed axis, read
    backwards."""
    n = x.shape[-1]
    order = np.argsort(np.flip(x, -1), axis=-1, kind="stable")
    return np.flip(n - 1 - order, -1)[..., :k]


def _local_reduce(xp):
    def local_reduce(*xs, op):
        """The in-process combine of the k local replicas' values, in replica order."""
        out = xs[0]
        fn = {"sum": xp.add, "max": xp.maximum, "min": xp.minimum}[op]
        for x in xs[1:]:
            out = fn(out, x)
        return out
    return local_reduce


ROWS = {
    "neg": _same("negative"), "abs": _same("abs"), "sign": _same("sign"), "exp": _same("exp"),
    "log": _same("log"), "log1p": _same("log1p"), "expm1": _same("expm1"),
    "sqrt": _same("sqrt"), "rsqrt": lambda xp: lambda x: 1.0 / xp.sqrt(x),
    "tanh": _same("tanh"), "logistic": lambda xp: _logistic_np, "sin": _same("sin"),
    "cos": _same("cos"),
    **{name: _same(name) for name in ("tan", "sinh", "cosh", "arcsin", "arccos", "arctan",
                                      "arcsinh", "arccosh", "arctanh", "log2", "log10",
                                      "arctan2", "logaddexp", "signbit", "copysign",
                                      "hypot")},
    "floor": _same("floor"), "ceil": _same("ceil"), "round": _same("rint"),  # half to even
    "erf": lambda xp: _erf_np, "mod": _same("remainder"), "floor_divide": _floor_divide,
    "add": _same("add"), "sub": _same("subtract"), "mul": _same("multiply"), "div": _div,
    "pow": _same("power"), "maximum": _same("maximum"), "minimum": _same("minimum"),
    "eq": _same("equal"), "ne": _same("not_equal"), "lt": _same("less"),
    "le": _same("less_equal"), "gt": _same("greater"), "ge": _same("greater_equal"),
    "logical_and": _same("logical_and"), "logical_or": _same("logical_or"),
    "logical_not": _same("logical_not"), "invert": _same("invert"),
    **{name: _same(name) for name in ("bitwise_and", "bitwise_or", "bitwise_xor", "left_shift",
                                      "right_shift")},
    "select": _same("where"),
    "cast": lambda xp: lambda x, dtype: xp.asarray(x).astype(dtype),
    "stop_gradient": lambda xp: lambda x: x,
    "custom_vjp": lambda xp: lambda value, *args, rule: value,
    "remat": lambda xp: lambda value, *args, rule: value,
    "remat_barrier": lambda xp: lambda x, after: x,
    "branch_input": lambda xp: lambda x, taken: x,
    "reduce_sum": lambda xp: lambda x, axes: xp.sum(x, axis=axes),
    "reduce_prod": lambda xp: lambda x, axes: xp.prod(x, axis=axes),
    "reduce_max": lambda xp: lambda x, axes: xp.max(x, axis=axes),
    "reduce_min": lambda xp: lambda x, axes: xp.min(x, axis=axes),
    "argmax": lambda xp: lambda x, axis: xp.argmax(x, axis=axis),
    "argmin": lambda xp: lambda x, axis: xp.argmin(x, axis=axis),
    "cumsum": _cumsum,
    "cumprod": lambda xp: lambda x, axis: xp.cumprod(x, axis=axis),
    "sort": lambda xp: lambda x, axis: xp.sort(x, axis=axis, stable=True),
    "argsort": lambda xp: lambda x, axis: xp.argsort(x, axis=axis, stable=True),
    "top_k_indices": lambda xp: _top_k_np,
    "searchsorted": lambda xp: lambda a, v, side: xp.searchsorted(a, v, side=side),
    "reshape": lambda xp: lambda x, shape: xp.reshape(x, shape),
    "transpose": lambda xp: lambda x, perm: xp.transpose(x, perm),
    "broadcast_to": lambda xp: lambda x, shape: xp.broadcast_to(x, shape),
    "concatenate": lambda xp: lambda *xs, axis: xp.concatenate(xs, axis=axis),
    "pad": lambda xp: lambda x, widths, value: xp.pad(x, widths, constant_values=value),
    "getitem": lambda xp: _getitem if xp is np else (
        lambda x, *idx, index: xp.asarray(x)[index_tuple(index, idx)]),
    "scatter_add": lambda xp: _scatter_add_np,
    "matmul": _same("matmul"),
    "einsum": lambda xp: _einsum_np,
    "random_bits": _random_bits,
    "random_uniform": _random_uniform,
    "const": lambda xp: lambda value: value,
    "local_reduce": _local_reduce,
    **conv.ROWS,  # conv2d, conv2d_input_grad, conv2d_weight_grad: im2col and GEMMs
    "attention_weights": attention.weights_row,  # the scores once, then in place
    **linalg.ROWS,  # solve, cholesky, qr, svd, eigh, det, slogdet: xp.linalg's
}




def table(xp, name: str, overrides=None) -> RuleTable:
    """The rule table of array module ``xp``: every row applied to it, then ``overrides``."""
    rules = {prim: row(xp) for prim, row in ROWS.items()}
    rules.update(overrides or {})
    return RuleTable(name, rules)


_LOW = frozenset(np.dtype(d) for d in LOW_PRECISION)


def _widened(rule):
    """``rule`` computing in float32 when an operand is float16 or bfloat16 (NumPy has no
    bfloat16 kernels, and its float16 sums and products accumulate in float16); the caller
    rounds the result to the node's dtype — one rounding per op, as XLA does on a CPU."""
    def run(*xs, **attrs):
        for x in xs:
            if getattr(x, "dtype", None) in _LOW:
                xs = [x.astype(np.float32) if getattr(x, "dtype", None) in LOW_PRECISION else x
                      for x in xs]
                break
        return rule(*xs, **attrs)
    run.__wrapped__ = rule
    return run


IMPL = table(np, "numpy", {  # (the ufuncs' and methods' own calls: no Python wrapper on them)
    "matmul": _matmul_np,
    "reduce_sum": lambda x, axes: np.add.reduce(x, axis=axes),
    "reduce_max": lambda x, axes: np.maximum.reduce(x, axis=axes),
    "reduce_min": lambda x, axes: np.minimum.reduce(x, axis=axes),
    "reshape": lambda x, shape: x.reshape(shape),
    "transpose": lambda x, perm: x.transpose(perm)})
for _prim in IMPL:  # (what only moves data runs on float16/bfloat16 as it is; the collectives
    if _prim not in REGISTRY or not REGISTRY[_prim].moves:  # are declared after this table)
        IMPL[_prim] = _widened(IMPL[_prim])


def apply(impl, node, args):
    """Run ``node``'s rule from table ``impl`` on ``args``; the result has the node's dtype."""
    value = impl[node.prim](*args, **node.attrs)
    dtype = node.out.aval.dtype
    if getattr(value, "dtype", dtype) != dtype:
        value = value.astype(dtype)
    return value


def reference_apply(node, args):
    """The NumPy reference on one node: always an ndarray of the node's dtype."""
    value = IMPL[node.prim](*args, **node.attrs)
    if type(value) is not np.ndarray:
        value = np.asarray(value)
    dtype = node.out.aval.dtype
    return value if value.dtype == dtype else value.astype(dtype)


__all__ = ["IMPL", "ROWS", "apply", "parse_einsum", "random_bits", "reference_apply", "table"]
