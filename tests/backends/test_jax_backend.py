"""The JAX backend's own promises: one trace per segment however many calls, no copy of the
caller's arrays is changed (donation), a host value that is not an array passes through
untouched, gradient buckets reach the host as their parts, fused groups and large constants run,
and a clear error when JAX is missing. (Its parity with NumPy: ``test_backend_parity.py``.)"""

from __future__ import annotations

import importlib.util
import sys

import numpy as np
import pytest
from harness.parity import assert_same, replicated_training

import replicate as rp
import replicate.numpy as rnp
from replicate.backends import available
from replicate.errors import MissingRuleError

HAVE_JAX = importlib.util.find_spec("jax") is not None
only_jax = pytest.mark.skipif(not HAVE_JAX, reason="jax not installed")


def counting_step():
    w = rp.Variable(np.linspace(-1.0, 1.0, 6).reshape(3, 2), name="w")

    def step(x):
        loss = rnp.sum(rnp.tanh(x @ w) ** 2)
        w.assign(w - 0.1 * rp.grad(loss, w))
        return loss

    return w, step


@only_jax
def test_jax_traces_once_and_dispatches_after():
    w, step = counting_step()
    f = rp.function(step, backend="jax")
    x = np.ones((4, 3))
    losses = [float(f(x)) for _ in range(5)]
    program = f.executable(x).run
    assert f.trace_count == 1 and program.traces == 1  # one segment, traced once
    assert len(f.executable(x).kernels) == 1 and f.executable(x).kernels[0].startswith("jit[")
    w2, step2 = counting_step()
    g = rp.function(step2)
    assert losses == pytest.approx([float(g(x)) for _ in range(5)], rel=1e-12)
    np.testing.assert_allclose(w.numpy(), w2.numpy(), rtol=1e-12)


@only_jax
def test_jax_in_process_combines_stay_inside_one_jit():
    """Only communication between processes cuts a JAX segment: on one process, the replicas'
    in-process combines (local_reduce, a sum of k arrays) are compiled with the rest of the
    step — one jit, traced once (issue 17: 29 segments, 11.6 s of compiling, on a small GAN)."""
    _, _, rep = replicated_training("jax", steps=3)
    exe = rep.executable()
    prims = [n.prim for n in exe.graph.nodes]
    assert prims.count("local_reduce") >= 3
    assert len(exe.kernels) == 1 and exe.kernels[0].startswith("jit["), exe.kernels
    assert exe.run.traces == 1


@only_jax
@pytest.mark.parametrize("donate", [False, True])
def test_jax_never_changes_the_callers_arrays(monkeypatch, donate):
    from replicate.backends import jax_backend

    monkeypatch.setattr(jax_backend, "DONATE", donate)
    w, step = counting_step()
    f = rp.function(step, backend="jax")
    x = np.ones((4, 3))
    start = w.numpy().copy()
    held = [w.numpy()]  # the caller keeps every value the variable had
    copies = [start]
    for _ in range(4):
        f(x)
        held.append(w.numpy())
        copies.append(w.numpy().copy())
    for h, c in zip(held, copies):
        np.testing.assert_array_equal(h, c)  # still readable, still the same numbers
    assert not np.array_equal(held[0], held[-1])
    np.testing.assert_array_equal(x, np.ones((4, 3)))


@only_jax
def test_jax_output_views_come_back_without_a_copy():
    import jax

    w, step = counting_step()
    f = rp.function(step, backend="jax")
    x = np.ones((4, 3))
    f(x)
    program = f.executable(x).run
    view = w.numpy()
    assert id(view) in program._views
    device = program._views[id(view)][1]
    assert isinstance(device, jax.Array)
    f(x)  # the device array behind the view went in; a new view came out
    assert id(w.numpy()) in program._views and w.numpy() is not view


@only_jax
@pytest.mark.parametrize("in_jit", [True, False], ids=["callbacks", "segments"])
def test_jax_host_handles_pass_between_host_nodes(monkeypatch, in_jit):
    """A host node may return a handle (say, an in-flight communication) that only another host
    node reads: the backend passes it along untouched, and the device values around it. By
    default the host nodes are ordered callbacks inside one jit; cut into segments, the same."""
    if in_jit:
        _skip_unless_host_nodes_run_in_the_jit()
    from replicate.backends import jax_backend
    from replicate.backends.jax_backend import lower
    from replicate.graph import primitives
    from replicate.graph.core import Array, AVal, Graph, Node
    from replicate.graph.reference import IMPL

    class Handle:
        def __init__(self, value):
            self.value = value

    monkeypatch.setitem(primitives.REGISTRY, "fake_start", primitives.Primitive(
        "fake_start", primitives.COLLECTIVE, lambda a: a, False))
    monkeypatch.setitem(primitives.REGISTRY, "fake_wait", primitives.Primitive(
        "fake_wait", primitives.COLLECTIVE, lambda h, **_: h, False))
    started = []

    def start(x):
        assert type(x) is np.ndarray  # device values reach host nodes as host arrays
        started.append(x)
        return Handle(x * 2.0)

    def wait(h, *others):
        assert isinstance(h, Handle)
        return h.value

    monkeypatch.setitem(IMPL, "fake_start", start)
    monkeypatch.setitem(IMPL, "fake_wait", wait)
    aval = AVal((3,), np.dtype(np.float64))

    def node(prim, *inputs, **attrs):
        n = Node(prim, inputs, attrs)
        n.out = Array(aval, node=n)
        return n

    x = Array(aval)
    a = node("exp", x)
    s = node("fake_start", a.out)
    b = node("tanh", x)  # device work between start and wait
    t = node("fake_wait", s.out, b.out)
    c = node("add", t.out, b.out)
    graph = Graph([x], [a, s, b, t, c], [c.out, b.out])
    monkeypatch.setattr(jax_backend, "HOST_IN_JIT", in_jit)
    exe = lower(graph)
    assert exe.kernels == (["jit[5 ops]"] if in_jit else [
        "jit[1 ops]", "host[fake_start]", "jit[1 ops]", "host[fake_wait]", "jit[1 ops]"])
    v = np.array([0.0, 0.5, -1.0])
    for _ in range(2):
        out, th = exe([v])
        np.testing.assert_allclose(out, 2 * np.exp(v) + np.tanh(v), rtol=1e-12)
        np.testing.assert_allclose(th, np.tanh(v), rtol=1e-12)
    assert exe.run.traces == (1 if in_jit else 3)
    assert len(started) == 2 and not exe.run.calls.values  # every handle was consumed

    def failing_wait(h, *others):
        raise ConnectionError("peer gone")  # say, a communication failure
    monkeypatch.setitem(IMPL, "fake_wait", failing_wait)
    exe = lower(graph)
    with pytest.raises(ConnectionError, match="peer gone"):  # the rule's own exception
        exe([v])

    # a host result of the wrong shape is never broadcast into the graph's value
    monkeypatch.setitem(IMPL, "fake_wait", lambda h, *others: h.value[:1])
    exe = lower(graph)
    with pytest.raises(RuntimeError, match=r"host node fake_wait .* float64\[1\], its graph "
                                           r"value is float64\[3\]"):
        exe([v])

    # an owned operand (a packed bucket) is reduced over XLA's own buffer, which travels to the
    # wait and comes back as its result: no copy in the callbacks, the values still right
    seen = []

    def start_in_place(x, owned=False):  # as MPIComm.allreduce: in place where writable
        assert owned
        seen.append(x.flags.writeable and not x.flags.owndata)  # XLA's own buffer, writable
        if x.flags.writeable:
            x *= 2.0
            return Handle(x)
        return Handle(x * 2.0)

    monkeypatch.setitem(IMPL, "fake_start", start_in_place)
    monkeypatch.setitem(IMPL, "fake_wait", wait)
    s.attrs["owned"] = True
    exe = lower(graph)
    for _ in range(2):
        out, th = exe([v])
        np.testing.assert_allclose(out, 2 * np.exp(v) + np.tanh(v), rtol=1e-12)
    assert seen == [in_jit] * 2 and not exe.run.calls.values


@only_jax
@pytest.mark.parametrize("overlap", [True, False], ids=["overlap", "blocking"])
@pytest.mark.parametrize("unpack", [True, False], ids=["parts", "packed"])
def test_jax_bucket_goes_to_the_host_unpacked(monkeypatch, unpack, overlap):
    """A packed gradient bucket (``concatenate`` of flattened values, reduced in place) reaches
    the host as its parts, each XLA's own buffer in its own shape, and the slices of the reduced
    bucket are those parts: no XLA concatenate (a per-element loop on CPU), no copy. A reader
    of the whole bucket still gets it whole. So with ``overlap`` (``comm_start``/``comm_wait``)
    and without (one blocking ``mpi_allreduce``). Off (``UNPACK_BUCKETS = False``): the same
    values from one packed buffer."""
    from replicate.backends import jax_backend
    from replicate.graph.core import bind
    from replicate.graph.reference import IMPL

    _skip_unless_host_nodes_run_in_the_jit()
    got = []

    def start(x, *, op, owned=False, **_):  # as the communication thread: in place
        assert owned and op == "sum"
        got.append([(a.shape, a.flags.owndata, a.flags.writeable)
                    for a in (x if isinstance(x, list) else [x])])
        for a in (x if isinstance(x, list) else [x]):
            a *= 2.0
        return x

    monkeypatch.setitem(IMPL, "comm_start", start)
    monkeypatch.setitem(IMPL, "comm_wait", lambda handle, **_: handle)
    monkeypatch.setitem(IMPL, "mpi_allreduce", start)  # (overlap=False: one blocking node)
    monkeypatch.setattr(jax_backend, "UNPACK_BUCKETS", unpack)

    def step(w, b, x):
        gw, gb = rnp.tanh(w * x.sum()), rnp.exp(b) + x.sum()
        flat = rnp.concatenate([rnp.reshape(gw, (-1,)), gb, rnp.reshape(x * 3.0, (-1,))], 0)
        if overlap:
            handle = bind("comm_start", flat, op="sum", size=2, bucket=0, owned=True)
            red = bind("comm_wait", handle, bucket=0)
        else:
            red = bind("mpi_allreduce", flat, op="sum", size=2, bucket=0, owned=True)
        gw2 = rnp.reshape(red[0:6], (3, 2))
        return w - 0.5 * gw2, b - red[6:8], red.sum() + red[1:7].sum()

    w, b = np.linspace(-1, 1, 6).reshape(3, 2), np.array([0.25, -0.5])
    x = np.linspace(0, 1, 12).reshape(4, 3)
    graph = rp.function(step).graph(w, b, x)
    exe = jax_backend.lower(graph)
    gw, gb = 2 * np.tanh(w * x.sum()), 2 * (np.exp(b) + x.sum())
    whole = np.concatenate([gw.ravel(), gb, 6 * x.ravel()])
    for _ in range(2):
        nw, nb, total = exe([w, b, x])
        np.testing.assert_allclose(nw, w - 0.5 * gw, rtol=1e-12, atol=1e-15)
        np.testing.assert_allclose(nb, b - gb, rtol=1e-12)
        np.testing.assert_allclose(total, whole.sum() + whole[1:7].sum(), rtol=1e-12)
    want = [((3, 2), False, True), ((2,), False, True), ((4, 3), False, True)] if unpack \
        else [((20,), False, True)]
    assert got == [want, want]  # XLA's own writable buffers; the parts in their shapes
    assert exe.run.traces == 1 and not exe.run.calls.values


def _fake_bucket_rows(monkeypatch, got):
    """comm_start/comm_wait/mpi_allreduce as an in-place sum over 2 processes (x2), recording
    what each receives: a list of parts (an unpacked bucket) or one array."""
    from replicate.graph.reference import IMPL

    def start(x, *, op, owned=False, **_):
        parts = x if isinstance(x, list) else [x]
        got.append([a.shape for a in parts])
        for a in parts:
            a *= 2.0
        return x

    monkeypatch.setitem(IMPL, "comm_start", start)
    monkeypatch.setitem(IMPL, "comm_wait", lambda handle, **_: handle)
    monkeypatch.setitem(IMPL, "mpi_allreduce", start)


def _skip_unless_host_nodes_run_in_the_jit():
    """Host nodes run inside the jit on a CPU JAX with ``buffer_callback`` only: on a GPU its
    buffers are device memory and host nodes cut the step into jit segments (tested there by
    the segment tests and the two-process parity)."""
    import jax

    from replicate.backends.jax_host import available

    if jax.default_backend() != "cpu":
        pytest.skip(f"a GPU is here: JAX on {jax.default_backend()} cuts the step into jit "
                    "segments at host nodes")
    if not available():
        pytest.skip("buffer_callback not available in this JAX (host nodes cut segments)")


@only_jax
@pytest.mark.parametrize("overlap", [True, False], ids=["overlap", "blocking"])
def test_jax_unpacked_bucket_member_that_is_an_output(monkeypatch, overlap):
    """A bucket member that is also a step output (a user's 1-D ``reshape``, all-reduced in a
    bucket with another value, and returned or written to a Variable) keeps its graph shape:
    only a flattening that nothing else reads (outputs included) hands the bucket its source
    unflattened. (It came back as the source, a Variable of shape (6,) became (3, 2).)"""
    from replicate.backends import jax_backend
    from replicate.graph.core import bind

    _skip_unless_host_nodes_run_in_the_jit()
    got = []
    _fake_bucket_rows(monkeypatch, got)

    def step(w, x):
        flat = rnp.reshape(w * 2.0, (-1,))  # the user's: an output, and a bucket member
        bucket = rnp.concatenate([flat, rnp.tanh(x)], 0)
        if overlap:
            red = bind("comm_wait", bind("comm_start", bucket, op="sum", size=2, bucket=0,
                                         owned=True), bucket=0)
        else:
            red = bind("mpi_allreduce", bucket, op="sum", size=2, bucket=0, owned=True)
        return flat, red[0:6] + 0.0, red[6:9] + 0.0

    w, x = np.linspace(-1, 1, 6).reshape(3, 2), np.array([0.5, -1.0, 2.0])
    exe = jax_backend.lower(rp.function(step).graph(w, x))
    for _ in range(2):
        flat, red_w, red_x = exe([w, x])
        assert_same(flat, 2.0 * w.ravel(), "the member returned")
        assert_same(red_w, 4.0 * w.ravel(), "its reduction")
        assert_same(red_x, 2.0 * np.tanh(x), "the other member's")
    assert got == [[(6,), (3,)]] * 2  # still unpacked: the member as its own (flat) value


@only_jax
@pytest.mark.parametrize("unpack", [True, False], ids=["parts", "packed"])
def test_jax_failure_waits_for_the_buckets_in_flight(monkeypatch, unpack):
    """A communication failure while another bucket is in flight: the program raises the
    original exception only once that bucket is done with XLA's buffers. (XLA frees them when
    the program stops: the communication thread went on writing into freed memory, a segfault
    or another call's values.) The next call is right and leaves nothing behind."""
    import threading
    import time

    from replicate.backends import jax_backend
    from replicate.graph.core import bind
    from replicate.graph.reference import IMPL

    _skip_unless_host_nodes_run_in_the_jit()
    jobs, fail = [], []

    class Job:  # a bucket on a communication thread: bucket 0 fails at once, bucket 1 is slow
        def __init__(self, x, bucket):
            self.x, self.error, self.done = x, None, threading.Event()
            self.failing = bool(fail) and bucket == 0
            threading.Thread(target=self.run, daemon=True).start()

        def run(self):
            if self.failing:
                self.error = ConnectionError("peer gone")
            else:
                time.sleep(0.2 if fail else 0.0)
                for a in (self.x if isinstance(self.x, list) else [self.x]):
                    a *= 2.0
            self.done.set()

        def result(self):
            self.done.wait()
            if self.error is not None:
                raise self.error
            return self.x

    def start(x, *, bucket, **_):
        jobs.append(Job(x, bucket))
        return jobs[-1]

    monkeypatch.setitem(IMPL, "comm_start", start)
    monkeypatch.setitem(IMPL, "comm_wait", lambda handle, **_: handle.result())
    monkeypatch.setattr(jax_backend, "UNPACK_BUCKETS", unpack)

    def step(a, b):
        handles = [bind("comm_start", rnp.concatenate([rnp.tanh(v), rnp.exp(v)], 0), op="sum",
                        size=2, bucket=i, owned=True) for i, v in enumerate((a, b))]
        red = [bind("comm_wait", h, bucket=i) for i, h in enumerate(handles)]
        return red[0] * 1.0, red[1] * 1.0

    a, b = np.linspace(-1, 1, 5), np.linspace(0, 2, 5)
    want = [2.0 * np.concatenate([np.tanh(v), np.exp(v)]) for v in (a, b)]
    exe = jax_backend.lower(rp.function(step).graph(a, b))
    fail.append(True)
    with pytest.raises(ConnectionError, match="peer gone"):
        exe([a, b])
    assert len(jobs) == 2 and all(j.done.is_set() for j in jobs)  # none still writing
    fail.clear()
    for got, w in zip(exe([a, b]), want):
        assert_same(got, w)
    assert not exe.run.calls.values and exe.run.calls.failure is None


@only_jax
def test_jax_runs_fused_groups_and_large_constants():
    """The JAX pipeline leaves fusion to XLA, but a graph fused by the NumPy pipeline runs too;
    a large constant is moved to the device once and passed in."""
    from replicate.backends import jax_backend
    from replicate.compiler import PIPELINE, optimize
    from replicate.graph.primitives import REGISTRY

    table = np.arange(40000.0).reshape(4, 10000) / 7.0  # 320 kB: not a literal

    def f(x, y):
        return rnp.tanh(x * 2.0 + y).sum(axis=1), rnp.exp(x) * y, x[0] @ (table[:4] * y[0])

    x, y = np.linspace(-1, 1, 12).reshape(3, 4), np.linspace(0, 1, 4)
    graph = rp.function(f).graph(x, y)
    if "fusion" in PIPELINE:
        graph = optimize(graph, tuple(PIPELINE))
        assert any(n.prim == "fused" for n in graph.nodes)
    else:
        assert "fused" not in REGISTRY
    exe = jax_backend.lower(graph)
    assert any(v is not None for v in exe.run._template)  # the table, on the device
    want = rp.function(f)(x, y)
    for _ in range(2):
        for a, b in zip(exe([x, y]), want):
            assert_same(a, b)
    assert exe.run.traces == 1


@only_jax
def test_jax_outputs_that_are_inputs_constants_or_repeated():
    def f(x, y):
        z = x * 2.0
        return x, rnp.asarray(3.0), z, z, y, rnp.ones((2,)) * 4.0

    x, y = np.arange(3.0), np.arange(4, dtype=np.int32)
    g = rp.function(f, backend="jax")
    for _ in range(3):
        out = g(x, y)
        for a, b in zip(out, rp.function(f)(x, y)):
            assert_same(a, b)
        x = out[2]  # an output view back in as an input
    np.testing.assert_array_equal(out[2], np.arange(3.0) * 8.0)


@only_jax
def test_jax_missing_rule_fails_at_lowering(monkeypatch):
    from replicate.backends.jax_impl import JAX

    monkeypatch.delitem(JAX, "tanh")
    with pytest.raises(MissingRuleError, match="no jax rule for tanh"):
        rp.function(lambda x: rnp.tanh(x), backend="jax")(np.ones(2))


@only_jax
def test_jax_backend_runs_every_pass_but_fusion_and_memory():
    """(and ``widen``: XLA has float16/bfloat16 kernels of its own)"""
    from replicate.backends import jax_backend
    from replicate.compiler import PIPELINE

    assert jax_backend.passes == tuple(p for p in PIPELINE
                                       if p not in ("widen", "fusion", "memory"))
    assert "fusion" not in jax_backend.passes and "dce" in jax_backend.passes


def test_missing_jax_is_a_clear_error(monkeypatch):
    from replicate.backends import get_backend

    monkeypatch.setitem(sys.modules, "jax", None)  # import jax now raises ImportError
    for name in [m for m in sys.modules if m.startswith("replicate.backends.jax")]:
        monkeypatch.delitem(sys.modules, name)
    with pytest.raises(rp.ReplicateError, match=r"pip install 'replicate\[jax\]'"):
        get_backend("jax")
    with pytest.raises(rp.ReplicateError, match="jax"):
        rp.function(lambda x: x, backend="jax")
    assert "jax" not in available() and "numpy" in available()


@only_jax
def test_index_arrays_from_the_host_are_checked_there_not_in_xla():
    """XLA clamps an out-of-range gather index, so the backend checks every index array: one
    that comes in from the host (labels, token ids, through reshapes) on the host before the
    call — nothing is added to the XLA program (checkify costs a conv net's step 3 %) — and one
    computed in the step with ``checkify``. Both raise NumPy's IndexError; nothing is written."""
    table = rp.Variable(np.arange(40.0).reshape(10, 4), name="table")

    def lookup(ids):
        out = table[ids.reshape(-1)].sum()
        table.assign(table * 2.0)
        return out

    def computed(x):
        out = table[rnp.argmax(x, axis=-1) * 3].sum()  # an index made in the step
        table.assign(table * 2.0)
        return out

    f, g = rp.function(lookup, backend="jax"), rp.function(computed, backend="jax")
    ids, x = np.array([[1, 2], [3, 9]]), np.eye(4)[[0, 1, 3]]
    assert float(f(ids)) == float(np.arange(40.0).reshape(10, 4)[[1, 2, 3, 9]].sum())
    program = f.executable(ids).run
    assert len(program.host_indices.plans) == 1
    assert not any(step[1].checked for step in program.steps if step[0])  # no checkify
    float(g(x))  # indices 0, 3, 9: inside
    assert any(step[1].checked for step in g.executable(x).run.steps if step[0])
    before = table.numpy().copy()
    with pytest.raises(IndexError, match="index 12 is out of bounds for axis 0 with size 10"):
        f(np.array([[1, 12]]))
    with pytest.raises(IndexError, match="index -11 is out of bounds for axis 0 with size 10"):
        f(np.array([[-11, 0]]))
    with pytest.raises(IndexError, match="out of bounds"):
        g(np.eye(5)[[4]])  # argmax 4 -> index 12
    np.testing.assert_array_equal(table.numpy(), before)  # no call wrote the variable
