"""bfloat16/float16 as dtypes, ``rp.autocast``, fp32 master weights and loss scaling, in graph
and eager mode, 1 and 2 processes."""

from __future__ import annotations

import json
import re

import ml_dtypes
import numpy as np
import pytest

import replicate as rp
import replicate.numpy as rnp
from conftest import have_mpi, mpirun, report

BF16, F16, F32 = rp.bfloat16, np.dtype(np.float16), np.dtype(np.float32)


def modes(fn, *args):
    """fn's result eager, traced on the NumPy backend and traced on the JAX backend."""
    eager = fn(*[rnp.asarray(a) for a in args])
    return {"eager": eager, "numpy": rp.function(fn)(*args),
            "jax": rp.function(fn, backend="jax")(*args)}


# -- dtypes ------------------------------------------------------------------------------------
def test_bfloat16_is_a_dtype_everywhere():
    assert rp.bfloat16 == np.dtype(ml_dtypes.bfloat16)
    x = rnp.cast(rnp.asarray([1.5, 2.7]), "bfloat16")
    assert x.dtype == BF16 and x.tolist() == [1.5, 2.703125]
    assert rnp.cast(x, np.int32).tolist() == [1, 2]
    w = rp.Variable(np.ones(2), dtype="bfloat16")
    assert w.dtype == BF16 and (w * 3).dtype == BF16


@pytest.mark.parametrize("low", [BF16, F16], ids=["bf16", "f16"])
def test_promotion_keeps_low_precision_with_python_numbers(low):
    x = rnp.ones(3, low)
    assert (x * 2.0).dtype == low and (x + 1).dtype == low and (2.0 / x).dtype == low
    assert (x + rnp.ones(3, np.float32)).dtype == F32
    # an integer array: bf16 as in JAX; float16 as in NumPy (float16 + int32 is float64)
    assert (x + rnp.ones(3, np.int32)).dtype == (BF16 if low == BF16 else np.float64)


def test_bf16_with_f16_is_f32():
    assert (rnp.ones(2, BF16) + rnp.ones(2, F16)).dtype == F32


def test_each_op_rounds_once_and_sums_accumulate_in_float32():
    """10 000 ones sum to 10 000 in float16 (an accumulation in float16 stops at 2048)."""
    for name, out in modes(lambda x: rnp.sum(x), np.ones(10_000, np.float16)).items():
        assert out.dtype == F16 and float(out) == 10_000.0, name
    for name, out in modes(lambda x: rnp.mean(x), np.full(4096, 0.1, BF16)).items():
        assert out.dtype == BF16 and abs(float(out) - 0.1) < 1e-3, name


def test_matmul_in_bfloat16_on_every_path():
    rng = np.random.default_rng(0)
    a, b = rng.normal(size=(8, 16)).astype(BF16), rng.normal(size=(16, 4)).astype(BF16)
    exact = a.astype(np.float64) @ b.astype(np.float64)
    for name, out in modes(lambda a, b: a @ b, a, b).items():
        assert out.dtype == BF16, name
        np.testing.assert_allclose(np.asarray(out, np.float64), exact, rtol=2e-2, atol=5e-2,
                                   err_msg=name)


@pytest.mark.parametrize("mode", ["graph", "eager"])
@pytest.mark.parametrize("low", [BF16, F16], ids=["bf16", "f16"])
def test_low_precision_batches_and_gradients_in_a_replicator(mode, low):
    w = rp.Variable(np.full((3, 1), 0.5), dtype=low, name="w")

    def input_fn(ctx):
        while True:
            yield np.ones((4, 3), low), np.ones((4, 1), low)

    def step_fn(xy):
        x, y = xy
        g = rp.grad(rnp.mean((x @ w - y) ** 2), w)
        assert g.dtype == low
        w.assign(w - 0.1 * rp.all_reduce(g, "mean"))
        return {"w": w.read()}

    out = rp.Replicator(input_fn, step_fn, mode=mode).run(2)
    assert out[-1]["w"].dtype == low and w.dtype == low
    # x @ w - y = 0.5, gradient 2 · 0.5 = 1: w 0.5 -> 0.4; then 0.2, 0.4: 0.4 -> 0.36 (rounded)
    np.testing.assert_allclose(w.numpy().astype(float).ravel(), [0.36] * 3, rtol=1e-2)


def test_bf16_all_reduce_sums_in_float32_and_rounds_once():
    """1 + 3 × 2**-8: a bfloat16 running sum stays at 1 (each 2**-8 is half an ulp); the float32
    sum rounded once is 1.015625."""
    for mode, k in [("graph", 4)]:
        def input_fn(ctx):
            while True:
                yield np.full(2, 1.0 if ctx.replica_id == 0 else 2.0 ** -8, BF16)

        out = rp.Replicator(input_fn, lambda x: {"s": rp.all_reduce(x, "sum")}, mode=mode,
                            replicas_per_rank=k).run(1)
        assert out[0]["s"].dtype == BF16 and out[0]["s"].tolist() == [1.015625] * 2


def test_bf16_checkpoint_is_readable_with_numpy_and_ml_dtypes(tmp_path):
    w = rp.Variable(np.array([0.1, 3.0]), dtype="bfloat16", name="w")
    path = str(tmp_path / "ck.npz")
    rp.checkpoint.save(path, {"w": w})
    raw = np.load(path)
    assert raw["var/w"].dtype == np.uint16  # .npy has no bfloat16: its bits, and the info says
    assert json.loads(bytes(raw["info"]).decode())["dtypes"] == {"var/w": "bfloat16"}
    assert raw["var/w"].view(ml_dtypes.bfloat16).tolist() == w.numpy().tolist()
    w.assign(np.zeros(2))
    rp.checkpoint.restore(path, {"w": w})
    assert w.dtype == BF16 and w.numpy().astype(float).tolist() == [0.10009765625, 3.0]


def test_check_finite_sees_bfloat16_overflow():
    w = rp.Variable(np.ones(2), dtype="bfloat16", name="w")
    rep = rp.Replicator(lambda ctx: iter([np.full(2, 3e38, BF16)] * 3),
                        lambda x: w.assign(w * x) or {}, check_finite=True)
    rep.run(1)
    with pytest.raises(rp.NonFiniteError, match="w"):
        rep.run(1)


# -- autocast -----------------------------------------------------------------------------------
def test_autocast_casts_products_and_keeps_statistics_in_float32():
    x = np.ones((2, 3), np.float32)

    def f(x):
        with rp.autocast("bfloat16"):
            y = x @ np.ones((3, 4), np.float32)
            s = rnp.sum(y)
            m = rnp.mean(y, axis=0)
            lsm = rp.nn.log_softmax(y)
            with rp.autocast(None):
                plain = x @ np.ones((3, 4), np.float32)
        return y, s, m, lsm, plain

    for name, (y, s, m, lsm, plain) in modes(f, x).items():
        assert y.dtype == BF16, name
        assert s.dtype == F32 and m.dtype == F32 and lsm.dtype == F32, name
        assert plain.dtype == F32, name
        assert float(s) == 24.0


def test_autocast_linear_gradients_reach_float32_parameters_in_float32():
    """The PyTorch habit: parameters in float32, the forward under autocast."""
    net = rp.nn.Sequential(rp.nn.Linear(4, 8), rp.nn.Linear(8, 3))
    rng = np.random.default_rng(0)
    x, y = rng.normal(size=(16, 4)).astype(np.float32), rng.integers(0, 3, 16)

    def loss_grads(x, y):
        def loss():
            with rp.autocast("bfloat16"):
                return rnp.mean(rp.nn.softmax_cross_entropy(net(x), y))
        return rp.value_and_grad(loss, wrt=net.parameters())()

    ref = None
    for name, (loss, grads) in modes(loss_grads, x, y).items():
        assert loss.dtype == F32, name
        assert {np.asarray(g).dtype for g in grads.values()} == {F32}, name
        flat = np.concatenate([np.asarray(g).ravel() for g in grads.values()])
        if ref is None:
            ref = flat
        np.testing.assert_allclose(flat, ref, rtol=5e-2, atol=5e-3, err_msg=name)
    for p in net.parameters().values():
        assert p.dtype == F32


def test_autocast_is_thread_local_and_restored():
    assert rp.dtypes.autocast_dtype() is None
    with rp.autocast("float16"):
        assert rp.dtypes.autocast_dtype() == F16
        with rp.autocast(None):
            assert rp.dtypes.autocast_dtype() is None
        assert rp.dtypes.autocast_dtype() == F16
    assert rp.dtypes.autocast_dtype() is None
    with pytest.raises(TypeError, match="not a float dtype"):
        rp.autocast("int32")


# -- master weights --------------------------------------------------------------------------------
@pytest.mark.parametrize("mode", ["graph", "eager"])
def test_master_weights_keep_updates_smaller_than_bf16_rounding(mode):
    """lr·g = 1e-3 per step on a weight of 1.0: every bf16 update rounds away (the ulp at 1 is
    2**-7); the float32 master copy accumulates them and the parameter follows."""
    for master, moves in [(None, True), (False, False)]:
        w = rp.Variable(np.ones(4), dtype="bfloat16", name="w")
        opt = rp.optim.SGD([w], lr=1e-3, master_weights=master)

        def step_fn(x):
            opt.apply([rnp.ones(4, BF16)])
            return {}

        rp.Replicator(lambda ctx: iter([np.zeros(1)] * 30), step_fn, mode=mode).run(30)
        got = w.numpy().astype(float)
        if moves:
            np.testing.assert_allclose(got, 0.97, atol=4e-3)
            np.testing.assert_allclose(opt.master[0].numpy(), 0.97, rtol=1e-5)
        else:
            assert got.tolist() == [1.0] * 4


def test_a_parameter_assigned_from_outside_restarts_its_master_copy():
    w = rp.Variable(np.ones(2), dtype="bfloat16", name="w")
    opt = rp.optim.SGD([w], lr=0.5)
    opt.apply([rnp.ones(2, BF16)])
    w.assign(np.full(2, 10.0))  # pretrained weights loaded after the optimiser was made
    opt.apply([rnp.ones(2, BF16)])
    assert w.numpy().astype(float).tolist() == [9.5, 9.5]  # not the stale master's 0.0


def test_float16_adam_without_master_weights_does_not_go_nan():
    """Adam's eps = 1e-8 is 0 in float16, and g² underflows: the update is computed in float32
    (the slots are float32) whatever ``master_weights`` says."""
    w = rp.Variable(np.ones(3), dtype="float16", name="w")
    opt = rp.optim.Adam([w], lr=1e-3, master_weights=False)
    for _ in range(5):
        opt.apply([rnp.full(3, 1e-5, F16)])
    assert np.isfinite(w.numpy().astype(float)).all()
    assert opt.m[0].dtype == F32 and opt.v[0].dtype == F32


# -- loss scaling ---------------------------------------------------------------------------------
@pytest.mark.parametrize("mode", ["graph", "eager"])
def test_dynamic_loss_scale_skips_overflow_and_grows(mode):
    w = rp.Variable(np.ones((3, 1)), dtype="float16", name="w")
    opt = rp.wrap_optimizer(rp.optim.Adam([w], lr=1e-2), loss_scale="dynamic",
                            growth_interval=2)
    assert opt.loss_scale == 2.0 ** 15
    opt.scale_var.assign(np.float32(8.0))

    def input_fn(ctx):
        for step in range(6):
            yield np.full((2, 3), 6e4 if step == 1 else 1.0, np.float16)

    def step_fn(x):
        loss = rnp.mean(rnp.cast(x @ w, np.float32) ** 2)
        opt.apply([rp.grad(opt.scale(loss), w)])
        return {"scale": opt.scale_var.read(), "updates": opt.optimizer.step.read()}

    hist = rp.Replicator(input_fn, step_fn, mode=mode).run(6)
    # step 1 fine; step 2 overflows: skipped, scale halved; two good steps double it
    assert [float(h["scale"]) for h in hist] == [8.0, 4.0, 4.0, 8.0, 8.0, 16.0]
    assert [int(h["updates"]) for h in hist] == [1, 1, 2, 3, 4, 5]
    assert np.isfinite(w.numpy().astype(float)).all()
    assert opt.loss_scale == 16.0
    assert "scale_var" in opt.variables() and "good_steps" in opt.variables()


def test_fixed_loss_scale_divides_the_gradients_back():
    w = rp.Variable(np.zeros(2), name="w")
    opt = rp.wrap_optimizer(rp.optim.SGD([w], lr=1.0), loss_scale=128.0)
    loss = opt.scale(rnp.sum(w * rnp.asarray([1.0, 2.0])))
    opt.apply([rp.grad(loss, w)])
    assert w.numpy().tolist() == [-1.0, -2.0] and opt.loss_scale == 128.0


@pytest.mark.parametrize("bad", ["static", 0, -1.0, True])
def test_loss_scale_is_checked(bad):
    with pytest.raises(rp.ReplicateError, match="loss_scale must be"):
        rp.wrap_optimizer(rp.optim.SGD([rp.Variable(np.zeros(1))]), loss_scale=bad)


# -- two processes ---------------------------------------------------------------------------------
def _line(stdout, rank, name):
    m = re.search(rf"^rank {rank} {name} (.*)$", stdout, re.M)
    assert m, f"no 'rank {rank} {name}' in:\n{stdout}"
    return json.loads(m.group(1))


@pytest.mark.mpi
@pytest.mark.parametrize("mode,k", [("graph", 2), ("eager", 1)])
def test_an_overflow_on_one_rank_skips_the_step_on_every_rank(mode, k):
    if not have_mpi():
        pytest.skip("needs mpi4py and mpiexec (mpich wheel)")
    result = mpirun("state_mpi.py", "overflow", mode, str(k), check=True)
    for rank in (0, 1):
        assert _line(result.stdout, rank, "scales") == [8.0, 4.0, 4.0, 4.0], report(result)
        assert _line(result.stdout, rank, "updates") == [1, 1, 2, 3], report(result)
    assert _line(result.stdout, 0, "w") == _line(result.stdout, 1, "w")


@pytest.mark.mpi
@pytest.mark.parametrize("mode,k", [("graph", 2), ("eager", 1)])
def test_bf16_all_reduce_across_processes_rounds_once(mode, k):
    if not have_mpi():
        pytest.skip("needs mpi4py and mpiexec (mpich wheel)")
    result = mpirun("state_mpi.py", "bf16_allreduce", mode, str(k), check=True)
    R = 2 * k  # 1 + (R - 1) × 2**-8, rounded once
    expect = float(np.float32(1 + (R - 1) * 2.0 ** -8).astype(BF16))
    for rank in (0, 1):
        assert _line(result.stdout, rank, "sum") == [expect, expect], report(result)
        assert _line(result.stdout, rank, "dtype") == "bfloat16"


def test_autocast_around_a_compiled_call_is_part_of_its_cache_key():
    """rp.autocast around the call (not inside the function) changes what is traced: the
    compiled step must not be reused without it (a silent change of precision)."""
    f = rp.function(lambda a, b: a @ b)
    a, b = np.ones((2, 3), np.float32), np.ones((3, 2), np.float32)
    with rp.autocast("bfloat16"):
        assert f(a, b).dtype == BF16
    assert f(a, b).dtype == F32 and f.trace_count == 2
    with rp.autocast("bfloat16"):
        assert f(a, b).dtype == BF16 and f.trace_count == 2  # the first compiled step again


def test_large_finite_gradients_are_not_taken_for_an_overflow():
    """Two float32 gradients of 3e38: finite, though their sum is not; the update happens."""
    w = rp.Variable(np.zeros(2, np.float32), name="w")
    opt = rp.wrap_optimizer(rp.optim.SGD([w], lr=1e-38), loss_scale="dynamic")
    opt.scale_var.assign(np.float32(1.0))
    loss = opt.scale(rnp.sum(w * rnp.full(2, 3e38, np.float32)))  # gradient 3e38 per element
    opt.apply([rp.grad(loss, w)])
    assert int(opt.optimizer.step.numpy()) == 1 and opt.loss_scale == 1.0
    np.testing.assert_allclose(w.numpy(), -3.0, rtol=1e-6)


@pytest.mark.parametrize("mode", ["graph", "eager"])
def test_forgetting_to_scale_the_loss_is_an_error(mode):
    """GradScaler's habit missed: grad(loss) instead of grad(opt.scale(loss)) would have every
    update divided by 32768 — silently tiny steps. It is an error instead."""
    w = rp.Variable(np.ones(2, np.float32), name="w")
    opt = rp.wrap_optimizer(rp.optim.SGD([w], lr=0.1), loss_scale="dynamic")

    def step_fn(x):
        opt.apply([rp.grad(rnp.sum(w * x), w)])
        return {}

    rep = rp.Replicator(lambda ctx: iter([np.ones(2, np.float32)] * 2), step_fn, mode=mode)
    with pytest.raises(rp.ReplicateError, match="loss was not scaled"):
        rep.run(1)
