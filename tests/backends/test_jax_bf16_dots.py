"""The JAX backend's bfloat16 products: every dot of an autocast training step reaches XLA's CPU
bf16 dot kernel (none is upcast to float32), and the transposed-operand products keep their
values (the float32 accumulation rounded once to bfloat16)."""

from __future__ import annotations

import re

import numpy as np
import pytest

import replicate as rp
import replicate.numpy as rnp

jax = pytest.importorskip("jax", reason="the JAX backend needs jax")

BF16 = rp.bfloat16


def _mlp_grads(x, w1, w2):
    with rp.autocast("bfloat16"):
        loss = rnp.sum((rnp.maximum(x @ w1, 0.0) @ w2) ** 2)
    return rp.grad(loss, [x, w1, w2])


def _mlp_grads_fp32(x, w1, w2):
    return rp.grad(rnp.sum((rnp.maximum(x @ w1, 0.0) @ w2) ** 2), [x, w1, w2])


def compiled_dots(fn, args):
    """(number of matmuls in the JAX backend's graph, [operand dtypes of each dot in the
    optimised HLO XLA compiles from it])."""
    from replicate.backends.jax_impl import apply
    from replicate.graph.interpret import eval_graph

    graph = rp.function(fn, backend="jax").executable(*args).graph
    text = jax.jit(lambda *a: eval_graph(graph, a, apply)).lower(*args).compile().as_text()
    types = dict(re.findall(r"%([\w.\-]+) = (\w+)\[", text))
    dots = [[types[name] for name in re.findall(r"%([\w.\-]+)", operands)]
            for operands in re.findall(r" dot\(([^)]*)\)", text)]
    return sum(n.prim == "matmul" for n in graph.nodes), dots


def test_every_dot_of_an_autocast_step_takes_bfloat16():
    """Forward, input-gradient (``g @ w.T``) and weight-gradient (``x.T @ g``) products: XLA
    upcast the last two kinds to float32 dots before the JAX backend wrote them in the form its
    bf16 kernel takes (bench/RESULTS.md, "Mixed precision")."""
    rng = np.random.default_rng(0)
    args = [rng.normal(size=s).astype(np.float32) for s in [(32, 16), (16, 24), (24, 8)]]
    matmuls, dots = compiled_dots(_mlp_grads, args)
    assert matmuls == 6 and len(dots) == 6, dots
    assert all(d == ["bf16", "bf16"] for d in dots), dots
    _, dots = compiled_dots(_mlp_grads_fp32, args)  # the float32 step: float32 dots
    assert len(dots) == 6 and all(d == ["f32", "f32"] for d in dots), dots


@pytest.mark.parametrize("lhs_t, rhs_t, batch", [(True, False, ()), (False, True, ()),
                                                 (True, True, ()), (True, True, (3,))],
                         ids=["x.T@g", "g@w.T", "a.T@b.T", "batched"])
def test_transposed_bf16_products_round_the_float32_sum_once(lhs_t, rhs_t, batch):
    rng = np.random.default_rng(1)
    a = rng.normal(size=batch + ((40, 24) if lhs_t else (24, 40))).astype(BF16)
    b = rng.normal(size=batch + ((16, 40) if rhs_t else (40, 16))).astype(BF16)

    def product(xp, a, b):
        return ((xp.swapaxes(a, -1, -2) if lhs_t else a)
                @ (xp.swapaxes(b, -1, -2) if rhs_t else b))

    wide = a.astype(np.float64), b.astype(np.float64)
    want, bound = product(np, *wide), product(np, *map(np.abs, wide))
    got = {backend: rp.function(lambda a, b: product(rnp, a, b), backend=backend)(a, b)
           for backend in ("numpy", "jax")}
    for backend, out in got.items():
        assert out.dtype == BF16 and out.shape == want.shape, backend
        err = np.abs(np.asarray(out, np.float64) - want)
        assert (err <= 2.0 ** -8 * np.abs(want) + 2.0 ** -22 * bound).all(), backend
    # one rounding of the same float32 sum (in another order): within a unit in the last place
    ulp = 2.0 ** (np.floor(np.log2(np.maximum(np.abs(want), 1e-30))) - 7)
    diff = np.abs(np.asarray(got["jax"], np.float64) - np.asarray(got["numpy"], np.float64))
    assert (diff <= ulp + 2.0 ** -22 * bound).all()
