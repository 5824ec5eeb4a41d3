"""Eager mode's NumPy kernels for the layers with written-out gradients
(``replicate/nn/eager_kernels.py``): the forward and the gradients are the ``replicate.numpy``
definition's to the bit, the second derivatives its own, and the layer runs as a couple of
kernels rather than op by op."""

from __future__ import annotations

import numpy as np
import pytest

import replicate as rp
import replicate.numpy as rnp
from replicate.nn import written_grads as wg

rng = np.random.default_rng(11)
# (shape, dtype): a GPT's activations, odd sizes, several elementwise blocks and a tail, 1-D
CASES = [((16, 64, 256), np.float32), ((3, 5, 7), np.float32),
         ((2 * wg.BLOCK + 77,), np.float32), ((7, 33), np.float64), ((5,), np.float64)]


def _layers(fast):
    """name -> f(x, w, b): the layer on the kernels' road (``fast``) or the definition's."""
    ln = wg.layer_norm if fast else wg._layer_norm
    gelu = wg.gelu_tanh if fast else wg._gelu_tanh
    return {"layer_norm": lambda x, w, b: ln(x, w, b, 1e-5),
            "gelu": lambda x, w, b: gelu(x) * w + b}


def _bits(a):
    a = np.ascontiguousarray(np.asarray(a))
    return a.view(np.uint8)


@pytest.mark.parametrize("shape,dtype", CASES)
@pytest.mark.parametrize("name", ["layer_norm", "gelu"])
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


@pytest.mark.parametrize("name", ["layer_norm", "gelu"])
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


@pytest.mark.parametrize("name", ["layer_norm", "gelu"])
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
    kernel = (wg.LAYER_NORM_KERNEL if name == "layer_norm" else wg.GELU_KERNEL).name
    assert [n for n in ops[True] if n.startswith(kernel)] == [kernel, f"{kernel} backward"]
    assert len(ops[True]) + 15 <= len(ops[False]), (ops[True], ops[False])


@pytest.mark.parametrize("dtype", [np.float16, rp.dtypes.bfloat16])
def test_low_precision_and_mixed_dtypes_take_the_definition(dtype):
    x = rng.standard_normal((3, 8)).astype(np.float32)
    w = np.ones(8, np.float32)
    low = [rnp.asarray(x.astype(dtype)), rnp.asarray(w.astype(dtype)), rnp.asarray(w * 0)]
    fast, plain = _layers(True), _layers(False)
    for name in fast:
        got, want = fast[name](*low), plain[name](*low)
        assert got.dtype == want.dtype
        np.testing.assert_array_equal(_bits(got), _bits(want))
