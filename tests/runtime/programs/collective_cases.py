"""Collective test cases and their NumPy reference semantics, shared by the in-process tests
(tests/runtime/test_collectives.py) and the `mpiexec -n 2` program
(tests/runtime/programs/collectives_mpi.py).

Every case is run as: replica r gets its own ``x_r`` and ``c_r``, computes ``y_r = collective(x_r)``
and ``loss_r = sum(c_r * y_r)`` and returns ``y_r`` and ``rp.grad(loss_r, x_r)``. The reference
gradient is d(sum_s loss_s)/d x_r, written out by hand for each collective below.
"""

from __future__ import annotations

import numpy as np

import replicate as rp

SHAPE = (12, 24)  # per replica; both axes divisible by 1, 2, 3 and 4 replicas (reduce_scatter)


def cases(R: int) -> list[tuple[str, str, dict]]:
    """(test id, kind, attrs) of every case that makes sense for R replicas."""
    out = [(f"all_reduce-{op}", "all_reduce", {"op": op}) for op in ("sum", "mean", "max", "min")]
    out += [(f"all_gather-axis{axis}-{'tiled' if tiled else 'stacked'}", "all_gather",
             {"axis": axis, "tiled": tiled}) for axis in (0, 1) for tiled in (False, True)]
    out += [(f"broadcast-root{root}", "broadcast", {"root": root})
            for root in sorted({0, 1 % R, R // 2, R - 1})]
    out += [(f"reduce_scatter-{op}-axis{axis}", "reduce_scatter", {"op": op, "axis": axis})
            for op in ("sum", "mean") for axis in (0, 1)]
    out += [(f"permute-shift{shift}", "permute", {"shift": shift}) for shift in (1, -1, 2)]
    return out


def apply(kind: str, attrs: dict, x):
    """Call the library's collective."""
    fn = {"all_reduce": rp.all_reduce, "all_gather": rp.all_gather, "broadcast": rp.broadcast,
          "reduce_scatter": rp.reduce_scatter, "permute": rp.permute}[kind]
    return fn(x, **attrs)


# -- NumPy semantics ------------------------------------------------------------------------------
def _reduce(X, op):
    return {"sum": X.sum(0), "mean": X.mean(0), "max": X.max(0), "min": X.min(0)}[op]


def ref_forward(kind: str, attrs: dict, X: np.ndarray) -> np.ndarray:
    """Y[r] = what replica r receives, given X[r] = what replica r sent."""
    R = len(X)
    if kind == "all_reduce":
        return np.stack([_reduce(X, attrs["op"])] * R)
    if kind == "all_gather":
        join = np.concatenate if attrs["tiled"] else np.stack
        return np.stack([join(list(X), axis=attrs["axis"])] * R)
    if kind == "broadcast":
        return np.stack([X[attrs["root"]]] * R)
    if kind == "reduce_scatter":
        total, axis = _reduce(X, attrs["op"]), attrs["axis"]
        chunks = np.split(total, R, axis=axis)
        return np.stack(chunks)
    if kind == "permute":
        return np.stack([X[(r - attrs["shift"]) % R] for r in range(R)])
    raise AssertionError(kind)


def ref_grad(kind: str, attrs: dict, X: np.ndarray, C: np.ndarray) -> np.ndarray:
    """G[r] = d/dX[r] of sum_s sum(C[s] * Y[s]) — the gradient of the total objective."""
    R = len(X)
    csum = C.sum(0)
    if kind == "all_reduce":
        op = attrs["op"]
        if op == "sum":
            return np.stack([csum] * R)
        if op == "mean":
            return np.stack([csum / R] * R)
        extreme = _reduce(X, op)
        return np.stack([csum * (X[r] == extreme) for r in range(R)])
    if kind == "all_gather":
        axis = attrs["axis"]
        if attrs["tiled"]:
            return np.stack(np.split(csum, R, axis=axis))
        return np.stack([np.take(csum, r, axis=axis) for r in range(R)])
    if kind == "broadcast":
        return np.stack([csum if r == attrs["root"] else np.zeros_like(csum) for r in range(R)])
    if kind == "reduce_scatter":
        full = np.concatenate(list(C), axis=attrs["axis"])
        if attrs["op"] == "mean":
            full = full / R
        return np.stack([full] * R)
    if kind == "permute":
        return np.stack([C[(r + attrs["shift"]) % R] for r in range(R)])
    raise AssertionError(kind)


def make_data(kind: str, attrs: dict, R: int, seed: int = 0):
    """float64 inputs X (R, *SHAPE) and cotangent weights C shaped like the outputs."""
    rng = np.random.default_rng([seed, R, len(kind)])
    X = rng.normal(size=(R,) + SHAPE)
    C = rng.normal(size=ref_forward(kind, attrs, X).shape)
    return X, C


def run_case(kind: str, attrs: dict, X, C, k: int = 1, mode: str = "graph", steps: int = 2,
             comm=None):
    """Run the case with the Replicator; return (Y, G, replicator) with Y, G of shape (R, ...)."""

    def input_fn(ctx):
        while True:
            yield {"x": X[ctx.replica_id], "c": C[ctx.replica_id]}

    def step_fn(batch):
        y = apply(kind, attrs, batch["x"])
        loss = (batch["c"] * y).sum()
        return {"y": y, "g": rp.grad(loss, batch["x"])}

    rep = rp.Replicator(input_fn, step_fn, mode=mode, replicas_per_rank=k,
                        outputs="per_replica", comm=comm)
    history = rep.run(steps)
    assert len(history) == steps
    for later in history[1:]:  # the same inputs every step: the same results every step
        np.testing.assert_array_equal(later["y"], history[0]["y"])
        np.testing.assert_array_equal(later["g"], history[0]["g"])
    return history[-1]["y"], history[-1]["g"], rep
