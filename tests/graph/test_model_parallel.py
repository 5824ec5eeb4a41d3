"""Model parallelism (issue 19): ``rp.logical_device``, transfers rewritten into send/recv per
device, the GPipe schedule, micro-batches, and the errors for what cannot work.

The structural tests compile each device's part in this one process (``compiler.step_graph``
for device d: nothing is sent); the oracle across processes — m-way model parallel x R-way data
parallel with M micro-batches gives the parameters of one device with batch R*B — runs under
``mpiexec`` (``tests/runtime/programs/model_parallel_mpi.py``: 2, 3 and 4 processes), with what a
newcomer meets where the Variables live on their devices: the memory split, reading a Variable
on another device's process, checkpoints in the middle of a run, check_finite and check_sync.
"""

from __future__ import annotations

import os

import numpy as np
import pytest

import replicate as rp
import replicate.numpy as rnp
from conftest import ROOT, mpirun, needs_mpi, report
from replicate.compiler import step_graph
from replicate.context import ReplicaContext
from replicate.graph.devices import Placement
from replicate.graph.validate import validate
from replicate.model_parallel import Where
from replicate.step import trace_step


def two_layer(m_devices=2):
    w0 = rp.Variable(np.linspace(-1, 1, 12).reshape(3, 4), name="w0")
    w1 = rp.Variable(np.linspace(-1, 1, 8).reshape(4, 2), name="w1")
    opt = rp.wrap_optimizer(rp.optim.SGD([w0, w1], lr=0.1))

    def step_fn(batch):
        x, y = batch
        with rp.logical_device(0):
            h = rnp.tanh(x @ w0)
        with rp.logical_device(1 % m_devices):
            loss = ((h @ w1 - y) ** 2).mean()
        opt.apply(rp.grad(loss, [w0, w1]))
        return {"loss": loss}

    return step_fn, (w0, w1)


BATCH = (np.ones((4, 3)), np.zeros((4, 2)))


def device_graph(step_fn, device, micro=1, batches=(BATCH,), contexts=None):
    contexts = contexts or [ReplicaContext(0, 1)]
    return step_graph(step_fn, list(batches), contexts,
                      where=Where(m=2, micro=micro, device=device))


def count(graph, prim, **attrs):
    return sum(n.prim == prim and all(n.attrs.get(k) == v for k, v in attrs.items())
               for n in graph.nodes)


# -- placement: transfers, their gradients, and each device's part -------------------------------
def test_a_value_crossing_devices_is_a_transfer_and_its_gradient_the_transfer_back():
    step_fn, _ = two_layer()
    graph = trace_step(step_fn, [BATCH], [ReplicaContext(0, 1)], placement=Placement(2))
    moves = [(n.attrs["src"], n.attrs["dst"], n.placed.backward) for n in graph.nodes
             if n.prim == "transfer"]
    # forward: h and the labels y (the batch lives on device 0); backward: h's gradient
    assert sorted(moves) == [(0, 1, False), (0, 1, False), (1, 0, True)]
    devices = {n.prim: n.placed.device for n in graph.nodes if n.placed is not None
               and not n.placed.backward and n.prim in ("tanh", "reduce_sum")}
    assert devices == {"tanh": 0, "reduce_sum": 1}
    assert "transfer[src=0 dst=1]" in str(graph)


def test_each_device_runs_its_part_with_sends_and_receives():
    step_fn, _ = two_layer()
    parts = [device_graph(step_fn, d, micro=2) for d in (0, 1)]
    for g in parts:
        validate(g)
        assert g.meta.pipeline == "device 0: F0 F1 B1 B0 U\ndevice 1: F0 F1 B1 B0 U"
    d0, d1 = parts
    # device 0 sends h and y per micro-batch; receives h's gradient per micro-batch and both
    # micro-batches' losses — and device 1 mirrors it. No update is sent: w0 lives on device 0,
    # w1 on device 1 (the step counter is computed on both)
    assert (count(d0, "send"), count(d0, "recv")) == (4, 4)
    assert (count(d1, "send"), count(d1, "recv")) == (4, 4)
    assert count(d0, "send", dst=1) == 4 and count(d1, "recv", src=0) == 4
    assert count(d0, "matmul") == 4 and count(d1, "matmul") == 6  # 2 fwd + 2/4 bwd each
    assert "send[" in str(d0) and "recv[" in str(d1)


def sent_bytes(graph):
    return sum(int(np.prod(n.inputs[0].shape)) * n.inputs[0].dtype.itemsize
               for n in graph.nodes if n.prim == "send")


def test_variables_live_on_their_device_and_no_update_is_sent():
    step_fn, (w0, w1) = two_layer()
    d0, d1 = (device_graph(step_fn, d, micro=2) for d in (0, 1))
    homes = {v.name: d for v, d in d0.meta.homes}
    assert homes == {"w0": 0, "w1": 1} and {v.name: d for v, d in d1.meta.homes} == homes
    # each device is fed and updates its own parameters (and the step counter both need)
    assert [v.name for v in d0.meta.fed] == ["w0", "opt.step"]
    assert [v.name for v in d1.meta.fed] == ["w1", "opt.step"]
    assert [v.name for v in d0.meta.updated] == ["w0", "opt.step"]
    assert [v.name for v in d1.meta.updated] == ["w1", "opt.step"]
    assert len(d0.inputs) == 2 * 2 + 2 and "w1" not in d0.meta.input_names
    # what crosses devices per step: activations, labels, their gradients, the losses — the
    # bytes of a micro-batch's values (2 rows), never a parameter
    f64 = 8
    assert sent_bytes(d0) == 2 * (2 * 4 + 2 * 2) * f64  # h (2x4) and y (2x2) per micro-batch
    assert sent_bytes(d1) == 2 * (2 * 4 + 1) * f64  # h's gradient and the loss per micro-batch
    assert not any(n.prim == "send" and n.inputs[0].aval.shape in ((3, 4), (4, 2))
                   for g in (d0, d1) for n in g.nodes)


def test_a_variable_updated_on_one_device_and_read_on_another_is_still_sent():
    w0 = rp.Variable(np.ones((3, 4)), name="w0")
    scale = rp.Variable(np.ones(()), name="scale")  # updated on device 1, read on device 0

    def step_fn(batch):
        x, _ = batch
        with rp.logical_device(0):
            h = rnp.tanh(x @ w0) * scale
        with rp.logical_device(1):
            loss = (h * h).mean()
            scale.assign(scale * 0.5 + loss * 0.0)
        w0.assign(w0 - 0.1 * rp.all_reduce(rp.grad(loss, w0), "mean"))
        return {"loss": loss}

    d0, d1 = (device_graph(step_fn, d) for d in (0, 1))
    assert [(v.name, d) for v, d in d0.meta.homes] == [("w0", 0)]
    assert [v.name for v in d0.meta.updated] == ["w0", "scale"]  # scale's update received
    assert [v.name for v in d1.meta.updated] == ["scale"] and "w0" not in d1.meta.input_names
    assert count(d1, "send", dst=0) == 3  # h's gradient, the loss, scale's update


def test_the_schedule_sends_each_activation_before_the_next_micro_batch():
    step_fn, _ = two_layer()
    d0 = device_graph(step_fn, 0, micro=3, batches=[(np.ones((6, 3)), np.zeros((6, 2)))])
    order = [n.prim for n in d0.nodes if n.prim in ("tanh", "send", "recv")]
    # F0 F1 F2 (each tanh then its sends), then the backward passes receive the gradients
    assert order[:9] == ["tanh", "send", "send"] * 3 and order[9] == "recv"


def test_ops_outside_any_block_run_where_their_operands_are():
    step_fn, (w0, w1) = two_layer()
    graph = trace_step(step_fn, [BATCH], [ReplicaContext(0, 1)], placement=Placement(2))
    updates = graph.outputs[graph.meta.num_results:]
    owner = {v.name: x.node.placed.device for v, x in zip(graph.meta.updated, updates)}
    assert owner == {"w0": 0, "w1": 1, "opt.step": None}  # the step counter: every device


def test_one_logical_device_is_a_no_op():
    w = rp.Variable(np.ones(3), name="w")

    @rp.function
    def f(x):
        with rp.logical_device(0):
            return (x * w).sum()

    assert float(f(np.arange(3.0))) == 3.0


# -- errors -------------------------------------------------------------------------------------
def test_a_device_index_out_of_range_names_the_line():
    def step_fn(batch):
        with rp.logical_device(2):
            return batch[0].sum()

    with pytest.raises(rp.PlacementError, match=r"logical_device\(2\): this replica has 2 "
                       r"logical device\(s\), indices 0 to 1 \(at \S*test_model_parallel"
                       r"\.py:\d+"):
        device_graph(step_fn, 0)

    def f(x):
        with rp.logical_device(1):
            return x.sum()

    with pytest.raises(rp.PlacementError, match=r"1 logical device.*logical_devices=m"):
        rp.function(f)(np.ones(2))
    with pytest.raises(rp.PlacementError, match="outside a traced step"):
        with rp.logical_device(1):
            pass
    with pytest.raises(rp.PlacementError, match="is an int"):
        with rp.logical_device(1.0):
            pass


def test_a_trained_variable_read_on_two_devices_names_both_lines():
    w0 = rp.Variable(np.ones((3, 4)), name="w0")
    w1 = rp.Variable(np.ones((4, 2)), name="w1")

    def step_fn(batch):
        x, _ = batch
        with rp.logical_device(0):
            h = rnp.tanh(x @ w0)
        with rp.logical_device(1):
            loss = (h @ w1).sum() + (w0 * w0).sum()  # w0 read here too
        grads = rp.all_reduce(rp.grad(loss, [w0, w1]), "mean")
        w0.assign(w0 - 0.1 * grads[0])
        w1.assign(w1 - 0.1 * grads[1])
        return loss

    with pytest.raises(rp.PlacementError) as e:
        device_graph(step_fn, 0)
    text = str(e.value)
    assert "parameter 'w0' is updated on logical device" in text
    assert "(first at " in text and "h = rnp.tanh(x @ w0)" in text, text
    assert "loss = (h @ w1).sum() + (w0 * w0).sum()" in text, text


def test_a_weight_read_by_matmuls_on_two_devices_names_the_reads_not_grad_and_apply():
    """Each device's first read is named — the two lines the user must change — not the
    gradient's or the update's line, where the backward pass and the update read it too."""
    w0 = rp.Variable(np.ones((3, 3)), name="w0")
    w1 = rp.Variable(np.ones((3, 2)), name="w1")
    opt = rp.wrap_optimizer(rp.optim.SGD([w0, w1], lr=0.1))

    def step_fn(batch):
        x, _ = batch
        with rp.logical_device(0):
            h = rnp.tanh(x @ w0)
        with rp.logical_device(1):
            h2 = h @ w0
            loss = (h2 @ w1).sum()
        opt.apply(rp.grad(loss, [w0, w1]))
        return loss

    with pytest.raises(rp.PlacementError) as e:
        device_graph(step_fn, 0, batches=[(np.ones((4, 3)), np.zeros((4, 2)))])
    text = str(e.value)
    reads = text.split(" and read on ")[1].split(". A Variable")[0]
    assert "0 (first at " in reads and "h = rnp.tanh(x @ w0)" in reads, text
    assert "1 (first at " in reads and "h2 = h @ w0" in reads, text
    assert "rp.grad" not in reads and "opt.apply" not in reads, text


def test_replicas_that_place_ops_differently_name_the_lines():
    def step_fn(batch):
        x, _ = batch
        with rp.logical_device(rp.replica_id() % 2):  # replica 0 on device 0, replica 1 on 1
            return (x * 2.0).sum()

    contexts = [ReplicaContext(0, 2, local_id=0, replicas_per_rank=2),
                ReplicaContext(1, 2, local_id=1, replicas_per_rank=2)]
    with pytest.raises(rp.CollectiveMismatchError, match=r"(?s)disagree about the placement.*"
                       r"local replica 0: .* at \S*test_model_parallel.py:\d+.*"
                       r"local replica 1: .* at \S*test_model_parallel.py:\d+"):
        device_graph(step_fn, 0, batches=[BATCH, BATCH], contexts=contexts)


def test_per_replica_variables_are_refused_with_logical_devices():
    seen = rp.Variable(np.zeros(()), name="seen", per_replica=True)

    def step_fn(batch):
        seen.assign(seen + 1.0)
        with rp.logical_device(1):
            return batch[0].sum()

    with pytest.raises(rp.PlacementError, match="per-replica Variable 'seen'"):
        device_graph(step_fn, 0)


def test_replicator_arguments_are_checked():
    step_fn, _ = two_layer()

    def input_fn(ctx):
        while True:
            yield BATCH

    with pytest.raises(rp.ReplicateError, match="graph mode only"):
        rp.Replicator(input_fn, step_fn, mode="eager", logical_devices=2)
    with pytest.raises(rp.ReplicateError, match="does not divide the 1 process"):
        rp.Replicator(input_fn, step_fn, logical_devices=2)
    for bad in (0, 1.5, "2", True):
        with pytest.raises(rp.ReplicateError, match="micro_batches must be an int >= 1"):
            rp.Replicator(input_fn, step_fn, micro_batches=bad)
    with pytest.raises(rp.InputError, match=r"micro_batches=3 cuts.*shape \[4, 3\]"):
        rp.Replicator(input_fn, two_layer(1)[0], micro_batches=3).run(1)


# -- micro-batches in one process: the oracle ----------------------------------------------------
def test_micro_batches_give_the_parameters_of_one_big_batch():
    rng = np.random.default_rng(0)
    x, y = rng.normal(size=(48, 3)), rng.normal(size=(48, 2))

    def train(k, micro, batch):
        step_fn, params = two_layer(1)

        def input_fn(ctx):
            return rp.shard_batches((x, y), batch, ctx, seed=1, epochs=None)

        rep = rp.Replicator(input_fn, step_fn, replicas_per_rank=k, micro_batches=micro,
                            outputs="per_replica")
        hist = rep.run(3)
        return [p.numpy() for p in params], [h["loss"] for h in hist]

    got, losses = train(2, 3, 6)  # 2 replicas x 3 micro-batches of 2 rows
    ref, ref_losses = train(1, 1, 12)
    np.testing.assert_allclose(np.concatenate([g.ravel() for g in got]),
                               np.concatenate([r.ravel() for r in ref]), rtol=0, atol=1e-13)
    assert losses[0].shape == (6,)  # one per micro-batch: "per_replica" counts R * M
    np.testing.assert_allclose([h.mean() for h in losses], [h[0] for h in ref_losses], atol=1e-13)


def test_micro_batches_are_replicas_for_the_divergence_check():
    w = rp.Variable(np.ones(3), name="w")
    opt = rp.optim.SGD([w], lr=0.1)  # not wrapped: the micro-batches' gradients never combine

    def input_fn(ctx):
        while True:
            yield np.ones((4, 3))

    def step_fn(x):
        opt.apply([rp.grad((x @ w).sum(), w)])
        return {}

    with pytest.raises(rp.DivergenceError, match=r"(?s)variable 'w'.*micro_batches=2 each "
                                                 r"micro-batch is traced as a replica"):
        rp.Replicator(input_fn, step_fn, micro_batches=2).run(1)


# -- across processes ----------------------------------------------------------------------------
@pytest.mark.mpi
@needs_mpi[1]
@pytest.mark.parametrize("n, configs", [
    (2, ["2,1,1", "2,3,1", "2,2,2", "1,2,2", "per_replica", "mismatch", "newcomer",
         "finite"]),
    (3, ["3,2,1"]),
    (4, ["2,2,1", "4,2,1", "2,1,2", "diverged"]),  # 4 processes on 2 cores: oversubscribed
])
def test_model_parallel_oracle_across_processes(n, configs):
    result = mpirun("model_parallel_mpi.py", *configs, n=n)
    assert result.returncode == 0, report(result)
    for config in configs:  # (every rank checks; lines of different ranks may run together)
        assert result.stdout.count(f"OK {config}") == n, report(result)
    assert result.stdout.count("DONE") == n, report(result)


@pytest.mark.mpi
@needs_mpi[1]
def test_a_device_failing_mid_step_ends_the_job():
    result = mpirun("model_parallel_mpi.py", "crash", n=2, timeout=30)
    assert result.returncode != 0, report(result)
    assert "rank 1 failed at step 3" in result.stderr, report(result)
    assert "IndexError" in result.stderr and "model_parallel_mpi.py" in result.stderr


@pytest.mark.mpi
@needs_mpi[1]
def test_the_pipeline_example_runs_on_two_processes():
    result = mpirun(os.path.join(ROOT, "examples", "pipeline.py"), "--width", "16", "--depth",
                    "4", "--batch-size", "16", "--micro-batches", "1", "4", "--steps", "2",
                    "--warmup", "1", n=2)
    assert result.returncode == 0, report(result)
    assert "device 0: F0 F1 F2 F3 B3 B2 B1 B0 U" in result.stdout, report(result)
    rows = [line.split() for line in result.stdout.splitlines() if line.strip()[:1].isdigit()]
    assert [r[0] for r in rows] == ["1", "4"], report(result)
    assert [float(r[6]) for r in rows] == [0.5, 0.2]  # the GPipe formula beside the measurement
