"""What the eager-kernel tests share (tests/api/test_eager_*.py): a function run with the
kernels and without them, its compute ops as the profiler records them, and whole training
steps compared bit for bit."""

from __future__ import annotations

import numpy as np

import replicate as rp
from replicate.nn import eager_kernels as ek


def bits(a) -> np.ndarray:
    return np.ascontiguousarray(np.asarray(a)).view(np.uint8)


def with_and_without(fn, tmp_path) -> dict:
    """{True: (fn's result, its compute ops), False: ...}: ``fn()`` with the kernels on, then
    off (the definition's road), each under the profiler."""
    out = {}
    for fast in (True, False):
        ek.ENABLED = fast
        try:
            path = str(tmp_path / f"{fast}.json")
            with rp.profile.recording(path):
                result = fn()
        finally:
            ek.ENABLED = True
        out[fast] = (result, [e["name"] for e in rp.profile.load(path)
                              if e.get("cat") == "compute"])
    return out


def two_steps(model, opt, batch, seed: int, scale: float = 0.4) -> list:
    """Two steps of ``model`` with ``opt`` on ``batch(rs)`` = (x, labels): the losses, then every
    slot and parameter (parameters drawn from ``seed`` first, times ``scale``)."""
    rs = np.random.default_rng(seed)
    for p in model.parameters().values():
        p.load(rs.standard_normal(p.shape).astype(np.float32) * scale)
    losses = []
    for _ in range(2):
        x, labels = batch(rs)
        loss = rp.nn.softmax_cross_entropy(model(x), labels).mean()
        opt.apply(rp.grad(loss, model.parameters()))
        losses.append(loss.numpy())
    return losses + [v.numpy() for v in opt.variables().values()] + \
        [p.numpy() for p in model.parameters().values()]


def assert_kernels_change_no_bit(monkeypatch, run, least: int) -> None:
    """``run()`` (a list of arrays) with the kernels and without: the same bits, value by value."""
    fast = run()
    monkeypatch.setattr(ek, "ENABLED", False)
    plain = run()
    assert len(fast) == len(plain) > least
    for k, (got, want) in enumerate(zip(fast, plain)):
        np.testing.assert_array_equal(bits(got), bits(want), err_msg=f"value {k}")
