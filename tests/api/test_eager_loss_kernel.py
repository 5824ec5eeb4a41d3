"""Eager mode's softmax cross-entropy with integer labels as two NumPy kernels
(``replicate/nn/eager_loss.py``): the per-example losses and the gradient are the
``replicate.numpy`` definition's to the bit (infinite and huge logits included), higher
derivatives the definition's, labels it cannot take (out of range, negative, one-hot) take the
definition, and the loss runs as two kernels where the definition runs ~35 ops."""

from __future__ import annotations

import numpy as np
import pytest
from eager_steps import with_and_without

import replicate as rp
import replicate.numpy as rnp
from replicate.nn import eager_kernels as ek

rng = np.random.default_rng(31)


def _bits(a):
    return np.ascontiguousarray(np.asarray(a)).view(np.uint8)


def _both(monkeypatch, logits, labels, weights):
    """(losses, gradient of sum(weights * losses)) with the kernels and op by op."""
    out = {}
    for fast in (True, False):
        monkeypatch.setattr(ek, "ENABLED", fast)
        x = rnp.asarray(logits)
        loss = rp.nn.softmax_cross_entropy(x, labels)
        out[fast] = [loss, rp.grad(rnp.sum(loss * weights), x)]
    return out


@pytest.mark.filterwarnings("ignore::RuntimeWarning")  # (inf - inf, log(0): both roads)
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("shape", [(256, 10), (7, 1), (3, 1000), (1, 5)])
def test_losses_and_gradient_equal_the_definition_bitwise(monkeypatch, shape, dtype):
    logits = (rng.standard_normal(shape) * 4).astype(dtype)
    if shape[0] >= 7 and shape[1] > 1:
        logits[0, 0] = np.inf
        logits[1, :] = -np.inf
        logits[2, -1] = 1e30 if dtype == np.float32 else 1e300
        logits[3, 0] = -0.0
    labels = rng.integers(0, shape[1], shape[0])
    labels[: min(2, shape[0])] = [0, shape[1] - 1][: min(2, shape[0])]
    weights = rng.standard_normal(shape[:1]).astype(dtype)
    out = _both(monkeypatch, logits, labels, weights)
    for k, (got, want) in enumerate(zip(out[True], out[False])):
        assert got.dtype == want.dtype == dtype
        np.testing.assert_array_equal(_bits(got), _bits(want), err_msg=f"output {k}")


def test_second_derivatives_are_the_definitions(monkeypatch):
    logits, v = rng.standard_normal((6, 4)), rng.standard_normal((6, 4))
    labels = rng.integers(0, 4, 6)
    got = {}
    for fast in (True, False):
        monkeypatch.setattr(ek, "ENABLED", fast)
        x = rnp.asarray(logits)
        dx = rp.grad(rnp.sum(rp.nn.softmax_cross_entropy(x * x, labels)), x)
        hx = rp.grad(rnp.sum(dx * v), x)
        got[fast] = [dx.numpy(), hx.numpy()]
    for a, want in zip(got[True], got[False]):
        np.testing.assert_allclose(a, want, rtol=1e-12, atol=1e-12)
        assert np.abs(want).max() > 1e-3


@pytest.mark.parametrize("labels", [[0, 4, 1], [0, -1, 2], [[0, 1, 0, 0, 0]] * 3])
def test_labels_the_kernel_does_not_take_are_the_definitions(monkeypatch, labels):
    """Out of range and negative labels (the definition's IndexError: a negative label is not
    counted from the end) and one-hot labels go the definition's way."""
    logits = rng.standard_normal((3, 4 if labels[1] == 4 else 5)).astype(np.float32)
    labels = np.asarray(labels, np.float32 if np.ndim(labels) == 2 else np.int64)
    if labels.ndim == 1:
        for fast in (True, False):
            monkeypatch.setattr(ek, "ENABLED", fast)
            with pytest.raises(IndexError, match="out of bounds"):
                rp.nn.softmax_cross_entropy(rnp.asarray(logits), labels)
        return
    out = _both(monkeypatch, logits, labels, np.ones(3, np.float32))
    for got, want in zip(out[True], out[False]):
        np.testing.assert_array_equal(_bits(got), _bits(want))


def test_the_loss_runs_as_two_kernels(tmp_path):
    x = rnp.asarray(rng.standard_normal((8, 5)).astype(np.float32))
    got = with_and_without(lambda: rp.grad(rnp.mean(rp.nn.softmax_cross_entropy(
        x, rng.integers(0, 5, 8))), x), tmp_path)
    ops = {fast: names for fast, (_, names) in got.items()}
    assert [n for n in ops[True] if n.startswith("softmax_cross_entropy")] == [
        "softmax_cross_entropy", "softmax_cross_entropy backward"]
    assert len(ops[True]) + 20 <= len(ops[False]), (ops[True], ops[False])
