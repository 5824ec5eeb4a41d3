"""Graph mode and eager mode agree on whole training steps; tracing, errors, printing, validation.

* the steps of ``tests/harness/steps.py`` — (a) an MLP SGD step, (b) a small conv net step with
  pooling, (c) a WGAN-GP critic step whose loss contains a gradient (so its parameter gradient is
  a gradient of a gradient): loss,
  gradients and updated ``rp.Variable``s agree between ``rp.function(step)`` and
  ``rp.function(step, mode="eager")``; (a) and (c) also against finite differences of a NumPy
  forward pass written independently here.
* A traced function is traced once per input signature.
* Python control flow on a traced value raises ``TracerConversionError`` naming this file and line.
* The printed IR has one line per node; the validator accepts traced graphs, rejects broken ones.
"""

from __future__ import annotations

import numpy as np
import pytest
from harness.steps import (
    CNN_BATCHES,
    CNN_INIT,
    GP_BATCHES,
    GP_INIT,
    LAMBDA,
    MLP_BATCHES,
    MLP_INIT,
    make_cnn_step,
    make_gp_step,
    make_mlp_step,
    snapshot,
    variables,
)

import replicate as rp
import replicate.numpy as rnp
from replicate.graph.core import Array, AVal, Graph
from replicate.graph.validate import InvalidGraphError, validate

RTOL = 1e-12  # graph and eager run the same float64 arithmetic


def run_both(make_step, init: dict, batches: list):
    """Run the same step in graph and eager mode from the same initial values."""
    results = {}
    for mode in ("graph", "eager"):
        params = variables(init)
        fn = rp.function(make_step(params), mode=mode)
        outs = [fn(*batch) for batch in batches]
        results[mode] = (outs, snapshot(params), fn)
    return results


def assert_nests_close(a, b, rtol=RTOL, atol=1e-13):
    if isinstance(a, dict):
        assert sorted(a) == sorted(b)
        for k in a:
            assert_nests_close(a[k], b[k], rtol, atol)
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b)
        for x, y in zip(a, b):
            assert_nests_close(x, y, rtol, atol)
    else:
        a, b = np.asarray(a), np.asarray(b)
        assert a.shape == b.shape and a.dtype == b.dtype, (a.shape, b.shape, a.dtype, b.dtype)
        np.testing.assert_allclose(a, b, rtol=rtol, atol=atol)


def finite_difference_grads(loss, params: dict, eps=1e-6) -> dict:
    grads = {}
    for name, value in params.items():
        g = np.zeros_like(value)
        for k in np.ndindex(value.shape):
            plus = {n: v.copy() for n, v in params.items()}
            minus = {n: v.copy() for n, v in params.items()}
            plus[name][k] += eps
            minus[name][k] -= eps
            g[k] = (loss(plus) - loss(minus)) / (2 * eps)
        grads[name] = g
    return grads


# -- (a) MLP -----------------------------------------------------------------------------------
def mlp_loss_numpy(p, x, y):
    h = np.tanh(x @ p["w1"] + p["b1"])
    logits = h @ p["w2"] + p["b2"]
    m = logits.max(axis=1, keepdims=True)
    lse = np.log(np.exp(logits - m).sum(axis=1)) + m[:, 0]
    return float(np.mean(lse - logits[np.arange(len(y)), y]))


def test_mlp_step_graph_equals_eager():
    res = run_both(make_mlp_step, MLP_INIT, MLP_BATCHES)
    (g_outs, g_params, g_fn), (e_outs, e_params, _) = res["graph"], res["eager"]
    assert_nests_close(g_outs, e_outs)
    assert_nests_close(g_params, e_params)
    assert g_fn.trace_count == 1
    losses = [float(o["loss"]) for o in g_outs]
    assert all(np.isfinite(losses))
    assert not np.allclose(g_params["w1"], MLP_INIT["w1"])  # the step did update the variables


def test_mlp_step_matches_numpy_and_finite_differences():
    (outs, params, _) = run_both(make_mlp_step, MLP_INIT, MLP_BATCHES[:1])["graph"]
    x, y = MLP_BATCHES[0]
    assert float(outs[0]["loss"]) == pytest.approx(mlp_loss_numpy(MLP_INIT, x, y), rel=1e-12)
    want = finite_difference_grads(lambda p: mlp_loss_numpy(p, x, y), MLP_INIT)
    assert_nests_close(outs[0]["grads"], want, rtol=1e-6, atol=1e-8)
    assert_nests_close(params, {k: MLP_INIT[k] - 0.1 * outs[0]["grads"][k] for k in MLP_INIT},
                       rtol=1e-12)


# -- (b) a small conv net with pooling ----------------------------------------------------------
def test_conv_net_step_graph_equals_eager():
    res = run_both(make_cnn_step, CNN_INIT, CNN_BATCHES)
    (g_outs, g_params, g_fn), (e_outs, e_params, _) = res["graph"], res["eager"]
    assert_nests_close(g_outs, e_outs)
    assert_nests_close(g_params, e_params)
    assert g_fn.trace_count == 1
    assert all(np.any(g != 0) for g in g_outs[0][1].values())  # every parameter gets a gradient
    assert not np.allclose(g_params["k1"], CNN_INIT["k1"])


# -- (c) WGAN-GP: a gradient penalty, so the parameter gradient is a gradient of a gradient ------
def gp_penalty_numpy(p, real, fake, eps):
    x_hat = eps * real + (1.0 - eps) * fake
    h = np.tanh(x_hat @ p["w1"] + p["b1"])
    g = ((1.0 - h ** 2) * p["w2"]) @ p["w1"].T  # d critic / d x_hat, by hand
    return float(np.mean((np.sqrt(np.sum(g ** 2, axis=1)) - 1.0) ** 2))


def gp_loss_numpy(p, real, fake, eps):
    def crit(x):
        return np.tanh(x @ p["w1"] + p["b1"]) @ p["w2"] + p["c"]

    return float(np.mean(crit(fake)) - np.mean(crit(real))
                 + LAMBDA * gp_penalty_numpy(p, real, fake, eps))


def test_gradient_penalty_step_graph_equals_eager():
    res = run_both(make_gp_step, GP_INIT, GP_BATCHES)
    (g_outs, g_params, g_fn), (e_outs, e_params, _) = res["graph"], res["eager"]
    assert_nests_close(g_outs, e_outs)
    assert_nests_close(g_params, e_params)
    assert g_fn.trace_count == 1


@pytest.mark.parametrize("mode", ["graph", "eager"])
def test_gradient_penalty_matches_finite_differences(mode):
    real, fake, eps = GP_BATCHES[0]
    params = variables(GP_INIT)
    loss, grads = rp.function(make_gp_step(params), mode=mode)(real, fake, eps)
    assert float(loss) == pytest.approx(gp_loss_numpy(GP_INIT, real, fake, eps), rel=1e-12)
    want = finite_difference_grads(lambda p: gp_loss_numpy(p, real, fake, eps), GP_INIT)
    assert_nests_close(grads, want, rtol=1e-6, atol=1e-7)
    # the penalty (the second-order part) contributes to the gradient, so it is really checked
    penalty_grad = finite_difference_grads(
        lambda p: LAMBDA * gp_penalty_numpy(p, real, fake, eps), GP_INIT)
    assert max(np.abs(v).max() for v in penalty_grad.values()) > 1e-2


# -- tracing and the cache -----------------------------------------------------------------------
def test_second_call_with_same_signature_does_not_retrace():
    w = rp.Variable(np.ones(3), name="w")
    calls = []

    def step(x):
        calls.append(1)  # Python side effects run only while tracing
        loss = rnp.sum((x @ w) ** 2)
        w.assign(w - 0.01 * rp.grad(loss, w))
        return loss

    f = rp.function(step)
    f(np.ones((2, 3)))
    f(np.full((2, 3), 2.0))
    assert f.trace_count == 1 and len(calls) == 1
    f(np.ones((5, 3)))  # new shape
    assert f.trace_count == 2
    f(np.ones((2, 3)))  # back to a cached signature
    assert f.trace_count == 2
    f(np.ones((2, 3), np.float32))  # new dtype
    assert f.trace_count == 3
    assert len(calls) == 3


def test_new_structure_retraces():
    f = rp.function(lambda xs: rnp.sum(xs[0]) + rnp.sum(xs[-1]))
    f([np.ones(2), np.ones(2)])
    f([np.zeros(2), np.ones(2)])
    assert f.trace_count == 1
    f([np.ones(2), np.ones(2), np.ones(2)])
    assert f.trace_count == 2
    f([np.ones(2)])
    assert f.trace_count == 3
    f((np.ones(2), np.ones(2)))  # a tuple is a different structure from a list
    assert f.trace_count == 4


def test_compiled_step_sees_new_variable_values_without_retracing():
    w = rp.Variable(np.array([1.0, 2.0]), name="w")
    f = rp.function(lambda x: rnp.sum(x * w))
    assert float(f(np.ones(2))) == 3.0
    w.assign(np.array([10.0, 20.0]))
    assert float(f(np.ones(2))) == 30.0
    assert f.trace_count == 1


def test_eager_mode_runs_python_each_call():
    calls = []

    def step(x):
        calls.append(1)
        return x * 2

    f = rp.function(step, mode="eager")
    f(np.ones(2))
    f(np.ones(2))
    assert len(calls) == 2


def test_an_eager_steps_arrays_are_freed_without_the_garbage_collector():
    """The tape holds no reference cycle: once the step returns, its intermediate arrays (and
    their nodes) go at once, not some steps later when the garbage collector runs."""
    import gc
    import weakref

    conv = rp.nn.Conv2d(2, 3, 3, padding=1)
    model = rp.nn.Sequential(conv, rp.nn.relu, lambda h: rnp.avg_pool2d(h, 2), rp.nn.Flatten(),
                             rp.nn.Linear(12, 2))
    opt = rp.optim.SGD(model.parameters(), lr=0.1)
    kept = []

    def step(x, y):
        h = conv(x)
        kept.extend([weakref.ref(h), weakref.ref(h.node)])
        loss = rp.nn.softmax_cross_entropy(model(x), y).mean()
        grads = rp.grad(loss, model.parameters())  # a dict: through tree.flatten
        kept.append(weakref.ref(next(iter(grads.values()))))
        opt.apply(grads)
        return loss

    f = rp.function(step, mode="eager")
    gc.disable()
    try:
        f(np.ones((2, 2, 4, 4)), np.array([0, 1]))
        assert [r() for r in kept] == [None] * 3
    finally:
        gc.enable()


# -- Python control flow on traced values --------------------------------------------------------
def branch_on_value(x):
    if rnp.sum(x) > 0:  # tracer: bool
        return x
    return -x


def loop_on_value(x):
    while rnp.max(x) > 100.0:  # tracer: while
        x = x / 2
    return x


def int_of_value(x):
    n = int(x[0])  # tracer: int
    return x * n


def float_of_value(x):
    scale = float(rnp.mean(x))  # tracer: float
    return x * scale


def numpy_of_value(x):
    a = np.asarray(x)  # tracer: asarray
    return rnp.asarray(a * 2)


def index_with_value(x):
    table = [1.0, 2.0, 3.0]
    return x * table[rnp.argmax(x)]  # tracer: index


def range_of_value(x):
    for _ in range(rnp.argmax(x)):  # tracer: range
        x = x + 1
    return x


def slice_with_value(x):
    return x[:rnp.argmax(x)]  # tracer: slice


def item_of_value(x):
    return x * x.sum().item()  # tracer: item


def _helper_branch(v):
    return v if v.sum() > 0 else -v  # tracer: nested


def nested_call(x):
    return _helper_branch(x * 2)


TRACER_CASES = [("bool", branch_on_value), ("while", loop_on_value), ("int", int_of_value),
                ("float", float_of_value), ("asarray", numpy_of_value),
                ("index", index_with_value), ("range", range_of_value),
                ("slice", slice_with_value), ("item", item_of_value), ("nested", nested_call)]


def line_of(marker: str) -> int:
    """The line number in this file of the line that ends with ``# tracer: <marker>``."""
    with open(__file__) as f:
        hits = [n for n, line in enumerate(f, 1) if line.rstrip().endswith(f"# tracer: {marker}")]
    assert len(hits) == 1, hits
    return hits[0]


@pytest.mark.parametrize("marker,fn", TRACER_CASES, ids=[m for m, _ in TRACER_CASES])
def test_tracer_conversion_error_points_at_the_line(marker, fn):
    x = np.array([1.0, 3.0, 2.0])
    with pytest.raises(rp.TracerConversionError) as info:
        rp.function(fn)(x)
    message = str(info.value)
    assert f"test_modes.py:{line_of(marker)}" in message, message
    assert "where" in message and "eager" in message, message
    assert isinstance(info.value, TypeError)  # what Python code expects from a bad conversion


@pytest.mark.parametrize("marker,fn", TRACER_CASES, ids=[m for m, _ in TRACER_CASES])
def test_the_same_code_runs_in_eager_mode(marker, fn):
    x = np.array([1.0, 3.0, 2.0])
    out = rp.function(fn, mode="eager")(x)
    assert np.all(np.isfinite(out))


def test_eager_control_flow_results():
    x = np.array([1.0, 3.0, 2.0])
    eager = {m: rp.function(fn, mode="eager")(x) for m, fn in TRACER_CASES}
    np.testing.assert_array_equal(eager["bool"], x)
    np.testing.assert_array_equal(eager["int"], x * 1)
    np.testing.assert_array_equal(eager["index"], x * 2.0)
    np.testing.assert_array_equal(eager["range"], x + 1)
    np.testing.assert_array_equal(eager["slice"], x[:1])
    np.testing.assert_array_equal(eager["item"], x * 6.0)


def test_traced_control_flow_alternatives_work():
    def f(x):
        y = rnp.where(rnp.sum(x) > 0, x, -x)
        z = rp.cond(rnp.max(x) > 2.0, lambda v: v * 10.0, lambda v: v, x)
        return y, z

    for mode in ("graph", "eager"):
        y, z = rp.function(f, mode=mode)(np.array([1.0, 3.0]))
        np.testing.assert_array_equal(y, [1.0, 3.0])
        np.testing.assert_array_equal(z, [10.0, 30.0])


def test_boolean_mask_of_traced_value_is_refused():
    def f(x):
        return x[x > 0]

    with pytest.raises(rp.ReplicateError, match="where"):
        rp.function(f)(np.array([1.0, -1.0]))
    np.testing.assert_array_equal(rp.function(f, mode="eager")(np.array([1.0, -1.0])), [1.0])


# -- printing and validation ---------------------------------------------------------------------
def traced_graphs():
    """Graphs traced from this file's steps plus one with many attribute kinds."""
    graphs = []
    f = rp.function(make_mlp_step(variables(MLP_INIT)))
    graphs.append(f.graph(*MLP_BATCHES[0]))
    f = rp.function(make_cnn_step(variables(CNN_INIT)))
    graphs.append(f.graph(*CNN_BATCHES[0]))
    f = rp.function(make_gp_step(variables(GP_INIT)))
    graphs.append(f.graph(*GP_BATCHES[0]))

    def assorted(x, i):
        c2 = np.arange(4.0).reshape(2, 2)  # a small multi-row constant
        big = np.arange(12.0).reshape(3, 4)  # a constant shown in summary
        y = rnp.einsum("ij,jk->ik", x[:, :2] @ c2, rnp.pad(x[:2, :2], 1)[:2, :2]) + big[:, :2]
        z = rnp.concatenate([x[i], rnp.cast(x > 0, np.float32)[i]], axis=0)
        k = rnp.random.split(rnp.random.key(0))[0]
        return y, z, rnp.random.uniform(k, (2,)), rnp.argmax(x, axis=1)

    f = rp.function(assorted)
    graphs.append(f.graph(np.ones((3, 4), np.float32), np.array([0, 2])))
    return graphs


def test_printed_ir_has_one_line_per_node():
    for graph in traced_graphs():
        text = str(graph)
        lines = text.splitlines()
        assert len(lines) == len(graph.nodes) + 2, text
        assert lines[0].startswith("{ lambda") and lines[-1].lstrip().startswith("in (")
        for node, line in zip(graph.nodes, lines[1:-1]):
            assert f" = {node.prim}" in line, (node.prim, line)
            assert str(node.out.aval) in line
        for x in graph.inputs:
            assert str(x.aval) in lines[0]


def test_printed_ir_example():
    f = rp.function(lambda x, w: rnp.sum(rnp.tanh(x @ w)))
    text = str(f.graph(np.ones((4, 3), np.float32), np.ones(3, np.float32)))
    assert text.splitlines()[0] == "{ lambda a:f32[4,3] b:f32[3] ."
    assert "= matmul " in text and "= tanh " in text and "reduce_sum[axes=(0,)]" in text


def test_validator_accepts_traced_graphs():
    for graph in traced_graphs():
        validate(graph)


def _graph():
    f = rp.function(lambda x, y: rnp.sum(rnp.tanh(x * y) + x))
    g = f.graph(np.ones(3), np.ones(3))
    validate(g)
    return g


def test_validator_rejects_use_before_definition():
    g = _graph()
    nodes = list(g.nodes)
    nodes[0], nodes[1] = nodes[1], nodes[0]
    with pytest.raises(InvalidGraphError, match="before it is defined"):
        validate(Graph(g.inputs, nodes, g.outputs))


def test_validator_rejects_missing_input():
    g = _graph()
    with pytest.raises(InvalidGraphError, match="before it is defined"):
        validate(Graph(g.inputs[:1], g.nodes, g.outputs))


def test_validator_rejects_wrong_type():
    g = _graph()
    out = g.nodes[0].out
    out.aval = AVal((4,), out.aval.dtype)
    with pytest.raises(InvalidGraphError, match="shape rule gives"):
        validate(g)


def test_validator_rejects_unknown_primitive():
    g = _graph()
    g.nodes[1].prim = "no_such_op"
    with pytest.raises(InvalidGraphError, match="unknown primitive 'no_such_op'"):
        validate(g)


def test_validator_rejects_redefinition_and_broken_links():
    g = _graph()
    with pytest.raises(InvalidGraphError, match="redefines"):
        validate(Graph(g.inputs, g.nodes + [g.nodes[-1]], g.outputs))
    g.nodes[0].out = g.nodes[1].out
    with pytest.raises(InvalidGraphError, match="broken output link"):
        validate(g)


def test_validator_rejects_undefined_output_and_duplicate_input():
    g = _graph()
    stray = Array(AVal((), np.dtype(np.float64)))
    with pytest.raises(InvalidGraphError, match="output is not defined"):
        validate(Graph(g.inputs, g.nodes, g.outputs + [stray]))
    with pytest.raises(InvalidGraphError, match="listed twice"):
        validate(Graph(g.inputs + g.inputs[:1], g.nodes, g.outputs))
