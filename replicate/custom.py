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
(grad-of-grad) when its ops are. How it works: each floating-point output leaf passes through a
``custom_vjp`` node whose other inputs are the function's array arguments; the gradient walk
calls ``bwd`` at that node and does not enter the forward's own graph. With several output
leaves ``bwd`` is called once per leaf that receives a gradient (the others' cotangents zero) and
the results are summed — the same by linearity, at the cost of extra ``bwd`` calls.
"""

from __future__ import annotations

import functools

from . import tree
from .errors import ReplicateError, ShapeError
from .graph.core import Array, bind
from .graph.primitives import is_float
from .numpy import as_array, cast, zeros_like


class CustomRule:
    """What the gradient walk needs at one output leaf of one call: ``bwd``, the residuals, the
    output's structure and this leaf's place in it, the arguments' structure."""

    def __init__(self, fn, residuals, outputs, out_tree, index, arg_trees):
        self.fn, self.residuals = fn, residuals
        self.outputs, self.out_tree, self.index = outputs, out_tree, index
        self.arg_trees = arg_trees  # per positional argument: (treedef, [is an array leaf])

    def __repr__(self):
        return f"<custom_vjp {self.fn.__name__}>"

    def cotangents(self, g, needs, args):
        """One cotangent (or None) per array argument of the call, from ``bwd``."""
        cts = [g if i == self.index else
               (zeros_like(leaf) if isinstance(leaf, Array) else None)
               for i, leaf in enumerate(self.outputs)]
        result = self.fn.bwd(self.residuals, tree.unflatten(self.out_tree, cts))
        name = self.fn.__name__
        if not isinstance(result, (tuple, list)) or len(result) != len(self.arg_trees):
            raise ReplicateError(
                f"custom_vjp {name}: bwd must return a tuple with one cotangent per positional "
                f"argument ({len(self.arg_trees)}), got {_describe(result)}")
        flat = []
        for k, (ct, (_, is_array)) in enumerate(zip(result, self.arg_trees)):
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
        args = tuple(tree.tree_map(_read, arg) for arg in args)
        self._inside += 1
        try:
            result = self.fwd(*args)
        finally:
            self._inside -= 1
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
        wrapped = []
        for i, leaf in enumerate(outputs):
            if isinstance(leaf, Array) and is_float(leaf.dtype):
                rule = CustomRule(self, residuals, outputs, out_tree, i, arg_trees)
                leaf = bind("custom_vjp", leaf, *arrays, rule=rule)
            wrapped.append(leaf)
        return tree.unflatten(out_tree, wrapped)


__all__ = ["custom_vjp"]
