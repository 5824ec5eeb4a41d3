"""NumPy implementation of every primitive: the reference semantics of the IR."""

from __future__ import annotations

import functools

import numpy as np

from ..errors import MissingRuleError
from ..graph.primitives import index_tuple, parse_einsum


class RuleTable(dict):
    """A rule table whose lookup of a missing primitive says which rule is missing."""

    def __init__(self, table: str, rules: dict):
        super().__init__(rules)
        self.table = table

    def __missing__(self, name):
        raise MissingRuleError(f"no {self.table} rule for {name}")


def _rsqrt(x):
    return 1.0 / np.sqrt(x)


def _logistic(x, out=None):
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
    return x[index_tuple(index, idx)]


def _scatter_add(g, *idx, index, shape):
    out = np.zeros(shape, g.dtype)
    ix = index_tuple(index, idx)
    if idx:
        np.add.at(out, ix, g)
    else:
        out[ix] = g
    return out


# -- counter-based random numbers: a murmur3-style mix of (key, counter), uint32 throughout ------
_M32 = np.uint32


def _fmix(h):
    h = h ^ (h >> _M32(16))
    h = h * _M32(0x85EBCA6B)
    h = h ^ (h >> _M32(13))
    h = h * _M32(0xC2B2AE35)
    return h ^ (h >> _M32(16))


def random_bits_np(key, size, stream):
    k0, k1 = key.astype(np.uint32)
    c = np.arange(size, dtype=np.uint32)
    with np.errstate(over="ignore"):
        h = _fmix(c * _M32(0x9E3779B9) + k0 + _M32((stream * 0x632BE5AB) & 0xFFFFFFFF))
        h = _fmix(h ^ k1)
        h = _fmix(h + (k0 ^ _M32(0x5BD1E995)))
    return h


def _random_bits(key, shape, dtype, stream=0):
    return random_bits_np(key, int(np.prod(shape, dtype=np.int64)), stream).reshape(shape)


def _random_uniform(key, shape, dtype):
    bits = _random_bits(key, shape, np.uint32, 2)
    return ((bits >> np.uint32(8)).astype(np.float64) * (1.0 / (1 << 24))).astype(dtype)


def _einsum(*xs, subscripts):
    return np.einsum(subscripts, *xs, optimize=_einsum_path(subscripts, *(x.shape for x in xs)))


@functools.lru_cache(maxsize=1024)
def _einsum_path(subscripts, *shapes):
    """The contraction order (through BLAS where it can: a convolution's einsum is a GEMM, several
    times faster than einsum's own loops), found once per subscripts and shapes."""
    dummies = [np.broadcast_to(np.zeros((), np.float32), s) for s in shapes]
    return np.einsum_path(subscripts, *dummies, optimize="greedy")[0]


def _div(a, b):
    return np.true_divide(a, b) if np.issubdtype(a.dtype, np.floating) else np.floor_divide(a, b)


IMPL = RuleTable("numpy", {
    "neg": np.negative, "abs": np.abs, "sign": np.sign, "exp": np.exp, "log": np.log,
    "log1p": np.log1p, "expm1": np.expm1, "sqrt": np.sqrt, "rsqrt": _rsqrt, "tanh": np.tanh,
    "logistic": _logistic, "sin": np.sin, "cos": np.cos,
    "add": np.add, "sub": np.subtract, "mul": np.multiply, "div": _div, "pow": np.power,
    "maximum": np.maximum, "minimum": np.minimum,
    "eq": np.equal, "ne": np.not_equal, "lt": np.less, "le": np.less_equal, "gt": np.greater,
    "ge": np.greater_equal, "logical_and": np.logical_and, "logical_or": np.logical_or,
    "logical_not": np.logical_not,
    "select": np.where,
    "cast": lambda x, dtype: x.astype(dtype),
    "stop_gradient": lambda x: x,
    "reduce_sum": lambda x, axes: np.sum(x, axis=axes),
    "reduce_prod": lambda x, axes: np.prod(x, axis=axes),
    "reduce_max": lambda x, axes: np.max(x, axis=axes),
    "reduce_min": lambda x, axes: np.min(x, axis=axes),
    "argmax": lambda x, axis: np.argmax(x, axis=axis),
    "argmin": lambda x, axis: np.argmin(x, axis=axis),
    "reshape": lambda x, shape: np.reshape(x, shape),
    "transpose": lambda x, perm: np.transpose(x, perm),
    "broadcast_to": lambda x, shape: np.broadcast_to(x, shape),
    "concatenate": lambda *xs, axis: np.concatenate(xs, axis=axis),
    "pad": lambda x, widths, value: np.pad(x, widths, constant_values=value),
    "getitem": _getitem,
    "scatter_add": _scatter_add,
    "matmul": np.matmul,
    "einsum": _einsum,
    "random_bits": _random_bits,
    "random_uniform": _random_uniform,
    "const": lambda value: value,
})

__all__ = ["IMPL", "parse_einsum"]
