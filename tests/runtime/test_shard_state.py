"""Sharded optimiser state (``wrap_optimizer(shard=True)``, ``graph/passes/shard_state.py``):
the rewrite's graph, its errors, and the oracle under mpiexec — the sharded step against the
unsharded one on 2 and 3 processes (``programs/shard_mpi.py``), and a sharded checkpoint
restored into 1 and 3 processes."""

import json
import sys

import numpy as np
import pytest

import replicate as rp
import replicate.numpy as rnp
from conftest import MPIEXEC, have_mpi, run
from replicate.backends import numpy_backend
from replicate.compiler import compile_step, step_graph
from replicate.context import ReplicaContext
from replicate.graph.passes.shard_state import ShardLayout
from replicate.graph.primitives import REGISTRY

needs_mpi = pytest.mark.skipif(not have_mpi(), reason="needs mpi4py and mpiexec (mpich wheel)")


@pytest.mark.parametrize("shape,n", [((5, 7), 2), ((7,), 3), ((1,), 3), ((4, 3), 3)])
def test_layout_parts_make_the_whole_again(shape, n):
    whole = np.arange(np.prod(shape), dtype=np.float64).reshape(shape) + 1
    parts = [ShardLayout(shape, n, r).part(whole) for r in range(n)]
    lay = ShardLayout(shape, n, 0)
    assert all(p.shape == (lay.chunk,) for p in parts)
    assert np.array_equal(lay.whole(parts), whole)
    assert sum(ShardLayout(shape, n, r).valid for r in range(n)) == whole.size
    assert np.count_nonzero(np.concatenate(parts)) == whole.size  # padding zero


def _sharded_graph(n=2, rank=0, k=1, shard_for=None, **wrap):
    """The step passes' graph of an AdamW step on process ``rank`` of ``n`` (no MPI needed:
    the sharded state is cut here as ``wrap_optimizer`` would on ``shard_for`` processes)."""
    w = rp.Variable(np.linspace(-1, 1, 6).reshape(3, 2), name="w")
    b = rp.Variable(np.zeros(2), name="b")
    opt = rp.wrap_optimizer(rp.optim.AdamW([w, b], lr=0.1), shard=True, **wrap)
    for var in opt.m + opt.v:
        lay = ShardLayout(tuple(var.shape), *(shard_for or (n, rank)))
        var.value, var.shard = lay.part(var.value), lay

    def step(x):
        loss = rnp.sum(rnp.tanh(x @ w + b))
        opt.apply(rp.grad(loss, [w, b]))
        return loss

    contexts = [ReplicaContext(replica_id=rank * k + r, num_replicas=n * k, rank=rank,
                               num_ranks=n, local_id=r, replicas_per_rank=k) for r in range(k)]
    return step_graph(step, [np.ones((4, 3))] * k, contexts, num_ranks=n, rank=rank,
                      gathers_outputs=False), opt


@pytest.mark.parametrize("k", [1, 2])
def test_the_gradient_all_reduce_becomes_reduce_scatter_and_all_gather(k):
    graph, opt = _sharded_graph(k=k, max_grad_norm=1.0)
    prims = [n.prim for n in graph.nodes]
    assert prims.count("mpi_reduce_scatter") == 2  # one per gradient
    assert prims.count("mpi_allgather") == 2  # one per parameter's new value
    # the global norm: each gradient slice's partial sum of squares, all-reduced
    assert [n.attrs["op"] for n in graph.nodes if n.prim == "mpi_allreduce"] == ["sum", "sum"]
    assert not any(n.attrs.get("shard") for n in graph.nodes if n.prim == "mpi_allreduce")
    assert prims.count("local_reduce") == (2 if k == 2 else 0)  # the in-process combine first
    # the state comes in and goes out as this process's slice; the parameters whole
    sizes = {name: x.shape for name, x in zip(graph.meta.input_names, graph.inputs)}
    assert sizes["w.m"] == (3,) and sizes["b.v"] == (1,) and sizes["w"] == (3, 2)
    outs = dict(zip([v.name for v in graph.meta.updated],
                    graph.outputs[graph.meta.num_results * k:]))
    assert outs["w.m"].shape == (3,) and outs["w"].shape == (3, 2)


def test_without_shard_the_graph_keeps_its_all_reduce():
    w = rp.Variable(np.ones((3, 2)), name="w")
    opt = rp.wrap_optimizer(rp.optim.Adam([w]))

    def step(x):
        opt.apply(rp.grad(rnp.sum(x @ w), [w]))
        return x

    graph = step_graph(step, [np.ones((4, 3))], [ReplicaContext(replica_id=0, num_replicas=2)],
                       num_ranks=2, rank=0, gathers_outputs=False)
    prims = [n.prim for n in graph.nodes]
    assert "mpi_allreduce" in prims and "mpi_reduce_scatter" not in prims


def test_state_cut_for_other_processes_is_an_error():
    with pytest.raises(rp.ReplicateError, match="holds process 0's slice of 2.*process 1 of 3"):
        _sharded_graph(n=3, rank=1, shard_for=(2, 0))


def test_eager_mode_says_what_to_use():
    w = rp.Variable(np.ones(4), name="w")
    opt = rp.wrap_optimizer(rp.optim.Adam([w]), shard=True)
    opt.shard = True  # (one process cuts nothing: as if it were one of several)
    with pytest.raises(rp.ReplicateError, match="eager mode.*graph mode"):
        opt.apply([np.ones(4)])


def test_a_sharded_variable_refuses_an_eager_read_and_slices_an_assign():
    v = rp.Variable(np.zeros((2, 3)), name="v")
    lay = ShardLayout((2, 3), 4, 3)
    v.value, v.shard = lay.part(v.value), lay
    assert v.shape == (2, 3) and not v.shared
    with pytest.raises(rp.ReplicateError, match="sharded optimiser state"):
        v.read()
    v.assign(np.arange(6.0).reshape(2, 3))
    assert v.value.tolist() == [0.0, 0.0]  # process 3 of 4: element 6 and 7 (padding)


def _oracle(tmp_path, n):
    out = tmp_path / f"oracle{n}.json"
    result = run([MPIEXEC, "-n", str(n), sys.executable, "shard_mpi.py", "oracle", str(out)],
                 check=True)
    data = json.loads(out.read_text())
    assert data["size"] == n, result.stderr
    return data["results"]


@pytest.mark.mpi
@needs_mpi
@pytest.mark.parametrize("n", [2, pytest.param(3, marks=pytest.mark.slow)])  # 3: second tier
def test_sharded_equals_unsharded(tmp_path, n):
    """Every configuration (AdamW, clipping, k = 2, accumulation, dynamic loss scaling,
    check_finite, bf16 autocast with master weights; buckets of every gradient, of about two
    or of one, overlapped or blocking, compressed; the JAX backend) trains to the unsharded
    result: float64 to 1e-12 — bitwise where no norm is split — and bfloat16 bitwise without
    clipping, within a float32 rounding of the norm with it (or of XLA's fused update); each
    process holds about 1/n of the state."""
    results = _oracle(tmp_path, n)
    for name, r in results.items():
        assert r["moved"] > 1e-2, name  # training moved the parameters
        assert r["sharded_vars"] >= 4, name
        clipped = "clip" in name or "accumulate" in name or "jax" in name
        if "bf16" in name:
            assert r["bitwise"] or (clipped and r["max"] <= 2e-7), (name, r["diff"])
        else:
            assert r["max"] <= 1e-12 and (r["bitwise"] or clipped), (name, r["diff"])
        # the gradients' reduce-scatters, bucketed (4 gradients of 280, 56, 168 and 8 bytes)
        per_update = 4 if "unbucketed" in name else 3 if "small-buckets" in name else 1
        updates = 3 if "accumulate" in name else 6
        assert r["reduce_scatters"] == per_update * updates, (name, r["reduce_scatters"])
        # 1/n of the slots plus at most one element of padding per parameter
        slack = r["sharded_vars"] * 8
        assert r["state_bytes"] <= r["plain_state_bytes"] / n + slack, (name, r)
        # rp.memory_report: the arrays held, this process's slices only
        report, plain = r["report"], r["plain_report"]
        assert report["optimizer_state"] == r["held"]["state"], (name, report, r["held"])
        assert report["master_weights"] == r["held"]["master_weights"], (name, report)
        assert report["parameters"] == plain["parameters"]  # (parameters stay whole)
        assert report["optimizer_state"] <= plain["optimizer_state"] / n + slack + 8, name
        if name.startswith("bf16"):
            assert 0 < report["master_weights"] <= plain["master_weights"] / n + 4 * 4, name


@pytest.mark.mpi
@needs_mpi
def test_a_sharded_checkpoint_restores_into_1_and_3_processes(tmp_path):
    """A checkpoint of a 2-process sharded run holds the whole state (equal to the unsharded
    run's); restored into 1 and 3 processes, sharded (resliced) or not, it saves back bitwise
    and trains on alike. The same run's asynchronous checkpoint equals the synchronous one."""
    run([MPIEXEC, "-n", "2", sys.executable, "shard_mpi.py", "save", str(tmp_path)], check=True)
    for n in (1, 3):
        out = tmp_path / f"restore{n}.json"
        run([MPIEXEC, "-n", str(n), sys.executable, "shard_mpi.py", "restore", str(tmp_path),
             str(out)], check=True)
        data = json.loads(out.read_text())
        assert data["size"] == n
        assert data["saved_vs_plain"] == 0.0
        assert data["background_equal"]  # the asynchronous checkpoint, 2 processes, sharded
        assert "o/m/0" in data["keys"] and "p/w1" in data["keys"]
        assert data["resaved_equal"] == {"True": True, "False": True}, data
        assert data["trained_diff"] <= 1e-12, data


def _compiled(n, rank, k=1, options=None, **wrap):
    """The optimised graph of a sharded Adam step on process ``rank`` of ``n``: three
    parameters, one of a single element (padding only on processes >= 1)."""
    rng = np.random.default_rng(0)
    params = [rp.Variable(rng.normal(size=s), name=f"p{i}")
              for i, s in enumerate([(3, 7), (7,), (7, 2), (1,)])]
    opt = rp.wrap_optimizer(rp.optim.Adam(params, lr=0.1), shard=True, **wrap)
    for var in opt.m + opt.v:
        lay = ShardLayout(tuple(var.shape), n, rank)
        var.value, var.shard = lay.part(var.value), lay

    def step(x):
        loss = rnp.sum(rnp.tanh(x @ params[0] + params[1]) @ params[2] * params[3])
        opt.apply(rp.grad(opt.scale(loss), params))
        return loss

    contexts = [ReplicaContext(replica_id=rank * k + r, num_replicas=n * k, rank=rank,
                               num_ranks=n, local_id=r, replicas_per_rank=k) for r in range(k)]
    return compile_step(step, [np.ones((4, 3))] * k, contexts, backend=numpy_backend,
                        options=rp.CompileOptions(**(options or {})), num_ranks=n, rank=rank,
                        gathers_outputs=False)


def _exchanges(graph):
    return [(n.prim, n.attrs.get("collective"), n.inputs[0].shape, n.out.shape)
            for n in graph.nodes if REGISTRY[n.prim].exchange]


@pytest.mark.parametrize("overlap", [True, False])
def test_the_sharded_exchanges_are_bucketed(overlap):
    """Every gradient in one reduce-scatter, every parameter in one all-gather (the default
    bucket size); the norm's partial sums in one all-reduce, never compressed."""
    step = _compiled(2, 0, k=2, options=dict(overlap=overlap, compress="float16"),
                     max_grad_norm=1.0)
    found = _exchanges(step.executable.graph)
    if overlap:
        assert found == [("comm_start", "reduce_scatter", (46,), (23,)),
                         ("comm_wait", None, (23,), (23,)),
                         ("comm_start", None, (4,), (4,)), ("comm_wait", None, (4,), (4,)),
                         ("comm_start", "allgather", (23,), (2, 23)),
                         ("comm_wait", None, (2, 23), (2, 23))]
    else:
        assert found == [("mpi_reduce_scatter", None, (46,), (23,)),
                         ("mpi_allreduce", None, (4,), (4,)),
                         ("mpi_allgather", None, (23,), (2, 23))]
    dtypes = [n.inputs[0].dtype.name for n in step.executable.graph.nodes
              if n.prim in ("comm_start", "mpi_reduce_scatter", "mpi_allreduce",
                            "mpi_allgather")]
    assert dtypes == ["float16", "float64", "float64"]  # compressed: the gradients only
    # the buckets join the schedule the processes compare
    assert [s for s, _ in step.schedule if s.startswith("bucket")] == [
        "bucket mpi_reduce_scatter[sum] float64 of [(22,), (8,), (14,), (2,)]",
        "bucket mpi_allreduce[sum] float64 of [(), (), (), ()]",
        "bucket mpi_allgather[None] float64 of [(11,), (4,), (7,), (1,)]"]


@pytest.mark.parametrize("options", [{}, dict(overlap=False), dict(bucket_bytes=40)])
def test_every_process_plans_the_same_buckets(options):
    """The processes' graphs differ (a one-element parameter's slice is padding on processes 1
    and 2, cut and reduced with a mask there), yet their exchanges, buckets and packing order
    agree: a plan that differed would mix the processes' buffers."""
    steps = [_compiled(3, r, options=options, loss_scale="dynamic") for r in range(3)]
    assert len({len(s.executable.graph.nodes) for s in steps}) > 1  # (the graphs differ)
    first = _exchanges(steps[0].executable.graph)
    assert first and all(_exchanges(s.executable.graph) == first for s in steps[1:])
    assert steps[1].schedule == steps[0].schedule == steps[2].schedule


@pytest.mark.mpi
@needs_mpi
def test_check_sync_checks_each_slice_where_it_lives(tmp_path):
    """A slice no other process holds is checked on its own process (its layout, its zero
    padding); the whole parameters are compared as without sharding. Each broken on purpose on
    process 1 after the last step: ``run``'s final check raises on every process."""
    out = tmp_path / "desync.json"
    run([MPIEXEC, "-n", "2", sys.executable, "shard_mpi.py", "desync", str(out)], check=True)
    caught = json.loads(out.read_text())["caught"]
    assert caught["none"] is None
    assert "rank 1's slice of the sharded variable 'b1.m'" in caught["padding"]
    assert "nonzero padding" in caught["padding"]
    assert "'s.v'" in caught["layout"]
    assert "process 0's of 2, held by process 1 of 2" in caught["layout"]
    assert "'w2'" in caught["parameter"] and "rank(s) [1] differ" in caught["parameter"]
