"""Every backend matches the NumPy reference: each primitive, forward and gradient; whole steps.

The backends under test are ``replicate.backends.available()`` less ``numpy`` (the reference) and
``null`` (it records, it does not compute), so a new backend is tested as soon as it is registered;
``jax`` is always listed, and skipped only when JAX is not installed.

* Primitives: the case table of the op harness, ``tests/harness/ops.py`` (every public op, every
  dtype it has cases for). The cases of one op run as one graph (one compile per op, not per
  case) on the backend and on ``numpy``; forward results, gradients (float64 and float32 cases)
  and the selected gradients of gradients must agree within the dtype's tolerance, ints and bools
  exactly. Random bits and uniform numbers (so keys, Bernoulli and categorical draws) agree bit
  for bit.
* Whole steps: the steps of ``tests/harness/steps.py`` (MLP SGD step, conv net with
  pooling, WGAN-GP penalty) and a ``rp.Replicator`` with 2 replicas per process using every
  collective (host nodes between device segments), in one process and in two (``mpiexec -n 2``,
  bucketed gradients with overlapped communication), give the same losses and parameters.
The JAX backend's own promises (one trace per segment, donation, host values, a clear error
when JAX is missing) are in ``test_jax_backend.py``.
"""

from __future__ import annotations

import builtins
import collections
import importlib.util
import os
import sys
import zlib

import numpy as np
import pytest
from harness import ops
from harness import steps as modes
from harness.parity import assert_nests_same, assert_same, replicated_training

import replicate as rp
import replicate.numpy as rnp
from conftest import column, mpirun, needs_mpi, report
from replicate.backends import available

HAVE_JAX = importlib.util.find_spec("jax") is not None


def backends_under_test() -> list:
    names = [n for n in available() if n not in ("numpy", "null")]
    if HAVE_JAX and "jax" not in names:
        names.append("jax")  # installed but not importable: let its tests fail, not skip
    params = [pytest.param(n, id=column(n)) for n in sorted(names)]
    if not HAVE_JAX:
        params.append(pytest.param("jax", id="jax",
                                   marks=pytest.mark.skip(reason="jax not installed")))
    return params


BACKENDS = backends_under_test()


def grouped(cases) -> dict:
    groups = collections.defaultdict(list)
    for c in cases:
        groups[c.op].append(c)
    return dict(groups)


def float_output(c) -> bool:
    return all(np.asarray(o).dtype.kind == "f" for o in ops.leaves(c.ref(*c.sample())))


FORWARD = grouped(ops.CASES)
GRAD64 = grouped(ops.GRAD_CASES)
GRAD32 = [c for c in ops.CASES if c.grad and "float32" in {i.dtype for i in c.inputs}
          and all(np.dtype(i.dtype).kind == "f" for i in c.inputs) and float_output(c)]
GG = grouped(ops.GG_CASES)


def forward_fn(cases):
    """One function computing every case: the flat inputs of all cases in, per case its leaves."""
    sizes = [len(c.inputs) for c in cases]

    def f(*flat):
        outs, k = [], 0
        for c, n in zip(cases, sizes):
            outs.append(ops.leaves(c.fn(*flat[k:k + n])))
            k += n
        return outs

    return f


def gradient_fn(cases, order=1):
    """Per case: d loss / d (its float inputs); order 2: the gradient of <that gradient, v>."""
    sizes = [len(c.inputs) for c in cases]
    data = []
    for c in cases:
        xs = c.sample()
        wrt = ops.float_inputs(xs)
        rng = np.random.default_rng(zlib.crc32(("v" + c.id).encode()))
        data.append((ops.loss_of(c, ops.cotangents(c, xs)), wrt,
                     [rng.standard_normal(xs[i].shape) for i in wrt]))

    def f(*flat):
        outs, k = [], 0
        for (loss, wrt, vs), n in zip(data, sizes):
            args = flat[k:k + n]
            k += n
            targets = [args[i] for i in wrt]
            grads = rp.grad(loss(*args), targets)
            if order == 2:
                inner = builtins.sum(rnp.sum(g * v) for g, v in zip(grads, vs))
                grads = rp.grad(inner, targets)
            outs.append(list(grads))
        return outs

    return f


_reference_cache: dict = {}


def run_cases(kind, key, cases, make, backend):
    """Run the group on ``backend`` and (once per group) on numpy; compare case by case."""
    fn = make(cases)
    flat = [x for c in cases for x in c.sample()]
    with np.errstate(all="ignore"):  # 1 / 0, inf - inf: as NumPy
        if (kind, key) not in _reference_cache:
            _reference_cache[(kind, key)] = rp.function(fn)(*flat)
        want = _reference_cache[(kind, key)]
        got = rp.function(fn, backend=backend)(*flat)
    assert len(got) == len(want) == len(cases)
    for c, g, w in zip(cases, got, want):
        assert len(g) == len(w), c.id
        for i, (a, e) in enumerate(zip(g, w)):
            assert_same(a, e, what=f"{kind} {c.id} output {i} on {backend}")


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("op", sorted(FORWARD))
def test_forward(backend, op):
    run_cases("forward", op, FORWARD[op], forward_fn, backend)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("op", sorted(GRAD64))
def test_gradient_float64(backend, op):
    run_cases("gradient", op, GRAD64[op], gradient_fn, backend)


@pytest.mark.parametrize("backend", BACKENDS)
def test_gradient_float32(backend):
    run_cases("gradient32", "all", GRAD32, gradient_fn, backend)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("op", sorted(GG))
def test_gradient_of_gradient(backend, op):
    run_cases("gradient2", op, GG[op], lambda cs: gradient_fn(cs, order=2), backend)


def random_draws(k, logits):
    return [v for _, v in sorted(ops.draws(k, logits).items())]


def test_the_cases_reach_every_device_primitive():
    """The tests here exercise every primitive a backend lowers (all but the collectives and the
    fused groups, which only the NumPy pipeline's fusion pass makes)."""
    from replicate.graph.primitives import COLLECTIVE, REGISTRY

    key = rnp.random.key(0).numpy()
    seen = {n.prim for n in rp.function(random_draws).graph(key, ops.LOGITS).nodes}
    for groups, make in ((FORWARD, forward_fn), (GRAD64, gradient_fn)):
        for cases in groups.values():
            flat = [x for c in cases for x in c.sample()]
            with np.errstate(all="ignore"):
                seen |= {n.prim for n in rp.function(make(cases)).graph(*flat).nodes}
    device = {n for n, p in REGISTRY.items() if p.kind not in (COLLECTIVE, "fused")}
    assert device - seen == set()


@pytest.mark.parametrize("backend", BACKENDS)
def test_random_numbers_are_bitwise_equal(backend):
    want_fn, got_fn = rp.function(random_draws), rp.function(random_draws, backend=backend)
    for seed in (0, 3, 2**40):
        k = rnp.random.key(seed).numpy()
        want, got = want_fn(k, ops.LOGITS), got_fn(k, ops.LOGITS)
        for name, a, b in zip(sorted(ops.EXPECTED), got, want):
            if name.startswith("normal"):  # Box-Muller: log, cos, sqrt round as the backend's do
                assert_same(a, b, f"{name} (seed {seed}) on {backend}")
                continue
            a = np.asarray(a)
            assert a.dtype == b.dtype and a.shape == b.shape, name
            assert a.tobytes() == b.tobytes(), f"{name} (seed {seed}) on {backend}"

    def more(k):
        return (rnp.random.uniform(k, (1000, 3)), rnp.random.split(k, 5),
                rnp.random.uniform(k, (7,), np.float64, minval=-1.0, maxval=2.0))

    key = rnp.random.key(9).numpy()
    for a, b in zip(rp.function(more, backend=backend)(key), rp.function(more)(key)):
        assert np.asarray(a).tobytes() == b.tobytes()


# ================================================================================================
# Whole steps.
# ================================================================================================
STEPS = {"mlp": (modes.make_mlp_step, modes.MLP_INIT, modes.MLP_BATCHES),
         "conv": (modes.make_cnn_step, modes.CNN_INIT, modes.CNN_BATCHES),
         "wgan-gp": (modes.make_gp_step, modes.GP_INIT, modes.GP_BATCHES)}


def run_step(make_step, init, batches, backend):
    params = modes.variables(init)
    fn = rp.function(make_step(params), backend=backend)
    outs = [fn(*batch) for batch in batches]
    return outs, modes.snapshot(params), fn


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("model", sorted(STEPS))
def test_whole_step_matches_numpy(backend, model):
    make_step, init, batches = STEPS[model]
    want_outs, want_params, _ = run_step(make_step, init, batches, "numpy")
    outs, params, fn = run_step(make_step, init, batches, backend)
    assert_nests_same(outs, want_outs, f"{model} outputs")
    assert_nests_same(params, want_params, f"{model} parameters")
    assert fn.trace_count == 1
    traced = getattr(fn.executable(*batches[0]).run, "traces", None)  # jitted segments: once each
    if traced is not None:
        assert traced == sum(k.startswith("jit") for k in fn.executable(*batches[0]).kernels)
    assert not np.allclose(params[sorted(params)[0]], init[sorted(params)[0]])


@pytest.mark.parametrize("backend", BACKENDS)
def test_replicator_with_collectives_matches_numpy(backend):
    want_hist, want_params, _ = replicated_training("numpy")
    hist, params, rep = replicated_training(backend)
    assert_nests_same(hist, want_hist, "per-step outputs")
    assert_nests_same(params, want_params, "parameters")
    assert rep.trace_count == 1
    assert any(abs(params[n] - p).max() > 1e-3 for n, p in
               replicated_training("numpy", steps=0)[1].items())


@pytest.mark.parametrize("backend", BACKENDS)
def test_replicator_two_processes_matches_numpy(backend):
    """2 processes x 2 replicas, gradients in several buckets whose communication overlaps the
    backward pass (comm_start / comm_wait between device segments): as NumPy, on every rank.
    First, with one replica a process, the default buckets sum as the unbucketed step."""
    result = mpirun(os.path.abspath(__file__), backend, cwd=os.path.dirname(__file__),
                    timeout=240)
    assert result.returncode == 0, report(result)
    assert result.stdout.count("parity ok") == 2, report(result)


for _mark in needs_mpi:
    test_replicator_two_processes_matches_numpy = _mark(test_replicator_two_processes_matches_numpy)


def two_process_main(backend):
    # the default buckets, one replica a process: planned alike on both ranks though their
    # graphs differ (the broadcast's gradient is used on the root's process only; planned from
    # each graph's positions, MPI stopped this with "message truncated"), they sum what the
    # unbucketed step does
    plain_hist, plain_params, _ = replicated_training("numpy", k=1, options={"bucket_bytes": 0})
    for default in ({}, {"overlap": False}):
        hist, params, _ = replicated_training("numpy", k=1, options=default)
        assert_nests_same(hist, plain_hist, f"per-step outputs, buckets {default}")
        assert_nests_same(params, plain_params, f"parameters, buckets {default}")
    options = {"bucket_bytes": 200, "overlap": True}
    want_hist, want_params, _ = replicated_training("numpy", options=options)
    hist, params, rep = replicated_training(backend, options=options)
    assert_nests_same(hist, want_hist, "per-step outputs")
    assert_nests_same(params, want_params, "parameters")
    prims = {n.prim for n in rep.executable().graph.nodes}
    assert {"comm_start", "comm_wait"} <= prims, sorted(prims)
    if backend == "jax":  # communication runs inside the one jitted program of the step
        from replicate.backends.jax_host import available
        kernels = rep.executable().kernels
        assert len(kernels) == 1 or not available(), kernels
        # the buckets' blocking all-reduces (no overlap), their parts reduced over XLA's buffers
        hist, params, rep = replicated_training(backend, options=dict(options, overlap=False))
        assert_nests_same(hist, want_hist, "per-step outputs (overlap=False)")
        assert_nests_same(params, want_params, "parameters (overlap=False)")
        assert "comm_start" not in {n.prim for n in rep.executable().graph.nodes}
    print(f"rank {rep.rank}: parity ok on {backend}", flush=True)


if __name__ == "__main__":  # run by test_replicator_two_processes_matches_numpy under mpiexec
    two_process_main(sys.argv[1])
