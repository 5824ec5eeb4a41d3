"""The op harness's cases: convolution and pooling (every window geometry), casts and creation."""

from __future__ import annotations

import numpy as np

import replicate as rp
import replicate.numpy as rnp

from .cases import BOOL, F32, F64, I32, I64, In, case

# -- convolution and pooling -------------------------------------------------------------------


def pair(v):
    return (v, v) if np.isscalar(v) else tuple(v)


def windows_ref(x, kernel, stride, padding, dilation, pad_value):
    """Yield (i, j, patch) for each output position: a direct loop over the output grid."""
    (kh, kw), (sh, sw), (ph, pw), (dh, dw) = kernel, pair(stride), pair(padding), pair(dilation)
    x = np.pad(x, ((0, 0), (0, 0), (ph, ph), (pw, pw)), constant_values=pad_value)
    oh = (x.shape[2] - dh * (kh - 1) - 1) // sh + 1
    ow = (x.shape[3] - dw * (kw - 1) - 1) // sw + 1
    for i in range(oh):
        for j in range(ow):
            r, c = i * sh, j * sw
            yield i, j, oh, ow, x[:, :, r:r + dh * (kh - 1) + 1:dh, c:c + dw * (kw - 1) + 1:dw]


def conv2d_ref(x, w, stride=1, padding=0, dilation=1):
    out = None
    for i, j, oh, ow, patch in windows_ref(x, w.shape[2:], stride, padding, dilation, 0.0):
        if out is None:
            out = np.zeros((x.shape[0], w.shape[0], oh, ow), np.result_type(x, w))
        out[:, :, i, j] = np.tensordot(patch, w, axes=([1, 2, 3], [1, 2, 3]))
    return out


def pool_ref(reduce, pad_value):
    def ref(x, kernel_size, stride=None, padding=0):
        kernel = pair(kernel_size)
        out = None
        for i, j, oh, ow, patch in windows_ref(x, kernel, stride or kernel_size, padding, 1,
                                               pad_value):
            if out is None:
                out = np.zeros(x.shape[:2] + (oh, ow), x.dtype)
            out[:, :, i, j] = reduce(patch, axis=(2, 3))
        return out

    return ref


max_pool2d_ref = pool_ref(np.max, -np.inf)
avg_pool2d_ref = pool_ref(np.mean, 0.0)

CONV = [((1, 1, 4, 4), (1, 1, 3, 3), {}), ((2, 2, 4, 4), (3, 2, 3, 3), {"padding": 1}),
        ((1, 2, 6, 7), (2, 2, 3, 2), {"stride": 2}), ((1, 1, 7, 7), (2, 1, 3, 3), {"dilation": 2}),
        ((2, 1, 5, 6), (1, 1, 2, 3), {"stride": (2, 1), "padding": (1, 2), "dilation": (1, 2)}),
        ((1, 3, 3, 3), (2, 3, 1, 1), {}), ((1, 1, 5, 5), (1, 1, 3, 3),
                                           {"stride": 3, "padding": 1})]
for xs_, ws_, kw in CONV:
    label = ",".join(f"{k}={v}" for k, v in kw.items()) or "plain"
    case("conv2d", lambda x, w, kw=kw: rnp.conv2d(x, w, **kw),
         lambda x, w, kw=kw: conv2d_ref(x, w, **kw), In(xs_), In(ws_), label=label)
case("conv2d", lambda x, w: rnp.conv2d(x, w, padding=1), lambda x, w: conv2d_ref(x, w, padding=1),
     In((1, 2, 4, 4), F32), In((2, 2, 3, 3), F32), label="float32")
POOL = [((1, 1, 4, 4), 2, {}), ((2, 2, 5, 5), 3, {"stride": 1}), ((1, 1, 5, 6), (2, 3), {}),
        ((1, 2, 5, 5), 3, {"stride": 2, "padding": 1}), ((1, 1, 4, 4), 2, {"stride": (1, 2)})]
for xs_, k, kw in POOL:
    label = f"k={k}," + ",".join(f"{a}={v}" for a, v in kw.items())
    for name, op, ref in [("max_pool2d", rnp.max_pool2d, max_pool2d_ref),
                          ("avg_pool2d", rnp.avg_pool2d, avg_pool2d_ref)]:
        case(name, lambda x, k=k, kw=kw, op=op: op(x, k, **kw),
             lambda x, k=k, kw=kw, ref=ref: ref(x, k, **kw), In(xs_), label=label)
case("max_pool2d", lambda x: rnp.max_pool2d(x, 2), lambda x: max_pool2d_ref(x, 2),
     In((1, 2, 4, 4), F32), label="float32")
case("max_pool2d", lambda x: rnp.max_pool2d(x, 3, stride=1, padding=1),
     lambda x: pool_ref(np.max, np.iinfo(np.int32).min)(x, 3, stride=1, padding=1),
     In((1, 1, 4, 4), I32, "int"), label="int32-padded")

# -- cast, creation ----------------------------------------------------------------------------
for src, dst in [(F64, F32), (F64, I32), (F32, F64), (I32, F32), (I64, F64), (BOOL, F64),
                 (F64, BOOL), (I32, I64), (F64, F64)]:
    case("cast", lambda x, d=dst: rnp.cast(x, d), lambda x, d=dst: x.astype(d),
         In((2, 3), src, "real"), grad=False, label=f"to {dst}")
    case("astype", lambda x, d=dst: x.astype(d), lambda x, d=dst: x.astype(d),
         In((3,), src, "real"), grad=False, label=f"to {dst}")
case("astype", lambda x: rnp.astype(x, np.float32), lambda x: x.astype(np.float32), In((2,), I64),
     grad=False)
case("cast", lambda x: rnp.cast(rnp.cast(x, F32), F64) * 3.0,
     lambda x: x.astype(F32).astype(F64) * 3.0, In((2, 3)), label="via float32", fd_eps=1e-3,
     grad_rtol=1e-3, grad_atol=1e-4)
case("cast", lambda x: rnp.cast(x * 1.0, F32), lambda x: (x * 1.0).astype(F32), In((4,)),
     label="float32 out", fd_eps=1e-3, grad_rtol=1e-3, grad_atol=1e-4)
CREATION = [
    ("zeros", lambda: rnp.zeros((2, 3), np.float64), lambda: np.zeros((2, 3), np.float64)),
    ("ones", lambda: rnp.ones((3,), np.int32), lambda: np.ones((3,), np.int32)),
    ("full", lambda: rnp.full((2, 2), 1.5, np.float64), lambda: np.full((2, 2), 1.5, np.float64)),
    ("arange", lambda: rnp.arange(5), lambda: np.arange(5)),
    ("arange", lambda: rnp.arange(1, 7, 2, dtype=np.float32),
     lambda: np.arange(1, 7, 2, dtype=np.float32)),
    ("arange", lambda: rnp.arange(0, 1, 0.25), lambda: np.arange(0, 1, 0.25, dtype=np.float32)),
    ("eye", lambda: rnp.eye(3, dtype=np.float64), lambda: np.eye(3)),
    ("eye", lambda: rnp.eye(2, 4, k=1, dtype=np.int32), lambda: np.eye(2, 4, 1, dtype=np.int32)),
    ("empty", lambda: rnp.empty((2, 3), np.int64), lambda: np.zeros((2, 3), np.int64)),
    ("linspace", lambda: rnp.linspace(0, 1, 5), lambda: np.linspace(0, 1, 5, dtype=np.float32)),
    ("linspace", lambda: rnp.linspace(-1, 2, 4, endpoint=False, dtype=np.float32),
     lambda: np.linspace(-1, 2, 4, endpoint=False, dtype=np.float32)),
    ("asarray", lambda: rnp.asarray([[1, 2], [3, 4]]), lambda: np.asarray([[1, 2], [3, 4]])),
    ("asarray", lambda: rnp.asarray([1.0, 2.0], np.float32),
     lambda: np.asarray([1.0, 2.0], np.float32)),
    ("array", lambda: rnp.array(3.5), lambda: np.array(3.5)),
    ("as_array", lambda: rnp.as_array(np.int32(4)), lambda: np.asarray(np.int32(4))),
]
for name, fn, ref in CREATION:
    case(name, fn, ref)
for name, op, ref in [("zeros_like", rnp.zeros_like, np.zeros_like),
                      ("ones_like", rnp.ones_like, np.ones_like)]:
    case(name, op, ref, In((2, 3), F32), grad=False)
    case(name, lambda x, op=op: op(x, dtype=np.int64) + x, lambda x, ref=ref: ref(x, np.int64) + x,
         In((3,), F64), label="dtype+x")
case("stop_gradient", rnp.stop_gradient, lambda x: x, In((2, 3), F32), grad=False)
# the staples (issue 30; tests/api/test_numpy_staples.py has the dtype sweeps and the errors)
case("tril", lambda x: rnp.tril(x, 1), lambda x: np.tril(x, 1), In((3, 4)))
case("triu", lambda x: rnp.triu(x, -1), lambda x: np.triu(x, -1), In((2, 3, 3)))
case("triu", rnp.triu, np.triu, In((3,), I64))
case("meshgrid", lambda a, b: rnp.meshgrid(a, b), lambda a, b: np.meshgrid(a, b), In((2,)),
     In((3,)))
case("meshgrid", lambda a, b: rnp.meshgrid(a, b, indexing="ij", sparse=True),
     lambda a, b: np.meshgrid(a, b, indexing="ij", sparse=True), In((2,)), In((3,), I32))
case("full_like", lambda x: rnp.full_like(x, 2.5) + x, lambda x: np.full_like(x, 2.5) + x,
     In((2, 3)))
case("full_like", lambda x: rnp.full_like(x, 2.5), lambda x: np.full_like(x, 2.5), In((3,), I32))
case("empty_like", lambda x: rnp.empty_like(x, np.int32), lambda x: np.zeros_like(x, np.int32),
     In((2, 3)), grad=False)


def _padded(values, size, fill):
    """NumPy's result cut or padded to ``size`` (what ``size=``/``fill_value=`` give)."""
    values = np.asarray(values)[:size]
    return np.concatenate([values, np.full(size - values.size, fill, values.dtype)])


# data-dependent sizes: traced, a static size= (tests/api/test_sets.py: eager answers, padding)
case("unique", lambda x: rnp.unique(x, size=7, fill_value=-9),
     lambda x: _padded(np.unique(x), 7, -9), In((3, 4), I64, "int"))
case("unique", lambda x: rnp.unique(x, size=6), np.unique, In((6,)))  # distinct: a sort
case("unique_values", lambda x: rnp.unique_values(x, size=6), np.unique, In((2, 3)))
case("unique_counts+unique_inverse+unique_all",
     lambda x: (*rnp.unique_counts(x, size=5), *rnp.unique_inverse(x, size=5),
                *rnp.unique_all(x, size=5)),
     lambda x: (*(_padded(v, 5, np.unique(x)[0] if i % 2 == 0 else 0) for i, v in
                  enumerate(np.unique_counts(x))),
                _padded(np.unique(x), 5, np.unique(x)[0]), np.unique_inverse(x)[1],
                *(v if i == 2 else _padded(v, 5, np.unique(x)[0] if i == 0 else 0) for i, v
                  in enumerate(np.unique_all(x)))), In((2, 4), I32, "int"), grad=False)
case("nonzero", lambda x: rnp.nonzero(x, size=8),
     lambda x: tuple(_padded(i, 8, 0) for i in np.nonzero(x)), In((2, 5), I64, "int"))


# rnp.linalg's primitives (tests/api/test_linalg.py: every function, tall/wide/batched, norms)
def _i3(a, xp):
    """3 I in ``a``'s dtype (a float64 constant would make a low-precision case float64)."""
    return 3.0 * xp.eye(3, dtype=a.dtype)


case("linalg.solve+inv", lambda a, b: (rnp.linalg.solve(a + _i3(a, rnp), b),
                                      rnp.linalg.inv(a + _i3(a, rnp))),
     lambda a, b: (np.linalg.solve(a + _i3(a, np), b), np.linalg.inv(a + _i3(a, np))),
     In((2, 3, 3)), In((2, 3, 2)))
case("linalg.cholesky+eigh", lambda a: (rnp.linalg.cholesky(a @ a.mT + _i3(a, rnp)),
                                        *rnp.linalg.eigh(a @ a.mT + _i3(a, rnp))),
     lambda a: (np.linalg.cholesky(a @ a.mT + _i3(a, np)), *np.linalg.eigh(a @ a.mT + _i3(a, np))),
     In((3, 3)), grad=False)  # (eigenvectors: signs are LAPACK's; test_linalg.py has grads)
case("linalg.qr+svd", lambda a: (*rnp.linalg.qr(a), rnp.linalg.svdvals(a),
                                 rnp.linalg.svd(a, False).U ** 2),
     lambda a: (*np.linalg.qr(a), np.linalg.svd(a, compute_uv=False),
                np.linalg.svd(a, False)[0] ** 2), In((4, 3)))
case("linalg.det+slogdet", lambda a: (rnp.linalg.det(a + _i3(a, rnp)),
                                      *rnp.linalg.slogdet(a + _i3(a, rnp))),
     lambda a: (np.linalg.det(a + _i3(a, np)), *np.linalg.slogdet(a + _i3(a, np))),
     In((2, 3, 3)))
# the Array API's spellings and compositions (replicate/numpy/_namespace.py)
for _name, _np_name, _dom in (("acos", "arccos", "unit"), ("asin", "arcsin", "unit"),
                              ("atan", "arctan", "real"), ("acosh", "arccosh", "above1"),
                              ("asinh", "arcsinh", "real"), ("atanh", "arctanh", "unit")):
    case(_name, getattr(rnp, _name), getattr(np, _np_name), In((2, 3), F64, _dom))
case("atan2", rnp.atan2, np.arctan2, In((2, 3)), In((3,), F64, "away0"))
case("pow", rnp.pow, np.power, In((2, 3), F64, "positive"), In((3,)))
case("bitwise_invert", rnp.bitwise_invert, np.invert, In((4,), I32, "int"), grad=False)
case("isnan+isinf", lambda x: (rnp.isnan(x / x), rnp.isinf(1.0 / x)),
     lambda x: (np.isnan(x / x), np.isinf(1.0 / x)), In((2, 3), F64, "int"), grad=False)
case("isnan+isinf", lambda x: (rnp.isnan(x), rnp.isinf(x)), lambda x: (np.isnan(x), np.isinf(x)),
     In((3,), I32, "int"), grad=False)
case("logical_xor+all+any", lambda a, b: (rnp.logical_xor(a, b), rnp.all(a, axis=1),
                                          rnp.any(b, axis=0, keepdims=True), rnp.all(a[:0])),
     lambda a, b: (np.logical_xor(a, b), np.all(a, axis=1), np.any(b, axis=0, keepdims=True),
                   np.all(a[:0])), In((2, 3), I64, "int"), In((3,), F64, "int"), grad=False)
case("cumulative_sum", lambda x: rnp.cumulative_sum(x, axis=1, include_initial=True),
     lambda x: np.cumulative_sum(x, axis=1, include_initial=True), In((2, 3)))
case("unstack", lambda x: rnp.unstack(x, axis=1), lambda x: np.unstack(x, axis=1), In((2, 3)))
case("tensordot", lambda a, b: rnp.tensordot(a, b, axes=([0, 2], [1, 0])),
     lambda a, b: np.tensordot(a, b, axes=([0, 2], [1, 0])), In((2, 3, 4)), In((4, 2, 5)))
case("tensordot", rnp.tensordot, np.tensordot, In((2, 3, 4)), In((3, 4)), label="axes=2")
case("finfo+iinfo+isdtype", lambda x: x * rnp.finfo(x).eps + rnp.iinfo(np.int8).max
     + rnp.isdtype(x.dtype, ("integral", "real floating")),
     lambda x: x * np.finfo(x.dtype).eps + np.iinfo(np.int8).max + 1, In((3,)), grad=False)
case("broadcast_arrays", lambda a, b: rnp.broadcast_arrays(a, b),
     lambda a, b: np.broadcast_arrays(a, b), In((2, 1)), In((3,)))
case("result_type", lambda x: rnp.astype(x, rnp.result_type(x, np.float32, 1.0)),
     lambda x: x.astype(np.result_type(x, np.float32, 1.0)), In((3,), I32), grad=False)
case("can_cast", lambda x: rnp.where(rnp.can_cast(x, np.int8), x, -x),
     lambda x: np.where(np.can_cast(x, np.int8), x, -x), In((3,), I32), grad=False)
case("masked_fill", lambda x, m: rnp.masked_fill(x, m, 0.5), lambda x, m: np.where(m, 0.5, x),
     In((2, 3)), In((3,), "bool"))
case("masked_fill", lambda x, v: rnp.masked_fill(x, np.array([True, False]), v),
     lambda x, v: np.where([True, False], v, x), In((3, 2)), In(()), label="array value")
case("concat", lambda a, b: rnp.concat([a, b], axis=None),
     lambda a, b: np.concatenate([a, b], None), In((2, 3)), In((3,)))
case("permute_dims", lambda x: rnp.permute_dims(x, (1, 2, 0)),
     lambda x: np.transpose(x, (1, 2, 0)), In((2, 3, 4)))
case("matrix_transpose", rnp.matrix_transpose, np.matrix_transpose, In((2, 3, 4)))
case("vecdot", rnp.vecdot, np.vecdot, In((2, 4)), In((4,)))
case("vecdot", lambda a, b: rnp.vecdot(a, b, axis=0), lambda a, b: np.vecdot(a, b, axis=0),
     In((3, 2), I32), In((3, 1), I32))
case("from_dlpack", rnp.from_dlpack, lambda x: x, In((2, 3)))  # (foreign arrays: test_interop)
case("stop_gradient", rnp.stop_gradient, lambda x: x, In((), I32), grad=False)


@rp.custom_vjp
def _twice(x):
    """x * 2 with its gradient written by hand (the custom_vjp primitive, on every backend)."""
    return x * 2.0


_twice.defvjp(lambda x: (_twice(x), None), lambda residuals, g: (g * 2.0,))
case("custom_vjp", _twice, lambda x: x * 2.0, In((2, 3), F64))
case("custom_vjp", _twice, lambda x: x * 2.0, In((4,), F32), label="f32")
# rp.remat: the remat node and, in its gradient, the remat_barrier copies (on every backend)
case("remat", rp.remat(lambda x: rnp.sin(x) * x), lambda x: np.sin(x) * x, In((2, 3), F64))
# rp.cond, traced: each branch reads x through a branch_input (its gradient: the taken branch's)
case("branch_input", lambda x: rp.cond(rnp.sum(x) > 0, lambda x: rnp.sin(x) * x,
                                       lambda x: -2.0 * x, x),
     lambda x: np.sin(x) * x if x.sum() > 0 else -2.0 * x, In((2, 3), F64))


# -- attention's weights (issue 29): softmax(q k^T * scale, masked), one primitive ---------------
def attention_ref(q, k, *mask, scale, causal, masking):
    s = q @ np.swapaxes(k, -1, -2) * scale
    s = s + mask[0] if masking == "add" else s
    keep = mask[0] if masking == "keep" else np.ones(s.shape[-2:], bool)
    keep = keep & np.tril(np.ones(s.shape[-2:], bool)) if causal else keep
    s = np.where(keep, s, -np.inf)
    s = np.exp(s - s.max(-1, keepdims=True))
    return s / s.sum(-1, keepdims=True)


def bind_attention(**attrs):
    from replicate.graph.core import bind

    return lambda q, k, *m: bind("attention_weights", q, k, *m, **attrs)


for label, attrs, extra in [
        ("plain", dict(scale=0.5, causal=False, masking="none"), ()),
        ("causal", dict(scale=0.5, causal=True, masking="none"), ()),
        ("add", dict(scale=0.3, causal=True, masking="add"), (In((4, 5)),))]:
    case("attention_weights", bind_attention(**attrs),
         lambda q, k, *m, attrs=attrs: attention_ref(q, k, *m, **attrs),
         In((2, 4, 3)), In((2, 5, 3)), *extra, label=label)
case("attention_weights", bind_attention(scale=1.0, causal=False, masking="keep"),
     lambda q, k, m: attention_ref(q, k, m, scale=1.0, causal=False, masking="keep"),
     In((2, 4, 3)), In((5, 3)), In((4, 5), BOOL), label="keep", grad=False)
case("attention_weights", bind_attention(scale=0.5, causal=True, masking="none"),
     lambda q, k: attention_ref(q, k, scale=0.5, causal=True, masking="none"),
     In((2, 4, 3), F32), In((2, 5, 3), F32), label="float32")
