"""Elementwise ops, NumPy broadcasting and promotion; re-exported by rnp (``__all__`` computed)."""

from __future__ import annotations

import numpy as np

from ..dtypes import is_float
from ..errors import DTypeError, NegativePowerError
from ..graph.core import bind
from ._base import as_array, cast, float_ufunc_operands, promote, ufunc_float_operand


def _unary(prim, floating, doc=None):
    """The wrapper of unary primitive ``prim``; ``floating``: a bool or integer operand is cast
    to the float type NumPy's float ufuncs give it (float16 for bools and 8-bit integers,
    float64 for 32- and 64-bit integers)."""
    def op(x):
        x = ufunc_float_operand(x) if floating else as_array(x)
        return bind(prim, x)

    op.__name__, op.__doc__ = prim, doc
    return op


def _binary(prim, floating=False, doc=None):
    """The wrapper of binary primitive ``prim``: NumPy's broadcasting and promotion."""
    def op(a, b):
        a, b = promote(a, b, floating=floating)
        return bind(prim, a, b)

    op.__name__, op.__doc__ = prim, doc
    return op


# (The float functions take bools and integers in NumPy's float type for them: module docstring.)
negative = _unary("neg", False, "``-x`` (``np.negative``); bools are refused, as by NumPy.")
abs = _unary("abs", False, "``|x|`` (``np.abs``); the most negative integer stays negative.")  # noqa: A001
sign = _unary("sign", False, "-1, 0 or 1 by the sign of x (``np.sign``); NaN at NaN; no bools.")
exp = _unary("exp", True, "``e ** x``, elementwise (``np.exp``).")
log = _unary("log", True, "The natural logarithm (``np.log``): -inf at 0, NaN below 0.")
log1p = _unary("log1p", True, "``log(1 + x)``, accurate for tiny x (``np.log1p``).")
expm1 = _unary("expm1", True, "``exp(x) - 1``, accurate for tiny x (``np.expm1``).")
sqrt = _unary("sqrt", True, "The square root (``np.sqrt``): NaN below 0.")
rsqrt = _unary("rsqrt", True, "``1 / sqrt(x)`` as one op (JAX's ``lax.rsqrt``; not in NumPy).")
tanh = _unary("tanh", True, "The hyperbolic tangent (``np.tanh``).")
sigmoid = _unary("logistic", True, "The logistic ``1 / (1 + exp(-x))`` (SciPy's ``expit``).")
sin = _unary("sin", True, "The sine of x radians (``np.sin``).")
cos = _unary("cos", True, "The cosine of x radians (``np.cos``).")
erf = _unary("erf", True)
erf.__doc__ = """The error function, elementwise (a primitive: NumPy has none, so the reference is
fdlibm's algorithm, ``replicate/graph/special.py``; JAX ``lax.erf``; CUDA ``erf``).

>>> import replicate.numpy as rnp
>>> rnp.erf(rnp.asarray([0.0, 1.0, -3.0])).tolist()
[0.0, 0.8427007929497149, -0.9999779095030014]
"""


def _documented(op, doc):
    op.__doc__ = doc
    return op


# NumPy's float functions, each a primitive (NumPy's, JAX's, CUDA's own: a composition rounds,
# overflows or cancels where the function does not: (exp(x) - exp(-x)) / 2 near 0)
tan = _documented(_unary("tan", True), """The tangent (``np.tan``); gradient ``1 + tan(x)**2``.""")
sinh = _documented(_unary("sinh", True), """The hyperbolic sine (``np.sinh``); gradient cosh.""")
cosh = _documented(_unary("cosh", True), """The hyperbolic cosine (``np.cosh``); gradient sinh.""")
arcsin = _documented(_unary("arcsin", True), """The inverse sine, elementwise (``np.arcsin``):
NaN outside [-1, 1]. A primitive; gradient ``1 / sqrt(1 - x**2)``.""")
arccos = _documented(_unary("arccos", True), """The inverse cosine, elementwise (``np.arccos``):
NaN outside [-1, 1]. A primitive; gradient ``-1 / sqrt(1 - x**2)``.""")
arctan = _documented(_unary("arctan", True), """The inverse tangent, elementwise (``np.arctan``).
A primitive; gradient ``1 / (1 + x**2)``.""")
arcsinh = _documented(_unary("arcsinh", True), """The inverse hyperbolic sine, elementwise
(``np.arcsinh``). A primitive; gradient ``1 / sqrt(x**2 + 1)`` (0 where ``x**2`` overflows).""")
arccosh = _documented(_unary("arccosh", True), """The inverse hyperbolic cosine, elementwise
(``np.arccosh``): NaN below 1. A primitive; gradient ``1 / sqrt(x**2 - 1)``.""")
arctanh = _documented(_unary("arctanh", True), """The inverse hyperbolic tangent, elementwise
(``np.arctanh``): ±inf at ±1, NaN beyond. A primitive; gradient ``1 / (1 - x**2)``.""")
log2 = _documented(_unary("log2", True), """The base-2 logarithm, elementwise (``np.log2``;
exact at powers of 2, which ``log(x) / log(2)`` is not — but on the JAX backend, whose
``log2`` is that quotient). A primitive; gradient ``1 / (x log 2)``.

>>> import replicate.numpy as rnp
>>> rnp.log2(rnp.asarray([1.0, 8.0, 0.5])).tolist()
[0.0, 3.0, -1.0]
""")
log10 = _documented(_unary("log10", True), """The base-10 logarithm, elementwise (``np.log10``;
exact at powers of 10 but on JAX, as ``log2``). A primitive; gradient ``1 / (x log 10)``.""")


def _binary_float_ufunc(prim):
    """The wrapper of a binary float primitive: bools and integers in the float NumPy's loop
    gives them (``np.arctan2`` of int8 is float16, of int32 float64: as ``exp``, not as
    ``divide``; ``_base.float_ufunc_operands``)."""
    def op(a, b):
        return bind(prim, *float_ufunc_operands(a, b))

    op.__name__ = prim
    return op


arctan2 = _documented(_binary_float_ufunc("arctan2"), """The angle of the point ``(x2, x1)``,
elementwise, in [-pi, pi] (``np.arctan2(x1, x2)``, the quadrant from both signs, signed zeros
included). A primitive; gradient ``(x2, -x1) / (x1**2 + x2**2)``.

>>> import replicate.numpy as rnp
>>> rnp.arctan2(rnp.asarray([1.0, -0.0]), -1.0).tolist()
[2.356194490192345, -3.141592653589793]
""")
logaddexp = _documented(_binary_float_ufunc("logaddexp"), """``log(exp(x1) + exp(x2))``,
elementwise, without overflow (``np.logaddexp``, whose formula and special values it keeps:
``logaddexp(inf, inf)`` is inf, ``logaddexp(-inf, -inf)`` is -inf, a NaN gives NaN). A
primitive; gradient ``exp(x1 - out)``, ``exp(x2 - out)``.

>>> import replicate.numpy as rnp
>>> rnp.logaddexp(rnp.asarray([1000.0, -1000.0]), 1000.0).tolist()
[1000.6931471805599, 1000.0]
""")


def positive(x):
    """``+x``, elementwise (``np.positive``): the values as they are (``-0.0`` stays); bools are
    refused, as NumPy refuses them. Gradient 1.

    >>> import replicate.numpy as rnp
    >>> rnp.positive(rnp.asarray([-1.5, 2.0])).tolist()
    [-1.5, 2.0]
    """
    x = as_array(x)
    if x.dtype == np.bool_:
        raise DTypeError("positive of bools is not defined (NumPy refuses it too); cast them "
                         "to a number first")
    return x


def logical_not(x):
    """The truth value of ``not x``, elementwise: bool whatever ``x``'s dtype (a number is true
    when it is not 0, NaN included), as NumPy's.

    >>> import replicate.numpy as rnp
    >>> rnp.logical_not(rnp.asarray([0.0, 2.5, -0.0])).tolist()
    [True, False, True]
    """
    x = as_array(x)
    return bind("logical_not", x) if x.dtype == np.bool_ else equal(x, 0)


def invert(x):
    """``~x``, as NumPy's: bitwise not of integers (``~6 == -7``), logical not of bools; floats
    are refused (NumPy's TypeError). No gradient (the values are integers or bools).

    >>> import replicate.numpy as rnp
    >>> (~rnp.asarray([0, 6])).tolist(), (~rnp.asarray([True, False])).tolist()
    ([-1, -7], [False, True])
    """
    x = as_array(x)
    if x.dtype == np.bool_:
        return bind("logical_not", x)
    if x.dtype.kind not in "iu":
        raise DTypeError(f"invert (~) needs integers or bools, got {x.dtype}")
    return bind("invert", x)


bitwise_not = invert


def _truth(x):
    """``x`` as bools: a number is true where it is not 0 (NumPy's logical ops)."""
    x = as_array(x)
    return x if x.dtype == np.bool_ else not_equal(x, 0)


def _logical(prim):
    def op(a, b):
        """NumPy's logical op: bool, operands of any dtype read as truth values."""
        return bind(prim, _truth(a), _truth(b))

    op.__name__ = prim
    return op


# Broadcast and promoted as NumPy 2 (Python scalars weak); integers wrap on overflow.
add = _binary("add", doc="``a + b`` (``np.add``); of bools, logical or.")
subtract = _binary("sub", doc="``a - b`` (``np.subtract``); bools are refused, as by NumPy.")
multiply = _binary("mul", doc="``a * b`` (``np.multiply``); of bools, logical and.")
maximum = _binary("maximum", doc="The larger of a and b (``np.maximum``): NaN if either is.")
minimum = _binary("minimum", doc="The smaller of a and b (``np.minimum``): NaN if either is.")
equal = _binary("eq", doc="``a == b``, bools (``np.equal``): NaN equals nothing.")
not_equal = _binary("ne", doc="``a != b``, bools (``np.not_equal``): True where either is NaN.")
less = _binary("lt", doc="``a < b``, bools (``np.less``): False where either is NaN.")
less_equal = _binary("le", doc="``a <= b``, bools (``np.less_equal``): False at NaN.")
greater = _binary("gt", doc="``a > b``, bools (``np.greater``): False where either is NaN.")
greater_equal = _binary("ge", doc="``a >= b``, bools (``np.greater_equal``): False at NaN.")
logical_and = _logical("logical_and")
logical_or = _logical("logical_or")
true_divide = divide = _binary("div", True, """``a / b`` (``np.divide``, ``np.true_divide``):
always a float: bools and integers of any width give float64, as NumPy's; ``x / 0`` is ±inf,
``0 / 0`` NaN.""")


def power(a, b):
    """``a ** b`` elementwise; the result is floating point unless both are integers.

    >>> import replicate.numpy as rnp
    >>> rnp.power(rnp.asarray([1.0, 2.0, 3.0]), 2).tolist()
    [1.0, 4.0, 9.0]
    """
    a, b = _int8_if_bool(*promote(a, b))
    if np.issubdtype(b.dtype, np.integer) and not b.symbolic and b.size and b.value.min() < 0:
        raise NegativePowerError("integers to negative integer powers are not allowed (as in "
                                 "NumPy); raise floats instead")
    return bind("pow", a, b)


def _int8_if_bool(a, b):
    """Two bool operands as int8: NumPy's arithmetic ufuncs (``power``, ``floor_divide``,
    ``remainder``) have no bool loop and compute two bools in int8."""
    if a.dtype == np.bool_:
        return cast(a, np.int8), cast(b, np.int8)
    return a, b


def floor_divide(a, b):
    """``a // b``, floored, as NumPy's: integers (a bool pair in int8; ``x // 0`` is 0, NumPy's
    value) and floats by NumPy's own algorithm (``inf // 2`` is NaN, ``x // 0`` is ``x / 0``, a
    zero quotient has the sign of ``a / b``). No gradient: its derivative is 0 wherever it has
    one. A primitive (``div`` for integers, ``floor_divide`` for floats).

    >>> import replicate.numpy as rnp
    >>> (rnp.asarray([7.0, -7.0, -0.5, 1.0]) // rnp.asarray([2.0, 2.0, 4.0, 0.0])).tolist()
    [3.0, -4.0, -1.0, inf]
    """
    a, b = _int8_if_bool(*promote(a, b))
    return bind("floor_divide" if is_float(a.dtype) else "div", a, b)


def mod(a, b):
    """The remainder of ``a / b`` with the divisor's sign, as NumPy's ``mod`` and ``%`` (and
    Python's): ``a - b * floor(a / b)``; floats and integers (an integer mod 0 is 0; two bools
    in int8, as NumPy). A primitive.

    Gradient (floats): 1 for ``a``, ``-floor(a / b)`` for ``b`` (the quotient the result was
    taken with); at the jumps, where ``a / b`` is an integer, it is the right-hand one.

    >>> import replicate.numpy as rnp
    >>> rnp.mod(rnp.asarray([7, -7, 7]), rnp.asarray([3, 3, -3])).tolist()
    [1, 2, -2]
    >>> (rnp.asarray([-0.5, 2.5]) % 2.0).tolist()
    [1.5, 0.5]
    """
    a, b = _int8_if_bool(*promote(a, b))
    return bind("mod", a, b)


remainder = mod


def _rounding(prim, what):
    def op(x):
        x = as_array(x)
        return bind(prim, x) if is_float(x.dtype) else x  # integers and bools are whole already

    op.__name__ = prim
    op.__doc__ = (f"{what}, elementwise; an integer or bool array comes back as it is (as "
                  "NumPy 2's floor and ceil do). A primitive; its gradient is zero (the "
                  "derivative wherever it has one).")
    return op


floor = _rounding("floor", "The largest integer not above x")
ceil = _rounding("ceil", "The smallest integer not below x")
_rint = _rounding("round", "x rounded to the nearest integer, halves to the even one")


def trunc(x):
    """x rounded towards zero, elementwise (``np.trunc``): ``ceil`` below 0, ``floor`` elsewhere
    (exact; -0.5 gives -0.0, NaN and ±inf stay). An integer or bool array comes back as it is
    (as NumPy 2's). Its gradient is zero (the derivative wherever it has one).

    >>> import replicate.numpy as rnp
    >>> rnp.trunc(rnp.asarray([-1.7, -0.5, 0.5, 2.9])).tolist()
    [-1.0, -0.0, 0.0, 2.0]
    """
    x = as_array(x)
    if not is_float(x.dtype):
        return x
    return where(less(x, 0), ceil(x), floor(x))


def round(x, decimals=0):  # noqa: A001 - mirrors numpy's name
    """Round to ``decimals`` places, halves to even, as ``np.round``: the ``round`` primitive
    (NumPy's ``rint``) for ``decimals=0``; otherwise NumPy's own formula, ``rint(x * 10**d) /
    10**d`` (``rint(x / 10**-d) * 10**-d`` for negative d), computed in x's dtype. The gradient
    is zero (the derivative wherever it has one). Integers and bools come back as they are
    (NumPy makes bools float16; negative ``decimals`` on integers are refused).

    >>> import replicate.numpy as rnp
    >>> rnp.round(rnp.asarray([0.5, 1.5, 2.5, -0.5, 2.675])).tolist()
    [0.0, 2.0, 2.0, -0.0, 3.0]
    >>> rnp.round(rnp.asarray([1.2345, 150.0]), 1).tolist()
    [1.2, 150.0]
    """
    x = as_array(x)
    if not is_float(x.dtype) and decimals >= 0:
        return x
    if decimals == 0:
        return _rint(x)
    if not is_float(x.dtype):  # NumPy: integer arithmetic, halves to even
        raise DTypeError("round of an integer array to negative decimals is not supported; "
                         "cast it to a float first")
    scale = 10.0 ** decimals if decimals > 0 else 10.0 ** -decimals  # (abs is rnp.abs here)
    if decimals > 0:
        return divide(_rint(multiply(x, scale)), scale)
    return multiply(_rint(divide(x, scale)), scale)


def square(x):
    """``x * x``, in x's dtype (a bool array in int8, as NumPy's ``square``)."""
    x = as_array(x)
    if x.dtype == np.bool_:
        x = cast(x, np.int8)
    return multiply(x, x)


def reciprocal(x):
    """``1 / x`` in x's dtype, as NumPy's ``reciprocal``: for integers the quotient truncated
    (1 for 1, -1 for -1, else 0 — and 0 for 0, the project's integer division by 0, where
    NumPy's value depends on the platform), a bool array in int8.

    >>> import replicate.numpy as rnp
    >>> rnp.reciprocal(rnp.asarray([-2, -1, 0, 1, 2])).tolist()
    [0, -1, 0, 1, 0]
    """
    x = as_array(x)
    if is_float(x.dtype):
        return divide(1.0, x)
    if x.dtype == np.bool_:
        x = cast(x, np.int8)
    return where(equal(abs(x), 1), x, 0)


def where(cond, a, b):
    """Choose elementwise: ``a`` where ``cond`` is true, else ``b`` (broadcasting): the traced
    replacement for a Python ``if`` on array values.

    >>> import replicate.numpy as rnp
    >>> x = rnp.asarray([-1.0, 2.0])
    >>> rnp.where(x > 0, x, 0.0).tolist()
    [0.0, 2.0]
    """
    cond = as_array(cond)
    if cond.dtype != np.bool_:
        cond = not_equal(cond, 0)
    a, b = promote(a, b)
    return bind("select", cond, a, b)


def clip(x, min=None, max=None):  # noqa: A002 - NumPy 2's and the Array API's names
    """Clamp into ``[min, max]``; either bound may be None. NumPy's: ``x`` itself where it equals
    a bound (``clip(-0.0, 0.0, 1.0)`` is -0.0), NaN for a NaN bound, ``max`` where min > max."""
    x = as_array(x)
    for bound, beyond in ((min, less), (max, greater)):
        if bound is not None:
            x = where(beyond(x, bound), bound, x)
            if not isinstance(bound, (int, float)) or bound != bound:  # (a NaN bound: NaN)
                x = where(not_equal(bound, bound), bound, x)
    return x


def softplus(x):
    """``log(1 + exp(x))``, stably (ints in NumPy's float, as ``exp``): two smooth branches, each
    fed 0 where the other is taken, so every derivative is softplus's (the second: 0.25 at 0)."""
    x = ufunc_float_operand(x)
    above = greater(x, 0.0)
    up, down = where(above, x, 0.0), where(above, 0.0, x)
    return where(above, add(up, log1p(exp(negative(up)))), log1p(exp(down)))


def isfinite(x):
    """Whether x is neither infinite nor NaN, elementwise (bool; every integer is finite)."""
    x = as_array(x)
    if not is_float(x.dtype):
        return equal(x, x)  # all true
    return less(abs(x), np.inf)


def stop_gradient(x):
    """The identity whose gradient is zero.

    >>> import replicate as rp, replicate.numpy as rnp; x = rnp.asarray(3.0)
    >>> float(rp.grad(x * rnp.stop_gradient(x), x))
    3.0
    """
    return bind("stop_gradient", as_array(x))


__all__ = sorted(n for n, v in list(globals().items()) if not n.startswith("_")
                 and callable(v) and getattr(v, "__module__", None) == __name__)
