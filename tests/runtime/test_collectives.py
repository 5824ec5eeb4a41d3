"""Every collective, forward and gradient, with k = 1, 2, 3 replicas in one process, against NumPy.

The semantics (see tests/runtime/programs/collective_cases.py): replica r sends x_r, receives y_r,
and its loss is sum(c_r * y_r); the gradient it gets for x_r is the gradient of the *total*
objective sum_s loss_s with respect to x_r (so the gradient of an all-reduce sum is an all-reduce
sum of the cotangents, of a broadcast a sum delivered to the root only, of a permute the opposite
permute).
"""

import os
import sys

import numpy as np
import pytest

import replicate as rp
import replicate.numpy as rnp

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "programs"))
import collective_cases as cc  # noqa: E402

RTOL, ATOL = 1e-12, 1e-12


def _params():
    out = []
    for k in (1, 2, 3):
        for name, kind, attrs in cc.cases(k):
            out.append(pytest.param(k, kind, attrs, id=f"k{k}-{name}"))
    return out


@pytest.mark.parametrize("k,kind,attrs", _params())
def test_collective_forward_and_gradient_graph(k, kind, attrs):
    X, C = cc.make_data(kind, attrs, k)
    Y, G, rep = cc.run_case(kind, attrs, X, C, k=k)
    np.testing.assert_allclose(Y, cc.ref_forward(kind, attrs, X), rtol=RTOL, atol=ATOL)
    np.testing.assert_allclose(G, cc.ref_grad(kind, attrs, X, C), rtol=RTOL, atol=ATOL)
    assert Y.dtype == np.float64 and G.dtype == np.float64
    assert rep.trace_count == 1


@pytest.mark.parametrize("kind,attrs", [pytest.param(kind, attrs, id=name)
                                        for name, kind, attrs in cc.cases(1)])
def test_collective_forward_and_gradient_eager_one_replica(kind, attrs):
    X, C = cc.make_data(kind, attrs, 1)
    Y, G, _ = cc.run_case(kind, attrs, X, C, k=1, mode="eager")
    np.testing.assert_allclose(Y, cc.ref_forward(kind, attrs, X), rtol=RTOL, atol=ATOL)
    np.testing.assert_allclose(G, cc.ref_grad(kind, attrs, X, C), rtol=RTOL, atol=ATOL)


# -- the reference itself: the hand-written gradients are those of the forward semantics -----------
def _numeric_grad(f, X, eps=1e-6):
    """Central differences of the scalar f(X) w.r.t. every element of X."""
    G = np.zeros_like(X)
    for i in np.ndindex(X.shape):
        up, down = X.copy(), X.copy()
        up[i] += eps
        down[i] -= eps
        G[i] = (f(up) - f(down)) / (2 * eps)
    return G


@pytest.mark.parametrize("kind,attrs", [pytest.param(kind, attrs, id=name)
                                        for name, kind, attrs in cc.cases(3)])
def test_reference_gradient_matches_finite_differences(kind, attrs):
    rng = np.random.default_rng(7)
    X = rng.normal(size=(3, 2, 3) if kind != "reduce_scatter" else (3, 3, 3))
    C = rng.normal(size=cc.ref_forward(kind, attrs, X).shape)
    numeric = _numeric_grad(lambda Z: (C * cc.ref_forward(kind, attrs, Z)).sum(), X)
    np.testing.assert_allclose(cc.ref_grad(kind, attrs, X, C), numeric, rtol=1e-7, atol=1e-7)


# -- compositions, nests, dtypes, variables --------------------------------------------------------
def _run(step_fn, batches, k, steps=1, outputs="per_replica"):
    def input_fn(ctx):
        while True:
            yield batches[ctx.replica_id]

    rep = rp.Replicator(input_fn, step_fn, replicas_per_rank=k, outputs=outputs)
    return rep.run(steps)[-1], rep


@pytest.mark.parametrize("k", [1, 2, 3])
def test_composed_collectives_gradient_matches_finite_differences(k):
    """Gradients flow through a chain of different collectives (and per-replica math between)."""
    rng = np.random.default_rng(11)
    X = rng.normal(size=(k, 6, 3))
    C = rng.normal(size=(k, 6 * k, 3))

    def numpy_total(Z):
        g = cc.ref_forward("all_gather", {"axis": 0, "tiled": True}, Z)  # (k, 6k, 3)
        weights = np.arange(1, k + 1)[:, None, None]  # replica_id() + 1
        s = cc.ref_forward("all_reduce", {"op": "mean"}, np.sin(g) * weights)
        p = cc.ref_forward("permute", {"shift": 1}, s * Z.sum(axis=(1, 2))[:, None, None])
        return (C * p).sum()

    def step_fn(b):
        x, c = b["x"], b["c"]
        g = rp.all_gather(x, 0, tiled=True)
        s = rp.all_reduce(rnp.sin(g) * (rp.replica_id() + 1.0), "mean")
        p = rp.permute(s * x.sum(), 1)
        loss = (c * p).sum()
        return {"loss": loss, "g": rp.grad(loss, x)}

    out, _ = _run(step_fn, [{"x": X[r], "c": C[r]} for r in range(k)], k)
    np.testing.assert_allclose(out["loss"].sum(), numpy_total(X), rtol=1e-12)
    np.testing.assert_allclose(out["g"], _numeric_grad(numpy_total, X), rtol=1e-6, atol=1e-8)


@pytest.mark.parametrize("k", [1, 2, 3])
def test_second_order_gradient_through_all_reduce(k):
    """grad of grad: loss_r = sum(c_r * all_reduce(x_r ** 3)); g_r = 3 x_r^2 * sum_s c_s;
    d/dx_r sum_s sum(d_s * g_s) = 6 x_r * d_r * sum_s c_s."""
    rng = np.random.default_rng(5)
    X, C, D = (rng.normal(size=(k, 4)) for _ in range(3))

    def step_fn(b):
        x = b["x"]
        loss = (b["c"] * rp.all_reduce(x ** 3, "sum")).sum()
        g = rp.grad(loss, x)
        return {"g": g, "h": rp.grad((b["d"] * g).sum(), x)}

    out, _ = _run(step_fn, [{"x": X[r], "c": C[r], "d": D[r]} for r in range(k)], k)
    np.testing.assert_allclose(out["g"], 3 * X ** 2 * C.sum(0), rtol=1e-12)
    np.testing.assert_allclose(out["h"], 6 * X * D * C.sum(0), rtol=1e-12)


@pytest.mark.parametrize("k", [1, 2, 3])
def test_collectives_on_nests_work_leaf_by_leaf(k):
    rng = np.random.default_rng(3)
    A, B = rng.normal(size=(k, 2, 3)), rng.normal(size=(k, 5))

    def step_fn(b):
        summed = rp.all_reduce({"a": b["a"], "pair": (b["b"], b["a"] * 2.0)}, "sum")
        gathered = rp.all_gather([b["a"], b["b"]], axis=0)
        return {"sum_a": summed["a"], "sum_b": summed["pair"][0], "sum_2a": summed["pair"][1],
                "gather_a": gathered[0], "gather_b": gathered[1]}

    out, _ = _run(step_fn, [{"a": A[r], "b": B[r]} for r in range(k)], k)
    for r in range(k):
        np.testing.assert_allclose(out["sum_a"][r], A.sum(0), rtol=1e-12)
        np.testing.assert_allclose(out["sum_b"][r], B.sum(0), rtol=1e-12)
        np.testing.assert_allclose(out["sum_2a"][r], 2 * A.sum(0), rtol=1e-12)
        np.testing.assert_array_equal(out["gather_a"][r], A)
        np.testing.assert_array_equal(out["gather_b"][r], B)


@pytest.mark.parametrize("k", [1, 2, 3])
def test_scalars_and_replica_ids(k):
    def step_fn(b):
        rid = rnp.asarray(float(rp.replica_id()))
        return {"id": rid, "n": rnp.asarray(float(rp.num_replicas())),
                "sum": rp.all_reduce(rid, "sum"), "ids": rp.all_gather(rid),
                "max": rp.all_reduce(rid, "max"), "prev": rp.permute(rid, 1)}

    out, _ = _run(step_fn, [np.zeros(1)] * k, k)
    ids = np.arange(k, dtype=np.float64)
    np.testing.assert_array_equal(out["id"], ids)
    np.testing.assert_array_equal(out["n"], np.full(k, float(k)))
    np.testing.assert_array_equal(out["sum"], np.full(k, ids.sum()))
    np.testing.assert_array_equal(out["max"], np.full(k, k - 1.0))
    np.testing.assert_array_equal(out["ids"], np.stack([ids] * k))
    np.testing.assert_array_equal(out["prev"], (ids - 1) % k)


@pytest.mark.parametrize("k", [2, 3])
@pytest.mark.parametrize("dtype", [np.int32, np.int64, np.float32])
def test_collectives_keep_the_dtype(k, dtype):
    X = (np.arange(k * 4).reshape(k, 4) * 3 % 7).astype(dtype)

    def step_fn(x):
        return {"sum": rp.all_reduce(x, "sum"), "max": rp.all_reduce(x, "max"),
                "min": rp.all_reduce(x, "min"), "gather": rp.all_gather(x, 0, tiled=True),
                "bcast": rp.broadcast(x, k - 1), "perm": rp.permute(x, -1)}

    out, _ = _run(step_fn, list(X), k)
    for name, value in out.items():
        assert value.dtype == dtype, name
    for r in range(k):
        np.testing.assert_array_equal(out["sum"][r], X.sum(0).astype(dtype))
        np.testing.assert_array_equal(out["max"][r], X.max(0))
        np.testing.assert_array_equal(out["min"][r], X.min(0))
        np.testing.assert_array_equal(out["gather"][r], X.reshape(-1))
        np.testing.assert_array_equal(out["bcast"][r], X[k - 1])
        np.testing.assert_array_equal(out["perm"][r], X[(r + 1) % k])


@pytest.mark.parametrize("k", [1, 2, 3])
def test_gradient_with_respect_to_a_shared_variable(k):
    """A Variable is shared by all replicas; replica r's gradient is that of the total objective
    through replica r's use of it: loss_r = sum(c_r * all_reduce(w * x_r)) -> x_r * sum_s c_s."""
    rng = np.random.default_rng(9)
    X, C = rng.normal(size=(k, 3)), rng.normal(size=(k, 3))
    w = rp.Variable(rng.normal(size=3), name="w_shared")

    def step_fn(b):
        loss = (b["c"] * rp.all_reduce(w * b["x"], "sum")).sum()
        return {"g": rp.grad(loss, w)}

    out, _ = _run(step_fn, [{"x": X[r], "c": C[r]} for r in range(k)], k)
    np.testing.assert_allclose(out["g"], X * C.sum(0), rtol=1e-12)


def test_collectives_outside_a_replicator_are_single_replica():
    x = np.arange(6.0).reshape(2, 3)
    np.testing.assert_array_equal(rp.all_reduce(rnp.asarray(x), "mean").numpy(), x)
    np.testing.assert_array_equal(rp.all_gather(rnp.asarray(x), 1).numpy(), x[:, None])
    np.testing.assert_array_equal(rp.all_gather(rnp.asarray(x), 1, tiled=True).numpy(), x)
    np.testing.assert_array_equal(rp.broadcast(rnp.asarray(x)).numpy(), x)
    np.testing.assert_array_equal(rp.reduce_scatter(rnp.asarray(x), "sum", 1).numpy(), x)
    np.testing.assert_array_equal(rp.permute(rnp.asarray(x), 3).numpy(), x)


def test_unknown_reduce_op_is_an_error():
    with pytest.raises(rp.ReplicateError, match="unknown op"):
        rp.all_reduce(rnp.ones(2), "prod")
    with pytest.raises(rp.ReplicateError):
        rp.reduce_scatter(rnp.ones(2), "median")


@pytest.mark.parametrize("k", [2, 3])
def test_reduce_scatter_of_an_indivisible_axis_is_a_shape_error(k):
    def step_fn(x):
        return {"y": rp.reduce_scatter(x, "sum", 0)}

    with pytest.raises(rp.ReplicateError, match="divisible"):
        _run(step_fn, [np.ones(k + 1)] * k, k)
