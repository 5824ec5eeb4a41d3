"""NumPy functions on library values never convert silently (issue 13).

``np.tanh(x)`` on an ``rp.Array`` used to return a NumPy array in eager mode (its gradient silently
zero) and ``np.tanh(w)`` on a ``Variable`` inside a traced step baked the variable's current value
into the graph. Both now raise ``rp.NumpyConversionError`` (a ``TracerConversionError``, so a
``TypeError``) in eager and graph mode alike, naming the NumPy function, the line, why, and the
``rnp`` function to use. What stays: ``np.asarray(x)`` of an eager value, ``float(x)``,
``x.numpy()``, ``np.asarray(w)`` outside a traced step, and ``ndarray * x`` (NumPy hands its
operators to the library value, which answers with the rnp op, gradient included).
"""

from __future__ import annotations

import numpy as np
import pytest

import replicate as rp
import replicate.numpy as rnp

MODES = ["graph", "eager"]


def line_of(marker: str) -> int:
    """The line number in this file of the line that ends with ``# np: <marker>``."""
    with open(__file__) as f:
        hits = [n for n, line in enumerate(f, 1) if line.rstrip().endswith(f"# np: {marker}")]
    assert len(hits) == 1, hits
    return hits[0]


def assert_refused(info, function: str, marker: str, rnp_name: str | None):
    """The message names the NumPy function, this file's line, why, and the rnp equivalent."""
    message = str(info.value)
    assert isinstance(info.value, rp.NumpyConversionError)
    assert isinstance(info.value, rp.TracerConversionError)  # graph mode's class, still caught
    assert isinstance(info.value, TypeError)
    assert f"{function}() called on" in message, message
    assert f"test_numpy_functions.py:{line_of(marker)}" in message, message
    assert "neither record gradients in eager mode nor trace in graph mode" in message, message
    if rnp_name is not None:
        assert f"rnp.{rnp_name}(" in message, message


# ================================================================================================
# NumPy functions on Arrays: refused in both modes, with one wording
# ================================================================================================
@pytest.mark.parametrize("mode", MODES)
def test_np_ufunc_on_an_array_refuses_and_names_rnp(mode):
    w = rp.Variable(np.full(3, 0.5), name="w")

    def step(x):
        h = np.tanh(x * w)  # np: tanh
        return rnp.sum(h)

    with pytest.raises(rp.NumpyConversionError) as info:
        rp.function(step, mode=mode)(np.ones(3))
    assert_refused(info, "np.tanh", "tanh", "tanh")
    message = str(info.value)
    if mode == "eager":
        assert "x.numpy() for the value without gradient" in message, message
        assert "a replicate array" in message, message
    else:
        assert "a traced value" in message, message


@pytest.mark.parametrize("mode", MODES)
def test_np_array_function_on_an_array_refuses_and_names_rnp(mode):
    def step(x):
        return np.mean(x * 2.0)  # np: mean

    with pytest.raises(rp.NumpyConversionError) as info:
        rp.function(step, mode=mode)(np.ones(3))
    assert_refused(info, "np.mean", "mean", "mean")


def test_refusal_outside_any_step_and_functions_without_an_rnp_twin():
    x = rnp.asarray([3.0, 4.0])
    with pytest.raises(rp.NumpyConversionError) as info:
        np.linalg.norm(x)  # np: norm
    assert_refused(info, "np.linalg.norm", "norm", None)
    assert "replicate.numpy has no linalg.norm" in str(info.value)
    with pytest.raises(rp.NumpyConversionError) as info:
        np.abs(x)  # np: abs
    assert_refused(info, "np.absolute", "abs", "abs")  # NumPy's name, replicate.numpy's twin
    with pytest.raises(rp.NumpyConversionError) as info:
        np.where(x > 3.5, x, 0.0)  # np: where
    assert_refused(info, "np.where", "where", "where")
    with pytest.raises(rp.NumpyConversionError):
        np.add.reduce(x)
    with pytest.raises(rp.NumpyConversionError):
        np.multiply(np.ones(2), x, out=np.empty(2))  # an ndarray cannot hold a library value


def test_the_rnp_function_it_names_gives_the_gradient():
    w = rp.Variable(np.full(3, 0.5), name="w")
    x = np.array([1.0, -2.0, 3.0])

    def step(x):
        return rp.grad(rnp.sum(rnp.tanh(x * w)), w)

    expected = x * (1 - np.tanh(x * 0.5) ** 2)
    for mode in MODES:
        np.testing.assert_allclose(rp.function(step, mode=mode)(x), expected, rtol=1e-12)


# ================================================================================================
# What keeps working
# ================================================================================================
def test_explicit_conversions_of_an_eager_value_keep_working():
    x = rnp.asarray([1.5, 2.5])
    np.testing.assert_array_equal(np.asarray(x), [1.5, 2.5])
    np.testing.assert_array_equal(np.array(x, dtype=np.float32), np.float32([1.5, 2.5]))
    np.testing.assert_array_equal(x.numpy(), [1.5, 2.5])
    assert x.tolist() == [1.5, 2.5]
    assert float(x[0]) == 1.5
    np.testing.assert_allclose(np.tanh(x.numpy()), np.tanh([1.5, 2.5]))

    def step(v):
        seen = np.asarray(v)  # the value, explicitly, without gradient
        return v * float(seen.sum())

    np.testing.assert_allclose(rp.function(step, mode="eager")(np.array([1.0, 2.0])), [3.0, 6.0])


def test_graph_mode_asarray_of_a_traced_value_still_raises_with_the_same_wording():
    def step(x):
        return np.asarray(x)  # np: asarray

    with pytest.raises(rp.TracerConversionError) as info:
        rp.function(step)(np.ones(2))
    message = str(info.value)
    assert f"test_numpy_functions.py:{line_of('asarray')}" in message, message
    assert "neither record gradients in eager mode nor trace in graph mode" in message, message
    assert "mode='eager'" in message, message


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("op", ["mul", "add", "sub", "truediv", "matmul", "pow"])
def test_ndarray_operator_array_keeps_the_gradient(mode, op):
    a = np.array([[1.0, 2.0], [3.0, 4.0]])
    w = rp.Variable(np.array([[0.5, -1.0], [2.0, 1.5]]), name="w")
    apply = {"mul": lambda n, v: n * v, "add": lambda n, v: n + v, "sub": lambda n, v: n - v,
             "truediv": lambda n, v: n / v, "matmul": lambda n, v: n @ v,
             "pow": lambda n, v: n ** v}[op]

    def step(x):
        y = apply(a, x * w)  # ndarray on the left: NumPy calls its ufunc on the Array
        assert isinstance(y, rp.Array)
        return y, rp.grad(rnp.sum(y), w)

    y, g = rp.function(step, mode=mode)(np.ones((2, 2)))
    np.testing.assert_allclose(y, apply(a, w.numpy()), rtol=1e-12)
    eps = 1e-6
    numeric = np.zeros((2, 2))
    for idx in np.ndindex(2, 2):
        plus, minus = w.numpy().copy(), w.numpy().copy()
        plus[idx] += eps
        minus[idx] -= eps
        numeric[idx] = (apply(a, plus).sum() - apply(a, minus).sum()) / (2 * eps)
    np.testing.assert_allclose(g, numeric, rtol=1e-6, atol=1e-8)


@pytest.mark.parametrize("mode", MODES)
def test_ndarray_operator_variable_reads_the_variable(mode):
    """``ndarray * w`` used to convert ``w`` (a Variable has no __array_priority__): in graph mode
    its value was baked in. Now it reads the Variable, so an update is seen on the next call."""
    w = rp.Variable(np.array([1.0, 2.0]), name="w")

    def step(x):
        y = np.array([3.0, 4.0]) * w + np.float64(2.0) * w
        return y, rp.grad(rnp.sum(y * x), w)

    f = rp.function(step, mode=mode)
    y, g = f(np.ones(2))
    np.testing.assert_allclose(y, [5.0, 12.0])
    np.testing.assert_allclose(g, [5.0, 6.0])
    w.load(np.array([10.0, 20.0]))
    y, _ = f(np.ones(2))
    np.testing.assert_allclose(y, [50.0, 120.0])


@pytest.mark.parametrize("mode", MODES)
def test_ndarray_comparison_with_an_array_gives_an_array(mode):
    def step(x):
        mask = np.array([0.0, 5.0]) < x
        assert isinstance(mask, rp.Array)
        return rnp.where(mask, x, 0.0)

    np.testing.assert_array_equal(rp.function(step, mode=mode)(np.array([1.0, 2.0])), [1.0, 0.0])


# ================================================================================================
# Variables
# ================================================================================================
@pytest.mark.parametrize("mode", MODES)
def test_np_function_on_a_variable_in_a_step_refuses(mode):
    w = rp.Variable(np.full(3, 0.5), name="w")

    def step(x):
        return x + np.tanh(w)  # np: variable tanh

    with pytest.raises(rp.NumpyConversionError) as info:
        rp.function(step, mode=mode)(np.ones(3))
    assert_refused(info, "np.tanh", "variable tanh", "tanh")
    message = str(info.value)
    assert "Variable 'w'" in message, message
    assert "np.tanh(w.numpy())" in message, message  # how to do it outside a step


def test_asarray_of_a_variable_in_a_traced_step_refuses():
    w = rp.Variable(np.full(3, 0.5), name="w")

    def step(x):
        return x + np.asarray(w)  # np: variable asarray

    with pytest.raises(rp.NumpyConversionError) as info:
        rp.function(step)(np.ones(3))
    message = str(info.value)
    assert f"test_numpy_functions.py:{line_of('variable asarray')}" in message, message
    assert "Variable 'w'" in message and "constant" in message, message
    assert "rnp" in message, message


def test_a_variable_outside_a_step_converts_for_logging_and_tests():
    w = rp.Variable(np.array([0.25, -0.5]), name="w")
    np.testing.assert_array_equal(np.asarray(w), [0.25, -0.5])
    np.testing.assert_array_equal(np.array(w, dtype=np.float32), np.float32([0.25, -0.5]))
    np.testing.assert_allclose(w, [0.25, -0.5])  # NumPy's testing helpers convert with asarray
    np.testing.assert_allclose(np.tanh(w.numpy()), np.tanh([0.25, -0.5]))
    with pytest.raises(rp.NumpyConversionError):
        np.tanh(w)  # one rule everywhere: a NumPy function takes w.numpy(), not w


# ================================================================================================
# A newcomer from PyTorch: an MLP step with np.tanh out of habit
# ================================================================================================
class MLP(rp.nn.Module):
    def __init__(self, rng, tanh):
        super().__init__()
        self.fc1 = rp.nn.Linear(4, 16, rng=rng)
        self.fc2 = rp.nn.Linear(16, 3, rng=rng)
        self.tanh = tanh

    def forward(self, x):
        return self.fc2(self.tanh(self.fc1(x)))  # np: mlp habit


@pytest.mark.parametrize("mode", MODES)
def test_mlp_step_written_with_np_tanh_by_habit_gets_a_clear_error(mode):
    rng = np.random.default_rng(0)
    x = rng.normal(size=(8, 4)).astype(np.float32)
    y = rng.integers(0, 3, size=8)
    model = MLP(rng, np.tanh)  # out of habit
    before = {n: p.numpy().copy() for n, p in model.parameters().items()}
    opt = rp.optim.SGD(model.parameters(), lr=0.1)

    def train_step(x, y):
        loss = rp.nn.softmax_cross_entropy(model(x), y).mean()
        opt.apply(rp.grad(loss, model.parameters()))
        return loss

    with pytest.raises(rp.NumpyConversionError) as info:
        rp.function(train_step, mode=mode)(x, y)
    assert_refused(info, "np.tanh", "mlp habit", "tanh")
    for n, p in model.parameters().items():  # nothing was trained with a zero gradient
        np.testing.assert_array_equal(p.numpy(), before[n])

    model.tanh = rnp.tanh  # what the message says
    step = rp.function(train_step, mode=mode)
    losses = [float(step(x, y)) for _ in range(5)]
    assert losses[-1] < losses[0]
