"""Eager mode's convolution layer as NumPy kernels (``replicate/nn/eager_kernels.py``: ``conv2d``
with its bias; the forward's im2col kept for the weight gradient, ``graph/conv.py``): the
output and the three gradients are the ``replicate.numpy`` definition's to the bit, for every
geometry and for batches that span several im2col chunks; higher derivatives the definition's;
a layer runs as two kernels; a conv net's SGD steps equal them op by op."""

from __future__ import annotations

import numpy as np
import pytest
from eager_steps import assert_kernels_change_no_bit, two_steps

import replicate as rp
import replicate.numpy as rnp
from replicate.graph import conv
from replicate.nn import eager_kernels as ek

rng = np.random.default_rng(21)
# (x shape, weight shape, stride, padding, dilation)
GEOMETRIES = [
    ((4, 3, 9, 9), (5, 3, 3, 3), 1, 1, 1),
    ((3, 4, 10, 11), (6, 4, 3, 3), 2, 1, 1),       # stride 2: a strided im2col
    ((2, 2, 9, 8), (3, 2, 3, 2), (2, 1), (0, 2), 2),  # uneven stride, padding, dilation
    ((3, 5, 6, 6), (4, 5, 1, 1), 1, 0, 1),         # 1x1: the im2col is x itself, no copy
    ((13, 8, 24, 24), (4, 8, 3, 3), 1, 1, 1),      # several chunks of images and a tail
]


def _plain(x, w, b, stride, padding, dilation):
    return rnp.conv2d(x, w, stride, padding, dilation) + rnp.reshape(b, (1, -1, 1, 1))


def _bits(a):
    return np.ascontiguousarray(np.asarray(a)).view(np.uint8)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("geometry", GEOMETRIES)
def test_conv_kernel_forward_and_gradients_equal_the_definition_bitwise(geometry, dtype):
    xs, ws, stride, padding, dilation = geometry
    x = rng.standard_normal(xs).astype(dtype)
    w = rng.standard_normal(ws).astype(dtype)
    b = rng.standard_normal(ws[:1]).astype(dtype)
    out, g = {}, None
    for fast in (True, False):
        ops = [rnp.asarray(a) for a in (x, w, b)]
        layer = ek.conv2d if fast else _plain
        y = layer(*ops, stride, padding, dilation)
        g = rng.standard_normal(y.shape).astype(dtype) if g is None else g
        out[fast] = [y, *rp.grad(rnp.sum(y * g), ops)]
    if xs[0] == 13:  # (the chunked case is chunked: images of 8*9*576 float32 elements)
        assert len(conv._chunks(np, 13, 8 * 9 * 576 * np.dtype(dtype).itemsize)) > 1
    for k, (got, want) in enumerate(zip(out[True], out[False])):
        assert got.dtype == want.dtype == dtype and got.shape == want.shape
        np.testing.assert_array_equal(_bits(got), _bits(want), err_msg=f"output {k}")


def test_conv_kernel_second_derivatives_are_the_definitions():
    xs, ws, stride, padding, dilation = GEOMETRIES[1]
    x, w, b = (rng.standard_normal(s) for s in (xs, ws, ws[:1]))
    got = {}
    for fast in (True, False):
        ops = [rnp.asarray(a) for a in (x, w, b)]
        y = (ek.conv2d if fast else _plain)(*ops, stride, padding, dilation)
        dx, dw, db = rp.grad(rnp.sum(rnp.sin(y)), ops)
        hx, hw = rp.grad(rnp.sum(dx * dx) + rnp.sum(dw * db[:, None, None, None]), ops[:2])
        got[fast] = [a.numpy() for a in (dx, dw, db, hx, hw)]
    for k, (a, want) in enumerate(zip(got[True], got[False])):
        np.testing.assert_allclose(a, want, rtol=1e-12, atol=1e-12, err_msg=f"#{k}")
        assert np.abs(want).max() > 1e-3


def test_an_eager_conv_layer_runs_as_two_kernels(tmp_path):
    layer = rp.nn.Conv2d(3, 4, 3, padding=1)
    x = rnp.asarray(rng.standard_normal((2, 3, 8, 8)).astype(np.float32))
    path = str(tmp_path / "trace.json")
    with rp.profile.recording(path):
        rp.grad(rnp.sum(layer(x)), layer.parameters())
    ops = [e["name"] for e in rp.profile.load(path) if e.get("cat") == "compute"]
    assert [n for n in ops if n.startswith("conv2d")] == ["conv2d", "conv2d backward"], ops


def test_conv_layer_errors_and_other_roads_are_the_ops():
    """A bad geometry raises as ``rnp.conv2d`` does; no bias, a float16 input or an input of
    another dtype than the weights take the ops (the same values)."""
    layer = rp.nn.Conv2d(3, 4, 5)
    with pytest.raises(rp.ReplicateError, match="larger than the padded input"):
        layer(rnp.zeros((1, 3, 4, 4), np.float32))
    with pytest.raises(rp.ReplicateError, match="stride and dilation must be positive"):
        rp.nn.Conv2d(3, 4, 3, stride=0)(rnp.zeros((1, 3, 8, 8), np.float32))
    x = rng.standard_normal((2, 3, 7, 7))
    for make in (lambda: rp.nn.Conv2d(3, 4, 3, bias=False),
                 lambda: rp.nn.Conv2d(3, 4, 3, dtype=np.float64)):
        m = make()
        xa = rnp.asarray(x.astype(m.weight.dtype if m.bias is None else np.float32))
        want = rnp.conv2d(xa, m.weight.read(), 1, 0, 1)
        if m.bias is not None:
            want = want + rnp.reshape(m.bias.read(), (1, -1, 1, 1))
        np.testing.assert_array_equal(m(xa).numpy(), want.numpy())


def _conv_net_steps(seed):
    model = rp.nn.Sequential(rp.nn.Conv2d(3, 6, 3, padding=1), rp.nn.relu,
                             rp.nn.Conv2d(6, 8, 3, stride=2, padding=1), rp.nn.relu,
                             rp.nn.Flatten(), rp.nn.Linear(8 * 5 * 5, 4))
    opt = rp.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    return two_steps(model, opt, lambda rs: (
        rnp.asarray(rs.standard_normal((5, 3, 10, 10)).astype(np.float32)),
        rnp.asarray(rs.integers(0, 4, 5))), seed, scale=0.3)


def test_a_conv_net_step_with_the_kernels_equals_it_op_by_op_bitwise(monkeypatch):
    assert_kernels_change_no_bit(monkeypatch, lambda: _conv_net_steps(6), 10)
