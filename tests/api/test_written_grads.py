"""LayerNorm and the tanh GELU with their gradients written out (``replicate/nn/written_grads.py``):
gradients and second derivatives equal PyTorch's double backward in float64 (eager, graph NumPy,
graph JAX), the forward values are the plain definition's to the bit, and the compiled backward
pass is shorter than the derived one."""

from __future__ import annotations

import numpy as np
import pytest

import replicate as rp
import replicate.numpy as rnp
from replicate.nn import written_grads

MODES = [("eager", "numpy"), ("graph", "numpy"), ("graph", "jax")]
rng = np.random.default_rng(5)
X = rng.standard_normal((3, 4, 8)) * 1.7 + 0.3
G = rng.standard_normal((3, 4, 8))
W, B = rng.standard_normal(8), rng.standard_normal(8)
V = rng.standard_normal((3, 4, 8))  # the direction of the second derivative


def _torch_ln(x, w, b):
    return torch.nn.functional.layer_norm(x, (8,), w, b, eps=1e-5)


def _torch_gelu(x, w, b):
    return torch.nn.functional.gelu(x, approximate="tanh") * w + b


def _reference(fn):
    """PyTorch float64: the gradients of sum(fn(x) * G) for x, w, b, and the gradient of
    sum(dx * V) for x (a Hessian-vector product)."""
    x, w, b = (torch.tensor(a, requires_grad=True) for a in (X, W, B))
    dx, dw, db = torch.autograd.grad((fn(x, w, b) * torch.tensor(G)).sum(), (x, w, b),
                                     create_graph=True)
    (hv,) = torch.autograd.grad((dx * torch.tensor(V)).sum(), x)
    return [t.detach().numpy() for t in (dx, dw, db, hv)]


def _ours(layer, mode, backend):
    def step(x, w, b):
        loss = rnp.sum(layer(x, w, b) * G)
        dx, dw, db = rp.grad(loss, [x, w, b])
        return dx, dw, db, rp.grad(rnp.sum(dx * V), x)

    return [np.asarray(a) for a in rp.function(step, mode=mode, backend=backend)(X, W, B)]


LAYERS = {
    "layer_norm": (lambda x, w, b: written_grads.layer_norm(x, w, b, 1e-5), _torch_ln),
    "gelu": (lambda x, w, b: rp.nn.gelu(x) * w + b, _torch_gelu),
}


@pytest.mark.parametrize("mode,backend", MODES)
@pytest.mark.parametrize("name", list(LAYERS))
def test_gradients_and_second_derivatives_equal_pytorchs(name, mode, backend):
    global torch
    torch = pytest.importorskip("torch", reason="PyTorch (the bench extra) is the reference")
    ours, theirs = LAYERS[name]
    for got, want, what in zip(_ours(ours, mode, backend), _reference(theirs),
                               ["dx", "dw", "db", "hessian-vector"]):
        np.testing.assert_allclose(got, want, rtol=1e-10, atol=1e-12, err_msg=f"{name} {what}")


def test_the_forward_is_the_plain_definitions_to_the_bit():
    x = X.astype(np.float32)
    plain = (x - x.mean(-1, keepdims=True)) / np.sqrt(x.var(-1, keepdims=True) + 1e-5)
    for mode in ("eager", "graph"):
        ln = rp.nn.LayerNorm(8)
        ln.weight.assign(W.astype(np.float32))
        ln.bias.assign(B.astype(np.float32))
        got = np.asarray(rp.function(ln, mode=mode)(x))
        mean = rnp.mean(rnp.asarray(x), axis=-1, keepdims=True)
        want = ((rnp.asarray(x) - mean) * rnp.rsqrt(rnp.var(rnp.asarray(x), axis=-1, keepdims=True)
                                                    + 1e-5) * W.astype(np.float32)
                + B.astype(np.float32))
        np.testing.assert_array_equal(got, np.asarray(want))
        np.testing.assert_allclose(got, plain * W + B, rtol=1e-5, atol=1e-5)
        c = np.float32(np.sqrt(2 / np.pi))
        want = 0.5 * x * (1 + np.tanh(c * (x + np.float32(0.044715) * x * x * x)))
        np.testing.assert_allclose(np.asarray(rp.function(rp.nn.gelu, mode=mode)(x)), want,
                                   rtol=2e-6, atol=1e-7)


def test_the_compiled_backward_is_shorter_than_the_derived_one():
    """The written-out rules against the plain definitions differentiated by the library: fewer
    ops in the compiled gradient step (NumPy backend)."""
    def plain_ln(x, w, b):
        mean = rnp.mean(x, axis=-1, keepdims=True)
        return (x - mean) * rnp.rsqrt(rnp.var(x, axis=-1, keepdims=True) + 1e-5) * w + b

    def plain_gelu(x, w, b):
        return 0.5 * x * (1.0 + rnp.tanh(0.7978845608 * (x + 0.044715 * x * x * x))) * w + b

    def ops(layer):
        f = rp.function(lambda x, w, b: rp.grad(rnp.sum(layer(x, w, b) * G), [x, w, b]))
        graph = f.executable(X, W, B).graph
        return sum(len(n.attrs["body"].prims) if n.prim == "fused" else 1 for n in graph.nodes)

    for name, plain in (("layer_norm", plain_ln), ("gelu", plain_gelu)):
        written, derived = ops(LAYERS[name][0]), ops(plain)
        assert written < derived, (name, written, derived)
