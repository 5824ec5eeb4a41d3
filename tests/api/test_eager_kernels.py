"""Eager mode's NumPy kernels (``replicate/nn/eager_kernels.py``): LayerNorm and the tanh GELU
(written-out gradients), Linear, attention's weights and ReLU. The forward and the gradients are the
``replicate.numpy`` definition's to the bit — one layer and a whole GPT step —, the second and
third derivatives the definition's own, and a layer runs as two kernels rather than op by op."""

from __future__ import annotations

import numpy as np
import pytest
from eager_steps import assert_kernels_change_no_bit, two_steps, with_and_without

import replicate as rp
import replicate.numpy as rnp
from replicate.nn import eager_kernels as ek
from replicate.nn import written_grads as wg

rng = np.random.default_rng(11)
# (shape, dtype): a GPT's activations, odd sizes, several elementwise blocks and a tail, 1-D
CASES = [((16, 64, 256), np.float32), ((3, 5, 7), np.float32),
         ((2 * wg.BLOCK + 77,), np.float32), ((7, 33), np.float64), ((5,), np.float64)]


def _layers(fast):
    """name -> f(x, w, b): the layer on the kernels' road (``fast``) or the definition's."""
    ln = wg.layer_norm if fast else wg._layer_norm
    gelu = wg.gelu_tanh if fast else wg._gelu_tanh
    lin = ek.linear if fast else (lambda x, w, b: rnp.matmul(x, w) + b)
    relu = ek.relu if fast else ek._relu_traced
    att = ek.attention_weights if fast else (lambda q, k, scale, causal: rp.graph.core.bind(
        "attention_weights", q, k, scale=scale, causal=causal, masking="none"))
    return {"layer_norm": lambda x, w, b: ln(x, w, b, 1e-5),
            "gelu": lambda x, w, b: gelu(x) * w + b,
            # (a square weight: x @ w keeps the shape; the attention's queries x, keys x * w)
            "linear": lambda x, w, b: lin(x, w[:, None] * b[None, :], b),
            "attention": lambda x, w, b: rnp.matmul(att(x, x * w, 0.3, True), x) + b,
            "relu": lambda x, w, b: relu(x) * w + b}


def _kernel(name):
    return {"layer_norm": wg.LAYER_NORM_KERNEL, "gelu": wg.GELU_KERNEL, "linear": ek.LINEAR,
            "attention": ek.ATTENTION, "relu": ek.RELU}[name].name


NAMES = ["layer_norm", "gelu", "linear", "attention", "relu"]


def _bits(a):
    a = np.ascontiguousarray(np.asarray(a))
    return a.view(np.uint8)


@pytest.mark.parametrize("name,shape,dtype", [  # (Linear and attention: 2-D operands and more)
    (name, shape, dtype) for name in NAMES for shape, dtype in CASES
    if len(shape) > 1 or name in ("layer_norm", "gelu", "relu")])
def test_forward_and_gradients_equal_the_definition_bitwise(name, shape, dtype):
    x = (rng.standard_normal(shape) * 2.5 + 0.3).astype(dtype)
    w, b = (rng.standard_normal(shape[-1:]).astype(dtype) for _ in range(2))
    g = rng.standard_normal(shape).astype(dtype)
    results = {}
    for fast in (True, False):
        layer = _layers(fast)[name]
        xs = [rnp.asarray(a) for a in (x, w, b)]
        y = layer(*xs)
        results[fast] = [y] + list(rp.grad(rnp.sum(y * g), xs))
    for k, (got, want) in enumerate(zip(results[True], results[False])):
        assert got.dtype == want.dtype == dtype
        np.testing.assert_array_equal(_bits(got), _bits(want), err_msg=f"{name} output {k}")


@pytest.mark.parametrize("name", NAMES)
def test_second_and_third_derivatives_are_the_definitions(name):
    shape = (4, 6)
    x, v = (rng.standard_normal(shape) for _ in range(2))
    w, b = (rng.standard_normal(6) for _ in range(2))
    got = {}
    for fast in (True, False):
        layer = _layers(fast)[name]
        xs = [rnp.asarray(a) for a in (x, w, b)]
        dx, dw = rp.grad(rnp.sum(layer(*xs) * rnp.sin(xs[0])), xs[:2])
        hx, hw = rp.grad(rnp.sum(dx * v) + rnp.sum(dw * dw), xs[:2])
        third = rp.grad(rnp.sum(hx * hx) + rnp.sum(hw), xs[0])
        got[fast] = [a.numpy() for a in (dx, dw, hx, hw, third)]
    for k, (a, want) in enumerate(zip(got[True], got[False])):
        np.testing.assert_allclose(a, want, rtol=1e-12, atol=1e-12, err_msg=f"{name} #{k}")
        assert np.abs(want).max() > 1e-3  # (each derivative is there to compare)


@pytest.mark.parametrize("name", NAMES)
def test_an_eager_layer_runs_as_two_kernels(name, tmp_path):
    """Forward and backward in eager mode: the two kernels where the definition runs ~20 ops
    (the profiler records each eager op); the rest (the step's own ops) is the same."""
    xs = [rnp.asarray(rng.standard_normal(s).astype(np.float32)) for s in ((8, 16), 16, 16)]
    ops = {}
    for fast in (True, False):
        path = str(tmp_path / f"{fast}.json")
        with rp.profile.recording(path):
            rp.grad(rnp.sum(_layers(fast)[name](*xs)), xs)
        ops[fast] = [e["name"] for e in rp.profile.load(path) if e.get("cat") == "compute"]
    kernel = _kernel(name)
    assert [n for n in ops[True] if n.startswith(kernel)] == [kernel, f"{kernel} backward"]
    fewer = {"linear": 5, "attention": 6, "relu": 2}.get(name, 15)
    assert len(ops[True]) + fewer <= len(ops[False]), (ops[True], ops[False])


@pytest.mark.filterwarnings("ignore:invalid value:RuntimeWarning")  # (inf * 0: both roads)
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_relu_at_zero_signed_zero_nan_and_infinity_is_the_definitions(dtype):
    """ReLU's kernel at the edges: ``maximum(x, 0)`` (NaN stays NaN, -0.0 against 0.0) and
    the gradient ``where(x > 0, g, 0)`` (0 at both zeros and where x is NaN, +0 where masked
    whatever the cotangent, inf and NaN included), bit for bit."""
    edges = np.array([-1.5, -0.0, 0.0, 2.0, np.nan, np.inf, -np.inf, 1e-40, -1e-40], dtype)
    x = np.concatenate([edges, edges[::-1]])
    g = np.array([-2.0, np.inf, -0.5, np.nan, 3.0, -1.0, np.inf, -0.0, 0.0] * 2, dtype)
    out = {}
    for fast in (True, False):
        xa = rnp.asarray(x)
        y = _layers(fast)["relu"](xa, rnp.ones((), dtype), rnp.zeros((), dtype))
        out[fast] = [y, rp.grad(rnp.sum(y * g), xa)]
    for got, want in zip(out[True], out[False]):
        np.testing.assert_array_equal(_bits(got), _bits(want))


@pytest.mark.parametrize("name,dtypes", [  # (the attention primitive takes one dtype only)
    (name, dtypes) for name in NAMES
    for dtypes in [(np.float16,) * 3, (rp.dtypes.bfloat16,) * 3,
                   (np.float32, np.float64, np.float64), (np.float64, np.float32, np.float32)]
    if name != "attention" or len(set(dtypes)) == 1])
def test_low_precision_and_mixed_dtypes_take_the_definition(name, dtypes):
    """Operands of a low precision, or of two dtypes, take the definition: its dtype (a float64
    weight makes a float64 result) and its bits (a float16 LayerNorm on the NumPy road differs
    by 2e-3)."""
    x = rng.standard_normal((3, 8)) * 2.5 + 0.3
    w, b = rng.standard_normal(8), rng.standard_normal(8)
    args = [rnp.asarray(a.astype(d)) for a, d in zip((x, w, b), dtypes)]
    got, want = _layers(True)[name](*args), _layers(False)[name](*args)
    assert got.dtype == want.dtype, (got.dtype, want.dtype)
    np.testing.assert_array_equal(_bits(got), _bits(want))


def _gpt_step(seed):
    """Two AdamW steps of a small GPT (embeddings, pre-LayerNorm block of causal attention and a
    GELU MLP, head): the losses, then every parameter and slot."""
    d, t, vocab = 16, 8, 11

    class Block(rp.nn.Module):
        def __init__(self):
            super().__init__()
            self.wte, self.wpe = rp.nn.Embedding(vocab, d), rp.nn.Embedding(t, d)
            self.ln1, self.ln2, self.lnf = (rp.nn.LayerNorm(d) for _ in range(3))
            self.qkv, self.proj = rp.nn.Linear(d, 3 * d), rp.nn.Linear(d, d)
            self.fc, self.fc2, self.head = (rp.nn.Linear(d, 4 * d), rp.nn.Linear(4 * d, d),
                                            rp.nn.Linear(d, vocab))

        def forward(self, ids):
            b = ids.shape[0]
            x = self.wte(ids) + self.wpe(rnp.arange(t))
            qkv = rnp.transpose(rnp.reshape(self.qkv(self.ln1(x)), (b, t, 3, 2, d // 2)),
                                (2, 0, 3, 1, 4))
            y = rp.nn.scaled_dot_product_attention(qkv[0], qkv[1], qkv[2], is_causal=True)
            x = x + self.proj(rnp.reshape(rnp.transpose(y, (0, 2, 1, 3)), (b, t, d)))
            x = x + self.fc2(rp.nn.gelu(self.fc(self.ln2(x))))
            return self.head(self.lnf(x))

    model = Block()
    opt = rp.optim.AdamW(model.parameters(), lr=0.01)
    return two_steps(model, opt, lambda rs: (rnp.asarray(rs.integers(0, vocab, (3, t))),
                                             rnp.asarray(rs.integers(0, vocab, (3, t)))),
                     seed, scale=0.3)


def test_a_gpt_step_with_the_kernels_equals_it_op_by_op_bitwise(monkeypatch):
    assert_kernels_change_no_bit(monkeypatch, lambda: _gpt_step(3), 30)


def _mlp_steps(seed):
    """Two SGD (momentum) steps of a ReLU MLP: the losses, then every parameter and slot."""
    model = rp.nn.Sequential(rp.nn.Linear(12, 32), rp.nn.relu, rp.nn.Linear(32, 32),
                             rp.nn.relu, rp.nn.Linear(32, 5))
    opt = rp.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    return two_steps(model, opt, lambda rs: (
        rnp.asarray(rs.standard_normal((9, 12)).astype(np.float32)),
        rnp.asarray(rs.integers(0, 5, 9))), seed)


def test_a_relu_mlp_step_with_the_kernels_equals_it_op_by_op_bitwise(monkeypatch):
    assert_kernels_change_no_bit(monkeypatch, lambda: _mlp_steps(4), 10)


def test_a_numpy_input_takes_the_kernels_with_the_same_values(tmp_path):
    """A layer called on a NumPy array (eager code without ``rp.function``) runs its kernel,
    with the values the definition gives on it."""
    layer = rp.nn.Conv2d(2, 3, 3, padding=1)
    x = rng.standard_normal((4, 2, 5, 5)).astype(np.float32)
    logits = rng.standard_normal((4, 3)).astype(np.float32)
    labels = rng.integers(0, 3, 4)

    def fn():
        y = layer(x)
        loss = rnp.sum(y) + rp.nn.softmax_cross_entropy(logits, labels).mean() + \
            rnp.sum(rp.nn.relu(logits))
        return [y, loss, *rp.grad(loss, list(layer.parameters().values()))]
    got = with_and_without(fn, tmp_path)
    kernels = ("conv2d backward", "relu", "softmax_cross_entropy")  # (not primitives)
    for fast in (True, False):
        assert [k in got[fast][1] for k in kernels] == [fast] * 3, got[fast][1]
    for a, b in zip(got[True][0], got[False][0]):
        np.testing.assert_array_equal(_bits(a), _bits(b))
