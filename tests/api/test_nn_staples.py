"""The transformer staples of ``rp.nn`` (issue 29): ModuleList, ModuleDict, one_hot, nll_loss,
flatten/Flatten, scaled_dot_product_attention and MultiheadAttention.

Every value is checked against a NumPy reference written here (so the tests check values without
PyTorch), and against PyTorch where it is installed; the gradients of attention against central
finite differences of the reference in float64. Each runs in graph mode on numpy and on jax and
in eager mode.
"""

from __future__ import annotations

import importlib.util
import zlib

import numpy as np
import pytest
from test_nn import numeric_grad  # central differences of a scalar loss

import replicate as rp
import replicate.numpy as rnp
from replicate.errors import ReplicateError

HAVE_JAX = importlib.util.find_spec("jax") is not None
CONFIGS = [
    pytest.param(("graph", "numpy"), id="graph-numpy"),
    pytest.param(("graph", "jax"), id="graph-jax",
                 marks=pytest.mark.skipif(not HAVE_JAX, reason="jax not installed")),
    pytest.param(("eager", "numpy"), id="eager"),
]


def torch_or_skip():
    return pytest.importorskip("torch", reason="PyTorch is optional (the [bench] extra)")


def rng_for(name: str):
    return np.random.default_rng(zlib.crc32(name.encode()))


def run(fn, config, *args):
    mode, backend = config
    return rp.function(fn, mode=mode, backend=backend)(*args)


# ================================================================================================
# NumPy references
# ================================================================================================
def sdpa_ref(q, k, v, mask=None, is_causal=False, scale=None):
    scale = 1.0 / np.sqrt(q.shape[-1]) if scale is None else scale
    s = q @ np.swapaxes(k, -1, -2) * scale
    if is_causal:
        L, S = q.shape[-2], k.shape[-2]
        mask = np.tril(np.ones((L, S), bool))
    if mask is not None:
        s = np.where(mask, s, -np.inf) if mask.dtype == bool else s + mask
    s = s - s.max(-1, keepdims=True)
    p = np.exp(s)
    return (p / p.sum(-1, keepdims=True)) @ v


def mha_ref(p, query, key, value, num_heads, attn_mask=None, is_causal=False):
    """Batch-first (B, T, E); ``p`` holds the (in, out) weights; a bool mask's True = blocked."""
    E = query.shape[-1]
    w, b = p["in_proj_weight"], p.get("in_proj_bias", np.zeros(3 * E))
    q, k, v = (x @ w[:, i * E:(i + 1) * E] + b[i * E:(i + 1) * E]
               for i, x in enumerate((query, key, value)))
    B, L, S, d = q.shape[0], q.shape[1], k.shape[1], E // num_heads
    heads = lambda x: x.reshape(B, -1, num_heads, d).transpose(0, 2, 1, 3)  # noqa: E731
    mask = None
    if attn_mask is not None:
        mask = ~attn_mask if attn_mask.dtype == bool else attn_mask
        if mask.ndim == 3:
            mask = mask.reshape(B, num_heads, L, S)
    if is_causal:
        causal = np.tril(np.ones((L, S), bool))
        mask = causal if mask is None else (
            mask & causal if mask.dtype == bool else np.where(causal, mask, -np.inf))
    o = sdpa_ref(heads(q), heads(k), heads(v), mask)
    o = o.transpose(0, 2, 1, 3).reshape(B, L, E)
    return o @ p["out_proj.weight"] + p.get("out_proj.bias", np.zeros(E))


# ================================================================================================
# scaled_dot_product_attention
# ================================================================================================
def sdpa_case(name, dtype=np.float64):
    """(q, k, v, mask, is_causal, scale) by name."""
    rng = rng_for(name)
    n = lambda *s: rng.standard_normal(s).astype(dtype)  # noqa: E731
    if name == "plain":
        return n(2, 3, 4, 5), n(2, 3, 6, 5), n(2, 3, 6, 7), None, False, None
    if name == "causal":
        return n(2, 5, 4), n(2, 5, 4), n(2, 5, 3), None, True, None
    if name == "causal-rect":  # L != S: PyTorch's top-left alignment
        return n(3, 4), n(6, 4), n(6, 2), None, True, None
    if name == "bool-mask":  # broadcast over the batch; every row keeps a key
        mask = rng.random((4, 6)) < 0.6
        mask[:, 0] = True
        return n(2, 4, 3), n(2, 6, 3), n(2, 6, 3), mask, False, None
    if name == "float-mask":
        return n(2, 4, 3), n(2, 6, 3), n(2, 6, 3), n(2, 4, 6), False, 0.3
    if name == "broadcast":  # key/value shared by the heads
        return n(2, 3, 4, 5), n(2, 1, 6, 5), n(2, 1, 6, 5), None, False, None
    raise KeyError(name)


SDPA = ["plain", "causal", "causal-rect", "bool-mask", "float-mask", "broadcast"]


@pytest.mark.parametrize("config", CONFIGS)
@pytest.mark.parametrize("case", SDPA)
def test_sdpa_against_numpy(config, case):
    q, k, v, mask, causal, scale = sdpa_case(case)
    got = run(lambda q, k, v: rp.nn.scaled_dot_product_attention(
        q, k, v, mask=mask, is_causal=causal, scale=scale), config, q, k, v)
    want = sdpa_ref(q, k, v, mask, causal, scale)
    assert got.shape == want.shape and got.dtype == np.float64
    np.testing.assert_allclose(np.asarray(got), want, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("config", CONFIGS)
def test_sdpa_float32_stays_float32_and_is_stable(config):
    q, k, v, *_ = sdpa_case("plain", np.float32)
    q = q * 100.0  # large scores: the max subtracted keeps exp finite
    got = np.asarray(run(rp.nn.scaled_dot_product_attention, config, q, k, v))
    assert got.dtype == np.float32 and np.isfinite(got).all()
    np.testing.assert_allclose(got, sdpa_ref(q.astype(np.float64), k, v), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("config", CONFIGS)
@pytest.mark.parametrize("case", ["plain", "causal", "causal-rect", "bool-mask", "float-mask"])
def test_sdpa_gradients_against_finite_differences(config, case):
    q, k, v, mask, causal, scale = sdpa_case(case)
    q, k, v = q[..., :3, :], k[..., :4, :], v[..., :4, :]  # small
    if mask is not None:
        mask = mask[..., :3, :4]
    cot = rng_for("cot" + case).standard_normal(sdpa_ref(q, k, v, mask, causal, scale).shape)

    def f(q, k, v):
        y = rp.nn.scaled_dot_product_attention(q, k, v, mask, causal, scale)
        return rp.grad(rnp.sum(y * cot), [q, k, v])

    grads = run(f, config, q, k, v)
    xs = [q, k, v]
    for i, g in enumerate(grads):
        def loss(x, i=i):
            args = list(xs)
            args[i] = x
            return float(np.sum(sdpa_ref(*args, mask, causal, scale) * cot))
        np.testing.assert_allclose(np.asarray(g), numeric_grad(loss, xs[i]), rtol=1e-6,
                                   atol=1e-8, err_msg=f"d/d{'qkv'[i]}")


@pytest.mark.parametrize("case", SDPA)
def test_sdpa_against_pytorch(case):
    torch = torch_or_skip()
    q, k, v, mask, causal, scale = sdpa_case(case)
    t = lambda x: None if x is None else torch.from_numpy(np.asarray(x))  # noqa: E731
    want = torch.nn.functional.scaled_dot_product_attention(
        t(q), t(k), t(v), attn_mask=t(mask), is_causal=causal, scale=scale).numpy()
    got = rp.nn.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=causal,
                                             scale=scale)
    np.testing.assert_allclose(np.asarray(got), want, rtol=1e-10, atol=1e-10)


def test_sdpa_refuses_what_pytorch_refuses():
    q, k, v, *_ = sdpa_case("causal")
    with pytest.raises(ReplicateError, match="is_causal"):
        rp.nn.scaled_dot_product_attention(q, k, v, np.ones((5, 5), bool), is_causal=True)
    with pytest.raises(ReplicateError, match="do not fit"):
        rp.nn.scaled_dot_product_attention(q, k[..., :3], v)


# ================================================================================================
# MultiheadAttention
# ================================================================================================
def mha_module(E=6, H=2, bias=True, batch_first=True, name="mha", dtype=np.float64):
    rng = rng_for(name)
    mha = rp.nn.MultiheadAttention(E, H, bias=bias, batch_first=batch_first, dtype=dtype)
    for var in mha.parameters().values():  # biases non-zero too
        var.assign((rng.standard_normal(var.shape) * 0.5).astype(dtype))
    return mha


MHA = {  # name: (L, S, mask kind, is_causal, self-attention)
    "self": (4, 4, None, False, True),
    "self-causal": (5, 5, None, True, True),
    "cross": (3, 5, None, False, False),
    "bool-mask": (4, 4, "bool", False, True),
    "float-mask-3d": (3, 5, "float3", False, False),
    "causal-and-mask": (4, 4, "bool", True, True),
}


def mha_inputs(case, B=3, E=6, H=2):  # B != H: a (B * H, L, S) mask is told apart
    L, S, kind, causal, self_attn = MHA[case]
    rng = rng_for("in" + case)
    x = rng.standard_normal((B, L, E))
    kv = (x, x) if self_attn else (rng.standard_normal((B, S, E)), rng.standard_normal((B, S, E)))
    mask = None
    if kind == "bool":  # True = blocked (this module's PyTorch convention); column 0 open
        mask = rng.random((L, S)) < 0.4
        mask[:, 0] = False
    elif kind == "float3":
        mask = rng.standard_normal((B * H, L, S))
    return x, kv[0], kv[1], mask, causal


@pytest.mark.parametrize("config", CONFIGS)
@pytest.mark.parametrize("case", sorted(MHA))
def test_mha_against_numpy(config, case):
    mha = mha_module()
    x, key, value, mask, causal = mha_inputs(case)
    p = {n: v.numpy() for n, v in mha.parameters().items()}
    self_attn = MHA[case][4]

    def f(x, key, value):
        out, weights = (mha(x, attn_mask=mask, is_causal=causal) if self_attn
                        else mha(x, key, value, attn_mask=mask, is_causal=causal))
        assert weights is None
        return out

    got = run(f, config, x, key, value)
    want = mha_ref(p, x, key, value, 2, mask, causal)
    np.testing.assert_allclose(np.asarray(got), want, rtol=1e-11, atol=1e-12)


@pytest.mark.parametrize("config", CONFIGS)
def test_mha_layouts_and_no_bias(config):
    mha = mha_module(bias=False, batch_first=False, name="nobias")
    assert sorted(mha.parameters()) == ["in_proj_weight", "out_proj.weight"]
    x = rng_for("tbe").standard_normal((4, 2, 6))  # (T, B, E)
    p = {n: v.numpy() for n, v in mha.parameters().items()}
    got = run(lambda x: mha(x, x, x)[0], config, x)
    want = mha_ref(p, x.transpose(1, 0, 2), *(x.transpose(1, 0, 2),) * 2, 2).transpose(1, 0, 2)
    np.testing.assert_allclose(np.asarray(got), want, rtol=1e-11, atol=1e-12)
    mha.batch_first = True  # an unbatched (T, E) input
    got = run(lambda x: mha(x, is_causal=True)[0], config, x[:, 0])
    want = mha_ref(p, x[None, :, 0], x[None, :, 0], x[None, :, 0], 2, is_causal=True)[0]
    np.testing.assert_allclose(np.asarray(got), want, rtol=1e-11, atol=1e-12)


@pytest.mark.parametrize("config", CONFIGS)
@pytest.mark.parametrize("case", ["self-causal", "cross"])
def test_mha_gradients_against_finite_differences(config, case):
    mha = mha_module(E=4, H=2, name="grad" + case)
    x, key, value, mask, causal = mha_inputs(case, B=1, E=4, H=2)
    x, key, value = x[:, :3], key[:, :3], value[:, :3]
    params = mha.parameters()
    names = list(params)
    p = {n: v.numpy().copy() for n, v in params.items()}
    cot = rng_for("mcot" + case).standard_normal(x.shape)

    def f(x, key, value):
        out, _ = mha(x, key, value, is_causal=causal)
        return rp.grad(rnp.sum(out * cot), [x] + [params[n] for n in names])

    grads = run(f, config, x, key, value)
    loss_x = lambda v: float(np.sum(mha_ref(p, v, key, value, 2, None, causal) * cot))  # noqa
    np.testing.assert_allclose(np.asarray(grads[0]), numeric_grad(loss_x, x), rtol=1e-6,
                               atol=1e-8)
    for n, g in zip(names, grads[1:]):
        def loss(v, n=n):
            return float(np.sum(mha_ref({**p, n: v}, x, key, value, 2, None, causal) * cot))
        np.testing.assert_allclose(np.asarray(g), numeric_grad(loss, p[n]), rtol=1e-6,
                                   atol=1e-8, err_msg=n)


# with is_causal=True PyTorch takes attn_mask to be the causal mask (a hint; it may drop it),
# where this module applies both: "causal-and-mask" is checked against NumPy only
@pytest.mark.parametrize("case", sorted(set(MHA) - {"causal-and-mask"}))
@pytest.mark.parametrize("batch_first", [True, False])
def test_mha_against_pytorch(case, batch_first):
    torch = torch_or_skip()
    mha = mha_module()
    x, key, value, mask, causal = mha_inputs(case)
    ref = torch.nn.MultiheadAttention(6, 2, batch_first=batch_first, dtype=torch.float64)
    with torch.no_grad():  # the same weights: PyTorch stores the transposes
        for n, var in mha.parameters().items():
            dict(ref.named_parameters())[n].copy_(torch.from_numpy(var.numpy().T.copy()))
    tmask = None if mask is None else torch.from_numpy(mask)
    if causal:  # PyTorch takes is_causal as a hint next to the mask
        square = torch.nn.Transformer.generate_square_subsequent_mask(x.shape[1],
                                                                      dtype=torch.float64)
        tmask = square
    swap = (lambda a: a) if batch_first else (lambda a: np.swapaxes(a, 0, 1))  # noqa: E731
    want, _ = ref(*(torch.from_numpy(swap(a).copy()) for a in (x, key, value)),
                  attn_mask=tmask, need_weights=False, is_causal=causal)
    mha.batch_first = batch_first
    got, weights = mha(swap(x), swap(key), swap(value), attn_mask=mask, is_causal=causal)
    assert weights is None
    np.testing.assert_allclose(np.asarray(got), want.detach().numpy(), rtol=1e-10, atol=1e-12)


def test_mha_names_and_refusals():
    mha = rp.nn.MultiheadAttention(8, 4)
    shapes = {n: v.shape for n, v in mha.parameters().items()}
    assert shapes == {"in_proj_weight": (8, 24), "in_proj_bias": (24,),
                      "out_proj.weight": (8, 8), "out_proj.bias": (8,)}
    with pytest.raises(ReplicateError, match="divisible"):
        rp.nn.MultiheadAttention(6, 4)
    with pytest.raises(ReplicateError, match="attn_mask"):
        mha(np.ones((2, 3, 8), np.float32), attn_mask=np.ones((5, 3, 3), bool))


# ================================================================================================
# one_hot, nll_loss, flatten
# ================================================================================================
@pytest.mark.parametrize("config", CONFIGS)
def test_one_hot(config):
    labels = np.array([[0, 3], [2, 5]])  # 5 is out of range: a zero row
    got = run(lambda y: rp.nn.one_hot(y, 4), config, labels)
    want = (labels[..., None] == np.arange(4)).astype(np.float32)
    assert got.dtype == np.float32 and got.shape == (2, 2, 4)
    np.testing.assert_array_equal(np.asarray(got), want)
    assert np.asarray(want[1, 1]).sum() == 0
    got = run(lambda y: rp.nn.one_hot(y, 3, dtype=np.int32), config, np.array([2, 0]))
    assert got.dtype == np.int32 and np.asarray(got).tolist() == [[0, 0, 1], [1, 0, 0]]
    with pytest.raises(ReplicateError, match="integers"):
        rp.nn.one_hot(np.ones(2), 3)


def test_one_hot_against_pytorch():
    torch = torch_or_skip()
    labels = np.array([[0, 3], [2, 1]])
    want = torch.nn.functional.one_hot(torch.from_numpy(labels), 4).numpy()
    np.testing.assert_array_equal(np.asarray(rp.nn.one_hot(labels, 4, np.int64)), want)


def nll_ref(logp, targets, reduction="none", ignore_index=-100):
    axis = 1 if logp.ndim >= 2 else 0
    keep = targets != ignore_index
    picked = np.take_along_axis(logp, np.expand_dims(np.where(keep, targets, 0), axis), axis)
    loss = np.where(keep, -np.squeeze(picked, axis), 0.0)
    return {"none": loss, "sum": loss.sum(), "mean": loss.sum() / keep.sum()}[reduction]


def nll_case(name):
    rng = rng_for("nll" + name)
    shape = {"2d": (5, 4), "3d": (2, 4, 3), "1d": (4,)}[name]
    x = rng.standard_normal(shape)
    logp = x - np.log(np.exp(x).sum(axis=1 if x.ndim >= 2 else 0, keepdims=True))
    tshape = shape[:1] + shape[2:] if len(shape) >= 2 else ()
    targets = rng.integers(0, 4, tshape)
    if name != "1d":
        targets.flat[1] = -100  # ignored
    return logp, np.asarray(targets, np.int64)


@pytest.mark.parametrize("config", CONFIGS)
@pytest.mark.parametrize("name", ["2d", "3d", "1d"])
@pytest.mark.parametrize("reduction", ["none", "mean", "sum"])
def test_nll_loss(config, name, reduction):
    logp, targets = nll_case(name)
    cot = rng_for("nllcot").standard_normal(nll_ref(logp, targets, reduction).shape)

    def f(logp, targets):
        loss = rp.nn.nll_loss(logp, targets, reduction)
        return loss, rp.grad(rnp.sum(loss * cot), logp)

    loss, g = run(f, config, logp, targets)
    np.testing.assert_allclose(np.asarray(loss), nll_ref(logp, targets, reduction), rtol=1e-12)
    want = numeric_grad(lambda v: float(np.sum(nll_ref(v, targets, reduction) * cot)), logp)
    np.testing.assert_allclose(np.asarray(g), want, rtol=1e-6, atol=1e-8)


@pytest.mark.parametrize("name", ["2d", "3d", "1d"])
@pytest.mark.parametrize("reduction", ["none", "mean", "sum"])
def test_nll_loss_against_pytorch(name, reduction):
    torch = torch_or_skip()
    logp, targets = nll_case(name)
    want = torch.nn.functional.nll_loss(torch.from_numpy(logp), torch.from_numpy(targets),
                                        reduction=reduction).numpy()
    got = rp.nn.nll_loss(logp, targets, reduction)
    np.testing.assert_allclose(np.asarray(got), want, rtol=1e-12)


def test_nll_loss_is_per_example_by_default_and_matches_cross_entropy():
    logits = rng_for("ce").standard_normal((3, 5))
    labels = np.array([0, 4, 2])
    got = rp.nn.nll_loss(rp.nn.log_softmax(logits), labels)
    assert got.shape == (3,)
    np.testing.assert_allclose(np.asarray(got),
                               np.asarray(rp.nn.softmax_cross_entropy(logits, labels)))
    with pytest.raises(ReplicateError, match="do not fit"):
        rp.nn.nll_loss(logits, labels[:2])


FLATTEN = [(1, -1), (0, -1), (0, 1), (1, 2), (2, 3), (-2, -1), (3, 3)]


@pytest.mark.parametrize("config", CONFIGS)
@pytest.mark.parametrize("dims", FLATTEN)
def test_flatten(config, dims):
    x = rng_for("flat").standard_normal((2, 3, 4, 5))
    s, e = (d % 4 for d in dims)
    want = x.reshape(x.shape[:s] + (-1,) + x.shape[e + 1:])
    got = run(lambda x: rp.nn.flatten(x, *dims), config, x)
    np.testing.assert_array_equal(np.asarray(got), want)
    got = run(lambda x: rp.nn.Flatten(*dims)(x), config, x)
    np.testing.assert_array_equal(np.asarray(got), want)
    assert rp.nn.Flatten()(x).shape == (2, 60)  # the batch axis kept by default
    with pytest.raises(ReplicateError, match="do not fit"):
        rp.nn.flatten(x, 2, 1)


@pytest.mark.parametrize("dims", FLATTEN)
def test_flatten_against_pytorch(dims):
    torch = torch_or_skip()
    x = rng_for("flat").standard_normal((2, 3, 4, 5))
    want = torch.flatten(torch.from_numpy(x), *dims).numpy()
    np.testing.assert_array_equal(np.asarray(rp.nn.flatten(x, *dims)), want)
    want = torch.nn.Flatten(*dims)(torch.from_numpy(x)).numpy()
    np.testing.assert_array_equal(np.asarray(rp.nn.Flatten(*dims)(x)), want)


# ================================================================================================
# ModuleList and ModuleDict
# ================================================================================================
class Block(rp.nn.Module):
    def __init__(self, dim, rng):
        super().__init__()
        self.ln = rp.nn.LayerNorm(dim, dtype=np.float64)
        self.attn = rp.nn.MultiheadAttention(dim, 2, rng=rng, dtype=np.float64)

    def forward(self, x):
        return x + self.attn(self.ln(x), is_causal=True)[0]


class TinyGPT(rp.nn.Module):
    def __init__(self, vocab=7, dim=4, depth=2, seed=0):
        super().__init__()
        rng = np.random.default_rng(seed)
        self.embed = rp.nn.Embedding(vocab, dim, rng=rng, dtype=np.float64)
        self.blocks = rp.nn.ModuleList([Block(dim, rng) for _ in range(depth)])
        self.heads = rp.nn.ModuleDict({"lm": rp.nn.Linear(dim, vocab, rng=rng,
                                                          dtype=np.float64)})

    def forward(self, ids):
        x = self.embed(ids)
        for block in self.blocks:
            x = block(x)
        return self.heads["lm"](x)


def test_module_list_names_index_and_mutation():
    layers = rp.nn.ModuleList([rp.nn.Linear(2, 3), rp.nn.Linear(3, 4)])
    assert list(layers.parameters()) == ["0.weight", "0.bias", "1.weight", "1.bias"]
    assert len(layers) == 2 and layers[-1] is layers[1] and layers[1].weight.shape == (3, 4)
    assert [m.weight.shape for m in layers] == [(2, 3), (3, 4)]
    extra = rp.nn.Linear(4, 5)
    layers.append(extra)
    layers.extend([rp.nn.LayerNorm(5)])
    assert len(layers) == 4 and layers[2] is extra
    assert list(layers.parameters())[4:] == ["2.weight", "2.bias", "3.weight", "3.bias"]
    sub = layers[1:3]
    assert isinstance(sub, rp.nn.ModuleList) and list(sub) == [layers[1], extra]
    layers.insert(0, rp.nn.Flatten())  # no parameters: the others renumbered
    assert list(layers.parameters())[:2] == ["1.weight", "1.bias"]
    del layers[0]
    layers[0] = rp.nn.Linear(2, 3)
    assert list(layers.parameters())[:2] == ["0.weight", "0.bias"]
    with pytest.raises(IndexError):
        layers[4]
    with pytest.raises(ReplicateError, match="Module"):
        layers.append(lambda x: x)


def test_module_dict_names_and_access():
    heads = rp.nn.ModuleDict({"cls": rp.nn.Linear(4, 3)})
    heads["box"] = rp.nn.Linear(4, 4)
    heads.update([("ln", rp.nn.LayerNorm(4))])
    assert list(heads) == heads.keys() == ["cls", "box", "ln"] and len(heads) == 3
    assert heads.box is heads["box"] and "ln" in heads and "nope" not in heads
    assert [k for k, _ in heads.items()] == ["cls", "box", "ln"]
    assert [m.weight.shape for m in heads.values()] == [(4, 3), (4, 4), (4,)]
    assert list(heads.parameters()) == ["cls.weight", "cls.bias", "box.weight", "box.bias",
                                        "ln.weight", "ln.bias"]
    assert heads.pop("cls").weight.shape == (4, 3)
    del heads["ln"]
    assert list(heads.parameters()) == ["box.weight", "box.bias"]
    for bad in ("a.b", "", "keys", "train", 3):
        with pytest.raises(ReplicateError):
            heads[bad] = rp.nn.Linear(1, 1)
    with pytest.raises(AttributeError):
        _ = heads.missing


def test_containers_nested_in_a_model_are_seen_by_parameters_and_checkpoints(tmp_path):
    model = TinyGPT()
    names = list(model.parameters())
    assert names[:3] == ["embed.weight", "blocks.0.ln.weight", "blocks.0.ln.bias"]
    assert "blocks.1.attn.in_proj_weight" in names and "blocks.1.attn.out_proj.bias" in names
    assert names[-2:] == ["heads.lm.weight", "heads.lm.bias"]
    assert len(names) == 1 + 2 * 6 + 2
    assert model.parameters()["blocks.1.attn.in_proj_weight"].name == \
        "blocks.1.attn.in_proj_weight"
    path = str(tmp_path / "gpt.npz")
    rp.checkpoint.save(path, model.variables())
    other = TinyGPT(seed=1)
    rp.checkpoint.restore(path, other.variables())
    for n, v in model.parameters().items():
        np.testing.assert_array_equal(other.parameters()[n].numpy(), v.numpy())


@pytest.mark.parametrize("config", CONFIGS)
def test_grad_and_optimizer_reach_the_containers(config):
    model = TinyGPT()
    params = model.parameters()
    opt = rp.optim.SGD(params, lr=0.1)
    ids = np.array([[1, 2, 3, 4], [0, 6, 5, 1]])
    before = {n: v.numpy().copy() for n, v in params.items()}

    def step(ids):
        logits = model(ids)
        loss = rnp.mean(rp.nn.softmax_cross_entropy(logits[:, :-1], ids[:, 1:]))
        grads = rp.grad(loss, params)
        opt.apply(grads)
        return loss, grads

    loss, grads = run(step, config, ids)
    assert set(grads) == set(params)
    for n, v in params.items():  # every parameter got a gradient and moved by -lr * grad
        g = np.asarray(grads[n])
        assert np.abs(g).max() > 0, n
        np.testing.assert_allclose(v.numpy(), before[n] - 0.1 * g, rtol=1e-12, atol=1e-14)


@pytest.mark.parametrize("config", CONFIGS)
def test_appending_a_block_after_compiling_traces_again(config):
    rng = np.random.default_rng(0)
    layers = rp.nn.ModuleList([rp.nn.Linear(2, 2, rng=rng, dtype=np.float64)])
    f = rp.function(lambda x: [m(x) for m in layers][-1], mode=config[0], backend=config[1])
    x = np.ones((1, 2))
    first = np.asarray(f(x))
    layers.append(rp.nn.Linear(2, 3, rng=rng, dtype=np.float64))
    assert np.asarray(f(x)).shape == (1, 3)
    layers[1] = rp.nn.Linear(2, 2, rng=rng, dtype=np.float64)
    layers[0] = layers[1]
    np.testing.assert_allclose(np.asarray(f(x)),
                               x @ layers[1].weight.numpy() + layers[1].bias.numpy())
    assert first.shape == (1, 2)
