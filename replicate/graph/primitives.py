"""Primitive declarations: each primitive once, with its flags and its shape/dtype rule.

A primitive's other concerns live in rule tables keyed by its name, one ``RuleTable`` each:

* shape/dtype rule ......... ``Primitive.shape_rule``, one of ``graph/shape_rules.py``
* CUDA expression .......... this module (``cuda=``: a C template, for fused kernels)
* NumPy reference .......... ``replicate/graph/reference.py`` (``IMPL``; JAX reuses its rows)
* gradient (VJP) rule ...... ``replicate/graph/vjp_rules.py`` (``VJP``)

The flags say what kind of op it is, and every pass and backend reads them instead of keeping
lists of names: ``effect`` (must run even when unused and is never merged: communication),
``host`` (runs on the host through the reference table), ``view`` (its result may share memory
with its first input), ``fuse`` (``"map"`` or ``"reduce"``: what it can be in a fused kernel),
``exchange`` (talks to the other processes), ``placeholder`` (a replica-level collective that
``passes/replicate_collectives.py`` rewrites), ``random`` (its value depends on a key).
What data an op touches: ``moves`` (it only moves or relabels data, computing nothing: every
view, ``concatenate``, ``const``, ``cast``; NumPy runs it on float16/bfloat16 as they are),
``alias`` (its result is its first operand's elements in their order, as many: no backend
copies it), ``repeats`` (the same, each element possibly repeated: a broadcast), ``indexes``
(it takes index arrays as operands). A placeholder says what the replicas receive
(``across``): ``"same"`` (one value for all), ``"own"`` (each its own part) or ``"moved"``
(another replica's value).

``tests/graph/test_rule_tables.py`` fails when a primitive lacks an entry it needs.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from ..dtypes import is_float  # noqa: F401 - autodiff and custom import it from here
from ..errors import MissingRuleError
from .attention import weights_shape as _attention_weights
from .conv import conv2d_input_grad_shape, conv2d_shape, conv2d_weight_grad_shape
from .linalg import cholesky_shape, det_shape, eigh_shape, qr_shape, solve_shape, svd_shape
from .shape_rules import (  # noqa: F401 - index_tuple, parse_einsum: imported from here too
    _arg_reduce,
    _argsort,
    _binary,
    _binary_float,
    _binary_signed,
    _bitwise,
    _broadcast_to,
    _cast,
    _compare,
    _concatenate,
    _const,
    _einsum,
    _getitem,
    _logical,
    _logical_not,
    _matmul,
    _mod,
    _pad,
    _random,
    _reduce,
    _reduce_nonempty,
    _reshape,
    _scan,
    _scatter_add,
    _searchsorted,
    _select,
    _shift,
    _signbit,
    _sort,
    _top_k,
    _transpose,
    _unary,
    _unary_float,
    _unary_integer,
    _unary_signed,
    index_tuple,
    parse_einsum,
)

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
    moves: bool = False
    alias: bool = False
    repeats: bool = False
    indexes: bool = False
    across: str | None = None  # placeholders: "same", "own" or "moved"

    def __post_init__(self):
        if self.kind not in KINDS:
            raise ValueError(f"primitive {self.name!r}: unknown kind {self.kind!r}")
        if self.host is None:
            object.__setattr__(self, "host", self.kind == COLLECTIVE)
        if self.fuse is None and self.kind == ELEMENTWISE:
            object.__setattr__(self, "fuse", "map")
        if self.alias or self.repeats:  # (what lists its operand's elements is a view of it)
            object.__setattr__(self, "view", True)
        if self.view:  # (a view moves no data of its own)
            object.__setattr__(self, "moves", True)
        if self.placeholder and self.across not in ("same", "own", "moved"):
            raise ValueError(f"placeholder {self.name!r}: across must be 'same', 'own' or "
                             f"'moved', got {self.across!r}")

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


# -- the declarations ---------------------------------------------------------------------------
# ``cuda``: the expression of one element in a generated kernel; {a}, {b}, {c} are the operands,
# {t} the C type of the result. Ops whose expression depends on the type are written in
# ``backends/cuda_codegen.py`` (``CUDA_RULES``).
_C_UNARY = {"exp": "exp({a})", "log": "log({a})", "log1p": "log1p({a})", "expm1": "expm1({a})",
            "sqrt": "sqrt({a})", "rsqrt": "rsqrt({a})", "tanh": "tanh({a})", "sin": "sin({a})",
            "cos": "cos({a})", "tan": "tan({a})", "sinh": "sinh({a})", "cosh": "cosh({a})",
            "arcsin": "asin({a})", "arccos": "acos({a})", "arctan": "atan({a})",
            "arcsinh": "asinh({a})", "arccosh": "acosh({a})", "arctanh": "atanh({a})",
            "log2": "log2({a})", "log10": "log10({a})",
            # exp(min(x, 0)) / (1 + exp(-|x|)), as the reference: 1 / (1 + exp(-x)) overflows to
            # 0 below -709.8 (float64) where the value is a denormal, not 0
            "logistic": "(exp({a} < 0 ? {a} : ({t})0) / (({t})1 + exp({a} < 0 ? {a} : -{a})))"}
declare("neg", ELEMENTWISE, _unary_signed, cuda="(-{a})")
declare("abs", ELEMENTWISE, _unary, cuda="({a} <= 0 ? ({t})0 - {a} : {a})")  # abs(-0.0) is +0
for _name, _c in _C_UNARY.items():
    declare(_name, ELEMENTWISE, _unary_float, cuda=_c)
for _name, _c in (("add", "({a} + {b})"), ("mul", "({a} * {b})"), ("div", None),
                  ("pow", None), ("maximum", None), ("minimum", None)):
    declare(_name, ELEMENTWISE, _binary, cuda=_c)
declare("arctan2", ELEMENTWISE, _binary_float, cuda="atan2({a}, {b})")
# NumPy's npy_logaddexp: equal operands (infinities of one sign too) give a + log 2; otherwise
# the larger plus log1p(exp(-|a - b|)), never overflowing; a NaN difference is returned (NaN)
declare("logaddexp", ELEMENTWISE, _binary_float,
        cuda="({a} == {b} ? {a} + ({t})0.6931471805599453 : ({a} > {b} ? {a} + log1p(exp({b} - "
             "{a})) : ({a} < {b} ? {b} + log1p(exp({a} - {b})) : {a} - {b})))")
declare("sub", ELEMENTWISE, _binary_signed, cuda="({a} - {b})")
for _name, _op in (("eq", "=="), ("ne", "!="), ("lt", "<"), ("le", "<="), ("gt", ">"),
                   ("ge", ">=")):
    declare(_name, ELEMENTWISE, _compare, differentiable=False, cuda=f"({{a}} {_op} {{b}})")
for _name, _op in (("logical_and", "&&"), ("logical_or", "||")):
    declare(_name, ELEMENTWISE, _logical, differentiable=False, cuda=f"({{a}} {_op} {{b}})")
declare("logical_not", ELEMENTWISE, _logical_not, differentiable=False, cuda="(!{a})")
# bitwise not of an integer (C promotes a char to int: the cast takes it back)
declare("invert", ELEMENTWISE, _unary_integer, differentiable=False, cuda="(({t})(~{a}))")
for _name, _op in (("bitwise_and", "&"), ("bitwise_or", "|"), ("bitwise_xor", "^")):
    declare(_name, ELEMENTWISE, _bitwise, differentiable=False,
            cuda=f"(({{t}})({{a}} {_op} {{b}}))")
# NumPy's shifts: a count outside [0, bits) gives 0 (left; right: -1 for a negative operand),
# where C's is undefined; a left shift in unsigned 64 bits (no signed overflow), truncated
_OUT = "(({b}) < 0 || ({b}) >= 8 * (long long)sizeof({t}))"
declare("left_shift", ELEMENTWISE, _shift, differentiable=False,
        cuda=f"({_OUT} ? ({{t}})0 : ({{t}})((unsigned long long)({{a}}) << ({{b}})))")
declare("right_shift", ELEMENTWISE, _shift, differentiable=False,
        cuda=f"({_OUT} ? ({{t}})(({{a}}) < 0 ? -1 : 0) : ({{t}})(({{a}}) >> ({{b}})))")
declare("sign", ELEMENTWISE, _unary_signed, differentiable=False,  # derivative: 0 almost anywhere
        cuda="({a} != {a} ? {a} : ({t})(({a} > 0) - ({a} < 0)))")  # sign(NaN) is NaN
declare("select", ELEMENTWISE, _select, cuda="({a} ? {b} : {c})")
declare("cast", ELEMENTWISE, _cast, moves=True, cuda="(({t}){a})")
# floats only (the wrappers return integers as they are); derivative 0 almost everywhere
for _name, _c in (("floor", "floor({a})"), ("ceil", "ceil({a})"), ("round", "rint({a})")):
    declare(_name, ELEMENTWISE, _unary_float, differentiable=False, cuda=_c)  # rint: half to even
declare("erf", ELEMENTWISE, _unary_float, cuda="erf({a})")
declare("mod", ELEMENTWISE, _mod)  # NumPy's remainder: the divisor's sign (CUDA: cuda_codegen)
# NumPy's float floor division (npy_floor_divide; integers floor in ``div``): the quotient of
# a - fmod(a, b), snapped to an integer; x // 0 is x / 0. Derivative 0 wherever it has one
declare("floor_divide", ELEMENTWISE, _binary_float, differentiable=False)
# the sign bit, of NaNs and zeros too (-0.0 and -NaN are set): a float in, a bool out
declare("signbit", ELEMENTWISE, _signbit, differentiable=False, cuda="((bool)signbit({a}))")
# a's magnitude with b's sign bit (C's copysign: -NaN's sign too); libm's hypot: no overflow or
# underflow of the squares, hypot(+-inf, NaN) is inf
declare("copysign", ELEMENTWISE, _binary_float, cuda="copysign({a}, {b})")
declare("hypot", ELEMENTWISE, _binary_float, cuda="hypot({a}, {b})")
declare("stop_gradient", ELEMENTWISE, _unary, differentiable=False, alias=True, cuda="{a}")
# rp.custom_vjp: the value (input 0) passes through; the gradient goes to the other inputs (the
# function's arguments) by the user's rule (attr ``rule``), never into the value's own graph
declare("custom_vjp", STRUCTURAL, lambda value, *args, rule: value, alias=True)
# rp.remat (``replicate/remat.py``): "remat" is custom_vjp's kind of node (the value passes
# through, the gradient comes from ``rule``: fn run again); "remat_barrier" is the recomputation's
# copy of one input of the region (a view of it), taken after ``after``, the cotangent that starts
# the region's backward pass. The copy is a new value, so CSE, which merges equal ops on equal
# inputs, cannot merge the recomputation back into the forward values it repeats (which would keep
# them alive until the backward pass: no saving), and ``after`` keeps it from being computed
# before the backward pass reaches the region (the JAX backend makes it an optimization_barrier,
# so XLA does not merge them either)
declare("remat", STRUCTURAL, lambda value, *args, rule: value, alias=True)
declare("remat_barrier", STRUCTURAL, lambda x, after: x, alias=True)
# rp.cond/rp.switch in graph mode: a value from outside a branch as the branch reads it. It
# passes through; its cotangent is the branch's where the branch is taken (``taken``), else 0 —
# a select, so what the untaken branch's backward pass makes of a zero cotangent (0 * inf, at
# sqrt's 0: NaN) never reaches the value (``control.py``)
declare("branch_input", STRUCTURAL, lambda x, taken: x, alias=True)

for _name in ("reduce_sum", "reduce_prod", "reduce_max", "reduce_min"):
    declare(_name, REDUCTION, _reduce_nonempty if _name in ("reduce_max", "reduce_min")
            else _reduce, fuse="reduce")
declare("argmax", REDUCTION, _arg_reduce, differentiable=False)
declare("argmin", REDUCTION, _arg_reduce, differentiable=False)
declare("cumsum", REDUCTION, _scan)  # scans: attrs axis (and reverse, for cumsum); not fused
declare("cumprod", REDUCTION, _scan)
declare("sort", STRUCTURAL, _sort)  # stable, NaNs last (as NumPy's kind="stable")
declare("argsort", STRUCTURAL, _argsort, differentiable=False)
# the insertion index of each value of v in the sorted 1-D a (attr side: "left" or "right"),
# NaNs sorting last (NumPy's order)
declare("searchsorted", STRUCTURAL, _searchsorted, differentiable=False)
declare("top_k_indices", STRUCTURAL, _top_k, differentiable=False)  # descending, ties: lower first

declare("reshape", STRUCTURAL, _reshape, alias=True)
declare("transpose", STRUCTURAL, _transpose, view=True)
# in a kernel, broadcasting is only a way of indexing an input, never a copy
declare("broadcast_to", STRUCTURAL, _broadcast_to, repeats=True, fuse="map", cuda="{a}")
declare("concatenate", STRUCTURAL, _concatenate, moves=True)
declare("pad", STRUCTURAL, _pad)
declare("getitem", STRUCTURAL, _getitem, view=True, indexes=True)
declare("scatter_add", STRUCTURAL, _scatter_add, indexes=True)

declare("matmul", CONTRACTION, _matmul)
declare("einsum", CONTRACTION, _einsum)
# 2-D convolution and its two gradients (``graph/conv.py``): attrs stride, padding, dilation
declare("conv2d", CONTRACTION, conv2d_shape)
declare("conv2d_input_grad", CONTRACTION, conv2d_input_grad_shape)  # attr size: the input's H, W
declare("conv2d_weight_grad", CONTRACTION, conv2d_weight_grad_shape)  # attr kernel: KH, KW
# softmax(q @ k^T * scale, masked) (``graph/attention.py``): attrs scale, causal, masking
declare("attention_weights", CONTRACTION, _attention_weights)

# linear algebra on stacks of float matrices (``graph/linalg.py``): one primitive per result of a
# factorisation (attr ``part``); svd: attr full_matrices
declare("solve", CONTRACTION, solve_shape)
declare("cholesky", CONTRACTION, cholesky_shape)
declare("qr", CONTRACTION, qr_shape)
declare("svd", CONTRACTION, svd_shape)
declare("eigh", CONTRACTION, eigh_shape)
declare("det", CONTRACTION, det_shape)
declare("slogdet", CONTRACTION, det_shape)

declare("random_bits", RANDOM, _random, differentiable=False)
declare("random_uniform", RANDOM, _random, differentiable=False)
declare("const", SOURCE, _const, differentiable=False, moves=True)


def prims_where(**flags) -> frozenset:
    """The names of the primitives whose flags have these values, e.g. ``prims_where(fuse=
    "reduce")``."""
    return frozenset(name for name, p in REGISTRY.items()
                     if all(getattr(p, k) == v for k, v in flags.items()))


def shown_attrs(attrs: dict) -> dict:
    """``attrs`` without the passes' private tags (names starting with ``_``, such as the
    rewrite's ``_exchange``/``_after`` that bucketing plans from): what a graph prints and what
    the ranks compare in their collective schedules."""
    return {k: v for k, v in attrs.items() if not k.startswith("_")}
