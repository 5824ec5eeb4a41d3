"""``Module``: a container of named, nested parameters (``Variable``s) and sub-modules."""

from __future__ import annotations

from .. import habits
from ..dependency import TraceKeyed
from ..state import Variable


class Module(TraceKeyed):
    """Base class of layers. Assigning a ``Variable`` or ``Module`` attribute registers it.

    Plain attributes (``training``, a rate, a flag) are read when a step is traced; changing one
    after the step was compiled makes it trace again (``replicate.dependency``), so ``eval()``,
    ``train()`` and ``layer.rate = 0.1`` take effect in graph mode as in eager mode. State kept
    outside the module that ``forward`` reads can be declared by overriding ``trace_key()``.

    >>> import numpy as np, replicate as rp
    >>> class Affine(rp.nn.Module):
    ...     def __init__(self):
    ...         super().__init__()
    ...         self.scale = rp.Variable(np.ones(2))
    >>> net = rp.nn.Sequential(Affine(), Affine())
    >>> sorted(net.parameters())
    ['0.scale', '1.scale']
    """

    def __init__(self):
        object.__setattr__(self, "_params", {})
        object.__setattr__(self, "_buffers", {})
        object.__setattr__(self, "_children", {})
        object.__setattr__(self, "_training", True)

    def __setattr__(self, name, value):
        if "_params" not in self.__dict__:
            raise RuntimeError(f"{type(self).__name__}.__init__ must call super().__init__() "
                               "before assigning attributes")
        for table in (self._params, self._buffers, self._children):
            table.pop(name, None)
        if isinstance(value, Variable):
            self._params[name] = value
        elif isinstance(value, Module):
            self._children[name] = value
        TraceKeyed.__setattr__(self, name, value)

    @property
    def training(self) -> bool:
        """Training (True) or evaluation (False) behaviour; read by a trace, it keys the step."""
        self.traced_by()
        return self._training

    @training.setter
    def training(self, mode: bool) -> None:
        TraceKeyed.__setattr__(self, "_training", bool(mode))

    def register_buffer(self, name: str, value: Variable) -> None:
        """A state variable that is not trained (e.g. BatchNorm's running mean)."""
        TraceKeyed.__setattr__(self, name, value)
        self._buffers[name] = value

    def _named(self, kind, prefix="", seen=None):
        # a variable reachable under several names (a shared sub-module, weight tying) is listed
        # once, under the first name, so an optimiser updates it once per step
        seen = set() if seen is None else seen
        out = {}
        for name, var in getattr(self, kind).items():
            if id(var) not in seen:
                seen.add(id(var))
                out[prefix + name] = var
        for name, child in self._children.items():
            out.update(child._named(kind, f"{prefix}{name}.", seen))
        return out

    def parameters(self) -> dict:
        """Trainable variables by dotted name (``"0.weight"``), in registration order."""
        params = self._named("_params")
        for name, var in params.items():
            if var.name.startswith("var"):
                var.name = name
        return params

    def buffers(self) -> dict:
        """Non-trainable state variables by dotted name."""
        return self._named("_buffers")

    def variables(self) -> dict:
        """Parameters and buffers (everything a checkpoint must hold)."""
        return {**self.parameters(), **self.buffers()}

    def train(self, mode: bool = True):
        self.training = mode
        for child in self._children.values():
            child.train(mode)
        return self

    def eval(self):
        return self.train(False)

    def __call__(self, *args, **kwargs):
        self.traced_by()
        return self.forward(*args, **kwargs)

    def forward(self, *args, **kwargs):
        raise NotImplementedError(f"{type(self).__name__} has no forward()")

    __getattr__ = habits.answers(habits.MODULE)  # (model.to(device), ...)


class Sequential(Module):
    """Apply layers (modules or plain functions) in order."""

    def __init__(self, *layers):
        super().__init__()
        self.layers = list(layers)
        for i, layer in enumerate(layers):
            if isinstance(layer, Module):
                self._children[str(i)] = layer

    def forward(self, x):
        for layer in self.layers:
            x = layer(x)
        return x
