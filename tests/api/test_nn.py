"""``replicate.nn``: every layer, activation and loss against a NumPy reference written here.

For each layer the forward value is compared with the reference and the gradients with respect to
the inputs *and* the parameters with central finite differences of the reference (float64), in
graph mode (``rp.function``) and in eager mode. Cross-replica BatchNorm is checked against plain
BatchNorm on the concatenated batch under a Replicator with 2 and 4 replicas; Dropout's keyed
randomness is checked per replica and per step.
"""

from __future__ import annotations

import importlib.util
import math
import zlib

import numpy as np
import pytest

import replicate as rp
import replicate.numpy as rnp

MODES = ["graph", "eager"]
F64 = np.float64


def rng_for(name: str):
    return np.random.default_rng(zlib.crc32(name.encode()))


def numeric_grad(loss, x, eps=1e-6):
    """Central differences of the scalar ``loss(x)`` with respect to every entry of ``x``."""
    x = np.array(x, F64)
    g = np.zeros_like(x)
    for idx in np.ndindex(x.shape):
        plus, minus = x.copy(), x.copy()
        plus[idx] += eps
        minus[idx] -= eps
        g[idx] = (loss(plus) - loss(minus)) / (2 * eps)
    return g


def randomise(module, rng, scale=0.5):
    """Give every parameter of ``module`` random values (so scale/shift gradients are generic)."""
    for var in module.parameters().values():
        var.assign(rng.normal(size=var.shape) * scale + (1.0 if var.ndim == 1 else 0.0))


def check_layer(layer, ref, xs, mode, *, wrt=(0,), rtol=1e-7, atol=1e-9, grad_rtol=1e-6,
                grad_atol=1e-8, name="layer"):
    """Forward value vs ``ref(params, *xs)`` and gradients of ``sum(out * cot)`` w.r.t. the
    inputs listed in ``wrt`` and every parameter vs central finite differences of ``ref``."""
    params = layer.parameters()
    names = list(params)
    pvals = {n: params[n].numpy().copy() for n in names}
    expected = ref(pvals, *xs)
    cot = rng_for("cot" + name).standard_normal(expected.shape)

    def f(*args):
        y = layer(*args)
        loss = rnp.sum(y * cot)
        return y, rp.grad(loss, [args[i] for i in wrt] + [params[n] for n in names])

    y, grads = rp.function(f, mode=mode)(*xs)
    y = np.asarray(y)
    assert y.shape == expected.shape and y.dtype == expected.dtype, (y.shape, y.dtype)
    np.testing.assert_allclose(y, expected, rtol=rtol, atol=atol, err_msg=f"{name} {mode}")

    def ref_loss(pv, xv):
        return float(np.sum(ref(pv, *xv) * cot))

    targets = [("input %d" % i, xs[i]) for i in wrt] + [(n, pvals[n]) for n in names]
    assert len(grads) == len(targets)
    for j, ((what, value), g) in enumerate(zip(targets, grads)):
        if j < len(wrt):
            i = wrt[j]

            def loss(v, i=i):
                xv = list(xs)
                xv[i] = v
                return ref_loss(pvals, xv)
        else:

            def loss(v, what=what):
                return ref_loss({**pvals, what: v}, xs)

        want = numeric_grad(loss, value)
        g = np.asarray(g)
        assert g.shape == np.shape(value), (what, g.shape)
        np.testing.assert_allclose(g, want, rtol=grad_rtol, atol=grad_atol,
                                   err_msg=f"d/d {what} of {name} in {mode} mode")
    return y, grads


# ================================================================================================
# NumPy references
# ================================================================================================
def linear_ref(p, x):
    return x @ p["weight"] + p["bias"] if "bias" in p else x @ p["weight"]


def conv2d_ref(x, w, b=None, stride=1, padding=0, dilation=1):
    sh, sw = (stride, stride) if np.isscalar(stride) else stride
    ph, pw = (padding, padding) if np.isscalar(padding) else padding
    dh, dw = (dilation, dilation) if np.isscalar(dilation) else dilation
    n, c, h, wd = x.shape
    o, _, kh, kw = w.shape
    xp = np.pad(x, ((0, 0), (0, 0), (ph, ph), (pw, pw)))
    oh = (h + 2 * ph - dh * (kh - 1) - 1) // sh + 1
    ow = (wd + 2 * pw - dw * (kw - 1) - 1) // sw + 1
    out = np.zeros((n, o, oh, ow), np.result_type(x, w))
    for i in range(oh):
        for j in range(ow):
            patch = xp[:, :, i * sh: i * sh + dh * (kh - 1) + 1: dh,
                       j * sw: j * sw + dw * (kw - 1) + 1: dw]  # (n, c, kh, kw)
            out[:, :, i, j] = np.einsum("nchw,ochw->no", patch, w)
    if b is not None:
        out = out + b.reshape(1, -1, 1, 1)
    return out


def layernorm_ref(p, x, eps=1e-5):
    mean = x.mean(-1, keepdims=True)
    var = x.var(-1, keepdims=True)
    return (x - mean) / np.sqrt(var + eps) * p["weight"] + p["bias"]


def batchnorm_stats(x):
    axes = (0,) + tuple(range(2, x.ndim))
    return x.mean(axis=axes), x.var(axis=axes)


def batchnorm_apply(x, mean, var, weight, bias, eps=1e-5):
    shape = (1, -1) + (1,) * (x.ndim - 2)
    return (x - mean.reshape(shape)) / np.sqrt(var.reshape(shape) + eps) * weight.reshape(shape) \
        + bias.reshape(shape)


def batchnorm_train_ref(p, x, eps=1e-5):
    mean, var = batchnorm_stats(x)
    return batchnorm_apply(x, mean, var, p["weight"], p["bias"], eps)


def sigmoid_ref(x):
    return 1.0 / (1.0 + np.exp(-x))


def log_softmax_ref(x, axis=-1):
    m = x.max(axis=axis, keepdims=True)
    return x - m - np.log(np.exp(x - m).sum(axis=axis, keepdims=True))


def gelu_ref(x):
    return 0.5 * x * (1.0 + np.tanh(np.sqrt(2.0 / np.pi) * (x + 0.044715 * x ** 3)))


def gelu_exact_ref(x):
    return x * 0.5 * (1.0 + np.vectorize(math.erf)(x / np.sqrt(2.0)))


# ================================================================================================
# Layers: values and gradients (inputs and parameters) in both modes
# ================================================================================================
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("bias", [True, False])
def test_linear(mode, bias):
    rng = rng_for("linear")
    layer = rp.nn.Linear(4, 3, bias=bias, rng=rng, dtype=F64)
    randomise(layer, rng)
    assert layer.weight.shape == (4, 3) and layer.weight.dtype == F64
    assert set(layer.parameters()) == ({"weight", "bias"} if bias else {"weight"})
    x = rng.normal(size=(5, 4))
    check_layer(layer, linear_ref, [x], mode, name=f"linear{bias}")
    # batched (3-D) input: the weight applies to the last axis
    check_layer(layer, linear_ref, [rng.normal(size=(2, 3, 4))], mode, name=f"linear3d{bias}")


def _uniform_within(a, limit):
    """``a`` looks drawn from U(-limit, limit): inside, reaching near the edge, its std."""
    a = np.asarray(a, np.float64).ravel()
    assert np.abs(a).max() <= limit and np.abs(a).max() > 0.95 * limit, (np.abs(a).max(), limit)
    np.testing.assert_allclose(a.std(), limit / np.sqrt(3), rtol=0.05)


@pytest.mark.parametrize("layer,fan_in", [
    (lambda rng: rp.nn.Linear(300, 2000, rng=rng), 300),
    (lambda rng: rp.nn.Conv2d(8, 500, 3, rng=rng), 8 * 9),
    (lambda rng: rp.nn.ConvTranspose2d(8, 400, 2, rng=rng), 400 * 4)],
    ids=["linear", "conv2d", "conv-transpose2d"])
def test_default_init_is_pytorchs(layer, fan_in):
    """Weight and bias uniform in ±1/sqrt(fan_in), as torch.nn's (kaiming_uniform_(a=sqrt(5)))."""
    m = layer(np.random.default_rng(0))
    assert m.weight.dtype == np.float32 and m.bias.dtype == np.float32
    _uniform_within(m.weight.numpy(), 1 / np.sqrt(fan_in))
    _uniform_within(m.bias.numpy(), 1 / np.sqrt(fan_in))


def test_default_init_other_layers_and_glorot_on_request():
    rng = np.random.default_rng(0)
    emb = rp.nn.Embedding(1000, 64, rng=rng).weight.numpy()  # N(0, 1), as torch.nn.Embedding
    np.testing.assert_allclose([emb.mean(), emb.std()], [0.0, 1.0], atol=0.02)
    mha = rp.nn.MultiheadAttention(256, 4, rng=rng)  # torch: xavier in_proj, zero biases
    _uniform_within(mha.in_proj_weight.numpy(), np.sqrt(6.0 / (256 + 768)))
    _uniform_within(mha.out_proj.weight.numpy(), 1 / 16)
    assert not mha.in_proj_bias.numpy().any() and not mha.out_proj.bias.numpy().any()
    glorot = rp.nn.Linear(300, 200, rng=rng, init_fn=rp.nn.init.glorot_uniform,
                          bias_fn=rp.nn.init.zeros)
    assert glorot.bias.numpy().tolist() == [0.0] * 200
    _uniform_within(glorot.weight.numpy(), np.sqrt(6.0 / 500))
    assert rp.nn.Linear(3, 2, bias=False).bias is None


def test_default_init_first_loss_near_ln_vocabulary():
    """A GPT's head on LayerNorm'd features: unit-variance inputs, so its logits have variance
    in_features * Var(w) = 1/3 with PyTorch's U(±1/sqrt(in)), and the first loss is about
    ln(95) + 1/6 = 4.72 (Glorot's gave variance 128/159 and 5.0, the issue's report)."""
    rng = np.random.default_rng(0)
    model = rp.nn.Sequential(rp.nn.Embedding(95, 64, rng=rng), rp.nn.LayerNorm(64),
                             rp.nn.Linear(64, 95, rng=rng))
    ids = np.random.default_rng(1).integers(0, 95, 4096)
    loss = float(rp.nn.softmax_cross_entropy(model(ids), ids).mean())
    assert np.log(95) < loss < np.log(95) + 0.25, loss


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("stride,padding,dilation,kernel", [
    (1, 0, 1, 3), (1, 1, 1, 3), (2, 1, 1, 3), (1, 2, 2, 3), (1, (1, 0), 1, (2, 3))])
def test_conv2d(mode, stride, padding, dilation, kernel):
    rng = rng_for(f"conv{stride}{padding}{dilation}{kernel}")
    layer = rp.nn.Conv2d(2, 3, kernel, stride=stride, padding=padding, dilation=dilation,
                         rng=rng, dtype=F64)
    kh, kw = (kernel, kernel) if np.isscalar(kernel) else kernel
    assert layer.weight.shape == (3, 2, kh, kw) and layer.bias.shape == (3,)
    randomise(layer, rng)
    x = rng.normal(size=(2, 2, 6, 5))

    def ref(p, x):
        return conv2d_ref(x, p["weight"], p["bias"], stride, padding, dilation)

    check_layer(layer, ref, [x], mode, name=f"conv{stride}{padding}{dilation}{kernel}")


@pytest.mark.parametrize("mode", MODES)
def test_conv2d_without_bias(mode):
    rng = rng_for("conv-nobias")
    layer = rp.nn.Conv2d(1, 2, 2, bias=False, rng=rng, dtype=F64)
    assert list(layer.parameters()) == ["weight"]
    check_layer(layer, lambda p, x: conv2d_ref(x, p["weight"]), [rng.normal(size=(1, 1, 4, 4))],
                mode, name="conv-nobias")


@pytest.mark.parametrize("mode", MODES)
def test_embedding(mode):
    rng = rng_for("embedding")
    layer = rp.nn.Embedding(6, 3, rng=rng, dtype=F64)
    ids = np.array([[0, 5, 2], [2, 2, 1]], np.int64)  # repeated ids: gradients accumulate
    check_layer(layer, lambda p, ids: p["weight"][ids], [ids], mode, wrt=(), name="embedding")
    # the gradient w.r.t. the table is the scatter-add of the cotangents, explicitly:
    cot = np.ones((2, 3, 3))
    (g,) = rp.function(lambda i: rp.grad(rnp.sum(layer(i) * cot), [layer.weight]),
                       mode=mode)(ids)
    counts = np.bincount(ids.ravel(), minlength=6)
    np.testing.assert_array_equal(np.asarray(g), np.repeat(counts[:, None], 3, 1).astype(F64))


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("shape", [(4, 5), (2, 3, 6)])
def test_layernorm(mode, shape):
    rng = rng_for(f"layernorm{shape}")
    layer = rp.nn.LayerNorm(shape[-1], dtype=F64)
    np.testing.assert_array_equal(layer.weight.numpy(), np.ones(shape[-1]))
    np.testing.assert_array_equal(layer.bias.numpy(), np.zeros(shape[-1]))
    randomise(layer, rng)
    x = rng.normal(size=shape) * 3.0 + 1.5
    check_layer(layer, layernorm_ref, [x], mode, name=f"layernorm{shape}")


def test_layernorm_takes_one_axis_and_says_so_for_more():
    """PyTorch's ``normalized_shape`` of one entry is the int; two entries normalised only the
    last axis before (a (3, 4) weight broadcast over it), silently: now an error, as is an
    input whose last axis is not the layer's."""
    x = np.arange(24.0).reshape(2, 3, 4)
    one = rp.nn.LayerNorm((4,), dtype=F64)
    np.testing.assert_allclose(one(x).numpy(), rp.nn.LayerNorm(4, dtype=F64)(x).numpy())
    for bad in [(3, 4), (), 0, 2.5]:
        with pytest.raises(rp.ReplicateError, match="LayerNorm"):
            rp.nn.LayerNorm(bad)
    for layer, x in [(rp.nn.LayerNorm(1), np.ones((2, 5))), (rp.nn.LayerNorm(4), np.ones(3))]:
        with pytest.raises(rp.ReplicateError, match="last axis"):
            layer(x)


@pytest.mark.parametrize("mode", MODES)
def test_layernorm_eps(mode):
    layer = rp.nn.LayerNorm(4, eps=0.5, dtype=F64)
    x = rng_for("ln-eps").normal(size=(3, 4)) * 0.1
    y = rp.function(layer, mode=mode)(x)
    np.testing.assert_allclose(y, layernorm_ref({"weight": 1.0, "bias": 0.0}, x, eps=0.5),
                               rtol=1e-10)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("shape", [(6, 3), (3, 2, 2, 3)])
def test_batchnorm_train(mode, shape):
    rng = rng_for(f"bn{shape}")
    layer = rp.nn.BatchNorm(shape[1], dtype=F64)
    assert set(layer.parameters()) == {"weight", "bias"}
    assert set(layer.buffers()) == {"running_mean", "running_var"}
    randomise(layer, rng)
    x = rng.normal(size=shape) * 2.0 + 0.7
    check_layer(layer, batchnorm_train_ref, [x], mode, grad_rtol=1e-5, grad_atol=1e-7,
                name=f"bn{shape}")


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("momentum", [0.1, 0.3])
def test_batchnorm_running_statistics(mode, momentum):
    """Running averages follow ``(1 - m) * running + m * batch statistic`` (biased variance)
    with no gradient flowing into them."""
    rng = rng_for(f"bn-running{momentum}")
    layer = rp.nn.BatchNorm(3, momentum=momentum, dtype=F64)
    batches = [rng.normal(size=(5, 3, 2, 2)) * (i + 1) + i for i in range(3)]
    f = rp.function(layer, mode=mode)
    run_mean, run_var = np.zeros(3), np.ones(3)
    for x in batches:
        f(x)
        mean, var = batchnorm_stats(x)
        run_mean = (1 - momentum) * run_mean + momentum * mean
        run_var = (1 - momentum) * run_var + momentum * var
        np.testing.assert_allclose(layer.running_mean.numpy(), run_mean, rtol=1e-12)
        np.testing.assert_allclose(layer.running_var.numpy(), run_var, rtol=1e-12)
    if mode == "graph":
        assert f.trace_count == 1


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("shape", [(6, 3), (3, 3, 2, 2)])
def test_batchnorm_eval(mode, shape):
    """In eval mode the running statistics normalise and are left unchanged."""
    rng = rng_for(f"bn-eval{shape}")
    layer = rp.nn.BatchNorm(3, eps=1e-3, dtype=F64)
    randomise(layer, rng)
    mean, var = rng.normal(size=3), rng.uniform(0.5, 2.0, 3)
    layer.running_mean.assign(mean)
    layer.running_var.assign(var)
    layer.eval()
    assert not layer.training
    x = rng.normal(size=shape)

    def ref(p, x):
        return batchnorm_apply(x, mean, var, p["weight"], p["bias"], eps=1e-3)

    check_layer(layer, ref, [x], mode, name=f"bn-eval{shape}")
    np.testing.assert_array_equal(layer.running_mean.numpy(), mean)
    np.testing.assert_array_equal(layer.running_var.numpy(), var)
    layer.train()
    y = rp.function(layer, mode=mode)(x)  # back in training mode: batch statistics
    np.testing.assert_allclose(y, batchnorm_train_ref(
        {"weight": layer.weight.numpy(), "bias": layer.bias.numpy()}, x, eps=1e-3), rtol=1e-9,
        atol=1e-12)


def test_batchnorm_refuses_wrong_channel_count():
    with pytest.raises(rp.ReplicateError, match="BatchNorm"):
        rp.nn.BatchNorm(4)(np.ones((2, 3), np.float32))


@pytest.mark.parametrize("mode", MODES)
def test_flatten(mode):
    rng = rng_for("flatten")
    layer = rp.nn.Flatten()
    assert layer.parameters() == {}
    x = rng.normal(size=(2, 3, 2, 2))
    check_layer(layer, lambda p, x: x.reshape(2, -1), [x], mode, name="flatten")



# ================================================================================================
# ConvTranspose2d and Upsample (issue 16): NumPy references here, and PyTorch where installed
# ================================================================================================
def conv_transpose2d_ref(x, w, b=None, stride=1, padding=0, output_padding=0, dilation=1):
    """By definition: each input pixel adds its kernel, times its value, onto the output."""
    sh, sw = (stride, stride) if np.isscalar(stride) else stride
    ph, pw = (padding, padding) if np.isscalar(padding) else padding
    eh, ew = (output_padding,) * 2 if np.isscalar(output_padding) else output_padding
    dh, dw = (dilation, dilation) if np.isscalar(dilation) else dilation
    n, c, h, wd = x.shape
    _, o, kh, kw = w.shape
    full = np.zeros((n, o, (h - 1) * sh + dh * (kh - 1) + 1 + eh,
                     (wd - 1) * sw + dw * (kw - 1) + 1 + ew))
    for i in range(h):
        for j in range(wd):
            for a in range(kh):
                for q in range(kw):
                    full[:, :, i * sh + a * dh, j * sw + q * dw] += np.einsum(
                        "nc,co->no", x[:, :, i, j], w[:, :, a, q])
    out = full[:, :, ph:full.shape[2] - ph, pw:full.shape[3] - pw]
    return out if b is None else out + b.reshape(1, -1, 1, 1)


def upsample_ref(x, scale, mode):
    """PyTorch's definitions, pixel by pixel: nearest takes source ``floor(dst / scale)``;
    bilinear (align_corners=False) weights the two neighbours of ``(dst + 0.5) / scale - 0.5``
    (clamped at 0) along each axis."""
    sh, sw = (scale, scale) if np.isscalar(scale) else scale
    n, c, h, w = x.shape
    oh, ow = int(np.floor(h * sh)), int(np.floor(w * sw))

    def taps(dst, size, s):
        if mode == "nearest":
            return [(min(int(np.floor(dst / s)), size - 1), 1.0)]
        src = max((dst + 0.5) / s - 0.5, 0.0)
        lo = min(int(np.floor(src)), size - 1)
        hi = min(lo + 1, size - 1)
        return [(lo, 1.0 - (src - lo)), (hi, src - lo)]

    out = np.zeros((n, c, oh, ow), x.dtype)
    for i in range(oh):
        for j in range(ow):
            for a, wa in taps(i, h, sh):
                for b, wb in taps(j, w, sw):
                    out[:, :, i, j] += wa * wb * x[:, :, a, b]
    return out


CONV_T_CONFIGS = [dict(), dict(stride=2), dict(stride=2, padding=1, output_padding=1),
                  dict(stride=(2, 3), padding=(0, 1), output_padding=(1, 2)),
                  dict(stride=2, dilation=2, padding=1)]


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("config", range(len(CONV_T_CONFIGS)))
def test_conv_transpose2d(mode, config):
    kw = CONV_T_CONFIGS[config]
    rng = rng_for(f"convT{config}")
    layer = rp.nn.ConvTranspose2d(2, 3, (3, 2), rng=rng, dtype=F64, **kw)
    assert layer.weight.shape == (2, 3, 3, 2) and layer.bias.shape == (3,)  # (in, out, kH, kW)
    randomise(layer, rng)
    x = rng.normal(size=(2, 2, 3, 4))

    def ref(p, x):
        return conv_transpose2d_ref(x, p["weight"], p["bias"], **kw)

    check_layer(layer, ref, [x], mode, name=f"convT{config}")


@pytest.mark.parametrize("mode", MODES)
def test_conv_transpose2d_without_bias(mode):
    rng = rng_for("convT-nobias")
    layer = rp.nn.ConvTranspose2d(1, 2, 2, stride=2, bias=False, rng=rng, dtype=F64)
    assert list(layer.parameters()) == ["weight"]
    check_layer(layer, lambda p, x: conv_transpose2d_ref(x, p["weight"], stride=2),
                [rng.normal(size=(1, 1, 3, 3))], mode, name="convT-nobias")
    y = rp.function(layer, mode=mode)(np.ones((1, 1, 3, 3)))
    assert y.shape == (1, 2, 6, 6)


def test_conv_transpose2d_refuses_what_pytorch_refuses():
    with pytest.raises(rp.ReplicateError, match="output_padding"):
        rp.nn.ConvTranspose2d(1, 1, 3, stride=2, output_padding=2)(np.ones((1, 1, 3, 3)))
    with pytest.raises(rp.ReplicateError, match="do not fit"):
        rp.nn.ConvTranspose2d(2, 1, 3)(np.ones((1, 3, 3, 3), np.float32))


UPSAMPLE = [(2, "nearest"), (3, "nearest"), ((2, 3), "nearest"), (1.5, "nearest"),
            (2, "bilinear"), (3, "bilinear"), ((1, 2), "bilinear"), (2.5, "bilinear"),
            (0.5, "bilinear")]


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("scale,how", UPSAMPLE)
def test_upsample(mode, scale, how):
    rng = rng_for(f"upsample{scale}{how}")
    layer = rp.nn.Upsample(scale, mode=how)
    assert layer.parameters() == {}
    x = rng.normal(size=(2, 2, 3, 4))
    check_layer(layer, lambda p, x: upsample_ref(x, scale, how), [x], mode,
                name=f"upsample{scale}{how}")
    y32 = rp.function(lambda v: rp.nn.functional.upsample(v, scale, how), mode=mode)(
        x.astype(np.float32))
    assert y32.dtype == np.float32
    np.testing.assert_allclose(y32, upsample_ref(x, scale, how), rtol=1e-5, atol=1e-6)


def test_upsample_nearest_of_integers_and_bad_arguments():
    x = np.arange(6, dtype=np.int32).reshape(1, 1, 2, 3)
    y = rp.function(lambda v: rp.nn.functional.upsample(v, 2))(x)
    np.testing.assert_array_equal(y, x.repeat(2, 2).repeat(2, 3))
    with pytest.raises(rp.ReplicateError, match="mode"):
        rp.nn.Upsample(2, mode="bicubic")(np.ones((1, 1, 2, 2)))
    with pytest.raises(rp.ReplicateError, match="NCHW"):
        rp.nn.Upsample(2)(np.ones((2, 2)))
    with pytest.raises(rp.ReplicateError, match="float"):
        rp.nn.Upsample(2, mode="bilinear")(x)


needs_torch = pytest.mark.skipif(importlib.util.find_spec("torch") is None,
                                 reason="torch is not installed (optional): the comparison with "
                                        "PyTorch is skipped; the NumPy references still run")


def _torch_grads(fn, *arrays, cot):
    import torch

    ts = [torch.tensor(a, requires_grad=True) for a in arrays]
    y = fn(*ts)
    (y * torch.tensor(cot)).sum().backward()
    return y.detach().numpy(), [t.grad.numpy() for t in ts]


@needs_torch
@pytest.mark.parametrize("config", range(len(CONV_T_CONFIGS)))
def test_conv_transpose2d_matches_pytorch(config):
    import torch

    kw = CONV_T_CONFIGS[config]
    rng = rng_for(f"convT-torch{config}")
    x, w, b = rng.normal(size=(2, 2, 3, 4)), rng.normal(size=(2, 3, 3, 2)), rng.normal(size=3)
    cot = rng.normal(size=conv_transpose2d_ref(x, w, **kw).shape)
    want, want_grads = _torch_grads(
        lambda x, w, b: torch.nn.functional.conv_transpose2d(x, w, b, **kw), x, w, b, cot=cot)
    layer = rp.nn.ConvTranspose2d(2, 3, (3, 2), dtype=F64, **kw)
    layer.weight.assign(w)
    layer.bias.assign(b)
    y, grads = rp.function(lambda v: (layer(v), rp.grad(rnp.sum(layer(v) * cot),
                                                        [v, layer.weight, layer.bias])))(x)
    np.testing.assert_allclose(y, want, rtol=1e-12, atol=1e-12)
    for g, t in zip(grads, want_grads):
        np.testing.assert_allclose(g, t, rtol=1e-12, atol=1e-12)


@needs_torch
@pytest.mark.parametrize("scale,how", UPSAMPLE + [(1.7, "nearest"), (7, "nearest"),
                                                  (1.7, "bilinear"), ((3, 0.5), "bilinear")])
def test_upsample_matches_pytorch(scale, how):
    import torch

    x = rng_for(f"up-torch{scale}{how}").normal(size=(2, 3, 5, 4))
    cot = np.random.default_rng(3).normal(size=upsample_ref(x, scale, how).shape)
    want, (want_grad,) = _torch_grads(
        lambda v: torch.nn.Upsample(scale_factor=scale, mode=how)(v), x, cot=cot)
    y, g = rp.function(lambda v: (rp.nn.Upsample(scale, how)(v),
                                  rp.grad(rnp.sum(rp.nn.Upsample(scale, how)(v) * cot), v)))(x)
    np.testing.assert_allclose(y, want, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(g, want_grad, rtol=1e-12, atol=1e-12)

# ================================================================================================
# Module / Sequential naming
# ================================================================================================
class Block(rp.nn.Module):
    def __init__(self):
        super().__init__()
        self.proj = rp.nn.Linear(3, 3)
        self.norm = rp.nn.BatchNorm(3)
        self.scale = rp.Variable(np.ones(3, np.float32))


def test_nested_parameter_names():
    net = rp.nn.Sequential(rp.nn.Linear(2, 3), rp.nn.relu,
                           rp.nn.Sequential(Block(), rp.nn.LayerNorm(3)), rp.nn.Linear(3, 1))
    params = net.parameters()
    assert list(params) == ["0.weight", "0.bias", "2.0.scale", "2.0.proj.weight",
                            "2.0.proj.bias", "2.0.norm.weight", "2.0.norm.bias", "2.1.weight",
                            "2.1.bias", "3.weight", "3.bias"]
    assert list(net.buffers()) == ["2.0.norm.running_mean", "2.0.norm.running_var"]
    assert list(net.variables()) == list(params) + list(net.buffers())
    # auto-named variables take their dotted name
    for name, var in params.items():
        assert var.name == name
    # a variable given a name keeps it
    v = rp.Variable(np.zeros(2), name="mine")
    block = Block()
    block.extra = v
    assert block.parameters()["extra"].name == "mine"
    # the named objects are the modules' own variables
    assert params["2.0.proj.weight"] is net.layers[2].layers[0].proj.weight


def test_reassigning_an_attribute_replaces_the_registration():
    block = Block()
    block.proj = rp.nn.Linear(3, 2)
    assert "proj.weight" in block.parameters()
    assert block.parameters()["proj.weight"].shape == (3, 2)
    block.proj = None  # no longer a module: its parameters go away
    assert not any(n.startswith("proj.") for n in block.parameters())
    block.scale = 3.0
    assert "scale" not in block.parameters()


def test_shared_submodule_is_listed_once():
    """A module reachable under two names (weight tying) holds each parameter once, so an
    optimiser updates it once per step."""
    shared = rp.nn.Linear(2, 2)

    class Tied(rp.nn.Module):
        def __init__(self):
            super().__init__()
            self.a = shared
            self.b = shared

    params = Tied().parameters()
    assert list(params) == ["a.weight", "a.bias"]
    assert len({id(v) for v in params.values()}) == len(params)


def test_train_eval_propagate():
    net = rp.nn.Sequential(rp.nn.Sequential(rp.nn.Dropout(0.5), rp.nn.BatchNorm(2)))
    assert net.eval() is net
    assert not net.layers[0].layers[0].training and not net.layers[0].layers[1].training
    net.train()
    assert net.layers[0].layers[0].training and net.layers[0].layers[1].training


def test_module_needs_super_init():
    class Bad(rp.nn.Module):
        def __init__(self):
            self.w = rp.Variable(np.zeros(1))

    with pytest.raises(RuntimeError, match="super"):
        Bad()


@pytest.mark.parametrize("mode", MODES)
def test_sequential_value_and_gradient(mode):
    rng = rng_for("sequential")
    net = rp.nn.Sequential(rp.nn.Linear(3, 4, rng=rng, dtype=F64), rp.nn.tanh,
                           rp.nn.LayerNorm(4, dtype=F64), rp.nn.Linear(4, 2, rng=rng, dtype=F64))
    randomise(net, rng)

    def ref(p, x):
        h = np.tanh(x @ p["0.weight"] + p["0.bias"])
        h = layernorm_ref({"weight": p["2.weight"], "bias": p["2.bias"]}, h)
        return h @ p["3.weight"] + p["3.bias"]

    check_layer(net, ref, [rng.normal(size=(5, 3))], mode, name="sequential")


# ================================================================================================
# Activations
# ================================================================================================
ACTIVATIONS = {
    "relu": (rp.nn.relu, lambda x: np.maximum(x, 0.0)),
    "leaky_relu": (rp.nn.leaky_relu, lambda x: np.where(x > 0, x, 0.01 * x)),
    "leaky_relu(0.2)": (lambda x: rp.nn.leaky_relu(x, 0.2), lambda x: np.where(x > 0, x, 0.2 * x)),
    "gelu": (rp.nn.gelu, gelu_ref),
    "gelu(approximate=False)": (lambda x: rp.nn.gelu(x, approximate=False), gelu_exact_ref),
    "gelu(approximate='none')": (lambda x: rp.nn.gelu(x, approximate="none"), gelu_exact_ref),
    "gelu(approximate='tanh')": (lambda x: rp.nn.gelu(x, approximate="tanh"), gelu_ref),
    "tanh": (rp.nn.tanh, np.tanh),
    "sigmoid": (rp.nn.sigmoid, sigmoid_ref),
    "softmax": (rp.nn.softmax, lambda x: np.exp(log_softmax_ref(x))),
    "softmax(axis=0)": (lambda x: rp.nn.softmax(x, axis=0),
                        lambda x: np.exp(log_softmax_ref(x, 0))),
    "log_softmax": (rp.nn.log_softmax, log_softmax_ref),
    "log_softmax(axis=0)": (lambda x: rp.nn.log_softmax(x, axis=0),
                            lambda x: log_softmax_ref(x, 0)),
}


def away_from_kinks(rng, shape):
    """Normal samples kept away from 0 (where relu/leaky_relu have no derivative)."""
    x = rng.normal(size=shape) * 2.0
    return np.where(np.abs(x) < 0.05, 0.5, x)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("name", list(ACTIVATIONS))
def test_activation(name, mode):
    fn, ref = ACTIVATIONS[name]
    rng = rng_for(name)
    x = away_from_kinks(rng, (4, 5))
    cot = rng.standard_normal((4, 5))

    def f(x):
        y = fn(x)
        return y, rp.grad(rnp.sum(y * cot), x)

    y, g = rp.function(f, mode=mode)(x)
    np.testing.assert_allclose(y, ref(x), rtol=1e-12, atol=1e-14, err_msg=name)
    assert np.asarray(y).dtype == F64
    want = numeric_grad(lambda v: float(np.sum(ref(v) * cot)), x)
    np.testing.assert_allclose(g, want, rtol=1e-6, atol=1e-8, err_msg=f"grad of {name}")
    # float32 in, float32 out
    y32 = rp.function(fn, mode=mode)(x.astype(np.float32))
    assert np.asarray(y32).dtype == np.float32
    np.testing.assert_allclose(y32, ref(x), rtol=1e-5, atol=1e-6)


def test_softmax_is_stable_and_normalised():
    x = np.array([[1000.0, 1000.0, -1000.0], [-1e4, 0.0, 1e4]])
    p = rp.function(rp.nn.softmax)(x)
    assert np.isfinite(p).all()
    np.testing.assert_allclose(p.sum(-1), 1.0)
    np.testing.assert_allclose(p[0], [0.5, 0.5, 0.0], atol=1e-300)
    lp = rp.function(rp.nn.log_softmax)(x)
    np.testing.assert_allclose(lp, log_softmax_ref(x))


def test_relu_and_leaky_relu_at_zero():
    x = np.array([-1.0, 0.0, 2.0])
    np.testing.assert_array_equal(rp.function(rp.nn.relu)(x), [0.0, 0.0, 2.0])
    np.testing.assert_array_equal(rp.function(lambda v: rp.nn.leaky_relu(v, 0.1))(x),
                                  [-0.1, 0.0, 2.0])


# ================================================================================================
# Losses
# ================================================================================================
def sce_int_ref(logits, labels):
    return -np.take_along_axis(log_softmax_ref(logits), labels[..., None], -1)[..., 0]


def sce_prob_ref(logits, targets):
    return -(targets * log_softmax_ref(logits)).sum(-1)


def bce_ref(logits, t):
    return np.logaddexp(0.0, logits) - logits * t


def mse_ref(p, t):
    return (p - t) ** 2


def huber_ref(p, t, delta=1.0):
    d = np.abs(p - t)
    return np.where(d <= delta, 0.5 * d * d, delta * (d - 0.5 * delta))


def _loss_data(name):
    rng = rng_for("loss" + name)
    logits = rng.normal(size=(6, 4)) * 2.0
    if name == "sce-int":
        return logits, rng.integers(0, 4, 6)
    if name == "sce-onehot":
        return logits, np.eye(4)[rng.integers(0, 4, 6)]
    if name == "sce-prob":
        return logits, np.exp(log_softmax_ref(rng.normal(size=(6, 4))))
    if name == "bce":
        return logits, (rng.random((6, 4)) < 0.5).astype(F64)
    if name == "bce-soft":
        return logits, rng.random((6, 4))
    pred = rng.normal(size=(6, 4)) * 2.0
    target = rng.normal(size=(6, 4)) * 2.0
    d = np.abs(pred - target)  # keep |pred - target| away from huber's joins at delta
    pred = np.where(np.abs(d - 1.0) < 0.05, pred + 0.3, pred)
    pred = np.where(np.abs(np.abs(pred - target) - 0.5) < 0.05, pred + 0.3, pred)
    return pred, target


LOSSES = {
    "sce-int": (rp.nn.softmax_cross_entropy, sce_int_ref),
    "sce-onehot": (rp.nn.softmax_cross_entropy, sce_prob_ref),
    "sce-prob": (rp.nn.softmax_cross_entropy, sce_prob_ref),
    "bce": (rp.nn.sigmoid_binary_cross_entropy, bce_ref),
    "bce-soft": (rp.nn.sigmoid_binary_cross_entropy, bce_ref),
    "mse": (rp.nn.mse, mse_ref),
    "huber": (rp.nn.huber, huber_ref),
    "huber(0.5)": (lambda p, t: rp.nn.huber(p, t, delta=0.5), lambda p, t: huber_ref(p, t, 0.5)),
}


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("name", list(LOSSES))
def test_loss(name, mode):
    fn, ref = LOSSES[name]
    a, b = _loss_data(name)
    expected = ref(a, b)
    cot = rng_for("losscot" + name).standard_normal(expected.shape)
    differentiable_target = b.dtype.kind == "f" and name != "sce-onehot"

    def f(a, b):
        loss = fn(a, b)
        wrt = [a, b] if differentiable_target else [a]
        return loss, rp.grad(rnp.sum(loss * cot), wrt)

    loss, grads = rp.function(f, mode=mode)(a, b)
    assert np.shape(loss) == expected.shape  # per-example (per-element) losses
    np.testing.assert_allclose(loss, expected, rtol=1e-12, atol=1e-13, err_msg=name)
    want = [numeric_grad(lambda v: float(np.sum(ref(v, b) * cot)), a)]
    if differentiable_target:
        want.append(numeric_grad(lambda v: float(np.sum(ref(a, v) * cot)), b))
    for g, w in zip(grads, want):
        np.testing.assert_allclose(g, w, rtol=1e-6, atol=1e-8, err_msg=f"grad of {name}")


def test_cross_entropy_integer_and_one_hot_agree():
    a, labels = _loss_data("sce-int")
    f = rp.function(lambda x, y: rp.nn.softmax_cross_entropy(x, y))
    np.testing.assert_allclose(f(a, labels), f(a, np.eye(4)[labels]), rtol=1e-12)
    # the gradient of the mean is (softmax - onehot) / n
    g = rp.function(lambda x: rp.grad(rp.nn.softmax_cross_entropy(x, labels).mean(), x))(a)
    np.testing.assert_allclose(g, (np.exp(log_softmax_ref(a)) - np.eye(4)[labels]) / 6,
                               rtol=1e-10, atol=1e-14)


def test_cross_entropy_refuses_mismatched_labels():
    with pytest.raises(rp.ReplicateError):
        rp.nn.softmax_cross_entropy(rnp.zeros((2, 3)), rnp.asarray([0, 1, 2]))
    with pytest.raises(rp.ReplicateError):
        rp.nn.softmax_cross_entropy(rnp.zeros((2, 3)), rnp.zeros((2, 4)))


def test_bce_is_stable_for_large_logits():
    x = np.array([-800.0, -50.0, 0.0, 50.0, 800.0])
    got = rp.function(lambda v: rp.nn.sigmoid_binary_cross_entropy(v, np.ones(5)))(x)
    assert np.isfinite(got).all()
    np.testing.assert_allclose(got, bce_ref(x, 1.0), rtol=1e-12)
    got0 = rp.function(lambda v: rp.nn.sigmoid_binary_cross_entropy(v, 0.0))(x)
    np.testing.assert_allclose(got0, bce_ref(x, 0.0), rtol=1e-12)


# ================================================================================================
# BatchNorm across replicas
# ================================================================================================
def _bn_replicated(k, cross_replica, steps=2, B=3, C=4):
    rng = rng_for(f"xbn{k}{cross_replica}")
    xs = [rng.normal(size=(k * B, C, 2, 2)) * rng.uniform(0.5, 3.0, (1, C, 1, 1))
          + rng.normal(size=(1, C, 1, 1)) for _ in range(steps)]
    cots = [rng.normal(size=x.shape) for x in xs]
    weight, bias = rng.normal(size=C), rng.normal(size=C)

    bn = rp.nn.BatchNorm(C, momentum=0.2, cross_replica=cross_replica, dtype=F64)
    bn.weight.assign(weight)
    bn.bias.assign(bias)

    def input_fn(ctx):
        sl = slice(ctx.replica_id * B, (ctx.replica_id + 1) * B)
        for x, c in zip(xs, cots):
            yield x[sl], c[sl]

    def step_fn(batch):
        x, cot = batch
        y = bn(x)
        gx, gw, gb = rp.grad(rnp.sum(y * cot), [x, bn.weight, bn.bias])
        return {"y": y, "gx": gx, "gw": gw, "gb": gb}

    rep = rp.Replicator(input_fn, step_fn, replicas_per_rank=k, outputs="per_replica")
    hist = rep.run(steps=steps)
    assert len(hist) == steps and rep.trace_count == 1
    return xs, cots, weight, bias, hist, bn


@pytest.mark.parametrize("k", [2, 4])
def test_cross_replica_batchnorm_equals_batchnorm_on_the_whole_batch(k):
    """R replicas x batch B normalise, differentiate and update running statistics exactly as one
    plain BatchNorm on the concatenated batch of R*B."""
    xs, cots, weight, bias, hist, bn = _bn_replicated(k, cross_replica=True)
    big = rp.nn.BatchNorm(4, momentum=0.2, dtype=F64)
    big.weight.assign(weight)
    big.bias.assign(bias)

    def big_step(x, cot):
        y = big(x)
        return (y,) + tuple(rp.grad(rnp.sum(y * cot), [x, big.weight, big.bias]))

    f = rp.function(big_step)
    run_mean, run_var = np.zeros(4), np.ones(4)
    for x, cot, out in zip(xs, cots, hist):
        y, gx, gw, gb = f(x, cot)
        assert out["y"].shape == (k, 3, 4, 2, 2)
        np.testing.assert_allclose(out["y"].reshape(x.shape), y, rtol=1e-10, atol=1e-12)
        np.testing.assert_allclose(out["y"].reshape(x.shape),
                                   batchnorm_train_ref({"weight": weight, "bias": bias}, x),
                                   rtol=1e-10, atol=1e-12)
        # the input gradient flows through the all-reduced statistics to every replica
        np.testing.assert_allclose(out["gx"].reshape(x.shape), gx, rtol=1e-9, atol=1e-11)
        # parameter gradients are per replica; their sum is the whole batch's
        np.testing.assert_allclose(out["gw"].sum(0), gw, rtol=1e-9, atol=1e-11)
        np.testing.assert_allclose(out["gb"].sum(0), gb, rtol=1e-9, atol=1e-11)
        mean, var = batchnorm_stats(x)
        run_mean = 0.8 * run_mean + 0.2 * mean
        run_var = 0.8 * run_var + 0.2 * var
    np.testing.assert_allclose(bn.running_mean.numpy(), big.running_mean.numpy(), rtol=1e-12)
    np.testing.assert_allclose(bn.running_var.numpy(), big.running_var.numpy(), rtol=1e-12)
    np.testing.assert_allclose(bn.running_mean.numpy(), run_mean, rtol=1e-12)
    np.testing.assert_allclose(bn.running_var.numpy(), run_var, rtol=1e-12)


def test_cross_replica_batchnorm_float32_with_a_large_mean_normalises():
    """Across 4 replicas, float32 features at a mean of 3000 with replica means apart: the
    statistics are each replica's (from its deviations) combined in float64, so the output is
    the whole batch's normalisation (E[x^2] - E[x]^2 across replicas gave a variance of 0)."""
    k, B = 4, 16
    rng = rng_for("xbn-large-mean")
    x = (rng.standard_normal((k * B, 3)) + 3000.0 + np.repeat(np.arange(k), B)[:, None] * 0.5)
    x = x.astype(np.float32)
    bn = rp.nn.BatchNorm(3, cross_replica=True)

    def input_fn(ctx):
        yield x[ctx.replica_id * B:(ctx.replica_id + 1) * B]

    rep = rp.Replicator(input_fn, lambda xb: bn(xb), replicas_per_rank=k,
                        outputs="per_replica")
    y = np.asarray(rep.run(steps=1)[0], np.float64).reshape(k * B, 3)
    x64 = x.astype(np.float64)
    np.testing.assert_allclose(y, (x64 - x64.mean(0)) / np.sqrt(x64.var(0) + 1e-5), atol=3e-3)
    np.testing.assert_allclose(bn.running_var.numpy(), 0.9 + 0.1 * x64.var(0), rtol=1e-3)


def test_per_replica_batchnorm_normalises_each_replica_alone():
    """Without cross_replica each replica uses its own batch statistics; the running averages
    are the replica mean of them (identical state everywhere)."""
    k, B = 2, 3
    xs, _, weight, bias, hist, bn = _bn_replicated(k, cross_replica=False)
    run_mean, run_var = np.zeros(4), np.ones(4)
    for x, out in zip(xs, hist):
        means, variances = [], []
        for r in range(k):
            xr = x[r * B:(r + 1) * B]
            np.testing.assert_allclose(out["y"][r],
                                       batchnorm_train_ref({"weight": weight, "bias": bias}, xr),
                                       rtol=1e-10, atol=1e-12)
            m, v = batchnorm_stats(xr)
            means.append(m)
            variances.append(v)
        run_mean = 0.8 * run_mean + 0.2 * np.mean(means, 0)
        run_var = 0.8 * run_var + 0.2 * np.mean(variances, 0)
    np.testing.assert_allclose(bn.running_mean.numpy(), run_mean, rtol=1e-12)
    np.testing.assert_allclose(bn.running_var.numpy(), run_var, rtol=1e-12)


# ================================================================================================
# Dropout
# ================================================================================================
def test_dropout_rejects_bad_rates():
    for rate in (-0.1, 1.0, 1.5):
        with pytest.raises(rp.ReplicateError):
            rp.nn.Dropout(rate)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("rate", [0.1, 0.5])
def test_dropout_keeps_and_scales(mode, rate):
    n = 20000
    drop = rp.nn.Dropout(rate, seed=3)
    x = rng_for("dropout").uniform(0.5, 1.5, n)
    cot = rng_for("dropout-cot").normal(size=n)

    def f(x):
        y = drop(x)
        return y, rp.grad(rnp.sum(y * cot), x)

    step = rp.function(f, mode=mode)
    outs = [step(x) for _ in range(3)]
    for y, g in outs:
        kept = y != 0
        # kept entries are scaled by 1 / (1 - rate), dropped ones are exactly 0
        np.testing.assert_allclose(y[kept], x[kept] / (1 - rate), rtol=1e-12)
        assert abs(kept.mean() - (1 - rate)) < 5 * np.sqrt(rate * (1 - rate) / n)
        # the gradient is the same mask and scale
        np.testing.assert_allclose(g, np.where(kept, cot / (1 - rate), 0.0), rtol=1e-12)
    masks = [y != 0 for y, _ in outs]
    assert not np.array_equal(masks[0], masks[1]) and not np.array_equal(masks[1], masks[2])
    if mode == "graph":
        assert step.trace_count == 1  # the key is state, not a constant


def test_dropout_is_reproducible_from_its_seed_in_both_modes():
    x = np.ones(500, np.float32)
    a = [rp.function(rp.nn.Dropout(0.3, seed=11))(x) for _ in range(1)][0]
    d = rp.nn.Dropout(0.3, seed=11)
    b = rp.function(d, mode="eager")(x)
    assert a.tobytes() == b.tobytes()
    c = rp.function(rp.nn.Dropout(0.3, seed=12))(x)
    assert not np.array_equal(a, c)


@pytest.mark.parametrize("mode", MODES)
def test_dropout_identity_in_eval_mode_and_at_rate_zero(mode):
    x = rng_for("dropout-eval").normal(size=(4, 50))
    drop = rp.nn.Dropout(0.5).eval()
    np.testing.assert_array_equal(rp.function(drop, mode=mode)(x), x)
    g = rp.function(lambda v: rp.grad(rnp.sum(drop(v) * 2.0), v), mode=mode)(x)
    np.testing.assert_array_equal(g, np.full_like(x, 2.0))
    np.testing.assert_array_equal(rp.function(rp.nn.Dropout(0.0), mode=mode)(x), x)


def test_dropout_differs_per_replica_and_per_step():
    k, n, rate = 4, 4000, 0.25
    drop = rp.nn.Dropout(rate, seed=0)

    def input_fn(ctx):
        while True:
            yield np.ones(n, np.float32)

    rep = rp.Replicator(input_fn, lambda x: {"y": drop(x)}, replicas_per_rank=k,
                        outputs="per_replica")
    hist = rep.run(steps=3)
    assert rep.trace_count == 1
    masks = np.stack([h["y"] != 0 for h in hist])  # (steps, replicas, n)
    for s in range(3):
        for r in range(k):
            y = hist[s]["y"][r]
            np.testing.assert_allclose(y[y != 0], 1.0 / (1.0 - rate), rtol=1e-6)
            assert abs(masks[s, r].mean() - (1 - rate)) < 5 * np.sqrt(rate * (1 - rate) / n)
    flat = masks.reshape(3 * k, n)
    for i in range(3 * k):
        for j in range(i + 1, 3 * k):
            assert not np.array_equal(flat[i], flat[j]), (divmod(i, k), divmod(j, k))
            # independent draws agree on ~ (1-rate)^2 + rate^2 of the entries, not all
            agree = (flat[i] == flat[j]).mean()
            assert abs(agree - ((1 - rate) ** 2 + rate ** 2)) < 0.05


@pytest.mark.parametrize("mode", MODES)
def test_batchnorm_float32_with_a_large_mean_normalises(mode):
    """float32 features far from zero (a mean of 3000, a spread of 1): the batch variance comes
    from the deviations, so the output has unit spread; E[x^2] - E[x]^2 cancelled to 0 there
    and scaled the output by ~300."""
    rng = rng_for("bn-large-mean")
    x = (rng.standard_normal((64, 3)) + 3000.0).astype(np.float32)
    layer = rp.nn.BatchNorm(3)
    y = np.asarray(rp.function(layer, mode=mode)(x), np.float64)
    x64 = x.astype(np.float64)
    want = (x64 - x64.mean(0)) / np.sqrt(x64.var(0) + 1e-5)
    np.testing.assert_allclose(y, want, atol=2e-3)
    np.testing.assert_allclose(layer.running_var.numpy(), 0.9 + 0.1 * x64.var(0), rtol=1e-3)
