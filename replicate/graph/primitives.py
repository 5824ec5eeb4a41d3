"""Primitive declarations: each primitive once, with its flags and its shape/dtype rule.

A primitive's other concerns live in rule tables keyed by its name, one ``RuleTable`` each:

* shape/dtype rule ......... this module (``Primitive.shape_rule``)
* CUDA expression .......... this module too (``cuda=``: a C template, for fused kernels)
* NumPy reference .......... ``replicate/graph/reference.py`` (``IMPL``; JAX reuses its rows)
* gradient (VJP) rule ...... ``replicate/graph/vjp_rules.py`` (``VJP``)

The flags say what kind of op it is, and every pass and backend reads them instead of keeping
lists of names: ``effect`` (must run even when unused and is never merged: communication),
``host`` (runs on the host through the reference table), ``view`` (its result may share memory
with its first input), ``fuse`` (``"map"`` or ``"reduce"``: what it can be in a fused kernel),
``exchange`` (talks to the other processes), ``placeholder`` (a replica-level collective that
``passes/replicate_collectives.py`` rewrites), ``random`` (its value depends on a key).

``tests/test_rule_tables.py`` fails when a primitive lacks an entry it needs.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np

from ..dtypes import is_float, is_supported
from ..errors import DTypeError, MissingRuleError, ShapeError
from .aval import AVal

ELEMENTWISE, REDUCTION, STRUCTURAL, CONTRACTION, RANDOM, SOURCE, COLLECTIVE, FUSED = (
    "elementwise", "reduction", "structural", "contraction", "random", "source", "collective",
    "fused")
KINDS = (ELEMENTWISE, REDUCTION, STRUCTURAL, CONTRACTION, RANDOM, SOURCE, COLLECTIVE, FUSED)


@dataclass(frozen=True)
class Primitive:
    """A primitive: its name, kind, shape rule and flags (see the module docstring).

    Flags left as ``None`` follow from the kind: an elementwise op fuses as a map, a random op
    is random, a collective (communication) runs on the host."""

    name: str
    kind: str
    shape_rule: Callable
    differentiable: bool = True  # False: gradient is zero by definition (no VJP entry needed)
    effect: bool = False
    host: bool | None = None
    view: bool = False
    fuse: str | None = None
    exchange: bool = False
    placeholder: bool = False
    cuda: str | None = None

    def __post_init__(self):
        if self.kind not in KINDS:
            raise ValueError(f"primitive {self.name!r}: unknown kind {self.kind!r}")
        if self.host is None:
            object.__setattr__(self, "host", self.kind == COLLECTIVE)
        if self.fuse is None and self.kind == ELEMENTWISE:
            object.__setattr__(self, "fuse", "map")

    @property
    def random(self) -> bool:
        return self.kind == RANDOM

    @property
    def elementwise(self) -> bool:
        return self.kind == ELEMENTWISE

    @property
    def foldable(self) -> bool:
        """Deterministic and free of effects: computable at compile time from constants."""
        return not (self.random or self.host or self.effect or self.kind == SOURCE)


class RuleTable(dict):
    """A rule table (primitive name -> rule) whose lookup of a missing primitive says which rule
    is missing: ``no <table> rule for <op>``."""

    def __init__(self, table: str, rules: dict | None = None):
        super().__init__(rules or {})
        self.table = table

    def __missing__(self, name):
        raise MissingRuleError(f"no {self.table} rule for {name}")


REGISTRY: dict[str, Primitive] = {}


def declare(name, kind, shape_rule, differentiable=True, **flags) -> Primitive:
    prim = REGISTRY[name] = Primitive(name, kind, shape_rule, differentiable, **flags)
    return prim


def get(name: str) -> Primitive:
    try:
        return REGISTRY[name]
    except KeyError:
        raise MissingRuleError(f"no primitive named {name!r}") from None


# -- shape rules ------------------------------------------------------------------------------
FLOATS = ("float16", "bfloat16", "float32", "float64")


def _unary(a, **_):
    return a


def _unary_signed(a, **_):
    if a.dtype == bool:
        raise DTypeError("neg and sign need numbers, got bool (logical_not negates a bool)")
    return a


def _binary_signed(a, b, **_):
    if a.dtype == bool or b.dtype == bool:
        raise DTypeError("cannot subtract bools; use logical_xor (a != b)")
    return _binary(a, b)


def _unary_float(a, **_):
    if not is_float(a.dtype):
        raise DTypeError(f"needs a floating-point operand, got {a.dtype}")
    return a


def _broadcast(*avals):
    first = avals[0].shape
    if all(a.shape == first for a in avals):
        return first
    try:
        return tuple(np.broadcast_shapes(*[a.shape for a in avals]))
    except ValueError:
        raise ShapeError("shapes " + " and ".join(str(a.shape) for a in avals)
                         + " do not broadcast") from None


def _same_dtype(*avals):
    first = avals[0].dtype
    if all(a.dtype == first for a in avals):
        return first
    dtypes = {np.dtype(a.dtype) for a in avals}
    if len(dtypes) != 1:
        raise DTypeError(f"operand dtypes differ: {sorted(str(d) for d in dtypes)}")
    return avals[0].dtype


def _binary(a, b, **_):
    return AVal(_broadcast(a, b), _same_dtype(a, b))


def _compare(a, b, **_):
    _same_dtype(a, b)
    return AVal(_broadcast(a, b), np.dtype(bool))


def _logical(a, b, **_):
    if a.dtype != bool or b.dtype != bool:
        raise DTypeError("logical ops need bool operands")
    return AVal(_broadcast(a, b), np.dtype(bool))


def _select(c, a, b, **_):
    if c.dtype != bool:
        raise DTypeError(f"select's condition must be bool, got {c.dtype}")
    return AVal(_broadcast(c, a, b), _same_dtype(a, b))


def _cast(a, dtype):
    if not is_supported(dtype):
        raise DTypeError(f"cannot cast to {np.dtype(dtype)}: the dtypes are bool, integers and "
                         "floats (float16, bfloat16, float32, float64)")
    return AVal(a.shape, np.dtype(dtype))


def _check_axes(a, axes):
    for ax in axes:
        if not 0 <= ax < len(a.shape):
            raise ShapeError(f"axis {ax} out of range for shape {a.shape}")
    if len(set(axes)) != len(axes):
        raise ShapeError(f"repeated axis in {axes}")


def _reduce(a, axes):
    _check_axes(a, axes)
    return AVal(tuple(d for i, d in enumerate(a.shape) if i not in axes), a.dtype)


def _reduce_nonempty(a, axes):
    if any(a.shape[ax] == 0 for ax in axes):
        raise ShapeError("max/min/argmax/argmin of an empty axis")
    return _reduce(a, axes)


def _arg_reduce(a, axis):
    out = _reduce_nonempty(a, (axis,))
    return AVal(out.shape, np.dtype(np.int64))


def _reshape(a, shape):
    if int(np.prod(shape, dtype=np.int64)) != int(np.prod(a.shape, dtype=np.int64)):
        raise ShapeError(f"cannot reshape {a.shape} to {shape}")
    return AVal(tuple(shape), a.dtype)


def _transpose(a, perm):
    if sorted(perm) != list(range(len(a.shape))):
        raise ShapeError(f"bad permutation {perm} for shape {a.shape}")
    return AVal(tuple(a.shape[p] for p in perm), a.dtype)


def _broadcast_to(a, shape):
    if tuple(np.broadcast_shapes(a.shape, shape)) != tuple(shape):
        raise ShapeError(f"cannot broadcast {a.shape} to {shape}")
    return AVal(tuple(shape), a.dtype)


def _concatenate(*avals, axis):
    dtype = _same_dtype(*avals)
    first = avals[0].shape
    if not 0 <= axis < len(first):
        raise ShapeError(f"axis {axis} out of range for shape {first}")
    for a in avals:
        if len(a.shape) != len(first) or any(
                d != e for i, (d, e) in enumerate(zip(a.shape, first)) if i != axis):
            raise ShapeError(f"cannot concatenate shapes {[x.shape for x in avals]} on axis {axis}")
    shape = list(first)
    shape[axis] = sum(a.shape[axis] for a in avals)
    return AVal(tuple(shape), dtype)


def _pad(a, widths, value):
    if len(widths) != len(a.shape) or any(lo < 0 or hi < 0 for lo, hi in widths):
        raise ShapeError(f"bad pad widths {widths} for shape {a.shape}")
    return AVal(tuple(d + lo + hi for d, (lo, hi) in zip(a.shape, widths)), a.dtype)


def index_tuple(index, arrays):
    """Turn a static index spec plus index arrays into a NumPy index tuple."""
    out = []
    for entry in index:
        tag = entry[0]
        if tag == "int":
            out.append(entry[1])
        elif tag == "slice":
            out.append(slice(*entry[1:]))
        elif tag == "none":
            out.append(None)
        elif tag == "ellipsis":
            out.append(Ellipsis)
        else:  # ("array", k)
            out.append(arrays[entry[1]])
    return tuple(out)


def _dummy(shape, dtype):
    return np.lib.stride_tricks.as_strided(np.zeros(1, dtype), shape, (0,) * len(shape))


def _getitem(a, *idx, index):
    for i in idx:
        if not np.issubdtype(i.dtype, np.integer):
            raise DTypeError(f"index arrays must be integers, got {i.dtype}")
    arrays = [np.zeros(i.shape, np.intp) for i in idx]
    try:
        shape = _dummy(a.shape, a.dtype)[index_tuple(index, arrays)].shape
    except IndexError as e:
        raise ShapeError(str(e)) from None
    return AVal(tuple(shape), a.dtype)


def _scatter_add(g, *idx, index, shape):
    expect = _getitem(AVal(tuple(shape), g.dtype), *idx, index=index)
    if expect.shape != g.shape:
        raise ShapeError(f"scatter_add update {g.shape} does not match {expect.shape}")
    return AVal(tuple(shape), g.dtype)


def _matmul(a, b):
    if len(a.shape) < 2 or len(b.shape) < 2:
        raise ShapeError("matmul primitive needs rank >= 2 operands")
    if a.shape[-1] != b.shape[-2]:
        raise ShapeError(f"matmul contraction mismatch: {a.shape} @ {b.shape}")
    batch = tuple(np.broadcast_shapes(a.shape[:-2], b.shape[:-2]))
    return AVal(batch + (a.shape[-2], b.shape[-1]), _same_dtype(a, b))


def parse_einsum(subscripts: str):
    lhs, out = subscripts.replace(" ", "").split("->")
    return lhs.split(","), out


def _einsum(*avals, subscripts):
    ins, out = parse_einsum(subscripts)
    if len(ins) != len(avals):
        raise ShapeError(f"einsum {subscripts!r} expects {len(ins)} operands, got {len(avals)}")
    sizes: dict = {}
    for term, a in zip(ins, avals):
        if len(term) != len(a.shape):
            raise ShapeError(f"einsum term {term!r} does not match shape {a.shape}")
        for letter, d in zip(term, a.shape):
            if sizes.setdefault(letter, d) != d:
                raise ShapeError(f"einsum index {letter!r} has sizes {sizes[letter]} and {d}")
    return AVal(tuple(sizes[c] for c in out), _same_dtype(*avals))


def _random(key, shape, dtype, stream=0):
    if key.shape != (2,) or key.dtype != np.uint32:
        raise ShapeError(f"a random key is uint32[2], got {key}")
    return AVal(tuple(shape), np.dtype(dtype))


def _const(*, value):
    return AVal(tuple(value.shape), value.dtype)


# -- the declarations ---------------------------------------------------------------------------
# ``cuda``: the expression of one element in a generated kernel; {a}, {b}, {c} are the operands,
# {t} the C type of the result. Ops whose expression depends on the type are written in
# ``backends/cuda_codegen.py`` (``CUDA_RULES``).
_C_UNARY = {"exp": "exp({a})", "log": "log({a})", "log1p": "log1p({a})", "expm1": "expm1({a})",
            "sqrt": "sqrt({a})", "rsqrt": "rsqrt({a})", "tanh": "tanh({a})", "sin": "sin({a})",
            "cos": "cos({a})", "logistic": "(({t})1 / (({t})1 + exp(-{a})))"}
declare("neg", ELEMENTWISE, _unary_signed, cuda="(-{a})")
declare("abs", ELEMENTWISE, _unary, cuda="({a} < 0 ? -{a} : {a})")
for _name, _c in _C_UNARY.items():
    declare(_name, ELEMENTWISE, _unary_float, cuda=_c)
for _name, _c in (("add", "({a} + {b})"), ("mul", "({a} * {b})"), ("div", None),
                  ("pow", "(({t})pow({a}, {b}))"), ("maximum", None), ("minimum", None)):
    declare(_name, ELEMENTWISE, _binary, cuda=_c)
declare("sub", ELEMENTWISE, _binary_signed, cuda="({a} - {b})")
for _name, _op in (("eq", "=="), ("ne", "!="), ("lt", "<"), ("le", "<="), ("gt", ">"),
                   ("ge", ">=")):
    declare(_name, ELEMENTWISE, _compare, differentiable=False, cuda=f"({{a}} {_op} {{b}})")
for _name, _op in (("logical_and", "&&"), ("logical_or", "||")):
    declare(_name, ELEMENTWISE, _logical, differentiable=False, cuda=f"({{a}} {_op} {{b}})")
declare("logical_not", ELEMENTWISE, _unary, differentiable=False, cuda="(!{a})")
declare("sign", ELEMENTWISE, _unary_signed, differentiable=False,  # derivative: 0 almost anywhere
        cuda="(({t})(({a} > 0) - ({a} < 0)))")
declare("select", ELEMENTWISE, _select, cuda="({a} ? {b} : {c})")
declare("cast", ELEMENTWISE, _cast, cuda="(({t}){a})")
declare("stop_gradient", ELEMENTWISE, _unary, differentiable=False, view=True, cuda="{a}")
# rp.custom_vjp: the value (input 0) passes through; the gradient goes to the other inputs (the
# function's arguments) by the user's rule (attr ``rule``), never into the value's own graph
declare("custom_vjp", STRUCTURAL, lambda value, *args, rule: value, view=True)

for _name in ("reduce_sum", "reduce_prod", "reduce_max", "reduce_min"):
    declare(_name, REDUCTION, _reduce_nonempty if _name in ("reduce_max", "reduce_min")
            else _reduce, fuse="reduce")
declare("argmax", REDUCTION, _arg_reduce, differentiable=False)
declare("argmin", REDUCTION, _arg_reduce, differentiable=False)

declare("reshape", STRUCTURAL, _reshape, view=True)
declare("transpose", STRUCTURAL, _transpose, view=True)
# in a kernel, broadcasting is only a way of indexing an input, never a copy
declare("broadcast_to", STRUCTURAL, _broadcast_to, view=True, fuse="map", cuda="{a}")
declare("concatenate", STRUCTURAL, _concatenate)
declare("pad", STRUCTURAL, _pad)
declare("getitem", STRUCTURAL, _getitem, view=True)
declare("scatter_add", STRUCTURAL, _scatter_add)

declare("matmul", CONTRACTION, _matmul)
declare("einsum", CONTRACTION, _einsum)

declare("random_bits", RANDOM, _random, differentiable=False)
declare("random_uniform", RANDOM, _random, differentiable=False)
declare("const", SOURCE, _const, differentiable=False)


def prims_where(**flags) -> frozenset:
    """The names of the primitives whose flags have these values, e.g. ``prims_where(fuse=
    "reduce")``."""
    return frozenset(name for name, p in REGISTRY.items()
                     if all(getattr(p, k) == v for k, v in flags.items()))
