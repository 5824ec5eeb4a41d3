"""The ``attention_weights`` primitive (issue 29): one op for scores, mask and softmax, its rows
on every backend (the CuPy column runs its reference row on the stand-in where there is no
GPU), low precision, the gradient of an additive mask, grad-of-grad, and the structure of
``scaled_dot_product_attention``'s step (values and first gradients of every case are in
``test_nn_staples.py``)."""

from __future__ import annotations

import numpy as np
import pytest
from test_nn import numeric_grad

import replicate as rp
import replicate.numpy as rnp
from replicate.backends import available
from replicate.graph.core import bind

BACKENDS = ["numpy", "jax"] + (["cupy"] if "cupy" in available() else [])


def weights_ref(q, k, scale, causal=False, keep=None, add=None):
    s = q @ np.swapaxes(k, -1, -2) * scale
    if add is not None:
        s = s + add
    if causal:
        keep = np.tril(np.ones(s.shape[-2:], bool)) if keep is None else \
            keep & np.tril(np.ones(s.shape[-2:], bool))
    if keep is not None:
        s = np.where(keep, s, -np.inf)
    s = np.exp(s - s.max(-1, keepdims=True))
    return s / s.sum(-1, keepdims=True)


def _inputs(dtype=np.float64):
    rng = np.random.default_rng(7)
    q, k = rng.normal(size=(2, 3, 4, 5)), rng.normal(size=(2, 1, 6, 5))
    keep = rng.random((4, 6)) < 0.7
    keep[:, 0] = True
    add = rng.normal(size=(3, 4, 6))
    return q.astype(dtype), k.astype(dtype), keep, add.astype(dtype)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("masking", ["none", "causal", "keep", "add", "keep+causal"])
def test_each_backend_gives_the_reference(backend, masking):
    q, k, keep, add = _inputs()
    causal = "causal" in masking
    kind = masking.replace("+causal", "").replace("causal", "none")
    extra = {"keep": (keep,), "add": (add,), "none": ()}[kind]
    f = rp.function(lambda q, k, *m: bind("attention_weights", q, k, *m, scale=0.4,
                                          causal=causal, masking=kind), backend=backend)
    got = np.asarray(f(q, k, *extra))
    want = weights_ref(q, k, 0.4, causal, keep if kind == "keep" else None,
                       add if kind == "add" else None)
    assert got.shape == (2, 3, 4, 6) and got.dtype == np.float64
    np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-14)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_low_precision_is_computed_wide_and_rounded_once(backend, dtype):
    if backend == "cupy" and dtype == "bfloat16":
        pytest.skip("CuPy has no bfloat16 (the cupy backend refuses it by name)")
    low = rp.bfloat16 if dtype == "bfloat16" else np.float16
    q, k, _, _ = _inputs()
    f = rp.function(lambda q, k: bind("attention_weights", q, k, scale=0.5, causal=True,
                                      masking="none"), backend=backend)
    ql, kl = q.astype(low), k.astype(low)
    got = np.asarray(f(ql, kl))
    want = weights_ref(ql.astype(np.float64), kl.astype(np.float64), 0.5, True)
    assert got.dtype == np.dtype(low)
    np.testing.assert_allclose(got.astype(np.float64), want, rtol=2**-7, atol=2**-9)


def test_the_additive_mask_has_a_gradient_and_the_gradient_a_gradient():
    rng = np.random.default_rng(3)
    q, k = rng.normal(size=(2, 3, 4)), rng.normal(size=(2, 5, 4))
    add, cot = rng.normal(size=(3, 5)), rng.normal(size=(2, 3, 5))

    def loss(q, k, add):
        return (bind("attention_weights", q, k, add, scale=0.6, causal=False,
                     masking="add") * cot).sum()

    args = [rnp.asarray(x) for x in (q, k, add)]
    grads = rp.grad(loss(*args), args)
    for i, (x, g) in enumerate(zip((q, k, add), grads)):
        def at(v, i=i):
            vals = [q, k, add]
            vals[i] = v
            return float(np.sum(weights_ref(vals[0], vals[1], 0.6, add=vals[2]) * cot))
        np.testing.assert_allclose(np.asarray(g), numeric_grad(at, x), rtol=1e-6, atol=1e-8)

    # grad of grad: d/dq of <dL/dq, u>, against differences of the first gradient
    u = rng.normal(size=q.shape)

    def inner(qv):
        g = rp.grad(loss(qv, rnp.asarray(k), rnp.asarray(add)), qv)
        return (g * u).sum()

    qa = rnp.asarray(q)
    second = np.asarray(rp.grad(inner(qa), qa))
    np.testing.assert_allclose(
        second, numeric_grad(lambda v: float(inner(rnp.asarray(v))), q, eps=1e-5),
        rtol=1e-5, atol=1e-7)


def test_sdpa_is_the_weights_and_one_matmul_and_keeps_them_for_the_backward_pass():
    rng = np.random.default_rng(1)
    q, k, v = (rng.normal(size=(2, 4, 8, 16)).astype(np.float32) for _ in range(3))
    forward = rp.function(lambda q, k, v: rp.nn.scaled_dot_product_attention(
        q, k, v, is_causal=True))
    assert forward.executable(q, k, v).kernels == ["attention_weights", "matmul"]

    def step(q, k, v):
        return rp.grad(rp.nn.scaled_dot_product_attention(q, k, v, is_causal=True).sum(), q)

    prims = [n.prim for n in rp.function(step).graph(q, k, v).nodes]
    assert prims.count("attention_weights") == 1  # computed once, never again for the gradient


def test_bad_operands_are_named():
    q = rnp.zeros((2, 3, 4))
    with pytest.raises(rp.ReplicateError, match=r"query \(\.\.\., L, E\) and key"):
        bind("attention_weights", q, rnp.zeros((2, 3, 5)), scale=1.0, causal=False,
             masking="none")
    with pytest.raises(rp.ReplicateError, match="a 'keep' mask is boolean"):
        bind("attention_weights", q, q, rnp.zeros((3, 3)), scale=1.0, causal=False,
             masking="keep")
    with pytest.raises(rp.ReplicateError, match="does not broadcast to the scores"):
        bind("attention_weights", q, q, rnp.zeros((4, 3), bool), scale=1.0, causal=False,
             masking="keep")
    with pytest.raises(rp.ReplicateError, match="masking is one of"):
        bind("attention_weights", q, q, scale=1.0, causal=False, masking="sometimes")
