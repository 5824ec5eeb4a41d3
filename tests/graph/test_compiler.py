"""The graph compiler: passes (each checked by the validator), fused kernels, buckets, memory.

Structural tests read the optimised graph (``Function.executable(...).graph`` / ``.kernels``);
the ``null`` backend compiles like the NumPy backend and runs nothing, so a two-process graph can
be inspected inside one process. Numerical tests compare every optimisation against the graph run
with all passes disabled (the plain reference interpretation).
"""

from __future__ import annotations

import json
import sys

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import replicate as rp
import replicate.numpy as rnp
from conftest import PROGRAMS, have_mpi, load_both, mpirun
from replicate.backends import get_backend, numpy_backend
from replicate.compiler import PIPELINE, CompileOptions, compile_graph, step_graph
from replicate.context import ReplicaContext
from replicate.graph import validate
from replicate.graph.passes import StepContext

NO_PASSES = {"disable": list(PIPELINE)}
NULL = get_backend("null")


def chain(x):
    return rnp.tanh(x * 1.7 + 0.3) * rnp.sigmoid(x) - rnp.exp(-0.5 * x)


def _mlp(sizes=(6, 16, 16, 3), seed=0):
    return rp.nn.Sequential(*[m for i, (a, b) in enumerate(zip(sizes[:-1], sizes[1:]))
                              for m in ([rp.nn.Linear(a, b, rng=np.random.default_rng(seed + i),
                                                       dtype=np.float64)]
                                        + ([rp.nn.relu] if i < len(sizes) - 2 else []))])


def _mlp_step(model, opt):
    def step(x, y):
        loss = rp.nn.softmax_cross_entropy(model(x), y).mean()
        opt.apply(rp.grad(loss, model.parameters()))
        return loss
    return step


# -- fusion ---------------------------------------------------------------------------------------
def test_eight_op_elementwise_chain_is_one_kernel():
    x = np.linspace(-2, 2, 1000).astype(np.float32)
    f = rp.function(chain)
    assert f.executable(x).kernels == ["fused[mul,add,tanh,logistic,mul,mul,exp,sub]"]
    np.testing.assert_allclose(f(x), np.tanh(x * 1.7 + 0.3) / (1 + np.exp(-x)) - np.exp(-0.5 * x),
                               rtol=1e-5, atol=1e-6)


def test_map_then_sum_is_one_kernel():
    f = rp.function(lambda x: (x * 2 + 1).sum())
    x = np.arange(12.0).reshape(3, 4)
    assert f.executable(x).kernels == ["fused[mul,add,reduce_sum]"]
    assert float(f(x)) == float((x * 2 + 1).sum())


def test_reduction_with_prologue_and_epilogue():
    f = rp.function(lambda x: rnp.sqrt((x * x).sum()) + 1.0)
    x = np.arange(6.0)
    assert f.executable(x).kernels == ["fused[mul,reduce_sum,sqrt,add]"]
    np.testing.assert_allclose(f(x), np.sqrt((x * x).sum()) + 1.0)


def test_one_reduction_per_kernel():
    # mean = sum / n; a second reduction over it starts a new kernel (the division joins it)
    f = rp.function(lambda x: rnp.mean(rnp.exp(x), axis=1).max())
    x = np.random.default_rng(0).normal(size=(4, 5))
    assert f.executable(x).kernels == ["fused[exp,reduce_sum]", "fused[div,reduce_max]"]
    np.testing.assert_allclose(f(x), np.exp(x).mean(1).max())


def test_epilogue_reads_only_scalars_from_outside():
    # (sum over rows) * w with a vector w: w is not a scalar, so the product is its own kernel
    w = np.arange(4.0)
    f = rp.function(lambda x: x.sum(axis=1) * w)
    x = np.ones((4, 3))
    assert f.executable(x).kernels == ["reduce_sum", "mul"]
    np.testing.assert_allclose(f(x), 3 * w)


def test_values_needed_elsewhere_are_not_fused_away():
    f = rp.function(lambda x: (rnp.exp(x), rnp.exp(x) * 2 + 1))  # exp is needed as an output
    x = np.ones(3)
    a, b = f(x)
    np.testing.assert_allclose(a, np.e)
    np.testing.assert_allclose(b, 2 * np.e + 1)
    assert "exp" in f.executable(x).kernels


def test_matmul_and_random_are_fusion_boundaries():
    w = np.ones((3, 2))
    f = rp.function(lambda x: rnp.tanh(x @ w + 1.0))
    assert f.executable(np.ones((4, 3))).kernels == ["matmul", "fused[add,tanh]"]


def test_mlp_training_step_kernel_count():
    """The documented figure (docs/concepts/compiler.md): a 3-layer MLP SGD step is 41 kernels."""
    model = _mlp()
    f = rp.function(_mlp_step(model, rp.optim.SGD(model.parameters(), lr=0.1)))
    x, y = np.ones((8, 6)), np.zeros(8, np.int64)
    kernels = f.executable(x, y).kernels
    assert kernels.count("matmul") == 8  # 3 forward, 5 backward (no gradient for the input)
    assert sum(k.startswith("fused") for k in kernels) == 14
    assert len(kernels) == 41
    unfused = rp.function(_mlp_step(_mlp(), rp.optim.SGD(_mlp().parameters(), lr=0.1)),
                          options=NO_PASSES)
    assert len(unfused.executable(x, y).kernels) > 60


# -- every pass keeps a valid graph and the same results ------------------------------------------
def _programs():
    model = _mlp()
    yield "mlp-sgd", _mlp_step(model, rp.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)), \
        (np.random.default_rng(1).normal(size=(8, 6)), np.arange(8) % 3)
    model2 = _mlp(seed=5)
    yield "mlp-adam", _mlp_step(model2, rp.optim.Adam(model2.parameters(), lr=0.01)), \
        (np.random.default_rng(2).normal(size=(8, 6)), np.arange(8) % 3)
    yield "chain", chain, (np.linspace(-3, 3, 50),)
    yield "softmax", lambda x: rnp.exp(x - rnp.logsumexp(x, axis=-1, keepdims=True)), \
        (np.random.default_rng(3).normal(size=(5, 7)),)


@pytest.mark.parametrize("name", [p[0] for p in _programs()])
def test_each_pass_keeps_the_graph_valid(name):
    fn, args = next((f, a) for n, f, a in _programs() if n == name)
    graph = rp.function(fn, options=NO_PASSES).graph(*args)
    for run_pass in PIPELINE.values():
        graph = run_pass.run(graph, StepContext(options=CompileOptions(), backend=numpy_backend))
        validate(graph)


@pytest.mark.parametrize("name", [p[0] for p in _programs()])
def test_optimised_equals_unoptimised(name):
    fn, args = next((f, a) for n, f, a in _programs() if n == name)
    fast_fn, _ = next((f, a) for n, f, a in _programs() if n == name)  # fresh state
    slow = rp.function(fn, options=NO_PASSES)
    fast = rp.function(fast_fn)
    for _ in range(3):  # state updates and reused buffers across calls
        a, b = slow(*args), fast(*args)
        np.testing.assert_allclose(np.asarray(b), np.asarray(a), rtol=1e-12, atol=1e-14)


@pytest.mark.parametrize("n", [4 * 2**14, 100_003])
def test_large_elementwise_groups_run_block_by_block_exactly(n, monkeypatch):
    """A big all-elementwise group runs in cache-sized blocks (numpy_backend.CHUNK): bitwise the
    whole-array result, the tail block included; inputs of another layout take the whole path."""
    from replicate.backends import numpy_backend as nb

    def f(x, y, s):
        return rnp.tanh(x * 1.7 + 0.3) * rnp.sigmoid(y) - rnp.exp(-0.5 * x) * s

    rng = np.random.default_rng(0)
    x, y = rng.normal(size=n).astype(np.float32) * 5, rng.normal(size=n).astype(np.float32) * 5
    s = np.full((1,), 2.0, np.float32)
    ref = rp.function(f, options=NO_PASSES)(x, y, s)
    fused = rp.function(f)
    assert len(fused.executable(x, y, s).kernels) == 1
    calls = []
    blocked = nb._blocked_runner
    monkeypatch.setattr(nb, "_blocked_runner", lambda node: calls.append(node) or blocked(node))
    fused = rp.function(f)
    for _ in range(2):
        got = fused(x, y, s)
        assert got.tobytes() == ref.tobytes()
    assert calls
    xs, ys = np.repeat(x, 2)[::2], np.repeat(y, 2)[::2]  # strided views: the whole-array path
    assert rp.function(f)(xs, ys, s).tobytes() == ref.tobytes()


def test_constant_folding():
    f = rp.function(lambda x: x * (np.float64(2.0) * 3.0 + 1.0) + rnp.exp(rnp.zeros(3)))
    g = f.executable(np.ones(3)).graph
    assert [n.prim for n in g.nodes if n.prim != "const"] == ["fused"]
    consts = [n.attrs["value"] for n in g.nodes if n.prim == "const"]
    assert any(np.array_equal(c, 7.0) for c in consts) and any(np.array_equal(c, np.ones(3))
                                                                for c in consts)
    np.testing.assert_allclose(f(np.ones(3)), 8.0)


def test_constant_folding_keeps_big_results_lazy():
    f = rp.function(lambda x: x + rnp.broadcast_to(rnp.asarray(1.0), (100, 100)))
    g = f.executable(np.ones((100, 100))).graph
    assert all(n.attrs["value"].size <= 4096 for n in g.nodes if n.prim == "const")


# -- memory planning ------------------------------------------------------------------------------
def test_memory_plan_reuses_buffers_and_outputs_are_fresh():
    model = _mlp((6, 32, 32, 32, 3))
    f = rp.function(lambda x: rnp.tanh(rnp.tanh(x * 2.0) @ np.ones((5, 5)) + 1.0).sum(axis=0))
    x = np.random.default_rng(0).normal(size=(40, 5))
    plan = f.executable(x).graph.meta["memory_plan"]
    assert plan.buffers and len(plan.buffers) <= len(plan.slot)
    first = f(x)
    kept = first.copy()
    f(x + 1.0)
    np.testing.assert_array_equal(first, kept)  # a later call never writes into a result
    step = rp.function(_mlp_step(model, rp.optim.SGD(model.parameters(), lr=0.1)))
    plan = step.executable(np.ones((8, 6)), np.zeros(8, np.int64)).graph.meta["memory_plan"]
    assert len(plan.buffers) < len(plan.slot)  # buffers are shared between values


# -- the IR dump shows each pass ------------------------------------------------------------------
def test_debug_prints_ir_after_every_pass(monkeypatch, capsys):
    monkeypatch.setenv("REPLICATE_DEBUG", "passes")
    rp.function(chain)(np.ones(3))
    out = capsys.readouterr().out
    for name in ("const_fold", "cse", "dce", "fusion", "memory"):
        assert f"# after pass {name}" in out
    assert "fused" in out


def test_bad_options_are_errors():
    with pytest.raises(rp.ReplicateError, match="unknown passes"):
        CompileOptions(disable={"nope"})
    with pytest.raises(rp.ReplicateError, match="compress"):
        rp.function(chain, options={"compress": "int8"})
    with pytest.raises(rp.ReplicateError, match="bad compile options"):
        rp.function(chain, options={"bucket_size": 3})


# -- gradient bucketing (structure on a two-process graph, inside one process) -----------------
def _two_process_graph(step_fn, batches, k=1):
    contexts = [ReplicaContext(r, 2 * k, 0, 2, r, k) for r in range(k)]
    return step_graph(step_fn, batches, contexts, num_ranks=2, rank=0)


def _many_gradients(n=100, size=1000):
    params = [rp.Variable(np.full(size, 0.01 * (i + 1), np.float32), name=f"p{i:03d}")
              for i in range(n)]

    def step(x):
        h = x
        for p in params:  # a chain, so the backward pass makes the last gradient first
            h = rnp.tanh(h * p)
        loss = h.sum()
        grads = rp.all_reduce(rp.grad(loss, params), "mean")
        for p, g in zip(params, grads):
            p.assign(p - 0.1 * g)
        return loss
    return params, step


@pytest.mark.parametrize("bucket_bytes,expect", [(40_000, 10), (100_000, 4), (25 * 2**20, 1),
                                                 (1, 100)])
def test_hundred_gradients_become_buckets(bucket_bytes, expect):
    params, step = _many_gradients()
    graph = _two_process_graph(step, [np.ones(1000, np.float32)])
    assert sum(n.prim == "mpi_allreduce" for n in graph.nodes) == 100
    exe = compile_graph(graph, NULL, CompileOptions(bucket_bytes=bucket_bytes))
    starts = [n for n in exe.graph.nodes if n.prim == "comm_start"]
    waits = [n for n in exe.graph.nodes if n.prim == "comm_wait"]
    assert len(starts) == len(waits) == expect
    assert not any(n.prim == "mpi_allreduce" for n in exe.graph.nodes)
    sizes = [n.out.size for n in starts]
    assert sum(sizes) == 100 * 1000 and max(sizes) * 4 <= max(bucket_bytes, 4000)
    # overlap: every bucket starts before the first wait (the backward pass runs meanwhile) ...
    order = [n.prim for n in exe.graph.nodes if n.prim.startswith("comm_")]
    assert order == ["comm_start"] * expect + ["comm_wait"] * expect
    # ... as soon as its gradients are made: the backward pass goes on between the starts
    at = [i for i, n in enumerate(exe.graph.nodes) if n.prim == "comm_start"]
    between = {n.prim for n in exe.graph.nodes[at[0]:at[-1]]}
    assert expect == 1 or {"tanh", "mul"} & between or "fused" in between, between
    # ... and the buckets fill in the order the gradients become ready: the last parameter's
    # first (its update reads bucket 0), the first parameter's last
    assert [n.attrs["bucket"] for n in starts] == list(range(expect))
    # a bucket runs on the step's thread (``_inline``) only when nothing worth overlapping
    # computes before its wait: the last one started (the first parameter's gradient, whose
    # update is the first to wait) — never the first of several, which the rest of the
    # backward pass overlaps
    inline = [n.attrs.get("_inline", False) for n in starts]
    assert inline[-1] and (expect == 1 or not inline[0]), inline
    assert "_inline" not in str(exe.graph.meta.collective_schedule)  # (ranks may differ)
    read = [_buckets_read(exe.graph.outputs[1 + i]) for i in range(len(params))]
    assert read[-1] == {0} and read[0] == {expect - 1}
    assert all(len(r) == 1 for r in read)
    assert [min(r) for r in read[::-1]] == sorted(min(r) for r in read)


def _buckets_read(value) -> set:
    """The buckets (``comm_wait`` nodes) that ``value`` is computed from."""
    found, seen, todo = set(), set(), [value]
    while todo:
        x = todo.pop()
        if x.node is None or x.id in seen:
            continue
        seen.add(x.id)
        if x.node.prim == "comm_wait":
            found.add(x.node.attrs["bucket"])
        else:
            todo.extend(x.node.inputs)
    return found


@pytest.mark.parametrize("grad_out", [False, True], ids=["bucket", "gradient-returned"])
def test_gradients_are_written_straight_into_their_bucket(grad_out):
    """NumPy backend: each gradient of a bucket is computed into its part of the bucket's buffer
    (the concatenation copies nothing), unless something reads it after the bucket is packed."""
    model = _mlp()
    params = list(model.parameters().values())

    def step(batch):
        x, y = batch
        loss = rp.nn.softmax_cross_entropy(model(x), y).mean()
        grads = rp.grad(loss, params)
        for p, g in zip(params, rp.all_reduce(grads, "mean")):
            p.assign(p - 0.1 * g)
        return (loss, grads[0]) if grad_out else loss
    graph = _two_process_graph(step, [(np.ones((8, 6)), np.zeros(8, np.int64))])
    exe = compile_graph(graph, get_backend("numpy"), CompileOptions())
    plan = exe.graph.meta["memory_plan"]
    (concat,) = [n for n in exe.graph.nodes if n.prim == "concatenate"]
    if grad_out:
        assert not plan.done and not plan.part
        return
    assert plan.done == {concat.out.id} and len(plan.part) == len(concat.inputs) == 6
    buffer = plan.slot[concat.out.id]
    spans = sorted((offset, int(np.prod(shape))) for b, offset, shape in plan.part.values()
                   if b == buffer)
    assert [o for o, _ in spans] == list(np.cumsum([0] + [n for _, n in spans])[:-1])
    assert sum(n for _, n in spans) == concat.out.size  # the parts tile the bucket


def test_bucketing_off_and_no_overlap():
    _, step = _many_gradients(10, 100)
    graph = _two_process_graph(step, [np.ones(100, np.float32)])
    off = compile_graph(graph, NULL, CompileOptions(bucket_bytes=0)).graph
    assert sum(n.prim == "mpi_allreduce" for n in off.nodes) == 10
    blocking = compile_graph(graph, NULL, CompileOptions(overlap=False)).graph
    assert sum(n.prim == "mpi_allreduce" for n in blocking.nodes) == 1
    assert not any(n.prim.startswith("comm_") for n in blocking.nodes)


def test_bucket_compression_casts_the_buffer():
    _, step = _many_gradients(10, 100)
    graph = _two_process_graph(step, [np.ones(100, np.float32)])
    g = compile_graph(graph, NULL, CompileOptions(compress="float16")).graph
    start = next(n for n in g.nodes if n.prim == "comm_start")
    assert start.inputs[0].dtype == np.float16


def test_dependent_all_reduces_never_share_a_bucket():
    # a two-pass variance: the second all-reduce needs the first one's result
    def step(x):
        m = rp.all_reduce(x.mean(0), "mean")
        v = rp.all_reduce(((x - m) ** 2).mean(0), "mean")
        return (v * m).sum()
    graph = _two_process_graph(step, [np.ones((3, 4)), np.ones((3, 4))], k=2)
    g = compile_graph(graph, NULL, CompileOptions()).graph
    assert sum(n.prim == "comm_start" for n in g.nodes) == 2
    validate(g)


def test_batchnorm_statistics_travel_in_one_bucket():
    # cross-replica BatchNorm reduces each replica's mean, variance and squared mean (float64)
    # weighted by its count, and the count, independent of each other: one exchange
    bn = rp.nn.BatchNorm(4, cross_replica=True)

    def step(x):
        return bn(x).sum()
    graph = _two_process_graph(step, [np.ones((3, 4)), np.ones((3, 4))], k=2)
    g = compile_graph(graph, NULL, CompileOptions()).graph
    starts = [n for n in g.nodes if n.prim == "comm_start"]
    assert len(starts) == 1 and starts[0].out.size == 3 * 4 + 1
    validate(g)


@pytest.mark.parametrize("k", [1, 2])
def test_batchnorm_statistics_of_a_training_step_travel_in_one_bucket_each_way(k):
    """In a whole training step (the GAN example's generator, cut down) BatchNorm's three
    statistics share one exchange forward and their cotangents one backward, whatever the
    replicas per process: the rewrite emitted the combine of the mean right after the last
    replica's mean, and its 1/R scaling before that replica's mean of squares, which closed the
    bucket (5 exchanges here, 21 of 512 bytes a GAN step; ``bucket_plan.glue``)."""
    lin, bn = rp.nn.Linear(4, 8), rp.nn.BatchNorm(8, cross_replica=True)
    params = list(lin.parameters().values())

    def step(x):
        loss = rnp.mean(bn(lin(x)) ** 2)
        grads = rp.all_reduce(rp.grad(loss, params), "mean")
        for p, g in zip(params, grads):
            p.assign(p - 0.1 * g)
        return loss
    graph = _two_process_graph(step, [np.ones((3, 4), np.float32) * (r + 1) for r in range(k)],
                               k=k)
    g = compile_graph(graph, NULL, CompileOptions()).graph
    validate(g)
    sizes = sorted(n.out.size for n in g.nodes if n.prim == "comm_start")
    # (mean, var, mean^2) both ways, the replica's count forward only; the gradients
    assert sizes == [24, 3 * 8 + 1, 4 * 8 + 8], sizes


def test_gradients_behind_batchnorm_all_reduces_share_one_bucket():
    """The parameters before and after a cross-replica BatchNorm have gradients behind different
    numbers of all-reduces, yet none needs another's result: one bucket (they were one bucket
    per parameter — each a cut in the JAX program). The BatchNorm statistics stay apart."""
    lin1, bn, lin2 = rp.nn.Linear(4, 8), rp.nn.BatchNorm(8, cross_replica=True), rp.nn.Linear(8, 1)
    params = [*lin1.parameters().values(), *bn.parameters().values(),
              *lin2.parameters().values()]

    def step(x):
        loss = (lin2(rnp.tanh(bn(lin1(x)))) ** 2).mean()
        grads = rp.all_reduce(rp.grad(loss, params), "mean")
        for p, g in zip(params, grads):
            p.assign(p - 0.1 * g)
        return loss
    graph = _two_process_graph(step, [np.ones((3, 4), np.float32)] * 2, k=2)
    g = compile_graph(graph, NULL, CompileOptions()).graph
    validate(g)
    starts = [n for n in g.nodes if n.prim == "comm_start"]
    sizes = sorted(n.out.size for n in starts)
    n_grad = sum(int(np.prod(p.shape)) for p in params)
    assert n_grad in sizes  # every gradient in one flat buffer
    assert len(starts) <= 1 + 4  # plus BatchNorm's forward and backward statistics


def test_cse_merges_the_k_identical_optimizer_updates():
    model = _mlp()
    opt = rp.wrap_optimizer(rp.optim.SGD(model.parameters(), lr=0.1))
    x, y = np.ones((4, 6)), np.zeros(4, np.int64)

    def step(b):
        loss = rp.nn.softmax_cross_entropy(model(b[0]), b[1]).mean()
        opt.apply(rp.grad(loss, model.parameters()))
        return loss
    k = 4
    graph = _two_process_graph(step, [(x, y)] * k, k=k)
    n_params = len(list(model.parameters().values()))
    # one all-reduce and one update per parameter, not one per replica
    assert sum(n.prim == "mpi_allreduce" for n in graph.nodes) == n_params
    assert sum(n.prim == "local_reduce" for n in graph.nodes) == n_params
    updates = graph.outputs[k:]  # after the k per-replica losses: one value per variable
    assert len(updates) == len(graph.meta["updated"]) >= n_params



def test_cse_tells_attributes_apart_by_their_bits():
    """Equal under ``==`` is not the same value: -0.0 == 0.0 (their quotients' signs differ), 1 ==
    1.0 == True; a NaN is the same attribute as itself. CSE keys a scalar attribute by its type
    and bits (found with CuPy: a -0.0 merged with a 0.0 gives the other quadrant of arctan2)."""
    from replicate.graph.passes.cse import _attr_key
    assert _attr_key({"v": -0.0}) != _attr_key({"v": 0.0})
    assert _attr_key({"v": np.float32(-0.0)}) != _attr_key({"v": np.float32(0.0)})
    assert len({_attr_key(v) for v in (1, 1.0, True, np.float64(1.0))}) == 4
    assert _attr_key({"v": float("nan")}) == _attr_key({"v": float("nan")})
    assert _attr_key({"v": 0.5}) == _attr_key({"v": 0.5})

# -- fused numerics: random elementwise programs ---------------------------------------------------
_UNARY = [rnp.tanh, rnp.exp, rnp.sigmoid, rnp.abs, lambda a: -a, lambda a: a * a,
          lambda a: rnp.sqrt(rnp.abs(a) + 1.0), rnp.sin]
_BINARY = [lambda a, b: a + b, lambda a, b: a - b, lambda a, b: a * b, rnp.maximum,
           lambda a, b: rnp.where(a > b, a, b * 0.5)]


@settings(max_examples=60, deadline=None)
@given(ops=st.lists(st.tuples(st.integers(0, 7), st.integers(0, 4), st.booleans()),
                    min_size=1, max_size=10),
       reduce=st.sampled_from([None, 0, 1, "all"]),
       bshape=st.sampled_from([(4, 3), (1, 3), (4, 1), ()]))
def test_random_elementwise_programs_fuse_correctly(ops, reduce, bshape):
    rng = np.random.default_rng(len(ops))
    x = rng.normal(size=(4, 3))
    y = rng.normal(size=bshape)

    def prog(x, y):
        vals = [x, y]
        for u, b, use_binary in ops:
            a = _UNARY[u](vals[-1])
            vals.append(_BINARY[b](a, vals[-2]) if use_binary else a)
        out = vals[-1]
        if reduce == "all":
            out = out.sum() * 0.5
        elif reduce is not None:
            out = rnp.max(out, axis=reduce) if out.ndim == 2 else out
        return out
    ref = rp.function(prog, options=NO_PASSES)(x, y)
    got = rp.function(prog)(x, y)
    np.testing.assert_allclose(got, ref, rtol=1e-12, atol=1e-12)


# -- the oracle with every pass, small buckets and overlap, across two processes ----------------
@pytest.mark.mpi
@pytest.mark.skipif(not have_mpi(), reason="needs mpi4py and mpiexec (mpich wheel)")
@pytest.mark.parametrize("options", [{"bucket_bytes": 64, "overlap": True},
                                     {"bucket_bytes": 64, "overlap": False},
                                     {"bucket_bytes": 25 * 2**20}])
def test_oracle_two_processes_with_every_pass(tmp_path, options):
    sys.path.insert(0, PROGRAMS)
    import oracle

    out = str(tmp_path / "params.npz")
    result = mpirun("oracle.py", out, "--k", "2", "--opt", "adam", "--options",
                    json.dumps(options))
    assert result.returncode == 0, result.stderr
    got = load_both(out)  # ranks bitwise equal
    ref, ref_losses = oracle.train(1, opt="adam", steps=10, batch=4 * 8, options=NO_PASSES)
    for name in ref:
        np.testing.assert_allclose(got[name], ref[name], rtol=1e-6, atol=1e-12, err_msg=name)
    np.testing.assert_allclose(got["losses"], ref_losses, rtol=1e-6)
    # and bitwise what the same run gives with no bucketing at all
    again = str(tmp_path / "plain.npz")
    assert mpirun("oracle.py", again, "--k", "2", "--opt", "adam", "--options",
                  json.dumps({"bucket_bytes": 0})).returncode == 0
    plain = load_both(again)
    for name in ref:
        assert got[name].tobytes() == plain[name].tobytes(), name
