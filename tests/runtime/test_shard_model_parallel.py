"""Sharded optimiser state with model parallelism (``wrap_optimizer(shard=True)`` and
``Replicator(logical_devices=m)``): each logical device's state sharded over the processes that
hold that device. The rewrite's graph per device, its errors, the schedule rows each device's
group compares, and under mpiexec (``programs/shard_mp_mpi.py``, 4 processes: 2 replica groups
of 2 devices) the sharded step against the unsharded one, what each process holds, and a
checkpoint restored into 2 processes."""

import json
import sys

import numpy as np
import pytest

import replicate as rp
import replicate.numpy as rnp
from conftest import MPIEXEC, have_mpi, run
from replicate.compiler import fingerprint, step_graph
from replicate.context import ReplicaContext
from replicate.graph.passes.shard_state import ShardLayout
from replicate.model_parallel import Where
from replicate.runtime.communication.schedule import check_schedules

needs_mpi = pytest.mark.skipif(not have_mpi(), reason="needs mpi4py and mpiexec (mpich wheel)")
WIDTHS = [5, 7, 6, 7, 3]


def _device_graph(device, group, groups=2, cut_for=None, **wrap):
    """This device's part of a sharded AdamW step with 2 logical devices (layer i on device
    i % 2, a bias on device 0, a one-element scale on device 1), as process ``group * 2 +
    device`` of ``groups * 2`` builds it; the state cut as the Replicator would (``cut_for``:
    another (n, rank))."""
    rng = np.random.default_rng(1)
    params = [rp.Variable(rng.normal(size=s), name=f"w{i}")
              for i, s in enumerate(zip(WIDTHS[:-1], WIDTHS[1:]))]
    params += [rp.Variable(np.zeros(7), name="bias"), rp.Variable(np.ones(1), name="s")]
    opt = rp.wrap_optimizer(rp.optim.AdamW(params, lr=0.05), shard=True, **wrap)
    for var in opt.m + opt.v:
        lay = ShardLayout(tuple(var.shape), *(cut_for or (groups, group)))
        var.value, var.shard = lay.part(var.value), lay

    def step(b):
        h, target = b
        for i in range(4):
            with rp.logical_device(i % 2):
                h = h @ params[i]
                h = h + params[4] if i == 0 else h * params[5] if i == 1 else h
                h = rnp.tanh(h) if i < 3 else h
        loss = ((h - target) ** 2).mean()
        opt.apply(rp.grad(loss, params))
        return loss

    rank = group * 2 + device
    contexts = [ReplicaContext(group, groups, rank, groups * 2, 0, 1)]
    where = Where(2, 1, device, group, groups, f"device{device}.of2", f"replica{group}.of2")
    return step_graph(step, [(np.ones((6, 5)), np.ones((6, 3)))], contexts,
                      num_ranks=groups * 2, rank=rank, gathers_outputs=False, where=where)


@pytest.mark.parametrize("device,group", [(0, 0), (0, 1), (1, 0), (1, 1)])
def test_each_device_shards_its_own_state_over_its_group(device, group):
    graph = _device_graph(device, group, max_grad_norm=0.5)
    mine = {0: ["w0", "w2", "bias"], 1: ["w1", "w3", "s"]}[device]
    exchanges = [n for n in graph.nodes if n.prim.startswith("mpi_")]
    assert {n.attrs["comm"] for n in exchanges} == {f"device{device}.of2"}
    assert all(n.attrs["size"] == 2 for n in exchanges)
    # one reduce-scatter per gradient of this device, one all-gather per new parameter
    shapes = {n.inputs[0].shape for n in exchanges if n.prim == "mpi_reduce_scatter"}
    sizes = {"w0": 35, "w1": 42, "w2": 42, "w3": 21, "bias": 7, "s": 1}
    assert sorted(n.prim for n in exchanges).count("mpi_reduce_scatter") == 3
    assert shapes == {(-(-sizes[p] // 2) * 2,) for p in mine}
    assert [n.prim for n in exchanges].count("mpi_allgather") == 3
    # the global norm: this device's partial sums all-reduced over its group, then sent on
    assert any(n.prim == "mpi_allreduce" and n.attrs.get("exact") for n in exchanges)
    assert {"send", "recv"} <= {n.prim for n in graph.nodes}
    # this device's state comes in as this process's slice; the other device's is not fed
    inputs = dict(zip(graph.meta.input_names, graph.inputs))
    for p in mine:
        assert inputs[f"{p}.m"].shape == (-(-sizes[p] // 2),), p
    other = {0: "w1", 1: "w0"}[device]
    assert f"{other}.m" not in inputs and f"{other}.v" not in inputs


def test_state_cut_for_other_processes_names_the_device_group():
    with pytest.raises(rp.ReplicateError, match=(
            "process 1's slice of 4.*process 0 of 2 of logical device 1's data-parallel group"
            ".*construct it after wrap_optimizer")):
        _device_graph(1, 0, cut_for=(4, 1))


def test_eager_mode_with_model_parallelism_says_what_to_use():
    w = rp.Variable(np.ones((3, 2)), name="w")
    opt = rp.wrap_optimizer(rp.optim.Adam([w]), shard=True)

    def step_fn(x):
        with rp.logical_device(1):
            opt.apply(rp.grad(rnp.sum(x @ w), [w]))
        return x

    with pytest.raises(rp.ReplicateError, match="logical_devices=2.*graph mode only"):
        rp.Replicator(lambda ctx: iter([np.ones((2, 3))]), step_fn, mode="eager",
                      logical_devices=2)


class _Gathered:
    """A communicator whose allgather returns the given rows (every rank's, as MPI would)."""

    def __init__(self, rows):
        self.size, self.rank, self.rows = len(rows), 0, rows

    def allgather_obj(self, _):
        return self.rows


def _row(schedule):
    return (None, fingerprint([r for r in schedule if not r[0].startswith("within ")]),
            schedule, None)


def test_each_device_group_compares_its_own_buckets():
    """The buckets of one device's group are compared among its processes (they differ between
    devices), the placement rows among every process."""
    common = [("transfer ...", "a.py:1")]
    dev = {d: [(f"within device{d}.of2: bucket mpi_reduce_scatter[sum] float64 of "
                f"[({36 + 6 * d},)]", "a.py:2")] for d in (0, 1)}
    good = [_row(common + dev[r % 2]) for r in range(4)]
    check_schedules(_Gathered(good), common + dev[0], None)  # (no error)
    bad = list(good)
    bad[2] = _row(common + [(dev[0][0][0].replace("36", "38"), "a.py:2")])
    with pytest.raises(rp.CollectiveMismatchError,
                       match=r"#0 of communicator device0.of2:\n  rank 0: .*\(36,\).*\n"
                             r"  rank 2: .*\(38,\)"):
        check_schedules(_Gathered(bad), common + dev[0], None)


@pytest.mark.mpi
@needs_mpi
def test_sharded_equals_unsharded_with_model_parallelism(tmp_path):
    """4 processes, logical_devices=2 (each device's state over its 2 processes), SGD momentum
    and AdamW with max_grad_norm (the norm over every device's slices), k = 1 and 2,
    micro-batches, unbucketed, Adam with dynamic loss scaling and check_finite, the JAX
    backend: the parameters and the whole optimiser state equal the unsharded model-parallel
    step's — bitwise in this run, 1e-12 allowed where a norm is split (its partial sums are
    added in another order); each device's gradients are reduce-scattered in one bucket.
    Mid-run each process holds half of its device's state (memory_report counts exactly that),
    none of the other device's."""
    out = tmp_path / "oracle.json"
    run([MPIEXEC, "-n", "4", sys.executable, "shard_mp_mpi.py", "oracle", str(out)],
        check=True)
    data = json.loads(out.read_text())
    assert data["size"] == 4
    for rank, results in enumerate(data["results"]):
        assert len(results) == 8
        for name, r in results.items():
            assert r["device"] == rank % 2 and r["group"] == rank // 2
            assert r["moved"] > 1e-2, name  # training moved the parameters
            assert r["max"] <= 1e-12 and (r["bitwise"] or "clip" in name), (name, r["diff"])
            assert r["comms"] == [f"device{rank % 2}.of2"], (name, r["comms"])
            # this device's 3 gradients in one bucket (the norm's sends do not split it)
            assert r["reduce_scatters"] == (3 if "unbucketed" in name else 1), (name, r)
            seen, plain = r["seen"], r["plain_seen"]
            assert seen["report"] == seen["held"] and plain["report"] == plain["held"], name
            # this device's 3 parameters' slots, sharded; the scalars (the step count, a loss
            # scale and its counter) whole
            assert seen["sharded"] == (3 if "sgd" in name else 6), name
            assert seen["count"] == plain["count"] <= seen["sharded"] + 3, name
            # half of this device's state, plus at most one element of padding per slice
            whole = 8 * (seen["count"] - seen["sharded"])  # (the scalars)
            assert seen["held"] <= (plain["held"] - whole) / 2 + whole + seen["sharded"] * 8, name
            assert seen["held"] < 0.55 * plain["held"], name


@pytest.mark.mpi
@needs_mpi
def test_a_model_parallel_sharded_checkpoint_restores_into_2_processes(tmp_path):
    """Saved on 4 processes (logical_devices=2, sharded): the checkpoint holds the whole state,
    equal to the unsharded run's. Restored into 2 processes — logical_devices=2 (one process
    per device: the state whole again) and logical_devices=1 (sharded over both) — sharded or
    not, it saves back bitwise and trains on alike."""
    run([MPIEXEC, "-n", "4", sys.executable, "shard_mp_mpi.py", "save", str(tmp_path)],
        check=True)
    out = tmp_path / "restore.json"
    run([MPIEXEC, "-n", "2", sys.executable, "shard_mp_mpi.py", "restore", str(tmp_path),
         str(out)], check=True)
    data = json.loads(out.read_text())
    assert data["size"] == 2
    assert data["saved_vs_plain"] == 0.0
    assert {"o/m/0", "o/v/5", "p/w3"} <= set(data["keys"])
    assert data["resaved_equal"] == {"2-True": True, "2-False": True, "1-True": True,
                                     "1-False": True}, data
    assert data["trained_diff"]["2"] == 0.0 and data["trained_diff"]["1"] <= 1e-12, data


def test_a_checkpoint_gathers_each_slice_by_its_layout():
    """With model parallelism both processes of a replica group hold the group's slice (after
    the end-of-run gather): the whole value is made of one slice per group, in group order, not
    of the job's ranks in order."""
    whole = np.arange(35.0).reshape(5, 7)
    lays = [ShardLayout((5, 7), 2, r // 2) for r in range(4)]  # process p: slice p // 2
    var = rp.Variable(np.zeros((5, 7)), name="w.m")
    var.value, var.shard = lays[0].part(whole), lays[0]
    rows = [[(lay, lay.part(whole))] for lay in lays]
    got = rp.sharding.whole_values(_Gathered(rows), {"w.m": var})
    assert np.array_equal(got["w.m"], whole)
    with pytest.raises(rp.ReplicateError, match=r"only slices \[0\] are held"):
        rp.sharding.whole_values(_Gathered(rows[:2]), {"w.m": var})
