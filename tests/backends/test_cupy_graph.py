"""CUDA-graph replay of the cupy backend's steps (issue 31, ``replicate/backends/cuda_graph.py``),
opt-in through ``rp.CompileOptions(cuda_graph=True)`` or ``REPLICATE_CUDA_GRAPH=1``.

Without a GPU these run on the CuPy stand-in, whose capture is at least as strict as CUDA's
(``cupy_standin_graph.py``: work recorded, not run, until a launch; host reads refused); on a GPU
(``bench/gpu_check.sh``) the same tests run on the real CuPy. They read only what the backend
records (``exe.run.state``), never the stand-in, except the one test that says so.
"""

from __future__ import annotations

import os
import sys

import cupy_standin
import numpy as np
import pytest

import replicate as rp
import replicate.numpy as rnp
from replicate.backends import available

pytestmark = pytest.mark.skipif("cupy" not in available(), reason=(
    "the cupy backend is not available: no GPU, and the CuPy stand-in is off "
    "(REPLICATE_CUPY_STANDIN=0)"))
sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "bench"))
GPT = dict(d=16, layers=1, heads=2, ctx=8, vocab=11, batch=2)
STEPS = 5


def _seeded(params, seed):
    rng = np.random.default_rng(seed)
    for name in sorted(params):
        v = params[name]
        v.load((rng.standard_normal(v.shape) * 0.3).astype(v.dtype))


def _mlp(options):
    model = rp.nn.Sequential(rp.nn.Linear(16, 32), rp.nn.relu, rp.nn.Linear(32, 4))
    _seeded(model.parameters(), 0)
    opt = rp.optim.Adam(model.parameters(), lr=1e-2)

    def step(x, y):
        loss = rp.nn.softmax_cross_entropy(model(x), y).mean()
        opt.apply(rp.grad(loss, model.parameters()))
        return loss

    rng = np.random.default_rng(1)
    batches = [(rng.standard_normal((8, 16)).astype(np.float32), rng.integers(0, 4, 8))
               for _ in range(STEPS)]
    return rp.function(step, backend="cupy", options=options), model, batches


class _Params:
    def __init__(self, **variables):
        self.variables = variables

    def parameters(self):
        return dict(self.variables)


def _labelled(seed):
    """STEPS batches of 8 rows of 16 features and labels of 4 classes."""
    rng = np.random.default_rng(seed)
    return [(rng.standard_normal((8, 16)).astype(np.float32), rng.integers(0, 4, 8))
            for _ in range(STEPS)]


def _no_library(options):
    """A step with no call into CUDA's libraries: elementwise layers, a label gather,
    reductions and Adam."""
    w = rp.Variable(np.zeros(16, np.float32), name="w")
    b = rp.Variable(np.zeros(4, np.float32), name="b")
    model = _Params(w=w, b=b)
    _seeded(model.parameters(), 4)
    opt = rp.optim.Adam([w, b], lr=1e-2)

    def step(x, y):
        logits = rnp.tanh(x * w).reshape((8, 4, 4)).sum(-1) + b
        loss = rp.nn.softmax_cross_entropy(logits, y).mean()
        opt.apply(rp.grad(loss, [w, b]))
        return loss

    return rp.function(step, backend="cupy", options=options), model, _labelled(5)


def _einsum(options):
    """A layer written as ``rnp.einsum`` (its gradient is einsums too): one cuBLAS product
    each (``cuda_blas.einsum``), so the step is captured."""
    w = rp.Variable(np.zeros((16, 4), np.float32), name="w")
    model = _Params(w=w)
    _seeded(model.parameters(), 6)
    opt = rp.optim.SGD([w], lr=1e-1)

    def step(x, y):
        logits = rnp.einsum("bi,io->bo", rnp.tanh(x), w)
        loss = rp.nn.softmax_cross_entropy(logits, y).mean()
        opt.apply(rp.grad(loss, [w]))
        return loss

    return rp.function(step, backend="cupy", options=options), model, _labelled(7)


def _gpt(options):
    import transformer as T

    params, ids, targets = T.init(GPT)
    model = T.replicate_model(GPT)
    _seeded(model.parameters(), 2)
    opt = rp.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=T.WD)

    def step(ids, targets):
        loss = rp.nn.softmax_cross_entropy(model(ids), targets).mean()
        opt.apply(rp.grad(loss, model.parameters()))
        return loss

    rng = np.random.default_rng(3)
    batches = [(ids, targets)] + [tuple(np.roll(a, k, axis=1) for a in (ids, targets))
                                  for k in range(1, STEPS)]
    del params, rng
    return rp.function(step, backend="cupy", options=options), model, batches


def _train(build, graph, device_inputs=False):
    """(the losses, as kept by the caller until the end; the parameters; the executable)."""
    import cupy

    f, model, batches = build(rp.CompileOptions(cuda_graph=graph))
    if device_inputs:
        batches = [tuple(cupy.asarray(a) for a in b) for b in batches]
    losses = [f(*b) for b in batches]  # (device arrays with device inputs: read at the end)
    losses = [np.asarray(cupy.asnumpy(x) if isinstance(x, cupy.ndarray) else x) for x in losses]
    params = {k: v.numpy() for k, v in model.parameters().items()}
    return losses, params, f.executable(*batches[0])


def _same_bits(a, b):
    return a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes()


# a step with matmuls: replayed too, its GEMMs called on cuBLAS directly (cuda_blas.py; CuPy's
# own wrappers refuse a capturing stream)
@pytest.mark.parametrize("build,state", [(_no_library, "replay"), (_mlp, "replay"),
                                         (_einsum, "replay"), (_gpt, "replay")],
                         ids=["no-library", "mlp", "einsum", "gpt"])
@pytest.mark.parametrize("device_inputs", [False, True], ids=["host-batch", "device-batch"])
def test_replayed_steps_give_the_bits_of_normal_steps(build, state, device_inputs):
    off, off_params, exe_off = _train(build, False, device_inputs)
    on, on_params, exe_on = _train(build, True, device_inputs)
    assert exe_on.run.state == state, exe_on.run.state  # replay: captured, checked, replayed
    assert not hasattr(exe_off.run, "state")  # off by default
    assert len(set(x.tobytes() for x in on)) == STEPS  # each step's loss kept as it was
    assert all(_same_bits(a, b) for a, b in zip(off, on)), (off, on)
    assert off_params.keys() == on_params.keys()
    assert all(_same_bits(off_params[k], on_params[k]) for k in off_params)


def test_the_environment_variable_turns_replay_on(monkeypatch):
    def step(x):
        return rnp.tanh(x * 2.0).sum()
    xs = [np.full(3, v, np.float32) for v in (0.1, 0.2, 0.3, 0.4)]
    plain = rp.function(step, backend="cupy")
    want = [float(plain(x)) for x in xs]  # the GPU's tanh: not NumPy's to the bit
    monkeypatch.setenv("REPLICATE_CUDA_GRAPH", "1")
    f = rp.function(step, backend="cupy")
    got = [float(f(x)) for x in xs]
    assert f.executable(xs[0]).run.state == "replay"
    assert not hasattr(plain.executable(xs[0]).run, "state")  # (made before the variable)
    assert got == want
    np.testing.assert_allclose(got, [np.tanh(x * np.float32(2.0)).sum(dtype=np.float32)
                                     for x in xs], rtol=1e-6)


def test_a_step_that_communicates_is_not_captured(capsys, monkeypatch):
    from replicate.backends import cupy_backend
    from replicate.compiler import compile_graph, step_graph

    monkeypatch.setenv("REPLICATE_DEBUG", "cuda_graph")
    from replicate.context import ReplicaContext

    graph = step_graph(lambda a: rp.all_reduce(a[0] * 2.0, "sum"), [(np.ones(3, np.float32),)],
                       [ReplicaContext(replica_id=0, num_replicas=2, num_ranks=2)],
                       num_ranks=2, rank=0, gathers_outputs=False)  # (an exchange: compiled only)
    exe = compile_graph(graph, cupy_backend, rp.CompileOptions(cuda_graph=True))
    assert not hasattr(exe.run, "state")
    assert "not captured" in capsys.readouterr().out


def test_a_capture_cuda_refuses_falls_back_to_the_normal_steps(monkeypatch, capsys):
    """A row that reads a device value on the host: fine op by op, refused under capture (a
    synchronisation): the replay is off for good and every step's bits are the normal ones."""
    import cupy

    from replicate.backends import cupy_backend

    def reading_sort(x, axis):
        return cupy.sort(x, axis=axis) + (x.dtype.type(0) * float(x.max()))  # a host read
    monkeypatch.setitem(cupy_backend.DEVICE_RULES, "sort", reading_sort)
    monkeypatch.setenv("REPLICATE_DEBUG", "cuda_graph")

    def step(x):
        return rnp.sort(x * 3.0, axis=-1)[..., :2].sum()

    xs = [np.linspace(-1, 1, 6, dtype=np.float32) * k for k in range(1, 5)]
    want = [float(rp.function(step, backend="cupy")(x)) for x in xs]
    f = rp.function(step, backend="cupy", options={"cuda_graph": True})
    assert [float(f(x)) for x in xs] == want
    assert f.executable(xs[0]).run.state == "off"
    assert "capture failed" in capsys.readouterr().out


def test_device_index_checks_are_read_after_a_replay():
    """Labels handed in on the device are checked there: the flag a replay's kernel writes is
    read after it, and an out-of-range label raises NumPy's IndexError as without a graph."""
    import cupy

    f, _, batches = _no_library(rp.CompileOptions(cuda_graph=True))
    for x, y in batches[:3]:
        f(cupy.asarray(x), cupy.asarray(y))
    assert f.executable(*batches[0]).run.state == "replay"
    x, y = batches[3]
    with pytest.raises(IndexError) as e:  # (a GPU's gather wraps around: only the flag tells)
        f(cupy.asarray(x), cupy.asarray(np.where(np.arange(8) == 5, 7, y)))
    assert "getitem" in " ".join(getattr(e.value, "__notes__", [])), e.value  # the op named
    with pytest.raises(IndexError):  # and from the host, before anything runs
        f(x, np.where(np.arange(8) == 5, 7, y))


def _capture(stream, pool, body):
    import cupy

    with cupy.cuda.using_allocator(pool.malloc), stream:
        stream.begin_capture()
        try:
            out = body()
        finally:
            graph = stream.end_capture()
    return graph, out


def test_a_captured_graph_computes_when_launched_and_again_on_new_inputs():
    import cupy

    x = cupy.asarray(np.arange(4.0, dtype=np.float32))
    stream, pool = cupy.cuda.Stream(non_blocking=True), cupy.cuda.MemoryPool()
    graph, (y, z) = _capture(stream, pool, lambda: (x * 2 + 1, (
        (x * 2 + 1).reshape(2, 2) * x.reshape(2, 2)).sum(0)))
    if cupy_standin.ACTIVE:  # nothing ran: what the capture made holds garbage
        assert np.isnan(cupy.asnumpy(y)).all() and np.isnan(cupy.asnumpy(z)).all()
    graph.launch(stream=stream)
    stream.synchronize()
    a = np.arange(4.0, dtype=np.float32)
    assert np.array_equal(cupy.asnumpy(y), a * 2 + 1)
    assert np.array_equal(cupy.asnumpy(z), ((a * 2 + 1).reshape(2, 2) * a.reshape(2, 2)).sum(0))
    w = cupy.zeros(4, np.float32)  # made before a capture that writes it: written at launch
    wgraph, _ = _capture(stream, cupy.cuda.MemoryPool(), lambda: cupy.copyto(w, x + 5))
    assert np.array_equal(cupy.asnumpy(w), np.zeros(4, np.float32))
    wgraph.launch(stream=stream)
    stream.synchronize()
    assert np.array_equal(cupy.asnumpy(w), a + 5)
    cupy.copyto(x, cupy.asarray(np.ones(4, np.float32)))
    graph.launch(stream=stream)
    stream.synchronize()
    assert np.array_equal(cupy.asnumpy(y), np.full(4, 3.0, np.float32))


def test_a_host_read_during_capture_is_refused_before_cuda_sees_it():
    import cupy

    x = cupy.asarray(np.arange(4.0, dtype=np.float32))
    stream, pool = cupy.cuda.Stream(non_blocking=True), cupy.cuda.MemoryPool()
    with cupy.cuda.using_allocator(pool.malloc), stream:
        stream.begin_capture()
        try:
            with pytest.raises(RuntimeError, match="the current stream is capturing"):
                (x * 3).get()  # CuPy's own check, before any CUDA call
            with pytest.raises(RuntimeError, match="the current stream is capturing"):
                cupy.asarray(np.ones(2, np.float32))
        finally:
            graph = stream.end_capture()  # so the capture is still valid
    assert not stream.is_capturing()
    y = x * 0
    graph.launch(stream=cupy.cuda.get_current_stream())  # (the graph's own arrays, not ``y``)
    assert np.array_equal(cupy.asnumpy(x * 3), np.arange(4.0, dtype=np.float32) * 3)
    assert np.array_equal(cupy.asnumpy(y), np.zeros(4, np.float32))


def test_the_standin_refuses_the_shared_pool_and_synchronising_in_a_capture():
    if not cupy_standin.ACTIVE:
        pytest.skip("a GPU is here: CuPy allows the shared pool (the stand-in is stricter)")
    import cupy

    x = cupy.asarray(np.arange(4.0, dtype=np.float32))
    stream = cupy.cuda.Stream(non_blocking=True)
    with stream:
        stream.begin_capture()
        with pytest.raises(RuntimeError, match="default memory pool"):
            x * 2
        with pytest.raises(RuntimeError):
            stream.end_capture()
    pool = cupy.cuda.MemoryPool()
    with cupy.cuda.using_allocator(pool.malloc), stream:
        stream.begin_capture()
        with pytest.raises(RuntimeError, match="StreamCaptureUnsupported"):
            stream.synchronize()
        with pytest.raises(RuntimeError):
            stream.end_capture()
    graph, y = _capture(stream, pool, lambda: x + 1)
    with cupy.cuda.using_allocator(pool.malloc), pytest.raises(RuntimeError,
                                                               match="belong to a CUDA graph"):
        x + 2  # the graph's pool serves nothing else
    graph.launch()
    assert np.array_equal(cupy.asnumpy(y), np.arange(1.0, 5.0, dtype=np.float32))


def test_cublas_is_refused_during_a_capture_as_cupy_refuses_it():
    """CuPy raises NotImplementedError for a cuBLAS call (a matmul) while the stream captures
    (``cupy_backends/cuda/libs/cublas.pyx``: ``setStream``); the stand-in as strictly. This is
    why a step with a matmul is not replayed yet; on a GPU it checks the real CuPy still does."""
    import cupy

    x = cupy.asarray(np.eye(2, dtype=np.float32))
    stream, pool = cupy.cuda.Stream(non_blocking=True), cupy.cuda.MemoryPool()
    for call in (lambda: cupy.matmul(x, x), lambda: x @ x, lambda: cupy.dot(x, x)):
        with pytest.raises(NotImplementedError, match="cuBLAS"):
            _capture(stream, pool, call)
    assert np.array_equal(cupy.asnumpy(x @ x), np.eye(2, dtype=np.float32))  # and after it
