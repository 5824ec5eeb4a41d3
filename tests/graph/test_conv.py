"""The convolution primitives (issue 17): ``conv2d``, ``conv2d_input_grad``, ``conv2d_weight_grad``.

* Against PyTorch, in float64: the forward, both gradients and the gradients of the gradients of
  the primitive (asymmetric padding through ``F.pad``), of ``rnp.conv2d`` and of
  ``rnp.conv_transpose2d`` (output_padding past the padding too), over random geometries
  (batch 1, one channel, non-square kernels, strides, dilations, windows larger than the
  stride), on the NumPy backend, in eager mode and on the JAX backend; in float32 too.
* Against the composition the primitives replaced (pad, strided slices, einsum; its gradients
  from the generic rules): values, gradients and gradients of gradients.
* Structure: the rnp ops bind the primitives, in eager mode too; a convolution's gradient is the
  two gradient primitives (no scatter, no einsum); XLA sees convolutions; autocast applies.
"""

from __future__ import annotations

import importlib.util
import inspect

import numpy as np
import pytest

import replicate as rp
import replicate.numpy as rnp
from conftest import optional_torch
from replicate.graph import conv
from replicate.graph.core import bind

HAVE_JAX = importlib.util.find_spec("jax") is not None
torch, needs_torch = optional_torch("the comparison with PyTorch's convolution")
F = torch.nn.functional if torch is not None else None
RUNS = {"numpy": dict(mode="graph"), "eager": dict(mode="eager")}
if HAVE_JAX:
    RUNS["jax"] = dict(backend="jax")


def random_geometries(count, seed, asymmetric, single=False):
    """(x shape, w shape, stride, padding ((t, b), (l, r)), dilation) with an output >= 1
    (``single``: one input and one output channel, as avg_pool2d's convolution)."""
    rng = np.random.default_rng(seed)
    out = []
    while len(out) < count:
        n, c, o = rng.integers(1, 4), rng.integers(1, 4), rng.integers(1, 4)
        if single:
            c = o = 1
        h, w = rng.integers(1, 10, 2)
        kh, kw = rng.integers(1, 5, 2)
        stride, dilation = tuple(rng.integers(1, 4, 2)), tuple(rng.integers(1, 4, 2))
        pads = rng.integers(0, 3, (2, 2)) if asymmetric else np.repeat(rng.integers(0, 3, 2), 2
                                                                       ).reshape(2, 2)
        padding = tuple(tuple(int(v) for v in p) for p in pads)
        size = conv.out_size((h, w), (kh, kw), stride, padding, dilation)
        if min(size) >= 1:
            out.append(((int(n), int(c), int(h), int(w)), (int(o), int(c), int(kh), int(kw)),
                        tuple(int(s) for s in stride), padding, tuple(int(d) for d in dilation)))
    return out


def derivatives(conv_fn, x, w, cot, v1, v2, grad):
    """(y, dx, dw, ddx, ddw): y = conv(x, w), (dx, dw) the gradient of <y, cot>, (ddx, ddw) that
    of <dx, v1> + <dw, v2>; ``grad(value, wrt)`` is rp.grad or torch's (create_graph)."""
    y = conv_fn(x, w)
    dx, dw = grad((y * cot).sum(), [x, w])
    ddx, ddw = grad((dx * v1).sum() + (dw * v2).sum(), [x, w])
    return y, dx, dw, ddx, ddw


def torch_derivatives(conv_fn, arrays):
    x, w = (torch.tensor(a, requires_grad=True) for a in arrays[:2])
    cot, v1, v2 = (torch.tensor(a) for a in arrays[2:])

    def grad(value, wrt):
        return torch.autograd.grad(value, wrt, create_graph=True, allow_unused=True)

    return [t.detach().numpy() for t in derivatives(conv_fn, x, w, cot, v1, v2, grad)]


def samples(x_shape, w_shape, out_shape, seed, dtype=np.float64):
    rng = np.random.default_rng(seed)
    return [rng.standard_normal(s).astype(dtype) for s in (x_shape, w_shape, out_shape, x_shape,
                                                           w_shape)]


def run_all(fns, arrays, how):
    """Every (fn, arrays) in one rp.function (one compile per backend)."""
    sizes = [len(a) for a in arrays]

    def program(*flat):
        outs, at = [], 0
        for fn, k in zip(fns, sizes):
            outs += derivatives(fn, *flat[at:at + k], lambda value, wrt: rp.grad(value, wrt))
            at += k
        return outs

    flat = rp.function(program, **RUNS[how])(*[a for group in arrays for a in group])
    return [flat[5 * i:5 * i + 5] for i in range(len(fns))]


def check(got, want, what, rtol=1e-9, atol=1e-10):
    for name, g, e in zip(("value", "d/dx", "d/dw", "dd/dx", "dd/dw"), got, want):
        g = np.asarray(g)
        assert g.shape == e.shape and g.dtype == e.dtype, f"{what} {name}: {g.shape} {g.dtype}"
        np.testing.assert_allclose(g, e, rtol=rtol, atol=atol, err_msg=f"{what} {name}")


# the last ones with one channel in and out (the JAX rows write those as strided slices)
PRIMITIVE = random_geometries(30, 0, asymmetric=True) + random_geometries(10, 5, True, True)


@needs_torch
@pytest.mark.parametrize("how", list(RUNS))
def test_the_primitive_against_pytorch(how):
    fns, arrays, wants = [], [], []
    for k, (xs, ws, stride, padding, dilation) in enumerate(PRIMITIVE):
        geo = dict(stride=stride, padding=padding, dilation=dilation)
        out = (xs[0], ws[0]) + conv.out_size(xs[2:], ws[2:], stride, padding, dilation)
        a = samples(xs, ws, out, k)
        (t, b), (le, r) = padding
        wants.append(torch_derivatives(lambda x, w, s=stride, p=(le, r, t, b), d=dilation:
                                       F.conv2d(F.pad(x, p), w, stride=s, dilation=d), a))
        fns.append(lambda x, w, geo=geo: bind("conv2d", x, w, **geo))
        arrays.append(a)
    for k, (got, want) in enumerate(zip(run_all(fns, arrays, how), wants)):
        check(got, want, f"{PRIMITIVE[k]} ({how})")


PUBLIC = random_geometries(20, 1, asymmetric=False)


@needs_torch
@pytest.mark.parametrize("how", list(RUNS))
def test_rnp_conv2d_against_pytorch(how):
    fns, arrays, wants = [], [], []
    for k, (xs, ws, stride, padding, dilation) in enumerate(PUBLIC):
        kw = dict(stride=stride, padding=(padding[0][0], padding[1][0]), dilation=dilation)
        out = (xs[0], ws[0]) + conv.out_size(xs[2:], ws[2:], stride, padding, dilation)
        a = samples(xs, ws, out, 100 + k)
        wants.append(torch_derivatives(lambda x, w, kw=kw: F.conv2d(x, w, **kw), a))
        fns.append(lambda x, w, kw=kw: rnp.conv2d(x, w, **kw))
        arrays.append(a)
    for k, (got, want) in enumerate(zip(run_all(fns, arrays, how), wants)):
        check(got, want, f"{PUBLIC[k]} ({how})")


def transposed_geometries(count, seed):
    """(x shape, w shape (in, out, kh, kw), kwargs) of conv_transpose2d, output_padding
    below max(stride, dilation) (sometimes above the padding)."""
    rng = np.random.default_rng(seed)
    out = []
    while len(out) < count:
        n, c, o = (int(v) for v in rng.integers(1, 4, 3))
        h, w, kh, kw = (int(v) for v in rng.integers(1, 5, 4))
        stride, dilation = [int(v) for v in rng.integers(1, 4, 2)], [int(v) for v in
                                                                     rng.integers(1, 3, 2)]
        padding = [int(v) for v in rng.integers(0, 3, 2)]
        extra = [int(rng.integers(0, max(s, d))) for s, d in zip(stride, dilation)]
        size = [(i - 1) * s - 2 * p + d * (k - 1) + e + 1 for i, s, p, d, k, e in
                zip((h, w), stride, padding, dilation, (kh, kw), extra)]
        if min(size) >= 1:
            out.append(((n, c, h, w), (c, o, kh, kw), dict(
                stride=tuple(stride), padding=tuple(padding), output_padding=tuple(extra),
                dilation=tuple(dilation))))
    return out


TRANSPOSED = transposed_geometries(24, 2)


def test_transposed_geometries_include_output_padding_past_the_padding():
    assert any(e > p for _, _, kw in TRANSPOSED
               for e, p in zip(kw["output_padding"], kw["padding"]))


@needs_torch
@pytest.mark.parametrize("how", list(RUNS))
def test_conv_transpose2d_against_pytorch(how):
    fns, arrays, wants = [], [], []
    for k, (xs, ws, kw) in enumerate(TRANSPOSED):
        a = samples(xs, ws, (1,), 200 + k)
        shape = F.conv_transpose2d(torch.tensor(a[0]), torch.tensor(a[1]), **kw).shape
        a[2] = np.random.default_rng(k).standard_normal(tuple(shape))
        wants.append(torch_derivatives(lambda x, w, kw=kw: F.conv_transpose2d(x, w, **kw), a))
        fns.append(lambda x, w, kw=kw: rnp.conv_transpose2d(x, w, **kw))
        arrays.append(a)
    for k, (got, want) in enumerate(zip(run_all(fns, arrays, how), wants)):
        check(got, want, f"{TRANSPOSED[k]} ({how})")


@needs_torch
@pytest.mark.parametrize("how", list(RUNS))
def test_float32_against_pytorch(how):
    cases = PUBLIC[:8]
    fns, arrays, wants = [], [], []
    for k, (xs, ws, stride, padding, dilation) in enumerate(cases):
        kw = dict(stride=stride, padding=(padding[0][0], padding[1][0]), dilation=dilation)
        out = (xs[0], ws[0]) + conv.out_size(xs[2:], ws[2:], stride, padding, dilation)
        a = samples(xs, ws, out, 300 + k, np.float32)
        wants.append(torch_derivatives(lambda x, w, kw=kw: F.conv2d(x, w, **kw), a))
        fns.append(lambda x, w, kw=kw: rnp.conv2d(x, w, **kw))
        arrays.append(a)
    for k, (got, want) in enumerate(zip(run_all(fns, arrays, how), wants)):
        check(got, want, f"{cases[k]} float32 ({how})", rtol=1e-4, atol=1e-4)


# the NumPy rows take a batch in chunks of images (``conv.CHUNK_BYTES`` of im2col each); the cases
# above fit in one chunk
CHUNKED = [((5, 3, 7, 6), (4, 3, 3, 3), (1, 1), ((1, 1), (1, 1)), (1, 1)),
           ((5, 2, 6, 6), (3, 2, 1, 1), (1, 1), ((0, 0), (0, 0)), (1, 1)),  # im2col is x itself
           ((5, 2, 6, 7), (3, 2, 2, 2), (2, 2), ((0, 0), (0, 1)), (1, 1)),  # windows apart
           ((5, 1, 6, 7), (1, 1, 2, 2), (2, 2), ((0, 0), (0, 0)), (1, 1)),  # as avg_pool2d's
           ] + [((5,) + xs[1:], ws, s, p, d) for xs, ws, s, p, d in
                random_geometries(6, 8, asymmetric=True)]


@pytest.mark.parametrize("images", [1, 2])
def test_the_numpy_rows_over_chunks_of_the_batch(monkeypatch, images):
    """One image per chunk, and two (5 images: a last chunk of one), in eager mode: against
    PyTorch where it is installed, else against the whole batch in one chunk."""
    for k, (xs, ws, stride, padding, dilation) in enumerate(CHUNKED):
        size = conv.out_size(xs[2:], ws[2:], stride, padding, dilation)
        a = samples(xs, ws, (xs[0], ws[0]) + size, 500 + k)
        (t, b), (le, r) = padding
        geo = dict(stride=stride, padding=padding, dilation=dilation)

        def ours():
            return derivatives(lambda x, w: bind("conv2d", x, w, **geo),
                               *[rnp.asarray(v) for v in a], rp.grad)
        if torch is not None:
            want = torch_derivatives(lambda x, w, s=stride, p=(le, r, t, b), d=dilation:
                                     F.conv2d(F.pad(x, p), w, stride=s, dilation=d), a)
        else:
            monkeypatch.setattr(conv, "CHUNK_BYTES", 1 << 40)
            want = [np.asarray(v) for v in ours()]
        monkeypatch.setattr(conv, "CHUNK_BYTES", images * int(np.prod(ws[1:] + size)) * 8)
        got = ours()
        check(got, want, f"{CHUNKED[k]}, {images} image(s) per chunk")


def test_an_empty_batch():
    """No images: an empty output, empty input gradients and zero weight gradients (both
    modes; PyTorch's second derivatives of an empty batch are None, so compared with zeros)."""
    a = [np.ones((0, 2, 5, 4)), np.ones((3, 2, 3, 3)), np.ones((0, 3, 3, 2)),
         np.ones((0, 2, 5, 4)), np.ones((3, 2, 3, 3))]
    want = [np.zeros((0, 3, 3, 2)), np.zeros((0, 2, 5, 4)), np.zeros((3, 2, 3, 3)),
            np.zeros((0, 2, 5, 4)), np.zeros((3, 2, 3, 3))]
    for how in ("numpy", "eager"):
        got = run_all([lambda x, w: rnp.conv2d(x, w, stride=2, padding=1)], [a], how)[0]
        check(got, want, f"empty batch ({how})")


# -- the composition the primitives replaced ------------------------------------------------------
def old_conv2d(x, w, stride, padding, dilation):
    """rnp.conv2d before issue 17: stacked strided slices of the padded input, one einsum."""
    (kh, kw), (sh, sw), (ph, pw), (dh, dw) = w.shape[2:], stride, padding, dilation
    x = rnp.pad(x, ((0, 0), (0, 0), (ph, ph), (pw, pw)))
    oh = (x.shape[2] - dh * (kh - 1) - 1) // sh + 1
    ow = (x.shape[3] - dw * (kw - 1) - 1) // sw + 1
    views = [rnp.expand_dims(x[:, :, i * dh:i * dh + sh * (oh - 1) + 1:sh,
                               j * dw:j * dw + sw * (ow - 1) + 1:sw], 2)
             for i in range(kh) for j in range(kw)]
    return rnp.einsum("nckhw,ock->nohw", rnp.concatenate(views, axis=2),
                      rnp.reshape(w, (w.shape[0], w.shape[1], kh * kw)))


@pytest.mark.parametrize("mode", ["numpy", "eager"])
def test_the_primitive_equals_the_composition_it_replaced(mode):
    fns, arrays = [], []
    for k, (xs, ws, stride, padding, dilation) in enumerate(PUBLIC[:12]):
        pads = (padding[0][0], padding[1][0])
        out = (xs[0], ws[0]) + conv.out_size(xs[2:], ws[2:], stride, padding, dilation)
        arrays.append(samples(xs, ws, out, 400 + k))
        fns += [lambda x, w, g=(stride, pads, dilation): rnp.conv2d(x, w, *g),
                lambda x, w, g=(stride, pads, dilation): old_conv2d(x, w, *g)]
    got = run_all(fns, [a for a in arrays for _ in range(2)], mode)
    for k in range(len(arrays)):
        check(got[2 * k], [np.asarray(v) for v in got[2 * k + 1]], f"{PUBLIC[k]} ({mode})")


# -- structure ----------------------------------------------------------------------------------
def prims(fn, *args):
    return [n.prim for n in rp.function(fn).graph(*args).nodes]


def test_the_rnp_ops_bind_the_primitives_in_eager_mode_too():
    x, w = np.ones((2, 3, 6, 6)), np.ones((4, 3, 3, 3))
    assert rnp.conv2d(x, w, stride=2).node.prim == "conv2d"
    assert rnp.conv_transpose2d(x, np.ones((3, 2, 3, 3)), stride=2).node.prim \
        == "conv2d_input_grad"
    assert "conv2d" in prims(lambda v: rnp.avg_pool2d(v, 2), x)
    layer = rp.nn.ConvTranspose2d(3, 2, 4, stride=2, padding=1, bias=False)
    assert layer(x.astype(np.float32)).node.prim == "conv2d_input_grad"


def test_a_convolution_gradient_is_the_two_gradient_primitives():
    x, w = np.ones((2, 3, 6, 6)), np.ones((4, 3, 3, 3))
    used = prims(lambda x, w: rp.grad(rnp.sum(rnp.conv2d(x, w, stride=2, padding=1) ** 2),
                                      [x, w]), x, w)
    assert {"conv2d", "conv2d_input_grad", "conv2d_weight_grad"} <= set(used)
    assert not {"scatter_add", "einsum", "concatenate", "getitem"} & set(used)
    assert "add.at" not in inspect.getsource(conv)  # col2im adds strided slices, no scatter
    pooled = prims(lambda x: rp.grad(rnp.sum(rnp.avg_pool2d(x, 2) ** 2), x), x)
    assert "conv2d_input_grad" in pooled and "scatter_add" not in pooled


def test_autocast_applies_to_conv2d():
    x, w = np.ones((1, 2, 5, 5), np.float32), np.ones((3, 2, 3, 3), np.float32)

    def f(x, w):
        with rp.autocast("bfloat16"):
            return rnp.conv2d(x, w)

    node = next(n for n in rp.function(f).graph(x, w).nodes if n.prim == "conv2d")
    assert {i.dtype for i in node.inputs} == {rp.bfloat16} and node.out.dtype == rp.bfloat16
    assert rp.function(f)(x, w).dtype == rp.bfloat16


@pytest.mark.skipif(not HAVE_JAX, reason="jax not installed")
def test_xla_sees_convolutions():
    import jax

    from replicate.backends.jax_impl import JAX

    x, w, g = np.ones((2, 3, 7, 6)), np.ones((4, 3, 3, 2)), np.ones((2, 4, 4, 3))
    geo = dict(stride=(2, 2), padding=((1, 1), (1, 1)), dilation=(1, 2))
    for name, args, attrs in [("conv2d", (x, w), {}), ("conv2d_input_grad", (g, w),
                                                      {"size": (7, 6)}),
                              ("conv2d_weight_grad", (x, g), {"kernel": (3, 2)})]:
        text = jax.jit(lambda *a, name=name, attrs=attrs: JAX[name](*a, **attrs, **geo)).lower(
            *args).as_text()
        assert text.count("convolution") >= 1 and "dot_general" not in text, name


def test_shape_errors_name_the_operands():
    with pytest.raises(rp.ReplicateError, match="do not fit"):
        rnp.conv2d(np.ones((1, 2, 4, 4)), np.ones((1, 3, 3, 3)))
    with pytest.raises(rp.ReplicateError, match="larger than the padded input"):
        rnp.conv2d(np.ones((1, 1, 2, 2)), np.ones((1, 1, 3, 3)))
    with pytest.raises(rp.ReplicateError, match="stride and dilation must be positive"):
        rnp.conv2d(np.ones((1, 1, 4, 4)), np.ones((1, 1, 3, 3)), stride=0)
    with pytest.raises(rp.ReplicateError, match="not the shape of a convolution"):
        bind("conv2d_input_grad", rnp.ones((1, 1, 3, 3)), rnp.ones((1, 1, 3, 3)), size=(4, 4),
             stride=(1, 1), padding=((0, 0), (0, 0)), dilation=(1, 1))
    with pytest.raises(rp.ReplicateError, match="at least 1 x 1"):
        bind("conv2d_weight_grad", rnp.ones((1, 1, 4, 4)), rnp.ones((1, 1, 5, 4)), kernel=(0, 1),
             stride=(1, 1), padding=((0, 0), (0, 0)), dilation=(1, 1))
    with pytest.raises(rp.ReplicateError, match="non-negative"):
        bind("conv2d", rnp.ones((1, 1, 4, 4)), rnp.ones((1, 1, 3, 3)), stride=(1, 1),
             padding=((-1, 0), (0, 0)), dilation=(1, 1))


def test_the_phased_col2im_gives_the_strided_one_bit_for_bit(monkeypatch):
    """The input gradient of strided, overlapping windows adds into the stride's phases
    (``conv._col2im_phased``): the same additions in the same order as adding into the strided
    view of the input, so the same bits — over random geometries, chunked batches included."""
    geometries = [g for g in random_geometries(60, 9, asymmetric=True)
                  if max(g[2]) > 1 and any(s < d * (k - 1) + 1 for s, d, k in
                                           zip(g[2], g[4], g[1][2:])) and g[1][0] > 1]
    geometries.append(((5, 3, 12, 11), (4, 3, 3, 3), (2, 2), ((1, 1), (1, 1)), (1, 1)))
    assert len(geometries) >= 10
    rng = np.random.default_rng(4)
    row = conv.conv2d_input_grad_row(np)
    for xs, ws, stride, padding, dilation in geometries:
        size = conv.out_size(xs[2:], ws[2:], stride, padding, dilation)
        g = rng.standard_normal((xs[0], ws[0]) + size).astype(np.float32)
        w = rng.standard_normal(ws).astype(np.float32)
        got = row(g, w, xs[2:], stride, padding, dilation)
        with monkeypatch.context() as m:
            m.setattr(conv, "_col2im_phased", lambda xp, dx, cols, spans, stride: conv._col2im(
                dx, lambda t, a, b, i, j: t.__iadd__(cols[:, a, b, :, i, j]), spans, stride))
            want = row(g, w, xs[2:], stride, padding, dilation)
        np.testing.assert_array_equal(got.view(np.uint32), want.view(np.uint32),
                                      err_msg=str((xs, ws, stride, padding, dilation)))
