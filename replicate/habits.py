"""PyTorch habits on library objects, answered: ``loss.backward()``, ``opt.zero_grad()``,
``opt.step()``, ``x.to(device)``, ``x.detach()`` ... raise one ``HabitError`` that starts with
the user's line and names replicate's way. Other missing attributes stay plain
``AttributeError``s. Also how arrays format in f-strings (NumPy's way).

>>> import numpy as np, replicate as rp, replicate.numpy as rnp
>>> f"{rnp.asarray(2.0) / 3:.4f}"
'0.6667'
>>> try:
...     rnp.asarray(1.0).backward()
... except rp.HabitError as e:
...     print(str(e).splitlines()[1].split(':')[0].strip())
Array.backward()
"""

from __future__ import annotations

from .errors import HabitError, TracerConversionError, source_line, user_frame

_GRAD = "grads = rp.grad(loss, params); opt.apply(grads)"
_DEVICE = ("the step's backend places values: rp.Replicator(..., backend='cupy') or "
           "rp.function(fn, backend='cupy') (rp.logical_device(i) for model parallelism)")
_DTYPE = "x.astype(np.float32), as NumPy"
_ANY = "every float value is differentiable: rp.grad(loss, x) names what to differentiate by"

# what each kind of object answers, by attribute name
COMMON = {
    "backward": "no tape to walk backwards: " + _GRAD,
    "grad": "gradients are values, not attributes: " + _GRAD,
    "requires_grad": _ANY, "requires_grad_": _ANY,
    "detach": "rp.stop_gradient(x) in a step; x.numpy() for the value",
    "zero_grad": "gradients are values, nothing to zero: " + _GRAD,
    "to": _DEVICE, "cuda": _DEVICE, "cpu": "x.numpy() is the value; " + _DEVICE,
    "float": _DTYPE, "double": _DTYPE, "half": _DTYPE,
    "clone": "x itself (arrays are never changed in place), or rnp.asarray(x, copy=True)",
    "view": "x.reshape(shape)", "unsqueeze": "rnp.expand_dims(x, axis)",
    "permute": "x.transpose(*axes)", "dim": "x.ndim", "numel": "x.size",
}
MODULE = {
    **{k: COMMON[k] for k in ("to", "cuda", "cpu", "zero_grad", "half", "float", "double")},
    "state_dict": "model.variables() (a dict by name); rp.checkpoint.save(path, state, step)",
    "load_state_dict": "rp.checkpoint.restore(path, model.variables())",
    "named_parameters": "model.parameters() is a dict by dotted name: .items()",
}
OPTIMIZER = {
    "zero_grad": COMMON["zero_grad"],
    "param_groups": "one optimiser per group (several may update in one step); opt.lr = ... "
                    "(traced again) or a schedule lr=fn(step) (rp.optim.StepLR, ...)",
    "state_dict": "opt.variables() (a dict by name); rp.checkpoint.save(path, state, step)",
    "load_state_dict": "rp.checkpoint.restore(path, opt.variables())",
}
STEP_COUNTER = "opt.step is the update counter (a Variable); the update is " + _GRAD


def habit_error(owner: str, name: str, advice: str, called: bool = True) -> HabitError:
    """The error: the user's line first, then what they wrote and replicate's way."""
    where = source_line(user_frame(skip_numpy=True))
    wrote = f"{owner}.{name}" + ("()" if called else "")
    return HabitError(f"{where}\n  {wrote}: {advice}")


def answers(table: dict):
    """A ``__getattr__`` (called only for names the object lacks) raising a ``HabitError``
    for the names of ``table`` and Python's own ``AttributeError`` for the others."""

    def __getattr__(self, name):
        advice = table.get(name)
        if advice is None or name.startswith("__"):
            raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")
        raise habit_error(type(self).__name__, name, advice, name not in ("grad", "requires_grad",
                                                            "param_groups"))

    return __getattr__


def not_callable(variable, *args, **kwargs):
    """``Variable.__call__``: ``opt.step()`` gets the habit's answer, any other call Python's
    TypeError."""
    if variable.name == "opt.step":
        raise habit_error("Optimizer", "step", STEP_COUNTER)
    raise TypeError(f"Variable {variable.name!r} is not callable")


def format_value(value, spec: str, subject) -> str:
    """``format(x, spec)`` as NumPy formats ``x``'s value (a 0-d array as its number; an
    n-d array with a spec: NumPy's TypeError); a traced value refuses at the user's line. No
    spec: ``str(x)``, as Python's ``format``."""
    if not spec:
        return str(subject)
    if value is None:
        where = source_line(user_frame(skip_numpy=True))
        raise TracerConversionError(
            f"format(x, {spec!r}) of a traced value at {where}\n  In graph mode values are "
            "symbolic while the step is traced: return it from the step and format the "
            "result, or run this step in eager mode (mode='eager')")
    return format(value, spec)
