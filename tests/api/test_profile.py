"""The profiler (issue 29): a Chrome/Perfetto trace per rank, kernels with their lines, the
communication with its bytes, eager mode op by op, and the text summary.

No timing is asserted: the checks are on the trace's structure (valid trace-event JSON, every
kernel of a step inside its step, the events of a step those its executable launches)."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest

import replicate as rp
import replicate.numpy as rnp
from conftest import ROOT, child_env, mpirun, needs_mpi, report

KEYS = {"name", "cat", "ph", "ts", "dur", "pid", "tid"}


def _valid_trace(path) -> list:
    """The X events of a trace file, checked against the trace-event format Perfetto reads."""
    with open(path) as f:
        data = json.load(f)
    assert isinstance(data["traceEvents"], list)
    events = data["traceEvents"]
    for e in events:
        assert e["ph"] in ("X", "M"), e
        if e["ph"] == "X":
            assert KEYS <= set(e), e
            assert isinstance(e["ts"], float) and e["dur"] >= 0 and isinstance(e["tid"], int)
    names = {e["name"] for e in events if e["ph"] == "M"}
    assert {"process_name", "thread_name"} <= names
    return [e for e in events if e["ph"] == "X"]


def _inside(events, step):
    return [e for e in events if e is not step and e["tid"] == step["tid"]
            and step["ts"] <= e["ts"] and e["ts"] + e["dur"] <= step["ts"] + step["dur"] + 1e-3]


def test_a_graph_step_records_its_kernels_with_their_lines_inside_the_step(tmp_path):
    w = rp.Variable(np.linspace(-1, 1, 12).reshape(4, 3), name="w")

    @rp.function
    def step(x):
        loss = (rnp.tanh(x @ w) ** 2).mean()
        w.assign(w - 0.1 * rp.grad(loss, w))
        return loss

    x = np.ones((5, 4))
    step(x)
    path = tmp_path / "trace.json"
    with rp.profile.recording(str(path)):
        for _ in range(2):
            step(x)
    events = _valid_trace(path)
    steps = [e for e in events if e["cat"] == "step"]
    assert len(steps) == 2
    kernels = step.executable(x).kernels
    for s in steps:
        inside = _inside(events, s)
        assert [e["name"] for e in inside] == kernels  # every launch, in order, nothing else
        assert sum(e["dur"] for e in inside) <= s["dur"] + 1e-3
        assert all("test_profile.py:" in e["args"]["line"] for e in inside), inside
    assert any("w.assign(w - 0.1 * rp.grad(loss, w))" in e.get("args", {}).get("line", "")
               for e in events)
    assert rp.profile.active() is None  # the block ended it


def test_eager_mode_is_recorded_op_by_op(tmp_path):
    path = tmp_path / "eager.json"
    with rp.profile.recording(str(path)):
        x = rnp.asarray(np.ones(3))
        y = rnp.exp(x) * 2.0
        float(y.sum())
    events = _valid_trace(path)
    assert [e["name"] for e in events] == ["exp", "mul", "reduce_sum"]
    assert all(e["cat"] == "compute" and "test_profile.py:" in e["args"]["line"]
               for e in events)


def test_the_jax_backend_records_its_programs(tmp_path):
    pytest.importorskip("jax", reason="the JAX backend needs jax (the test extra has it)")
    f = rp.function(lambda x: rnp.tanh(x * 2.0).sum(), backend="jax")
    f(np.ones(3))
    path = tmp_path / "jax.json"
    with rp.profile.recording(str(path)):
        f(np.ones(3))
    events = _valid_trace(path)
    (step,) = [e for e in events if e["cat"] == "step"]
    assert [e["name"] for e in _inside(events, step)] == ["jax program 0"]


def test_the_summary_names_the_top_kernels_and_splits_each_step(tmp_path):
    f = rp.function(lambda x: (rnp.tanh(x @ x) * 2.0).sum())
    path = tmp_path / "t.json"
    with rp.profile.recording(str(path)):
        for _ in range(3):
            f(np.ones((8, 8)))
    text = subprocess.run([sys.executable, "-m", "replicate.profile", str(path)], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)
    assert text.returncode == 0, text.stderr
    out = text.stdout
    assert "matmul" in out and "test_profile.py:" in out, out
    assert "3 steps; per step (ms): compute, communication, wait, input, other" in out, out
    assert out.count("  step ") == 3, out


@needs_mpi[0]
@needs_mpi[1]
def test_every_rank_writes_its_trace_with_the_bytes_it_exchanged(tmp_path):
    script = tmp_path / "prog.py"
    script.write_text(
        "import numpy as np, replicate as rp\n"
        "w = rp.Variable(np.zeros(1000, np.float32), name='w')\n"
        "def input_fn(ctx):\n"
        "    while True:\n"
        "        yield np.ones(1000, np.float32)\n"
        "def step_fn(x):\n"
        "    w.assign(w + rp.all_reduce(x * 2.0, 'sum'))\n"
        "    return w.sum()\n"
        "rp.Replicator(input_fn, step_fn).run(steps=2)\n")
    env = child_env(REPLICATE_PROFILE=str(tmp_path / "trace.json"))
    result = mpirun(str(script), n=2, env=env)
    assert result.returncode == 0, report(result)
    for rank in (0, 1):
        events = _valid_trace(tmp_path / f"trace.rank{rank}.json")
        assert {e["pid"] for e in events} == {rank}
        comm = [e for e in events if e["cat"] == "communication"]
        assert comm and comm[0]["args"]["bytes"] == 4000, comm
        assert "prog.py:" in comm[0]["args"]["line"]


def test_the_cupy_backend_records_each_kernel_synchronised(tmp_path):
    from replicate.backends import available

    if "cupy" not in available():
        pytest.skip("the cupy backend is not available: no GPU, and the CuPy stand-in is off")
    f = rp.function(lambda x: (rnp.tanh(x @ x) * 2.0).sum(), backend="cupy")
    x = np.ones((4, 4), np.float32)
    f(x)
    path = tmp_path / "cupy.json"
    with rp.profile.recording(str(path)):
        f(x)
    events = _valid_trace(path)
    (step,) = [e for e in events if e["cat"] == "step"]
    assert [e["name"] for e in _inside(events, step)] == f.executable(x).kernels


def test_a_replicator_run_records_input_steps_and_checkpoints(tmp_path):
    w = rp.Variable(np.zeros(4), name="w")

    def input_fn(ctx):
        for _ in range(3):
            yield np.ones(4)

    def step_fn(x):
        w.assign(w + rp.all_reduce(x, "mean"))
        return w.sum()

    rep = rp.Replicator(input_fn, step_fn, replicas_per_rank=2)
    save = rp.callbacks.Checkpoint(str(tmp_path / "ckpt-{step}.npz"), w, every=2)
    path = tmp_path / "run.json"
    rep.run(profile=str(path), callbacks=[save])
    events = _valid_trace(path)
    names = [e["name"] for e in events]
    assert names.count("replicator step") == 3 and names.count("input") == 4  # (+ the end)
    assert names.count("checkpoint save") == 1
    for outer in (e for e in events if e["name"] == "replicator step"):
        assert any(e["name"] == "compiled step" for e in _inside(events, outer))
    assert rp.profile.active() is None
