"""``rp.custom_vjp``: a function whose gradient the user writes (JAX's ``jax.custom_vjp`` style).

>>> import replicate as rp, replicate.numpy as rnp
>>> @rp.custom_vjp
... def clip_gradient(x):
...     return x
>>> def fwd(x):
...     return x, None
>>> def bwd(residuals, g):
...     return (rnp.clip(g, -1.0, 1.0),)
>>> clip_gradient.defvjp(fwd, bwd)
>>> x = rnp.asarray(3.0)
>>> float(rp.grad(clip_gradient(x) * 5.0, x))  # 5 clipped to 1
1.0

``fwd(*args)`` returns ``(output, residuals)``; ``bwd(residuals, g)`` returns one cotangent per
positional argument of the function (a nest like the argument, or ``None`` for none), ``g``
being the cotangent of the output (a nest like it). Both are written with ``replicate.numpy`` ops,
so they run eagerly or are traced like any other code, and ``bwd`` is differentiable again
(grad-of-grad) when its ops are. How it works: the first floating-point output leaf passes
through a ``custom_vjp`` node whose other inputs are the function's array arguments; the
gradient walk calls ``bwd`` at that node and does not enter the forward's own graph. Every other
floating-point output leaf passes through a ``custom_vjp`` node that depends on the first, so
the walk meets it earlier and it hands its cotangent over: ``bwd`` runs once, with every
output's cotangent (zeros for the unused ones), as in JAX — a ``bwd`` that is not linear in
``g`` (a clip by the global norm) is right too. A floating-point Variable that ``fwd`` reads must be
one of the arguments (it is an error otherwise: its gradient could not flow through ``bwd``).
"""

from __future__ import annotations

import functools

from . import state, tree
from .errors import ReplicateError, ShapeError
from .graph.core import Array, bind
from .graph.primitives import is_float
from .numpy import as_array, cast, zeros_like


class CustomCall:
    """One call of a custom_vjp function: ``bwd``, the residuals, the output's structure, the
    arguments' structure, and the cotangents of its outputs gathered so far in a gradient walk."""

    def __init__(self, fn, residuals, outputs, out_tree, arg_trees):
        self.fn, self.residuals = fn, residuals
        self.outputs, self.out_tree = outputs, out_tree
        self.arg_trees = arg_trees  # per positional argument: (treedef, [is an array leaf])
        self.pending: dict[int, Array] = {}  # output index -> its cotangent, until bwd runs


class CustomRule:
    """The ``rule`` attribute of one ``custom_vjp`` node: output ``index`` of ``call``. The first
    floating-point output's node has the call's arguments as inputs and runs ``bwd``; every other
    output's node has that first output as its input, so the gradient walk reaches them first:
    they hand their cotangents over (``pending``) and ``bwd`` runs once with all of them."""

    def __init__(self, call, index, gather):
        self.call, self.index, self.gather = call, index, gather

    def __repr__(self):
        return f"<custom_vjp {self.call.fn.__name__} output {self.index}>"

    def cotangents(self, g, needs, args):
        """The node's inputs' cotangents: for another output, a zero for the first one (so that
        its node runs ``bwd`` even when only this output is used); for the first output, one
        cotangent (or None) per array argument of the call, from ``bwd``."""
        call = self.call
        if self.gather:
            call.pending[self.index] = g
            return [zeros_like(args[0]) if needs[0] else None]
        cts = [g if i == self.index else call.pending.pop(i, None) for i in
               range(len(call.outputs))]
        call.pending.clear()
        cts = [zeros_like(leaf) if ct is None and isinstance(leaf, Array) else ct
               for ct, leaf in zip(cts, call.outputs)]
        result = call.fn.bwd(call.residuals, tree.unflatten(call.out_tree, cts))
        name = call.fn.__name__
        if not isinstance(result, (tuple, list)) or len(result) != len(call.arg_trees):
            raise ReplicateError(
                f"custom_vjp {name}: bwd must return a tuple with one cotangent per positional "
                f"argument ({len(call.arg_trees)}), got {_describe(result)}")
        flat = []
        for k, (ct, (_, is_array)) in enumerate(zip(result, call.arg_trees)):
            if ct is None:
                flat.extend(None for a in is_array if a)
                continue
            leaves, ct_tree = tree.flatten(ct)
            if len(leaves) != len(is_array):
                raise ReplicateError(f"custom_vjp {name}: bwd's cotangent #{k} has "
                                     f"{len(leaves)} leaves, its argument {len(is_array)}")
            flat.extend(leaf for leaf, a in zip(leaves, is_array) if a)
        out = []
        for x, need, ct in zip(args, needs, flat):
            if not need or ct is None:
                out.append(None)
                continue
            ct = cast(as_array(ct), x.dtype)
            if ct.shape != x.shape:
                raise ShapeError(f"custom_vjp {name}: bwd gave a cotangent of shape {ct.shape} "
                                 f"for an argument of shape {x.shape}")
            out.append(ct)
        return out


def _read(x):
    """A Variable's current value as an Array; anything else as it is."""
    return x.read() if hasattr(x, "read") and not isinstance(x, Array) else x


def _describe(value) -> str:
    if isinstance(value, (tuple, list)):
        return f"a {type(value).__name__} of {len(value)}"
    return type(value).__name__


class custom_vjp:  # noqa: N801 - the name users know from JAX
    """Decorate a function to give its gradient by hand: ``f.defvjp(fwd, bwd)``."""

    def __init__(self, fun):
        if not callable(fun):
            raise ReplicateError(f"custom_vjp needs a function, got {type(fun).__name__}")
        functools.update_wrapper(self, fun)
        self.fun, self.fwd, self.bwd = fun, None, None
        self._inside = 0

    def defvjp(self, fwd, bwd) -> None:
        if not callable(fwd) or not callable(bwd):
            raise ReplicateError(f"custom_vjp {self.__name__}: defvjp(fwd, bwd) takes two "
                                 "functions")
        self.fwd, self.bwd = fwd, bwd

    def __call__(self, *args, **kwargs):
        if kwargs:
            raise ReplicateError(f"custom_vjp {self.__name__}: pass the arguments by position "
                                 "(bwd returns one cotangent per positional argument)")
        if self.fwd is None:
            raise ReplicateError(f"custom_vjp {self.__name__}: no gradient rule; call "
                                 f"{self.__name__}.defvjp(fwd, bwd) first")
        if self._inside:  # fwd calls the function itself: the plain function
            return self.fun(*args)
        # Variables are read first: fwd and the gradient see one Array per argument (a fwd that
        # returned a Variable argument unchanged would otherwise bypass the rule)
        passed = {id(x) for arg in args for x in tree.flatten(arg)[0]}
        args = tuple(tree.tree_map(_read, arg) for arg in args)
        closed = {}

        def observe(var):  # a Variable fwd reads without taking it as an argument
            if id(var) not in passed and is_float(var.dtype):
                closed.setdefault(id(var), var)

        self._inside += 1
        state.read_observers().append(observe)
        try:
            result = self.fwd(*args)
        finally:
            state.read_observers().remove(observe)
            self._inside -= 1
        if closed:
            names = ", ".join(repr(v.name) for v in closed.values())
            raise ReplicateError(
                f"custom_vjp {self.__name__}: fwd reads the Variable(s) {names} without taking "
                "them as arguments: their gradient would not flow through bwd (it would be zero, "
                "silently). Pass them as arguments (bwd may return None for one that needs no "
                "gradient).")
        if not isinstance(result, tuple) or len(result) != 2:
            raise ReplicateError(f"custom_vjp {self.__name__}: fwd must return (output, "
                                 f"residuals), got {type(result).__name__}")
        output, residuals = result
        arg_trees, arrays = [], []
        for arg in args:
            leaves, treedef = tree.flatten(arg)
            arg_trees.append((treedef, [isinstance(x, Array) for x in leaves]))
            arrays.extend(x for x in leaves if isinstance(x, Array))
        outputs, out_tree = tree.flatten(tree.tree_map(_read, output))
        call = CustomCall(self, residuals, outputs, out_tree, arg_trees)
        wrapped, first = [], None
        for i, leaf in enumerate(outputs):
            if isinstance(leaf, Array) and is_float(leaf.dtype):
                if first is None:
                    leaf = first = bind("custom_vjp", leaf, *arrays,
                                        rule=CustomRule(call, i, gather=False))
                else:
                    leaf = bind("custom_vjp", leaf, first, rule=CustomRule(call, i, gather=True))
            wrapped.append(leaf)
        return tree.unflatten(out_tree, wrapped)


__all__ = ["custom_vjp"]
