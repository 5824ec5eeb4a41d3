"""What the parity suites compare with: the tolerance of a dtype, two results (or nests of them)
alike within it, and a replicated training run that uses every collective
(``replicated_training``: ``test_backend_parity.py`` in one and two processes,
``programs/gpu_transport_mpi.py`` over each GPU transport).
"""

from __future__ import annotations

import numpy as np

import replicate as rp
import replicate.numpy as rnp


def tolerance(dtype):
    """(rtol, atol) by dtype: float32 ~1e-5, float64 ~1e-10, everything else exact."""
    dtype = np.dtype(dtype)
    if dtype.kind != "f":
        return 0.0, 0.0
    if dtype.itemsize <= 4:
        return 1e-5, 1e-6
    return 1e-10, 1e-12


def assert_same(actual, expected, what=""):
    actual, expected = np.asarray(actual), np.asarray(expected)
    assert actual.shape == expected.shape, f"{what}: shape {actual.shape} != {expected.shape}"
    assert actual.dtype == expected.dtype, f"{what}: dtype {actual.dtype} != {expected.dtype}"
    rtol, atol = tolerance(expected.dtype)
    np.testing.assert_allclose(actual, expected, rtol=rtol, atol=atol, err_msg=what)


def assert_nests_same(actual, expected, what=""):
    if isinstance(expected, dict):
        assert sorted(actual) == sorted(expected), what
        for k in expected:
            assert_nests_same(actual[k], expected[k], f"{what}[{k!r}]")
    elif isinstance(expected, (list, tuple)):
        assert len(actual) == len(expected), what
        for i, (a, e) in enumerate(zip(actual, expected)):
            assert_nests_same(a, e, f"{what}[{i}]")
    else:
        assert_same(actual, expected, what)


# ================================================================================================
# Primitives: the cases of test_ops, one graph per op.
# ================================================================================================


N_FEATURES, N_HIDDEN, N_CLASSES = 5, 8, 3


def replicated_training(backend, steps=4, k=2, options=None):
    """An MLP trained with 2 replicas per process: Adam on all-reduced gradients, plus every
    other collective (gather, broadcast, reduce_scatter, permute, max) in the loss and outputs."""
    rng = np.random.default_rng(7)
    params = {"w1": rp.Variable(rng.normal(size=(N_FEATURES, N_HIDDEN)) * 0.5, name="w1"),
              "b1": rp.Variable(np.zeros(N_HIDDEN), name="b1"),
              "w2": rp.Variable(rng.normal(size=(N_HIDDEN, N_CLASSES)) * 0.5, name="w2")}
    opt = rp.wrap_optimizer(rp.optim.Adam(params, lr=0.05))
    x = rng.normal(size=(64, N_FEATURES))
    y = (x[:, 0] + x[:, 1] > 0).astype(np.int64) + (x[:, 2] > 1).astype(np.int64)

    def input_fn(ctx):
        return rp.shard_batches((x, y), 8, ctx, seed=1, epochs=None)

    def step_fn(batch):
        bx, by = batch
        h = rnp.tanh(bx @ params["w1"] + params["b1"])
        logits = h @ params["w2"]
        logp = logits - rnp.logsumexp(logits, axis=-1, keepdims=True)
        loss = -rnp.take_along_axis(logp, rnp.expand_dims(by, -1), axis=-1).mean()
        centre = rp.broadcast(rnp.mean(h, axis=0), root=1)  # a regulariser made of collectives
        spread = rp.all_gather(rnp.mean(h * h, axis=0)).sum() + rp.permute(loss, 1)
        total = loss + 0.01 * rnp.sum(centre ** 2) + 0.001 * spread
        opt.apply(rp.grad(total, params))
        chunk = rp.reduce_scatter(rnp.sum(h, axis=0), "sum")
        return {"loss": loss, "max": rp.all_reduce(loss, "max"), "chunk": chunk}

    rep = rp.Replicator(input_fn, step_fn, backend=backend, replicas_per_rank=k,
                        outputs="per_replica", options=options)
    history = rep.run(steps)
    return history, {n: v.numpy().copy() for n, v in params.items()}, rep
