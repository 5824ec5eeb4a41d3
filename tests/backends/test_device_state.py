"""State lives on the device (issue 18): the cupy backend keeps variables in device memory between
steps, copies up only the batch and copies down only the results; the runtime's host readers
(``numpy()``, eager mode, checkpoints, the sync and finite checks) each copy what they read;
``rp.function`` takes and returns CuPy and JAX arrays; the GPU transports are chosen alike on
every rank and reduce bitwise as the host path (under ``mpiexec -n 2``).

Without a GPU all of it runs on the CuPy stand-in (``cupy_standin.py``), whose own count of
copies (``TRANSFERS``: every ``asarray``/``get`` and every host read of a device value) must
equal the backend's (``DEVICE.transfers``): no copy escapes the count.
"""

from __future__ import annotations

import importlib.util
import os
import threading
import warnings

import cupy_standin
import numpy as np
import pytest

import replicate as rp
import replicate.numpy as rnp
from conftest import PROGRAMS, child_env, mpirun, needs_mpi, report  # noqa: E402
from replicate.backends import available

pytestmark = pytest.mark.skipif("cupy" not in available(), reason=(
    "the cupy backend is not available: no GPU, and the CuPy stand-in is off "
    "(REPLICATE_CUPY_STANDIN=0)"))
HAVE_JAX = importlib.util.find_spec("jax") is not None


def _counted(fn):
    """(fn's result, bytes the backend counted each way, bytes the stand-in counted — on a GPU,
    where the stand-in is off, the backend's count again)."""
    from replicate.backends.cupy_device import DEVICE

    ours, theirs = dict(DEVICE.transfers), dict(cupy_standin.TRANSFERS)
    out = fn()
    moved = {k: DEVICE.transfers[k] - v for k, v in ours.items()}
    if not cupy_standin.ACTIVE:
        return out, moved, moved
    return out, moved, {k: cupy_standin.TRANSFERS[k] - v for k, v in theirs.items()}


def _mlp(seed=0):
    """A newcomer's MLP: Sequential, softmax cross-entropy (integer labels), Adam."""
    rng = np.random.default_rng(seed)
    model = rp.nn.Sequential(rp.nn.Linear(16, 32), rp.nn.relu, rp.nn.Linear(32, 4))
    opt = rp.optim.Adam(model.parameters(), lr=1e-2)

    def step(x, y):
        loss = rp.nn.softmax_cross_entropy(model(x), y).mean()
        opt.apply(rp.grad(loss, model.parameters()))
        return loss

    batches = [(rng.standard_normal((8, 16)).astype(np.float32), rng.integers(0, 4, 8))
               for _ in range(4)]
    return model, opt, step, batches


def test_a_steady_state_step_moves_only_the_batch_in_and_the_loss_out():
    model, opt, step_fn, batches = _mlp()
    model2, opt2, step2, _ = _mlp()  # the same training on NumPy
    for a, b in zip(model.parameters().values(), model2.parameters().values()):
        b.assign(a.numpy())
    f = rp.function(step_fn, backend="cupy")
    from replicate.backends.cupy_device import DEVICE

    losses, moves = [], []
    for x, y in batches:
        loss, moved, standin = _counted(lambda x=x, y=y: f(x, y))
        assert moved == standin  # every copy went through the backend's count
        losses.append(float(loss))
        moves.append((moved, x.nbytes + y.nbytes, loss.nbytes))
    nodes = f.executable(*batches[0]).graph.nodes
    assert any(n.prim == "getitem" and len(n.inputs) > 1 for n in nodes)  # logits[rows, y]
    for moved, batch, out in moves[1:]:  # the first step also copies the state up, once
        assert moved == {"to_device": batch, "to_host": out}, moved  # (labels checked here)
    state = [v for v in f.graph(*batches[0]).meta.variables]
    assert len(state) == 3 * 4 + 1  # 4 parameters, Adam's 2 moments each, its step count
    assert all(v.on_device is DEVICE for v in state)
    g = rp.function(step2)
    want = [float(g(x, y)) for x, y in batches]
    np.testing.assert_allclose(losses, want, rtol=1e-4)  # float32 (cuBLAS on a GPU)
    for a, b in zip(model.parameters().values(), model2.parameters().values()):
        np.testing.assert_allclose(a.numpy(), b.numpy(), rtol=1e-4, atol=1e-5)


def test_numpy_copies_a_device_value_once_and_host_writes_go_back_up_once():
    w = rp.Variable(np.arange(6.0).reshape(2, 3), name="w_dev")
    f = rp.function(lambda x: w.assign(w * x) or rnp.sum(w), backend="cupy")
    f(np.float64(2.0))
    assert w.on_device is not None and repr(w).endswith("on cupy)")
    value, moved, _ = _counted(w.numpy)
    assert moved["to_host"] == 48 and value.tolist() == [[0, 2, 4], [6, 8, 10]]
    _, moved, _ = _counted(w.numpy)
    assert moved["to_host"] == 0  # kept on the host until the next device write
    assert np.asarray(w).tolist() == value.tolist() and w.shape == (2, 3)
    w.assign(np.ones((2, 3)))  # a host write (outside a step): the device copy is dropped
    assert w.on_device is None
    out, moved, _ = _counted(lambda: f(np.float64(3.0)))
    assert moved["to_device"] == 48 + 8 and float(out) == 18.0  # w up once, and the batch
    _, moved, _ = _counted(lambda: f(np.float64(1.0)))
    assert moved["to_device"] == 8


def test_eager_mode_graph_mode_and_checkpoints_share_device_state(tmp_path):
    w = rp.Variable(np.ones(3), name="w_mix")

    def step(x):
        loss = rnp.sum((w * x) ** 2)
        w.assign(w - 0.1 * rp.grad(loss, w))
        return loss

    graph = rp.function(step, backend="cupy")
    eager = rp.function(step, mode="eager")
    ref = rp.Variable(np.ones(3), name="w_ref")
    x = np.array([1.0, 2.0, 3.0])
    graph(x)
    assert w.on_device is not None
    eager(x)  # reads the device value (copied down), writes on the host
    assert w.on_device is None
    graph(x)
    for _ in range(3):
        ref.assign(ref - 0.1 * 2 * x * x * ref)
    np.testing.assert_allclose(w.numpy(), ref.numpy(), rtol=1e-12)
    path = str(tmp_path / "ckpt.npz")
    rp.checkpoint.save(path, {"w": w}, step=3)  # reads the device value
    saved = w.numpy().copy()
    graph(x)
    rp.checkpoint.restore(path, {"w": w})
    assert w.on_device is None and w.numpy().tolist() == saved.tolist()
    graph(x)  # continues from the restored value, copied up again
    np.testing.assert_allclose(w.numpy(), saved - 0.2 * x * x * saved, rtol=1e-12)


def test_a_replicator_step_of_two_replicas_combines_them_on_the_device():
    w = rp.Variable(np.zeros(4, np.float32), name="w_rep")
    per = rp.Variable(np.zeros(4, np.float32), name="acc", per_replica=True)
    data = np.arange(32, dtype=np.float32).reshape(8, 4)

    def input_fn(ctx):
        return rp.shard_batches(data, 2, ctx, epochs=None)

    def step_fn(x):
        g = rp.all_reduce(rnp.mean(x, axis=0), "mean")  # a local_reduce of the 2 replicas
        w.assign(w + g)
        per.assign(per + rnp.sum(x, axis=0))
        return {"g": rnp.sum(g)}

    # prefetch=0: the step copies its batches up itself (with prefetch on, the prefetch thread
    # copies the next ones during the step: tests below)
    rep = rp.Replicator(input_fn, step_fn, backend="cupy", replicas_per_rank=2, prefetch=0)
    rep.run(1)
    prims = {n.prim for n in rep.executable().graph.nodes}
    assert "local_reduce" in prims and not {"mpi_allreduce", "comm_start"} & prims
    (_, moved, standin) = _counted(lambda: rep.run(1))
    assert moved == standin
    assert moved == {"to_device": 2 * 2 * 4 * 4, "to_host": 2 * 4}, moved  # batches; outputs
    got_w, got_per = w.numpy().copy(), per.numpy().copy()
    w.assign(np.zeros(4)), per.restart(np.zeros(4))
    rp.Replicator(input_fn, step_fn, replicas_per_rank=2).run(2)
    assert got_w.tolist() == w.numpy().tolist() and got_per.tolist() == per.numpy().tolist()
    assert got_per.shape == (2, 4)


def test_a_failed_step_leaves_the_device_variables_as_they_were():
    w = rp.Variable(np.ones(3), name="w_fail")
    table = rp.Variable(np.arange(5.0), name="table")

    def step(x, i):
        w.assign(w * 2.0)
        return rnp.sum(rnp.sqrt(x) * w) + table[i].sum()

    f = rp.function(step, backend="cupy")
    f(np.ones(3), np.array([0, 4]))
    before = w.numpy().copy()
    with pytest.raises(IndexError, match="index 5 is out of bounds for axis 0 with size 5"):
        f(np.ones(3), np.array([1, 5]))  # NumPy raises; CuPy would wrap around (host check)
    import cupy

    with pytest.raises(IndexError, match="index -6 is out of bounds for axis 0 with size 5"):
        f(np.ones(3), cupy.asarray(np.array([-6, 1])))  # a device index: checked there
    g = rp.function(lambda x, i: step(x, i * 2), backend="cupy")  # computed on the device
    (_, moved, _) = _counted(lambda: g(np.ones(3), np.array([1, 2])))
    assert moved["to_host"] == 8 + 1  # the result and the one flag
    with pytest.raises(IndexError, match="index 6 is out of bounds for axis 0 with size 5"):
        g(np.ones(3), np.array([1, 3]))
    w.assign(before)
    input_fn = lambda ctx: iter([np.ones(3), -np.ones(3)])  # noqa: E731 - sqrt(-1): nan
    rep = rp.Replicator(input_fn, lambda x: {"l": step(x, np.array([0]))}, backend="cupy",
                        check_finite=True)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        with pytest.raises(rp.NonFiniteError, match=r"sqrt\(f64\[3\]\) -> f64\[3\] at "):
            rep.run(2)
    assert w.numpy().tolist() == (before * 2).tolist()  # step 1 written, step 2 not


def test_function_returns_cupy_arrays_when_given_them_without_copying_them():
    import cupy

    w = rp.Variable(np.ones(3, np.float32), name="w_cp")
    f = rp.function(lambda x: (x * w, rnp.sum(x)), backend="cupy")
    x = cupy.asarray(np.arange(3, dtype=np.float32))
    (a, s), moved, _ = _counted(lambda: f(x))
    assert isinstance(a, cupy.ndarray) and isinstance(s, cupy.ndarray)
    assert moved == {"to_device": 12, "to_host": 0}  # w, once; x and the results stay
    _, moved, _ = _counted(lambda: f(x))
    assert moved == {"to_device": 0, "to_host": 0}
    assert a.get().tolist() == [0, 1, 2] and float(s) == 3.0
    b, t = rp.function(lambda x: (x * w, rnp.sum(x)))(x)  # a host backend: CuPy out too
    assert isinstance(b, cupy.ndarray) and b.get().tolist() == [0, 1, 2]
    host = f(np.arange(3, dtype=np.float32))
    assert type(host[0]) is np.ndarray  # NumPy in, NumPy out
    v = rp.Variable(x * 2, name="from_cupy")  # a Variable made from a device array
    assert v.numpy().tolist() == [0, 2, 4] and v.on_device is None


@pytest.mark.skipif(not HAVE_JAX, reason="jax not installed")
@pytest.mark.parametrize("backend", ["cupy", "jax", "numpy"])
def test_function_returns_jax_arrays_when_given_them(backend):
    import jax
    import jax.numpy as jnp

    f = rp.function(lambda x: rnp.tanh(x) * 2.0, backend=backend)
    x = jnp.linspace(-1.0, 1.0, 5, dtype=jnp.float32)
    out = f(x)
    assert isinstance(out, jax.Array)
    np.testing.assert_allclose(np.asarray(out), np.tanh(np.asarray(x)) * 2, rtol=1e-6)
    assert type(f(np.asarray(x))) is np.ndarray


def test_constants_and_random_bits_are_made_once_and_on_the_device():
    table = np.linspace(0.0, 1.0, 1000)

    def draw(key, x):
        return rnp.random.uniform(key, (64,), np.float32), rnp.random.split(key, 3), \
            rnp.sum(table * x)

    f = rp.function(draw, backend="cupy")
    key = rnp.random.key(3).numpy()
    _, moved, _ = _counted(lambda: f(key, np.float64(2.0)))
    assert moved["to_device"] >= table.nbytes  # the constant, at lowering
    got, moved, standin = _counted(lambda: f(key, np.float64(2.0)))
    assert moved == standin and moved["to_device"] == key.nbytes + 8, moved
    want = rp.function(draw)(key, np.float64(2.0))
    for a, b in zip(got[:2], want[:2]):  # the random bits: NumPy's, bit for bit
        assert a.dtype == b.dtype and a.tobytes() == b.tobytes()
    np.testing.assert_allclose(got[2], want[2], rtol=1e-12)


def test_transport_choice():
    from replicate.runtime.communication.gpu_transport import (
        Facts,
        choose,
        cuda_aware_mpi,
        requested,
    )

    own = [Facts("n0", "0000:17:00.0", True, False), Facts("n0", "0000:18:00.0", True, False),
           Facts("n1", "0000:17:00.0", True, False)]  # one bus id on two machines: not shared
    shared = own[:1] + [Facts("n0", "0000:17:00.0", True, False)]
    no_nccl = [Facts("n0", "0000:17:00.0", False, False), own[1]]
    assert choose("auto", own) == ("nccl", "each rank has its own GPU")
    kind, why = choose("auto", shared)
    assert kind == "host" and "ranks 0 and 1 share GPU 0000:17:00.0 on n0" in why
    assert "Duplicate GPU detected" in why
    kind, why = choose("auto", no_nccl)
    assert kind == "host" and "NCCL does not load on rank(s) [0]" in why
    aware = [Facts(f.host, f.gpu, False, True) for f in own]
    assert choose("auto", aware)[0] == "cuda-aware-mpi"
    assert choose("host", own) == ("host", "REPLICATE_TRANSPORT=host")
    assert choose("cuda-aware-mpi", own)[1].endswith("must be CUDA-aware, or it will fail)")
    with pytest.raises(rp.ReplicateError, match=r"share GPU .*Duplicate GPU detected.*=host"):
        choose("nccl", shared)
    with pytest.raises(rp.ReplicateError, match=r"NCCL does not load on rank\(s\) \[0\]"):
        choose("nccl", no_nccl)
    assert requested({}) == "auto" and requested({"REPLICATE_TRANSPORT": " NCCL "}) == "nccl"
    with pytest.raises(rp.ReplicateError, match="REPLICATE_TRANSPORT='gloo': choose one of"):
        requested({"REPLICATE_TRANSPORT": "gloo"})
    assert not cuda_aware_mpi({}) and cuda_aware_mpi({"MPICH_GPU_SUPPORT_ENABLED": "1"})


@pytest.mark.parametrize("ranks", [2])
def test_two_processes_over_every_transport(ranks):
    """NCCL (each rank its own GPU), CUDA-aware MPI (asked for), host-staged (one shared GPU):
    NumPy's results, bitwise the same parameters whichever carries the reductions; NCCL on one
    shared GPU refused on every rank."""
    if not cupy_standin.ACTIVE:
        pytest.skip("a GPU is here: this runs the stand-in's NCCL (bench/gpu_nccl_check.py "
                    "checks the real one)")
    result = mpirun(os.path.join(PROGRAMS, "gpu_transport_mpi.py"), n=ranks, timeout=120,
                    env=child_env())
    assert result.returncode == 0, report(result)
    for check in ("own GPUs as numpy over nccl", "CUDA-aware MPI as numpy over cuda-aware-mpi",
                  "one shared GPU as numpy over host", "forced NCCL on one GPU refused",
                  "the stand-in NCCL takes integers only",
                  "the stand-in NCCL refuses too", "own GPUs sharded as numpy over nccl",
                  "CUDA-aware MPI sharded as numpy over cuda-aware-mpi",
                  "one shared GPU sharded as numpy over host"):
        assert result.stdout.count(check) == ranks, report(result)


for _mark in needs_mpi:
    test_two_processes_over_every_transport = _mark(test_two_processes_over_every_transport)


def test_variables_keep_one_device_buffer_written_in_place_and_never_the_callers():
    """A step's commit writes each variable's new value into the device buffer it already has
    (one address from step to step, no new buffer kept per step) with the reference's values; a
    variable only written, or written with another's value, gets a buffer of its own; a device
    result that is a variable (or a view of one) is a copy, not changed by the next step."""
    import cupy

    model, _, step, batches = _mlp()
    ref_model, _, ref_step, _ = _mlp()
    for p, q in zip(model.parameters().values(), ref_model.parameters().values()):
        q.load(p.numpy())
    f = rp.function(step, backend="cupy")
    f(*batches[0])
    state = f.executable(*batches[0]).graph.meta.updated  # parameters, Adam's moments, count
    held = [v.held for v in state]
    ptrs = [h.data.ptr for h in held]
    for x, y in batches[1:]:
        f(x, y)
    assert len(state) > 4 and [v.held.data.ptr for v in state] == ptrs
    assert all(v.held is h for v, h in zip(state, held))
    g = rp.function(ref_step)
    for x, y in batches:
        g(x, y)
    for p, q in zip(model.parameters().values(), ref_model.parameters().values()):
        np.testing.assert_allclose(p.numpy(), q.numpy(), rtol=1e-5, atol=1e-6)

    w = rp.Variable(np.ones(3, np.float32), name="w_inplace")
    v = rp.Variable(np.zeros(3, np.float32), name="v_written_only")

    def h(x):
        w.assign(w + x)
        v.assign(w)
        return w, w.reshape((3, 1))

    fh = rp.function(h, backend="cupy")
    read = rp.function(lambda x: (w, rnp.reshape(w, (3, 1)), x + 0), backend="cupy")
    x = cupy.asarray(np.ones(3, np.float32))
    r0, r1 = fh(x)
    assert v.held is not w.held and r0 is not w.held
    s0, s1, _ = read(x)  # w itself, and a view of it
    fh(x)
    for r in (r0, r1, s0, s1):
        assert r.get().reshape(-1).tolist() == [2.0] * 3
    assert w.numpy().tolist() == [3.0] * 3 and v.numpy().tolist() == [3.0] * 3


def _staged_training(backend, prefetch, steps=6, log=None):
    w = rp.Variable(np.zeros(4, np.float32), name="w_staged")
    data = np.arange(48, dtype=np.float32).reshape(12, 4)

    def input_fn(ctx):
        return rp.shard_batches(data, 2, ctx, epochs=None)

    def step_fn(x):
        w.assign(w * 0.5 + rp.all_reduce(rnp.mean(x, axis=0), "mean"))
        return {"s": rnp.sum(w)}

    rep = rp.Replicator(input_fn, step_fn, backend=backend, replicas_per_rank=2,
                        prefetch=prefetch)
    rep.run(1)
    runs = [] if log is None else log  # ("run", thread, inputs) per step after the first
    exe = rep.executable()
    real_run = exe.run
    exe.run = lambda inputs: runs.append(("run", threading.current_thread().name,
                                          list(inputs))) or real_run(inputs)
    history = rep.run(steps - 1)
    return [r for r in runs if r[0] == "run"], [float(h["s"]) for h in history], \
        w.numpy().copy()


@pytest.mark.parametrize("prefetch", [2, 0])
def test_prefetch_copies_batches_up_on_its_thread_and_the_step_waits_for_them(prefetch):
    """With prefetch on, the prefetch thread copies each batch up (on its own stream, an event
    recorded after the copies) once the first step is compiled; the step's stream waits for that
    event before the step reads the batch; the values are those of prefetch=0 (every batch
    copied up by the step, on the main thread) and of the NumPy backend."""
    from replicate.backends.cupy_device import DEVICE

    with DEVICE.recording_staging() as log:  # the backend's own record: the same on a GPU
        runs, history, w = _staged_training("cupy", prefetch, log=log)
    _, want_history, want_w = _staged_training("numpy", 0)
    assert history == want_history and w.tolist() == want_w.tolist()
    main = threading.main_thread().name
    staged = {}  # id of a staged device array -> the event recorded after its copy
    for what, thread, obj in log:
        if what == "stage":
            assert thread == "replicate-prefetch"
            buffers, event, _ = obj
            staged.update((id(b), event) for b in buffers)
    used = [x for r in runs for x in r[2] if id(x) in staged]
    if prefetch == 0:
        assert not staged and not used
        assert {t for what, t, _ in log if what == "upload"} == {main}
        return
    # batches 1 to 4 are drawn before the first step is compiled (the backend unknown yet)
    assert len(used) >= 2 * 2, "batches 5 and 6 of both replicas come staged"
    waited: set = set()  # the events the main thread's stream waited for, so far
    for what, thread, obj in log:
        if what == "wait" and thread == main:
            waited.add(id(obj))
        if what == "run":
            assert thread == main
            assert all(id(staged[id(x)]) in waited for x in obj if id(x) in staged)


def test_cupys_devices_streams_events_and_nccl_ids_are_as_the_standin_models_them(monkeypatch):
    """What ``cupy_standin_cuda.py`` models of CuPy 14 and the backend relies on, asserted of
    whichever ``cupy`` is in place (on a GPU, of the real one): the current device and current
    streams are per host thread (a new thread starts on device 0, on the null stream);
    ``Device.use`` returns the device; ``Event.record`` takes a ``Stream``, not its pointer; NCCL's
    unique id is 128 ``bytes`` and a tuple is refused. With two devices: a stream made current
    or recorded on from another device fails, a stream waits for another device's event."""
    import cupy

    from replicate.runtime.communication.gpu_transport import nccl_module

    cuda = cupy.cuda
    if cupy_standin.ACTIVE:
        monkeypatch.setenv("REPLICATE_STANDIN_DEVICES", "2")
    main = cuda.runtime.getDevice()
    device = cuda.Device(main)
    assert device.use() is device
    stream = cuda.Stream(non_blocking=True)
    assert stream.device_id == main
    with stream:
        assert cuda.get_current_stream() == stream
        seen = {}
        thread = threading.Thread(target=lambda: seen.update(
            device=cuda.runtime.getDevice(), stream=cuda.get_current_stream()))
        thread.start()
        thread.join()
        assert seen == {"device": 0, "stream": cuda.Stream.null}
    assert cuda.get_current_stream() == cuda.Stream.null
    cuda.get_current_stream().wait_event(stream.record())
    with pytest.raises(AttributeError):
        cuda.Event().record(stream.ptr)
    nccl = nccl_module()
    if nccl is not None:
        uid = nccl.get_unique_id()
        assert type(uid) is bytes and len(uid) == 128
        with pytest.raises(TypeError, match=r"Argument 'commId' has incorrect type \(expected "
                                            r"bytes, got tuple\)"):
            nccl.NcclCommunicator(1, tuple(uid), 0)
    if cuda.runtime.getDeviceCount() < 2:
        return
    with cuda.Device(1):
        other = cuda.Stream(non_blocking=True)
        assert other.device_id == 1 and cuda.get_current_stream(0) == cuda.Stream.null
        seen = []
        thread = threading.Thread(target=lambda: seen.append(cuda.runtime.getDevice()))
        thread.start()
        thread.join()
        assert seen == [0]
        event = other.record()
    with cuda.Device(0):
        cuda.get_current_stream().wait_event(event)  # (CUDA allows another device's event)
        for wrong in (other.use, other.__enter__, other.record, lambda: cuda.Event().record(
                other)):
            with pytest.raises(RuntimeError):
                wrong()


def test_the_prefetch_thread_stages_batches_on_the_ranks_gpu(monkeypatch):
    """CuPy's current device is per host thread (a new thread starts on device 0), and only the
    main thread selects the rank's GPU: with two GPUs and this process placed on GPU 1 (as rank
    1 of two on one machine is), the prefetch thread's stream, buffers and events must be on
    GPU 1 too, and the training NumPy's."""
    if not cupy_standin.ACTIVE:
        pytest.skip("a GPU is here: this places the process on the stand-in's second device")
    import cupy_standin_cuda as cuda

    from replicate.backends import cupy_device
    from replicate.backends.base import PLACEMENT

    log = []  # (what, thread, current device, stream's device, event's device)
    real_set, real_record = cupy_standin.ndarray.set, cuda.Stream.record

    def set_(self, arr, stream=None):
        log.append(("set", threading.current_thread().name, cuda.STATE.device,
                    stream.device_id, None))
        return real_set(self, arr, stream)

    def record(self, event=None):
        event = real_record(self, event)
        log.append(("record", threading.current_thread().name, cuda.STATE.device,
                    self.device_id, event.device_id))
        return event

    monkeypatch.setattr(cupy_standin.ndarray, "set", set_)
    monkeypatch.setattr(cuda.Stream, "record", record)
    monkeypatch.setenv("REPLICATE_STANDIN_DEVICES", "2")
    before = cuda.STATE.device
    monkeypatch.setitem(PLACEMENT, "cupy", lambda count: 1)
    try:
        assert cupy_device.place() == 1
        _, history, w = _staged_training("cupy", 2)
    finally:
        monkeypatch.setitem(PLACEMENT, "cupy", lambda count: before)
        cupy_device.place()
    _, want_history, want_w = _staged_training("numpy", 0)
    assert history == want_history and w.tolist() == want_w.tolist()
    staged = [entry for entry in log if entry[1] == "replicate-prefetch"]
    assert any(what == "set" for what, *_ in staged), "later batches come staged"
    assert all(entry[2:] == (1, 1, None if entry[0] == "set" else 1) for entry in staged), \
        staged


@pytest.mark.skipif(not HAVE_JAX, reason="jax not installed")
def test_prefetch_puts_batches_on_the_jax_device_on_its_thread(monkeypatch):
    import jax

    threads, real_put = [], jax.device_put

    def put(x, *args, **kwargs):  # a batch's leaves: where each is put (a float constant of
        if isinstance(x, (list, tuple)) or np.ndim(x) > 0:  # the step, a scalar: once, at compile)
            threads.append(threading.current_thread().name)
        return real_put(x, *args, **kwargs)

    monkeypatch.setattr(jax, "device_put", put)
    runs, history, w = _staged_training("jax", 2)
    _, want_history, want_w = _staged_training("numpy", 0)
    assert history == want_history and w.tolist() == want_w.tolist()
    fed = [x for r in runs[3:] for x in r[2][:2]]  # steps 5 and 6: their batch leaves
    assert fed and all(isinstance(x, jax.Array) for x in fed)
    assert threads and set(threads) == {"replicate-prefetch"}
