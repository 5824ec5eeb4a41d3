"""The op harness's cases: unary and binary elementwise ops, broadcasting, NumPy 2's dtype
promotion, ``where`` and ``clip``."""

from __future__ import annotations

import itertools

import numpy as np

import replicate.numpy as rnp

from .cases import BOOL, DTYPES, F32, F64, I32, I64, In, case


def sigmoid_ref(x):
    return 1.0 / (1.0 + np.exp(-x))


UNARY = {  # name: (rnp op, NumPy reference, domain)
    "exp": (rnp.exp, np.exp, "real"),
    "log": (rnp.log, np.log, "positive"),
    "log1p": (rnp.log1p, np.log1p, "positive"),
    "expm1": (rnp.expm1, np.expm1, "real"),
    "sqrt": (rnp.sqrt, np.sqrt, "positive"),
    "rsqrt": (rnp.rsqrt, lambda x: 1.0 / np.sqrt(x), "positive"),
    "tanh": (rnp.tanh, np.tanh, "real"),
    "sigmoid": (rnp.sigmoid, sigmoid_ref, "real"),
    "softplus": (rnp.softplus, lambda x: np.logaddexp(0.0, x), "real"),
    "sin": (rnp.sin, np.sin, "real"),
    "cos": (rnp.cos, np.cos, "real"),
    "reciprocal": (rnp.reciprocal, np.reciprocal, "away0"),
    # these keep integer dtypes
    "abs": (rnp.abs, np.abs, "away0"),
    "sign": (rnp.sign, np.sign, "away0"),
    "negative": (rnp.negative, np.negative, "real"),
    "square": (rnp.square, np.square, "real"),
}
KEEPS_INT = {"abs", "sign", "negative", "square"}
UNARY_SHAPES = [(), (1,), (4,), (2, 3), (2, 1, 3)]

for name, (op, ref, domain) in UNARY.items():
    for shape in UNARY_SHAPES:
        case(name, op, ref, In(shape, F64, domain))
    for dtype in (F32, I32, I64):
        case(name, op, ref, In((2, 3), dtype, domain))
case("abs+sign", lambda x: rnp.abs(x) + rnp.sign(x), lambda x: np.abs(x) + np.sign(x),
     In((5,), F64, "int"), grad=False, label="zeros")
case("isfinite", rnp.isfinite, np.isfinite, In((3, 4), F64, "special"))
case("isfinite", rnp.isfinite, np.isfinite, In((6,), F32, "special"))
case("isfinite", rnp.isfinite, np.isfinite, In((), F64, "special"))
case("sigmoid+softplus", lambda x: rnp.sigmoid(x * 40.0) + rnp.softplus(x * 40.0),
     lambda x: sigmoid_ref(x * 40.0) + np.logaddexp(0.0, x * 40.0), In((6,), F64), label="large",
     grad_rtol=1e-4)

# -- binary elementwise, broadcasting ----------------------------------------------------------
BINARY = {
    "add": (rnp.add, np.add, "real", "real"),
    "subtract": (rnp.subtract, np.subtract, "real", "real"),
    "multiply": (rnp.multiply, np.multiply, "real", "real"),
    "divide": (rnp.divide, np.divide, "real", "away0"),
    "true_divide": (rnp.true_divide, np.true_divide, "real", "away0"),
    "power": (rnp.power, np.power, "positive", "real"),
    "maximum": (rnp.maximum, np.maximum, "real", "real"),
    "minimum": (rnp.minimum, np.minimum, "real", "real"),
}
BINARY_SHAPES = [((), ()), ((3,), ()), ((), (3,)), ((2, 3), (3,)), ((2, 1), (1, 3)),
                 ((2, 3), (2, 3)), ((1,), (2, 3)), ((4, 1, 3), (2, 1)), ((2, 3), (1, 1))]
for name, (op, ref, da, db) in BINARY.items():
    for sa, sb in BINARY_SHAPES:
        case(name, op, ref, In(sa, F64, da), In(sb, F64, db))
for label, op, ref in [("+", lambda a, b: a + b, np.add), ("-", lambda a, b: a - b, np.subtract),
                       ("*", lambda a, b: a * b, np.multiply), ("/", lambda a, b: a / b, np.divide),
                       ("**", lambda a, b: a ** b, np.power)]:
    da, db = ("positive", "real") if label == "**" else ("real", "away0")
    case({"+": "add", "-": "subtract", "*": "multiply", "/": "divide", "**": "power"}[label],
         op, ref, In((2, 3), F64, da), In((3,), F64, db), label=f"operator{label}")
case("power", rnp.power, np.power, In((2, 3), I32, "posint"), In((3,), I32, "posint"),
     label="int")
case("power", lambda x: x ** 3, lambda x: x ** 3, In((2, 3), F64), label="cube")
case("power", lambda x: x ** 2, lambda x: x ** 2, In((4,), I64), label="int-square")
case("power", lambda x: 2.0 ** x, lambda x: 2.0 ** x, In((2, 3), F64), label="rpow")
case("floor_divide", rnp.floor_divide, np.floor_divide, In((2, 3), I64, "int"),
     In((3,), I64, "away0"))
case("floor_divide", lambda a, b: a // b, lambda a, b: a // b, In((2, 3), I32, "int"),
     In((2, 3), I32, "away0"), label="operator")
case("floor_divide", lambda a, b: a // b, lambda a, b: a // b, In((2, 3), F64, "real"),
     In((3,), F64, "away0"), label="float", grad=False)

# integer edges, every pair of (0, +-1, 7, -7, MIN, MAX) (a (7, 1) by a (1, 7) grid): NumPy
# gives 0 for x // 0 and x % 0 (with a warning) and wraps MIN // -1, -MIN and abs(MIN); XLA's
# x // 0 is -1 (all ones unsigned), C leaves all of them undefined (guides/gpu.md)
I8, U8, U32 = "int8", "uint8", "uint32"
for dt in (I8, I32, I64, U8, U32):
    grid = (In((7, 1), dt, "edges"), In((1, 7), dt, "edges"))
    case("floor_divide", lambda a, b: a // b, lambda a, b: a // b, *grid, label="edges",
         grad=False)
    case("mod", lambda a, b: a % b, lambda a, b: a % b, *grid, label="edges", grad=False)
case("floor_divide", rnp.floor_divide, np.floor_divide, In((7, 1), I32, "edges"),
     In((1, 7), I32, "edges"), label="edges", grad=False)
case("remainder", rnp.remainder, np.remainder, In((7, 1), I64, "edges"),
     In((1, 7), I64, "edges"), label="edges", grad=False)
for dt in (I8, I32, I64):
    case("abs", rnp.abs, np.abs, In((7,), dt, "edges"), label="edges", grad=False)
    case("negative", lambda a: -a, lambda a: -a, In((7,), dt, "edges"), label="edges",
         grad=False)

COMPARISONS = {"equal": (rnp.equal, np.equal, "=="),
               "not_equal": (rnp.not_equal, np.not_equal, "!="),
               "less": (rnp.less, np.less, "<"),
               "less_equal": (rnp.less_equal, np.less_equal, "<="),
               "greater": (rnp.greater, np.greater, ">"),
               "greater_equal": (rnp.greater_equal, np.greater_equal, ">=")}
for name, (op, ref, sym) in COMPARISONS.items():
    for sa, sb in [((), ()), ((2, 3), (3,)), ((4, 1), (1, 3)), ((3,), ())]:
        case(name, op, ref, In(sa, F64, "int"), In(sb, F64, "int"))
    operator = eval(f"lambda a, b: a {sym} b")  # noqa: S307 - a fixed operator symbol
    case(name, operator, operator, In((2, 3), I32), In((3,), I32), label=f"operator{sym}")

for name, op, ref in [("logical_and", rnp.logical_and, np.logical_and),
                      ("logical_or", rnp.logical_or, np.logical_or)]:
    case(name, op, ref, In((2, 3), BOOL), In((3,), BOOL))
    case(name, op, ref, In((), BOOL), In((2,), BOOL))
case("logical_not", rnp.logical_not, np.logical_not, In((2, 3), BOOL))
for dtype in (F64, I32):  # numbers are truth values: the result is bool
    case("logical_not", rnp.logical_not, np.logical_not, In((2, 3), dtype, "int"))
    case("logical_and+logical_or", lambda a, b: (rnp.logical_and(a, b), rnp.logical_or(a, b)),
         lambda a, b: (np.logical_and(a, b), np.logical_or(a, b)), In((2, 3), dtype, "int"),
         In((3,), BOOL), label="numbers")
for dtype in (I32, I64, BOOL):  # ~ is NumPy's: bitwise not of integers, logical not of bools
    case("invert+bitwise_not", lambda x: (rnp.invert(x), rnp.bitwise_not(x), ~x),
         lambda x: (np.invert(x), np.invert(x), ~x), In((7,), dtype, "edges"))
case("invert", lambda x: ~rnp.cast(x, "uint8"), lambda x: ~x.astype(np.uint8),
     In((5,), I32, "class256"), label="uint8")
BITWISE = "bitwise_and+bitwise_or+bitwise_xor+left_shift+right_shift"
for dtype in (I32, I64):  # every pair of edges (shifts by negative counts and past the width too)
    case(BITWISE, lambda a, b: (rnp.bitwise_and(a, b), rnp.bitwise_or(a, b), rnp.bitwise_xor(a, b),
                                rnp.left_shift(a, b), rnp.right_shift(a, b)),
         lambda a, b: (a & b, a | b, a ^ b, a << b, a >> b), In((7, 1), dtype, "edges"),
         In((1, 7), dtype, "edges"), label="edges", grad=False)
    case(BITWISE, lambda a, b: (a & b, a | b, a ^ b, a << (b % 70 - 3), a >> (b % 70 - 3)),
         lambda a, b: (a & b, a | b, a ^ b, a << (b % 70 - 3), a >> (b % 70 - 3)),
         In((4, 3), dtype, "int"), In((3,), dtype, "class200"), label="operators", grad=False)
case("bitwise_left_shift+bitwise_right_shift", lambda a: (rnp.bitwise_left_shift(a, 3),
                                                          rnp.bitwise_right_shift(a, 3), 1 << a),
     lambda a: (a << 3, a >> 3, 1 << a), In((5,), I32, "class40"), grad=False)
case(BITWISE, lambda a, b: (a & b, a | b, a ^ b, a << b, a >> b),
     lambda a, b: (a & b, a | b, a ^ b, a << b, a >> b), In((4,), BOOL), In((4,), BOOL),
     label="bools", grad=False)
case("logical_and+logical_or+logical_not", lambda a, b: (a & b) | ~a,
     lambda a, b: (a & b) | ~a, In((4,), BOOL), In((4,), BOOL), label="operators")

# -- dtype promotion (NumPy 2 rules; Python scalars are weak) -----------------------------------
PROMOTING = {"add": (rnp.add, np.add), "multiply": (rnp.multiply, np.multiply),
             "subtract": (rnp.subtract, np.subtract), "divide": (rnp.divide, np.divide),
             "maximum": (rnp.maximum, np.maximum), "minimum": (rnp.minimum, np.minimum),
             "less": (rnp.less, np.less), "equal": (rnp.equal, np.equal)}
for name, (op, ref) in PROMOTING.items():
    for da, db in itertools.product(DTYPES, DTYPES):
        if name == "subtract" and da == db == BOOL:
            continue  # NumPy refuses bool - bool
        case(name, op, ref, In((2, 3), da, "posint"), In((3,), db, "posint"), grad=False,
             label="promote")

SCALAR_EXPRS = ["x + 1", "x + 1.5", "2 * x", "x * 2.5", "x / 2", "1 / x", "x - 3", "3.0 - x",
                "x ** 2", "x > 1", "x == 2", "x >= 1.5", "x + True", "rnp_max(x, 2)",
                "rnp_min(x, 0.5)", "rnp.where(x > 1, x, 0)", "rnp.where(x > 1, x, 0.5)"]
for expr in SCALAR_EXPRS:
    for dtype in DTYPES:
        if dtype == BOOL and any(s in expr for s in ("- x", "x -", "**")):
            continue  # NumPy refuses bool subtraction; bool ** int is int8 in NumPy
        fn = eval(f"lambda x: {expr}", {"rnp": rnp, "rnp_max": rnp.maximum,  # noqa: S307
                                        "rnp_min": rnp.minimum})
        ref = eval(f"lambda x: {expr}", {"rnp": np, "rnp_max": np.maximum,  # noqa: S307
                                         "rnp_min": np.minimum})
        for shape in [(2, 3), ()]:
            case("add+multiply+divide+subtract+power+where", fn, ref, In(shape, dtype, "posint"),
                 grad=dtype == F64, label=f"weak {expr}")
case("multiply", lambda x: x * np.float64(2.0), lambda x: x * np.float64(2.0),
     In((3,), F32), grad=False, label="numpy-scalar-is-strong")
case("add", lambda x: np.ones((2, 3)) + x, lambda x: np.ones((2, 3)) + x, In((3,), F32),
     label="ndarray-on-the-left")

# -- where and clip ----------------------------------------------------------------------------
for sc, sa, sb in [((2, 3), (2, 3), (2, 3)), ((3,), (2, 1), ()), ((), (2, 3), (3,)),
                   ((2, 1), (1, 3), (2, 3))]:
    case("where", rnp.where, np.where, In(sc, BOOL), In(sa, F64), In(sb, F64))
case("where", rnp.where, np.where, In((2, 3), I64, "int"), In((2, 3), F64), In((3,), F32),
     label="int-cond")
case("where", lambda c, a: rnp.where(c, a, 0.0), lambda c, a: np.where(c, a, 0.0),
     In((2, 3), BOOL), In((2, 3), F32), label="weak-scalar")
case("where", rnp.where, np.where, In((2, 3), BOOL), In((2, 3), I32), In((3,), F32),
     label="promote")
case("clip", lambda x: rnp.clip(x, -0.5, 0.5), lambda x: np.clip(x, -0.5, 0.5), In((3, 4)))
case("clip", lambda x: rnp.clip(x, None, 0.3), lambda x: np.clip(x, None, 0.3), In((5,)))
case("clip", lambda x: rnp.clip(x, -0.2, None), lambda x: np.clip(x, -0.2, None), In(()))
case("clip", lambda x, lo, hi: rnp.clip(x, -rnp.abs(lo), rnp.abs(hi)),
     lambda x, lo, hi: np.clip(x, -np.abs(lo), np.abs(hi)), In((2, 3)), In((3,), F64, "unit"),
     In((2, 1), F64, "unit"), label="array-bounds")
case("clip", lambda x: rnp.clip(x, 0, 2), lambda x: np.clip(x, 0, 2), In((2, 3), I32),
     label="int")
# NumPy keeps x where it equals a bound (-0.0 stays -0.0), a NaN bound gives NaN, max wins over
# a larger min: the sign bits read out, and every special value against every bound
case("clip", lambda x: (rnp.signbit(rnp.clip(x * -0.0, 0.0, 1.0)),
                        rnp.signbit(rnp.clip(x * 0.0, -1.0, -0.0))),
     lambda x: (np.signbit(np.clip(x * -0.0, 0.0, 1.0)), np.signbit(np.clip(x * 0.0, -1.0, -0.0))),
     In((6,), F64, "away0"), grad=False, label="signed zero")
case("clip", lambda x, lo, hi: rnp.clip(x, lo, hi), lambda x, lo, hi: np.clip(x, lo, hi),
     In((6, 1, 1), F64, "special"), In((1, 6, 1), F64, "special"), In((1, 1, 6), F64, "special"),
     grad=False, label="special bounds")
