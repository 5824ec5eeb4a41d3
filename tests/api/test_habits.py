"""PyTorch habits on library objects raise one HabitError naming the user's line and the
replicate way (replicate/habits.py); arrays format as NumPy formats them."""

from __future__ import annotations

import copy
import os
import traceback

import numpy as np
import pytest

import replicate as rp
import replicate.numpy as rnp

HERE = os.path.basename(__file__)
PACKAGE = os.path.dirname(rp.__file__)


def _objects():
    model = rp.nn.Linear(3, 2)
    opt = rp.optim.SGD(model.parameters(), lr=0.1)
    return {"array": rnp.asarray([1.0, 2.0]), "variable": model.weight, "module": model,
            "optimizer": opt, "wrapped": rp.wrap_optimizer(opt)}


CASES = [  # (object, habit, a word of the answer)
    ("array", lambda x: x.backward(), "rp.grad"),
    ("array", lambda x: x.to("cuda"), "backend="),
    ("array", lambda x: x.cuda(), "backend="),
    ("array", lambda x: x.cpu(), "x.numpy()"),
    ("array", lambda x: x.detach(), "rp.stop_gradient"),
    ("array", lambda x: x.float(), "astype"),
    ("array", lambda x: x.unsqueeze(0), "expand_dims"),
    ("variable", lambda w: w.grad, "rp.grad"),
    ("variable", lambda w: w.requires_grad_(), "rp.grad"),
    ("variable", lambda w: w.to("cuda"), "backend="),
    ("module", lambda m: m.to("cuda"), "backend="),
    ("module", lambda m: m.zero_grad(), "rp.grad"),
    ("module", lambda m: m.state_dict(), "model.variables()"),
    ("optimizer", lambda o: o.zero_grad(), "opt.apply"),
    ("optimizer", lambda o: o.step(), "opt.apply"),
    ("optimizer", lambda o: o.param_groups, "schedule"),
    ("wrapped", lambda o: o.zero_grad(), "opt.apply"),
    ("wrapped", lambda o: o.step(), "opt.apply"),
]


@pytest.mark.parametrize("kind,habit,answer", CASES)
def test_a_habit_names_the_users_line_and_the_replicate_way(kind, habit, answer):
    with pytest.raises(rp.HabitError) as info:
        habit(_objects()[kind])
    first, second = str(info.value).splitlines()[:2]
    assert first.startswith(f"{HERE}:") or f"/{HERE}:" in first  # the user's line first
    assert "lambda" in first  # (the habit's own line in CASES)
    assert answer in second
    assert isinstance(info.value, AttributeError) and isinstance(info.value, TypeError)


def test_other_missing_names_stay_plain_attribute_errors():
    objects = _objects()
    for obj in objects.values():
        assert not hasattr(obj, "to") and not hasattr(obj, "zero_grad")  # hasattr: False
        with pytest.raises(AttributeError) as info:
            obj.no_such_thing  # noqa: B018
        assert not isinstance(info.value, rp.HabitError)
    w = objects["variable"]
    with pytest.raises(TypeError) as info:
        w()
    assert not isinstance(info.value, rp.HabitError) and "not callable" in str(info.value)
    clone = copy.deepcopy(objects["module"])  # copy probes __deepcopy__, __setstate__: plain
    np.testing.assert_array_equal(clone.weight.numpy(), objects["module"].weight.numpy())


@pytest.mark.parametrize("mode", ["graph", "eager"])
def test_inside_a_replicator_step_the_traceback_holds_only_user_frames(mode):
    model = rp.nn.Linear(3, 1)

    def step(x):
        loss = rnp.mean(model(x) ** 2)
        loss.backward()
        return {"loss": loss}

    batches = lambda ctx: iter([np.ones((2, 3), np.float32)] * 2)  # noqa: E731
    with pytest.raises(rp.HabitError) as info:
        rp.Replicator(batches, step, mode=mode).run(1)
    assert "loss.backward()" in str(info.value).splitlines()[0]
    frames = traceback.extract_tb(info.value.__traceback__)
    assert frames and not [f for f in frames if f.filename.startswith(PACKAGE + os.sep)]


@pytest.mark.parametrize("value", [np.float32(2 / 3), np.float64(-1e-7), np.int64(7)])
def test_a_0d_array_or_variable_formats_as_numpy(value):
    x, w = rnp.asarray(value), rp.Variable(value)
    for spec in (".4f", ".3e", "8.2f", "", ">10"):
        if spec and value.dtype.kind == "i" and "f" not in spec and "e" not in spec:
            continue
        want = format(np.asarray(value), spec)
        assert f"{x:{spec}}" == want or not spec and f"{x}" == repr(x)
        assert f"{w:{spec}}" == want or not spec and f"{w}" == repr(w)
    assert x.item() == value.item() and w.item() == value.item()
    assert rp.Variable(np.arange(3.0)).tolist() == [0.0, 1.0, 2.0]


def test_an_nd_array_formats_as_numpy_does_and_a_traced_value_refuses():
    x = rnp.ones(3)
    with pytest.raises(TypeError, match="unsupported format string"):  # NumPy's answer
        f"{x:.2f}"  # noqa: B018
    with pytest.raises(TypeError, match="unsupported format string"):
        f"{np.ones(3):.2f}"  # noqa: B018
    assert f"{x}" == repr(x)

    @rp.function
    def f(v):
        return f"{v:.3f}"

    with pytest.raises(rp.TracerConversionError, match="format.*traced value"):
        f(np.float32(1.0))
