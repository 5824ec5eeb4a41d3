"""The op harness's cases: the everyday ops (rounding, ``mod``, ``erf``, scans, sorting,
rearranging), NumPy's remaining float functions, ``conv_transpose2d`` and the convolution's two
gradients as primitives."""

from __future__ import annotations

import itertools
import math

import numpy as np

import replicate.numpy as rnp

from .cases import BOOL, F32, F64, I32, I64, In, case
from .ops_structure import axis_op
from .ops_windows import conv2d_ref, pair

# -- everyday ops (issue 16): rounding, mod, erf, scans, sorting, rearranging ---------------------
ROUNDING = {"floor": (rnp.floor, np.floor), "ceil": (rnp.ceil, np.ceil),
            "round": (rnp.round, np.round), "trunc": (rnp.trunc, np.trunc)}
for name, (op, ref) in ROUNDING.items():
    # the gradient is zero (checked: no sample is within fd_eps of a jump)
    case(name, op, ref, In((2, 3)))
    case(name, op, ref, In((), F64))
    case(name, op, ref, In((4,), F32))
    case(name, op, ref, In((5,), F64, "special"), grad=False, label="special")
    for dtype in (I32, I64):
        case(name, op, ref, In((2, 3), dtype), label="int")  # whole already: returned as is
    case(name, lambda x, op=op: op(x + 0.5), lambda x, ref=ref: ref(x + 0.5),
         In((3, 4), F64, "int"), grad=False, label="halves")  # round: halves to even
case("floor+ceil", lambda x: rnp.floor(x) + rnp.ceil(x), lambda x: np.floor(x) + np.ceil(x),
     In((4,), BOOL), label="bool")
case("trunc", rnp.trunc, np.trunc, In((4,), BOOL), label="bool")
case("trunc", lambda x: rnp.trunc(x * 0.5), lambda x: np.trunc(x * 0.5), In((3, 4), F64, "int"),
     grad=False, label="negative halves")  # -0.5 -> -0.0, -1.0 stays
# halves again, at decimals 1 and -1 (exact in bfloat16 too: a rounding step before a jump
# would move the value across it; test_round_with_decimals takes general values)
case("round", lambda x: rnp.round(x + 0.25, 1), lambda x: np.round(x + 0.25, 1),
     In((3, 4), F64, "int"), grad=False, label="decimals=1")
case("round", lambda x: rnp.round(x * 10.0 + 5.0, -1), lambda x: np.round(x * 10.0 + 5.0, -1),
     In((3, 4), F32, "int"), grad=False, label="decimals=-1")

for sa, sb in [((), ()), ((2, 3), (3,)), ((2, 1), (1, 3)), ((3,), ()), ((), (2, 3))]:
    case("mod", rnp.mod, np.mod, In(sa, F64), In(sb, F64, "away0"))
    case("mod", rnp.mod, np.mod, In(sa, I64, "int"), In(sb, I64, "away0"))
case("mod", rnp.mod, np.mod, In((2, 3), F32), In((3,), F32, "away0"))
case("mod", rnp.mod, np.mod, In((3, 4), I32), In((3, 4), I32), label="zero divisors")
case("mod", rnp.mod, np.mod, In((6,), F64, "special"), In((6,), F64, "special"),
     grad=False, label="special")
case("mod", lambda a: rnp.mod(a * 4.0, 1.0), lambda a: np.mod(a * 4.0, 1.0), In((2, 3)),
     label="fractional part")
case("remainder", rnp.remainder, np.remainder, In((2, 3)), In((3,), F64, "away0"))
case("mod", lambda a, b: a % b, lambda a, b: a % b, In((2, 3)), In((3,), F64, "away0"),
     label="operator%")
case("mod", lambda a, b: a % b, lambda a, b: a % b, In((2, 3), I32, "int"),
     In((2, 3), I32, "away0"), label="operator%")
case("mod", lambda a: a % -1.5, lambda a: a % -1.5, In((2, 3)), label="operator% scalar")
case("mod", lambda a: 7.0 % a, lambda a: 7.0 % a, In((2, 3), F64, "away0"), label="rmod")
case("mod", lambda a: np.full((2, 3), 5.5) % a, lambda a: np.full((2, 3), 5.5) % a,
     In((3,), F64, "away0"), label="ndarray-on-the-left")
case("mod", lambda a: a % 3, lambda a: a % 3, In((4,), BOOL), label="bool % int")


def erf_ref(x):
    out = np.vectorize(math.erf, otypes=[np.float64])(x)
    return np.asarray(out, x.dtype if x.dtype.kind == "f" else np.float64)


for shape in [(), (4,), (2, 3)]:
    case("erf", rnp.erf, erf_ref, In(shape, F64))
case("erf", rnp.erf, erf_ref, In((2, 3), F32))
case("erf", rnp.erf, erf_ref, In((2, 3), I32), label="int")
case("erf", lambda x: rnp.erf(x * 4.0), lambda x: erf_ref(x * 4.0), In((4, 5)),
     label="every branch")
case("erf", rnp.erf, erf_ref, In((6,), F64, "special"), grad=False, label="special")

# -- NumPy's remaining float functions (issue 30): trigonometric, hyperbolic, log2/log10 --------
MORE_UNARY = {  # name: (rnp op, NumPy reference, domain)
    "tan": (rnp.tan, np.tan, "unit"),
    "sinh": (rnp.sinh, np.sinh, "real"),
    "cosh": (rnp.cosh, np.cosh, "real"),
    "arcsin": (rnp.arcsin, np.arcsin, "unit"),
    "arccos": (rnp.arccos, np.arccos, "unit"),
    "arctan": (rnp.arctan, np.arctan, "real"),
    "arcsinh": (rnp.arcsinh, np.arcsinh, "real"),
    "arccosh": (rnp.arccosh, np.arccosh, "above1"),
    "arctanh": (rnp.arctanh, np.arctanh, "unit"),
    "log2": (rnp.log2, np.log2, "positive"),
    "log10": (rnp.log10, np.log10, "positive"),
    "positive": (rnp.positive, np.positive, "real"),  # keeps integer dtypes
}
for name, (op, ref, domain) in MORE_UNARY.items():
    for shape in [(), (4,), (2, 3)]:
        case(name, op, ref, In(shape, F64, domain))
    for dtype in (F32, I32, I64):
        case(name, op, ref, In((2, 3), dtype, domain))
    # NaN, +-inf, 0, and values outside the domain (NaN, or +-inf at a pole) as NumPy's
    case(name, op, ref, In((6,), F64, "special"), grad=False, label="special")
    case(name, lambda x, op=op: op(x * 3.0), lambda x, ref=ref: ref(x * 3.0),
         In((8,), F32), grad=False, label="wide")
case("arcsin+arccos+arctanh", lambda x: rnp.arcsin(x) + rnp.arccos(x) + rnp.arctanh(x),
     lambda x: np.arcsin(x) + np.arccos(x) + np.arctanh(x), In((6,), F64, "int"), grad=False,
     label="ends")  # -1, 0, 1: arctanh's +-inf, NaN beyond
case("log2+log10", lambda x: rnp.log2(2.0 ** x) + rnp.log10(10.0 ** x),
     lambda x: np.log2(2.0 ** x) + np.log10(10.0 ** x), In((5,), F64, "int"), grad=False,
     label="exact powers")
case("sinh+cosh", lambda x: rnp.sinh(x * 300.0) + rnp.cosh(x * 300.0),
     lambda x: np.sinh(x * 300.0) + np.cosh(x * 300.0), In((6,), F64, "unit"), grad=False,
     label="large")  # beyond exp's overflow (709.8) up to sinh's (710.5): finite, or inf

# binary: arctan2 (the quadrant from both signs) and logaddexp (stable for large inputs)
for name, op, ref in [("arctan2", rnp.arctan2, np.arctan2),
                      ("logaddexp", rnp.logaddexp, np.logaddexp)]:
    for sa, sb in [((), ()), ((2, 3), (3,)), ((2, 1), (1, 3)), ((3,), ())]:
        case(name, op, ref, In(sa, F64, "away0"), In(sb, F64, "away0"))
    case(name, op, ref, In((2, 3), F32), In((3,), F32))
    case(name, op, ref, In((2, 3), I32), In((3,), I32), label="int")
    case(name, op, ref, In((4,), BOOL), In((4,), BOOL), label="bool")  # float16, as NumPy's
    case(name, op, ref, In((6, 1), F64, "special"), In((1, 6), F64, "special"), grad=False,
         label="special")  # every pair of NaN, +-inf, 0, 1.5, -2
    case(name, lambda a, op=op: op(a, 2), lambda a, ref=ref: ref(a, 2), In((2, 3)),
         label="scalar")
    case(name, lambda a, op=op: op(-0.0, a), lambda a, ref=ref: ref(-0.0, a),
         In((4,), F64, "int"), grad=False, label="signed zero")
case("logaddexp", lambda a, b: rnp.logaddexp(a * 1000.0, b * 1000.0),
     lambda a, b: np.logaddexp(a * 1000.0, b * 1000.0), In((2, 3)), In((3,)), label="large")
case("logaddexp", lambda a: rnp.logaddexp(a, a), lambda a: np.logaddexp(a, a), In((4,)),
     label="equal")

SCAN_AXES = {(4,): [None, 0, -1], (2, 3): [None, 0, 1], (2, 3, 2): [1, -1]}
for name, op, ref, domain in [("cumsum", rnp.cumsum, np.cumsum, "real"),
                              ("cumprod", rnp.cumprod, np.cumprod, "away0")]:
    for shape, axes in SCAN_AXES.items():
        for axis in axes:
            case(name, axis_op(op, axis=axis), axis_op(ref, axis=axis), In(shape, F64, domain),
                 label=f"axis={axis}")
    for dtype in (F32, I32, I64, BOOL):
        case(name, axis_op(op, axis=1), axis_op(ref, axis=1), In((2, 3), dtype, domain))
    case(name, axis_op(op, axis=0, dtype=np.float64), axis_op(ref, axis=0, dtype=np.float64),
         In((3, 2), I32), label="dtype")
    case(name, op, ref, In((), F64, domain), label="0d")
case("cumprod", axis_op(rnp.cumprod, axis=1), axis_op(np.cumprod, axis=1), In((4, 5), F64, "int"),
     label="zeros")  # multilinear: central differences are exact at the zeros too
case("cumsum", lambda x: x - rnp.cumsum(x, 0), lambda x: x - np.cumsum(x, 0), In((3,), F64),
     label="reuse")


def top_k_ref(x, k):
    """Largest first; equal values in index order; NaN largest (as jax.lax.top_k)."""
    rows = x.reshape(-1, x.shape[-1])
    order = [sorted(range(x.shape[-1]), key=lambda i, r=r: (not np.isnan(r[i]),
                                                            -float(r[i]) if r[i] == r[i] else 0,
                                                            i))[:k] for r in rows]
    idx = np.array(order, np.int64).reshape(x.shape[:-1] + (k,))
    return np.take_along_axis(x, idx, -1), idx


SORT = [((5,), -1), ((3, 4), -1), ((3, 4), 0), ((2, 3, 2), 1), ((3, 4), None)]
for shape, axis in SORT:
    case("sort", lambda x, a=axis: rnp.sort(x, axis=a),
         lambda x, a=axis: np.sort(x, axis=a, kind="stable"), In(shape), label=f"axis={axis}")
    case("argsort", lambda x, a=axis: rnp.argsort(x, axis=a),
         lambda x, a=axis: np.argsort(x, axis=a, kind="stable"), In(shape, F64, "int"),
         label=f"ties,axis={axis}")
for dtype, domain in [(F32, "real"), (I32, "int"), (BOOL, "real"), (F64, "special"),
                      (F64, "int")]:
    case("sort+argsort", lambda x: (rnp.sort(x), rnp.argsort(x, 0)),
         lambda x: (np.sort(x, kind="stable"), np.argsort(x, 0, kind="stable")),
         In((4, 6), dtype, domain), grad=False, label="ties")
case("sort+argsort", lambda x: (rnp.sort(x * 0.0), rnp.argsort(x * 0.0)),
     lambda x: (np.sort(x * 0.0, kind="stable"), np.argsort(x * 0.0, kind="stable")),
     In((8,), F64, "int"), label="signed zeros are equal")
case("sort", lambda x: rnp.sort(x)[..., -1] - rnp.sort(x, 0)[0], lambda x: np.sort(x)[..., -1]
     - np.sort(x, 0)[0], In((3, 3)), label="max-min")
for shape, k in [((6,), 3), ((3, 5), 1), ((3, 5), 5), ((2, 2, 4), 2), ((4,), 0)]:
    case("top_k", lambda x, k=k: rnp.top_k(x, k), lambda x, k=k: top_k_ref(x, k), In(shape),
         label=f"k={k}")
    case("top_k", lambda x, k=k: rnp.top_k(x, k)[0], lambda x, k=k: top_k_ref(x, k)[0],
         In(shape), label=f"values,k={k}")
for dtype, domain in [(F32, "real"), (I32, "int"), (BOOL, "real"), (F64, "special"),
                      (F64, "int")]:
    case("top_k", lambda x: rnp.top_k(x, 4), lambda x: top_k_ref(x, 4), In((3, 6), dtype, domain),
         label="ties")
case("top_k", lambda x: rnp.top_k(x * 0.0, 5), lambda x: top_k_ref(x * 0.0, 5),
     In((8,), F64, "int"), label="signed zeros are equal")

REARRANGE = [
    ("flip", lambda x: rnp.flip(x), lambda x: np.flip(x), [(2, 3)]),
    ("flip", lambda x: rnp.flip(x, 1), lambda x: np.flip(x, 1), [(2, 3, 2)]),
    ("flip", lambda x: rnp.flip(x, (0, -1)), lambda x: np.flip(x, (0, -1)), [(2, 3, 2)]),
    ("flip", lambda x: rnp.flip(x), lambda x: np.flip(x), [()]),
    ("roll", lambda x: rnp.roll(x, 2), lambda x: np.roll(x, 2), [(2, 3)]),
    ("roll", lambda x: rnp.roll(x, -1, 1), lambda x: np.roll(x, -1, 1), [(2, 3)]),
    ("roll", lambda x: rnp.roll(x, 7, 0), lambda x: np.roll(x, 7, 0), [(3, 2)]),
    ("roll", lambda x: rnp.roll(x, (1, 2), (0, 1)), lambda x: np.roll(x, (1, 2), (0, 1)),
     [(2, 3, 2)]),
    ("roll", lambda x: rnp.roll(x, (1, 1), (1, -2)), lambda x: np.roll(x, (1, 1), (1, -2)),
     [(2, 3, 2)]),
    ("roll", lambda x: rnp.roll(x, 1, (0, 2)), lambda x: np.roll(x, 1, (0, 2)), [(2, 3, 2)]),
    ("roll", lambda x: rnp.roll(x, 3, 0), lambda x: np.roll(x, 3, 0), [(3,)]),
    ("repeat", lambda x: rnp.repeat(x, 2), lambda x: np.repeat(x, 2), [(2, 3)]),
    ("repeat", lambda x: rnp.repeat(x, 3, 1), lambda x: np.repeat(x, 3, 1), [(2, 2)]),
    ("repeat", lambda x: rnp.repeat(x, 2, -1), lambda x: np.repeat(x, 2, -1), [(2, 1, 2)]),
    ("repeat", lambda x: rnp.repeat(x, [1, 0, 2], 0), lambda x: np.repeat(x, [1, 0, 2], 0),
     [(3, 2)]),
    ("repeat", lambda x: rnp.repeat(x, [2], 1), lambda x: np.repeat(x, [2], 1), [(2, 3)]),
    ("repeat", lambda x: rnp.repeat(x, 0, 0), lambda x: np.repeat(x, 0, 0), [(2, 3)]),
    ("repeat", lambda x: rnp.repeat(x, 3), lambda x: np.repeat(x, 3), [()]),
    ("tile", lambda x: rnp.tile(x, 2), lambda x: np.tile(x, 2), [(2, 3)]),
    ("tile", lambda x: rnp.tile(x, (2, 1)), lambda x: np.tile(x, (2, 1)), [(2, 3)]),
    ("tile", lambda x: rnp.tile(x, (2, 1, 3)), lambda x: np.tile(x, (2, 1, 3)), [(2, 3)]),
    ("tile", lambda x: rnp.tile(x, (3, 2)), lambda x: np.tile(x, (3, 2)), [(2, 1, 2)]),
    ("tile", lambda x: rnp.tile(x, (1, 1)), lambda x: np.tile(x, (1, 1)), [(3,)]),
    ("tile", lambda x: rnp.tile(x, (2, 0)), lambda x: np.tile(x, (2, 0)), [(2, 3)]),
    ("tile", lambda x: rnp.tile(x, 3), lambda x: np.tile(x, 3), [()]),
]
for name, fn, ref, shapes in REARRANGE:
    case(name, fn, ref, *[In(s) for s in shapes])
for dtype in (F32, I32, BOOL):
    case("flip+roll+repeat+tile", lambda x: (rnp.flip(x, 0), rnp.roll(x, 1, 1),
                                             rnp.repeat(x, 2, 0), rnp.tile(x, (1, 2))),
         lambda x: (np.flip(x, 0), np.roll(x, 1, 1), np.repeat(x, 2, 0), np.tile(x, (1, 2))),
         In((2, 3), dtype), label="dtypes")


def conv_transpose2d_ref(x, w, stride=1, padding=0, output_padding=0, dilation=1):
    """The transposed convolution by its definition: every input pixel scatters its kernel."""
    (sh, sw), (ph, pw), (eh, ew), (dh, dw) = (pair(stride), pair(padding),
                                              pair(output_padding), pair(dilation))
    n, c, h, wd = x.shape
    _, o, kh, kw = w.shape
    full = np.zeros((n, o, (h - 1) * sh + dh * (kh - 1) + 1 + eh,
                     (wd - 1) * sw + dw * (kw - 1) + 1 + ew), np.result_type(x, w))
    for i, j, a, b in itertools.product(range(h), range(wd), range(kh), range(kw)):
        full[:, :, i * sh + a * dh, j * sw + b * dw] += x[:, :, i, j] @ w[:, :, a, b]
    return full[:, :, ph:full.shape[2] - ph, pw:full.shape[3] - pw]


CONV_T = [((1, 1, 3, 3), (1, 1, 2, 2), {}), ((2, 2, 3, 3), (2, 3, 3, 3), {"stride": 2}),
          ((1, 2, 3, 4), (2, 2, 3, 3), {"stride": 2, "padding": 1, "output_padding": 1}),
          ((1, 1, 3, 2), (1, 2, 2, 3), {"stride": (3, 1), "padding": (1, 0)}),
          ((1, 1, 3, 3), (1, 1, 3, 2), {"dilation": 2, "stride": 2, "output_padding": (1, 0)}),
          ((1, 3, 2, 2), (3, 1, 1, 1), {"stride": 3, "output_padding": 2}),
          ((1, 1, 2, 2), (1, 1, 5, 5), {"stride": 2, "padding": 2})]
for xs_, ws_, kw in CONV_T:
    label = ",".join(f"{k}={v}" for k, v in kw.items()) or "plain"
    case("conv_transpose2d", lambda x, w, kw=kw: rnp.conv_transpose2d(x, w, **kw),
         lambda x, w, kw=kw: conv_transpose2d_ref(x, w, **kw), In(xs_), In(ws_), label=label)
case("conv_transpose2d", lambda x, w: rnp.conv_transpose2d(x, w, stride=2, padding=1),
     lambda x, w: conv_transpose2d_ref(x, w, stride=2, padding=1), In((1, 2, 3, 3), F32),
     In((2, 2, 3, 3), F32), label="float32")


# the convolution primitives themselves (rnp binds them for conv2d, conv_transpose2d and
# avg_pool2d): each gradient as an op, with asymmetric padding, and their own gradients
def bind_conv(prim, **attrs):
    from replicate.graph.core import bind

    return lambda a, b: bind(prim, a, b, **attrs)


def geometry(stride=1, padding=0, dilation=1):
    pads = pair(padding)
    pads = tuple(p if isinstance(p, tuple) else (p, p) for p in pads)
    return dict(stride=pair(stride), padding=pads, dilation=pair(dilation))


def conv_input_grad_ref(g, w, size, stride, padding, dilation):
    """The transpose of the convolution by its definition: every output pixel's cotangent goes
    back to the input pixels its window read (the padding's share dropped)."""
    (sh, sw), ((t, b), (le, r)), (dh, dw) = stride, padding, dilation
    n, o, oh, ow = g.shape
    _, c, kh, kw = w.shape
    full = np.zeros((n, c, size[0] + t + b, size[1] + le + r), np.result_type(g, w))
    for i, j, a, q in itertools.product(range(oh), range(ow), range(kh), range(kw)):
        full[:, :, i * sh + a * dh, j * sw + q * dw] += g[:, :, i, j] @ w[:, :, a, q]
    return full[:, :, t:t + size[0], le:le + size[1]]


def conv_weight_grad_ref(x, g, kernel, stride, padding, dilation):
    """sum over the batch and the output grid of the cotangent times the window it read."""
    (sh, sw), ((t, b), (le, r)), (dh, dw) = stride, padding, dilation
    x = np.pad(x, ((0, 0), (0, 0), (t, b), (le, r)))
    oh, ow = g.shape[2:]
    out = np.zeros((g.shape[1], x.shape[1]) + tuple(kernel), np.result_type(x, g))
    for a, q in itertools.product(range(kernel[0]), range(kernel[1])):
        patch = x[:, :, a * dh:a * dh + sh * (oh - 1) + 1:sh, q * dw:q * dw + sw * (ow - 1) + 1:sw]
        out[:, :, a, q] = np.einsum("noij,ncij->oc", g, patch)
    return out


CONV_GRADS = [  # x shape, w shape, geometry (the first small enough for a gradient of gradient)
    ((1, 1, 4, 4), (1, 1, 2, 2), geometry(stride=(2, 1), padding=((1, 0), (0, 2)),
                                          dilation=(1, 2))),
    ((1, 1, 4, 4), (1, 1, 3, 3), geometry()),
    ((2, 2, 5, 4), (3, 2, 2, 3), geometry(stride=2, padding=((1, 0), (2, 1)))),
    ((1, 2, 7, 6), (2, 2, 3, 2), geometry(stride=(2, 3), padding=(1, 0), dilation=(2, 1))),
    ((2, 1, 6, 6), (1, 1, 1, 1), geometry(stride=2, padding=((0, 2), (1, 0)))),
    ((1, 3, 5, 5), (2, 3, 3, 3), geometry(stride=3, padding=2, dilation=2)),
]
for xs_, ws_, geo in CONV_GRADS:
    label = f"s={geo['stride']},p={geo['padding']},d={geo['dilation']}"
    out = (xs_[0], ws_[0]) + tuple(
        (n + lo + hi - d * (k - 1) - 1) // s + 1 for n, k, s, (lo, hi), d in
        zip(xs_[2:], ws_[2:], geo["stride"], geo["padding"], geo["dilation"]))
    case("conv2d", bind_conv("conv2d", **geo),
         lambda x, w, geo=geo: conv2d_ref(np.pad(x, ((0, 0), (0, 0)) + geo["padding"]), w,
                                          geo["stride"], 0, geo["dilation"]),
         In(xs_), In(ws_), label="primitive " + label)
    case("conv2d_input_grad", bind_conv("conv2d_input_grad", size=xs_[2:], **geo),
         lambda g, w, size=xs_[2:], geo=geo: conv_input_grad_ref(g, w, size, **geo), In(out),
         In(ws_), label=label)
    case("conv2d_weight_grad", bind_conv("conv2d_weight_grad", kernel=ws_[2:], **geo),
         lambda x, g, kernel=ws_[2:], geo=geo: conv_weight_grad_ref(x, g, kernel, **geo),
         In(xs_), In(out), label=label)
case("conv2d_input_grad", bind_conv("conv2d_input_grad", size=(4, 5), **geometry(2, 1)),
     lambda g, w: conv_input_grad_ref(g, w, (4, 5), **geometry(2, 1)), In((1, 2, 2, 3), F32),
     In((2, 3, 3, 3), F32), label="float32")
case("conv2d_weight_grad", bind_conv("conv2d_weight_grad", kernel=(3, 3), **geometry(2, 1)),
     lambda x, g: conv_weight_grad_ref(x, g, (3, 3), **geometry(2, 1)), In((2, 3, 4, 5), F32),
     In((2, 2, 2, 3), F32), label="float32")
