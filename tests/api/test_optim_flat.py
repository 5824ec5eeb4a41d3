"""Eager mode's built-in updates without a loop over the parameters
(``replicate/optimizers.py``: ``_Group``): one update a dtype group, the parameters and slots
laid end to end, to the bit what the compiled (per-parameter) step gives."""

from __future__ import annotations

import numpy as np
import pytest

import replicate as rp
import replicate.numpy as rnp

# a mixed model: float32, float64 and bfloat16 (master weights) parameters, interleaved
SPECS = [((3, 4), np.float32), ((5,), np.float64), ((2, 3), rp.dtypes.bfloat16),
         ((7,), np.float32), ((4, 2), np.float64), ((6,), rp.dtypes.bfloat16), ((), np.float32)]
MAKERS = {
    "adamw": lambda ps: rp.optim.AdamW(ps, lr=0.01, weight_decay=0.1),
    "sgd-nesterov": lambda ps: rp.optim.SGD(ps, lr=0.05, momentum=0.8, nesterov=True),
    "rmsprop": lambda ps: rp.optim.RMSProp(ps, lr=0.01, momentum=0.5),
    "adagrad": lambda ps: rp.optim.Adagrad(ps, lr=0.1, initial_accumulator_value=0.2),
    "adadelta": lambda ps: rp.optim.Adadelta(ps, weight_decay=0.01),
}


def _values(seed):
    rng = np.random.default_rng(seed)
    return [rng.standard_normal(shape).astype(dtype) for shape, dtype in SPECS]


def _bits(a):
    return np.ascontiguousarray(np.atleast_1d(np.asarray(a))).view(np.uint8)


def _run(make, mode, calls, outside=None):
    """Four steps; ``outside``: assign a new value to parameter 3 after step 2 (a parameter
    assigned from outside between updates)."""
    params = [rp.Variable(v) for v in _values(0)]
    opt = make(params)
    original = type(opt).update

    def counted(self, i, *args):
        calls.append(i)
        return original(self, i, *args)

    type(opt).update = counted
    counted.elementwise = getattr(original, "elementwise", False)
    try:
        step = rp.function(lambda gs: opt.apply(gs) or rnp.zeros(()), mode=mode)
        for s in range(4):
            step([g.astype(np.float32) for g in _values(s + 1)])
            if outside is not None and s == 1:
                params[3].assign(np.full(SPECS[3][0], outside, np.float32))
    finally:
        type(opt).update = original
    out = {k: v.numpy() for k, v in opt.variables().items()}
    out.update({f"param/{i}": p.numpy() for i, p in enumerate(params)})
    return out


@pytest.mark.parametrize("outside", [None, 0.25])
@pytest.mark.parametrize("name", list(MAKERS))
def test_eager_updates_a_group_at_once_and_equals_the_compiled_step_bitwise(name, outside):
    calls = {"eager": [], "graph": []}
    results = {mode: _run(MAKERS[name], mode, calls[mode], outside) for mode in calls}
    for key, want in results["graph"].items():
        got = results["eager"][key]
        assert got.dtype == want.dtype, key
        np.testing.assert_array_equal(_bits(got), _bits(want), err_msg=f"{name} {key}")
    # eager: one update per group (float32, float64, bfloat16) and step; the trace: per parameter
    assert len(calls["eager"]) == 3 * 4 and not any(isinstance(i, int) for i in calls["eager"])
    assert calls["graph"] == list(range(len(SPECS)))


def test_an_update_written_by_a_subclass_runs_per_parameter():
    """A subclass that overrides ``update`` is not known to be elementwise (a layer-wise trust
    ratio is not): eager mode calls it once per parameter, with the parameter's index."""
    seen = []

    class Lars(rp.optim.SGD):
        def update(self, i, p, g, lr, step):
            seen.append((i, p.shape))
            return p - lr * g * (np.linalg.norm(p) / (np.linalg.norm(g) + 1e-9))

    params = [rp.Variable(v.astype(np.float32)) for v in _values(0)[:2]]
    before = [p.numpy().astype(np.float64) for p in params]
    grads = [np.ones(p.shape, np.float32) for p in params]
    Lars(params, lr=0.1).apply(grads)
    assert seen == [(0, (3, 4)), (1, (5,))]
    for b, p, g in zip(before, params, grads):
        want = b - 0.1 * g * (np.linalg.norm(b) / (np.linalg.norm(g) + 1e-9))
        np.testing.assert_allclose(p.numpy(), want, rtol=1e-5)


def test_a_group_is_updated_in_place_of_its_buffer_after_the_first_step():
    """After an update the group's parameters are pieces of one buffer, which the next update
    takes as it is (no copy); the values stay each parameter's own."""
    params = [rp.Variable(np.full(s, k, np.float32)) for k, s in enumerate([(2, 2), (3,), ()])]
    opt = rp.optim.SGD(params, lr=1.0)
    for _ in range(2):
        opt.apply([np.ones(p.shape, np.float32) for p in params])
    base = params[0].value.base
    assert base is not None and all(p.value.base is base for p in params)
    from replicate.optim_flat import Group  # the pieces of a buffer give the buffer itself
    group = Group([0, 1, 2], [(2, 2), (3,), ()])
    buffer = np.arange(8, dtype=np.float32)
    assert group.flat(group.split(buffer), np.float32) is buffer
    assert group.flat([np.ones((2, 2), np.float32), np.ones(3, np.float32),
                       np.ones((), np.float32)], np.float32).base is None  # (else a copy)
    assert [p.numpy().tolist() for p in params] == [[[-2.0, -2.0], [-2.0, -2.0]],
                                                    [-1.0, -1.0, -1.0], 0.0]


@pytest.mark.parametrize("name", ["sgd", "adam", *MAKERS])
def test_an_eager_update_writes_no_array_that_another_holder_still_reads(name):
    """Eager updates write their result into a temporary of their own (``xp.minus``), never
    into what a tape or the caller still holds: the parameters' and slots' values read before
    the update (a tape's residuals), and the gradients passed in, stay as they were."""
    make = {"sgd": lambda ps: rp.optim.SGD(ps, lr=0.1),
            "adam": lambda ps: rp.optim.Adam(ps, lr=0.1)}.get(name) or MAKERS[name]
    rng = np.random.default_rng(5)
    shapes = [(200, 100), (3, 4), (7,)]  # (one large parameter: a group of its own)
    params = [rp.Variable(rng.standard_normal(s).astype(np.float32)) for s in shapes]
    opt = make(params)
    for step in range(3):
        held = [v.read() for v in [*params, *opt.variables().values()]]
        grads = [rnp.asarray(rng.standard_normal(s).astype(np.float32)) for s in shapes]
        copies = [np.array(a.numpy(), copy=True) for a in held + grads]
        opt.apply(grads)
        for k, (a, want) in enumerate(zip(held + grads, copies)):
            np.testing.assert_array_equal(_bits(a.numpy()), _bits(want), err_msg=f"{step} {k}")
        assert not np.array_equal(params[0].numpy(), copies[0])  # (the update happened)
