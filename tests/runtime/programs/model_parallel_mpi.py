"""Model parallelism under mpiexec: the oracle for each R x m x M combination, and the errors.

    mpiexec -n 2 python model_parallel_mpi.py 2,1,1 2,3,1 2,2,2 mismatch
    mpiexec -n 4 python model_parallel_mpi.py 2,2,1 4,2,1
    mpiexec -n 2 python model_parallel_mpi.py crash      (ends the job: exit code 1)

A config ``m,M,k`` trains a 4-layer MLP (layer l on logical device l % m) with m logical devices,
M micro-batches and k replicas per process (R = n/m * k replicas) for 2 steps, and compares the
parameters and losses on every rank with one device trained on batch R*B in this process
(float64). Prints ``OK <config> <max error>`` per config, ``DONE`` at the end.
"""

from __future__ import annotations

import os
import shutil
import sys

import numpy as np

import replicate as rp
import replicate.numpy as rnp
from replicate.runtime.communication.comm import SelfComm

B, STEPS = 6, 2
WIDTHS = [5, 7, 6, 7, 3]


def data():
    rng = np.random.default_rng(0)
    x = rng.normal(size=(96, WIDTHS[0]))
    return x, (x[:, :WIDTHS[-1]] ** 2).astype(np.float64)


def train(m, micro, k, batch, comm=None, backend="numpy", outputs="mean"):
    rng = np.random.default_rng(1)
    ws = [rp.Variable(rng.normal(size=(a, b)) * 0.4, name=f"w{i}")
          for i, (a, b) in enumerate(zip(WIDTHS[:-1], WIDTHS[1:]))]
    bias = rp.Variable(np.zeros(WIDTHS[1]), name="bias")
    params = ws + [bias]
    opt = rp.wrap_optimizer(rp.optim.Adam(params, lr=0.05), max_grad_norm=1.0)
    x, y = data()

    def input_fn(ctx):
        return rp.shard_batches((x, y), batch, ctx, seed=3, epochs=None)

    def step_fn(b):
        h, target = b
        for i, w in enumerate(ws):
            with rp.logical_device(i % m):
                h = h @ w
                if i == 0:
                    h = h + bias
                if i < len(ws) - 1:
                    h = rnp.tanh(h)
        loss = ((h - target) ** 2).mean()  # outside any block: where its operands are
        opt.apply(rp.grad(loss, params))
        return {"loss": loss}

    rep = rp.Replicator(input_fn, step_fn, logical_devices=m, micro_batches=micro,
                        replicas_per_rank=k, comm=comm, backend=backend, outputs=outputs)
    hist = rep.run(STEPS)
    return [p.numpy().copy() for p in params], [np.asarray(h["loss"]) for h in hist], rep


def oracle(config, backend="numpy"):
    m, micro, k = (int(v) for v in config.split(","))
    got, losses, rep = train(m, micro, k, B * micro, backend=backend)
    R = rep.num_replicas
    ref, ref_losses, _ = train(1, 1, 1, B * micro * R, comm=SelfComm())
    err = max(float(np.abs(a - b).max()) for a, b in zip(got + losses, ref + ref_losses))
    assert err < 1e-12, (config, err)
    kinds = [n.prim for n in rep.compiled_graph().nodes]
    if m > 1:
        assert "send" in kinds and "recv" in kinds, kinds
    if m > 1 and rep.layout.groups > 1:  # the gradients' buckets, among this device's group
        comms = {n.attrs.get("comm") for n in rep.executable().graph.nodes
                 if n.prim in ("comm_start", "mpi_allreduce")}
        assert comms == {f"device{rep.layout.device}.of{m}"}, comms
    print(f"OK {config} {backend} R={R} {err:.1e}", flush=True)


def per_replica_outputs():
    _, _, rep = train(2, 3, 1, B * 3, outputs="per_replica")
    hist = rep.run(1)
    assert hist[0]["loss"].shape == (rep.num_replicas * 3,), hist[0]["loss"].shape
    print("OK per_replica outputs", flush=True)


class Symmetric:
    """Four 8x8 layers, two on each of m=2 devices, Adam with a dynamic loss scale (read on
    both devices: its update is still sent); ``state``: the checkpoint nest."""

    def __init__(self, m):
        rng = np.random.default_rng(2)
        self.ws = ws = [rp.Variable(rng.normal(size=(8, 8)) * 0.4, name=f"s{i}")
                        for i in range(4)]
        opt = rp.wrap_optimizer(rp.optim.Adam(ws, lr=0.05), loss_scale="dynamic")
        self.state = {"w": ws, "opt": opt.variables()}
        x = rng.normal(size=(96, 8))
        y = np.tanh(x[:, ::-1] ** 2)

        def input_fn(ctx):
            return rp.shard_batches((x, y), B, ctx, seed=3, epochs=None)

        def step_fn(b):
            h, target = b
            for i, w in enumerate(ws):
                with rp.logical_device(i * m // 4):
                    h = rnp.tanh(h @ w)
            loss = ((h - target) ** 2).mean()
            opt.apply(rp.grad(opt.scale(loss), ws))
            return {"loss": loss}

        self.m, self.input_fn, self.step_fn = m, input_fn, step_fn

    def run(self, steps, comm=None, callbacks=(), restore=None, check_sync=True):
        """The weights after ``steps`` steps of a new Replicator (``restore``: from there)."""
        rep = rp.Replicator(self.input_fn, self.step_fn, logical_devices=self.m, comm=comm,
                            check_sync=check_sync)
        if restore:
            rep.restore(restore, self.state)
        rep.run(steps, callbacks=callbacks)
        return [w.numpy().copy() for w in self.ws]

    def nbytes(self):
        """(bytes of the state this process holds a value of, bytes of the whole state)"""
        leaves = self.ws + list(self.state["opt"].values())
        total = sum(v.size * v.dtype.itemsize for v in leaves)
        return sum(v.value.nbytes for v in leaves if v.released is None), total


def expect_placement_error(what, fn, name, device):
    try:
        fn()
    except rp.PlacementError as e:
        text = str(e)
        assert f"Variable {name!r} lives on logical device {device}" in text, text
        assert f"(rank {device})" in text and "after run() returns" in text, text
        return
    raise AssertionError(f"{what} of {name!r} on a process that does not hold it: no error")


def close(a, b):
    err = max(float(np.abs(x - y).max()) for x, y in zip(a, b))
    assert err < 1e-12, err


def newcomer():
    """m=2 on 2 processes: the Variables' memory is split between the steps (a checkpoint in
    the middle of the run gathers them and drops them again); reading one on the other
    device's process is an error naming it; the end of run gathers every value; the checkpoint
    restores with and without model parallelism; check_sync (every step) passes."""
    other = 1 - rp.process_index()  # s0, s1 live on device 0; s2, s3 on device 1
    theirs = f"s{2 * other}"
    folder = f"/tmp/replicate-mp-{int(rp.host.broadcast(np.array([os.getpid()]))[0])}"
    path = folder + "/ck-{step}.npz"
    model = Symmetric(2)
    shares = []

    def probe(rep, step, outputs):
        held, total = model.nbytes()
        shares.append(held / total)
        w = model.ws[2 * other]
        expect_placement_error("numpy()", w.numpy, theirs, other)
        expect_placement_error("an eager op", lambda: w * 2.0, theirs, other)
        expect_placement_error("rp.function", lambda: rp.function(lambda: w.sum())(), theirs,
                               other)
        expect_placement_error("assign", lambda: w.assign(np.zeros((8, 8))), theirs, other)
        assert f"lives on logical device {other}" in repr(w), repr(w)

    try:
        got = model.run(2, callbacks=[rp.callbacks.Checkpoint(path, model.state, every=1,
                                                              keep=0), probe], check_sync=1)
        assert all(0.45 < share < 0.55 for share in shares), shares  # half of the state each
        held, total = model.nbytes()
        assert held == total, (held, total)  # after run: every value everywhere
        ref1, ref2 = Symmetric(1).run(1, comm=SelfComm()), Symmetric(1).run(2, comm=SelfComm())
        close(got, ref2)
        saved, info = rp.checkpoint.load(path.format(step=1))
        assert info["step"] == 1 and len(saved) == 4 + len(model.state["opt"]), sorted(saved)
        close([saved[f"w/{i}"] for i in range(4)], ref1)
        close(Symmetric(2).run(1, restore=path.format(step=1)), ref2)  # into m=2 ...
        close(Symmetric(1).run(1, comm=SelfComm(), restore=path.format(step=1)), ref2)  # m=1
    finally:
        rp.host.barrier()
        if rp.process_index() == 0:
            shutil.rmtree(folder, ignore_errors=True)
    print(f"OK newcomer shares={[round(s, 3) for s in shares]}", flush=True)


def finite():
    """check_finite: a non-finite update made on device 1 only (its Variable lives there) is
    found by every process, which all raise, naming it."""
    w0 = rp.Variable(np.ones((3, 4)), name="w0")
    bad = rp.Variable(np.ones(()), name="bad")
    opt = rp.wrap_optimizer(rp.optim.SGD([w0], lr=0.1))

    def input_fn(ctx):
        while True:
            yield np.ones((4, 3))

    def step_fn(x):
        with rp.logical_device(0):
            h = rnp.tanh(x @ w0)
        with rp.logical_device(1):
            loss = (h * h).mean()
            bad.assign(bad * (loss - loss) / (loss - loss))  # 0/0, not used by the loss
        opt.apply(rp.grad(loss, [w0]))
        return loss

    try:
        rp.Replicator(input_fn, step_fn, logical_devices=2, check_finite=True).run(2)
    except rp.NonFiniteError as e:
        assert "variable 'bad'" in str(e), str(e)
        print("OK finite", flush=True)
        return
    raise AssertionError("no NonFiniteError for an update made on another device")


def diverged():
    """m=2 x R=2 on 4 processes, check_sync every step: a weight perturbed on one process of
    the device that holds it is found (that device's processes compare it)."""
    model = Symmetric(2)

    def perturb(rep, step, outputs):
        if step == 1 and rp.process_index() == 2:  # group 1, device 0: it holds s0
            model.ws[0].assign(model.ws[0].numpy() + 1.0)

    try:
        model.run(2, callbacks=[perturb], check_sync=1)
    except rp.DivergenceError as e:
        assert "variable 's0'" in str(e) and "rank(s) [2] differ" in str(e), str(e)
        print("OK diverged", flush=True)
        return
    raise AssertionError("check_sync missed a diverged weight")


def mismatch():
    """A placement that differs between processes is an error on every rank, naming lines."""
    w0 = rp.Variable(np.ones((3, 4)), name="w0")
    w1 = rp.Variable(np.ones((4, 2)), name="w1")
    opt = rp.wrap_optimizer(rp.optim.SGD([w0, w1], lr=0.1))

    def input_fn(ctx):
        while True:
            yield np.ones((4, 3))

    def step_fn(x):
        with rp.logical_device(0):
            h = rnp.tanh(x @ w0)
        with rp.logical_device(rp.process_index() % 2):  # each process places it elsewhere
            loss = (h @ w1).sum()
        opt.apply(rp.grad(loss, [w0, w1]))
        return loss

    try:
        rp.Replicator(input_fn, step_fn, logical_devices=2).run(2)
    except rp.CollectiveMismatchError as e:
        text = str(e)
        assert "rank 0:" in text and "rank 1:" in text, text
        assert "model_parallel_mpi.py:" in text and "transfer from device 0 to 1" in text, text
        print("OK mismatch", flush=True)
        return
    raise AssertionError("no error for a placement that differs between processes")


def crash():
    """Device 1 fails in the middle of a step while device 0 waits for its gradient: the job
    ends (no hang), naming the rank and the user's line."""
    w0 = rp.Variable(np.ones((3, 4)), name="w0")
    w1 = rp.Variable(np.ones((4, 2)), name="w1")
    opt = rp.wrap_optimizer(rp.optim.SGD([w0, w1], lr=0.1))

    def input_fn(ctx):
        for step in range(1, 100):  # (the batch is read on device 0 and sent on)
            yield np.ones((4, 3)), np.array([0, 1, 2, 3 if step < 3 else 9])

    def step_fn(b):
        x, index = b
        with rp.logical_device(0):
            h = rnp.tanh(x @ w0)
        with rp.logical_device(1):
            loss = (h[index] @ w1).sum()  # index 9 at step 3: IndexError on device 1
        opt.apply(rp.grad(loss, [w0, w1]))
        return loss

    rp.Replicator(input_fn, step_fn, logical_devices=2).run(5)


if __name__ == "__main__":
    for arg in sys.argv[1:]:
        if arg == "mismatch":
            mismatch()
        elif arg == "crash":
            crash()
        elif arg in ("newcomer", "finite", "diverged"):
            globals()[arg]()
        elif arg == "per_replica":
            per_replica_outputs()
        elif arg.startswith("jax:"):
            oracle(arg[4:], backend="jax")
        else:
            oracle(arg)
    print("DONE", flush=True)
