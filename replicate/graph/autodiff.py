"""Reverse-mode autodiff over the node graph, in both modes.

``grad`` walks back from the output through ``array.node`` links (the eager tape or the traced
graph) and applies the VJP rules of ``vjp_rules.VJP``. The rules are written with
``replicate.numpy`` ops, so in graph mode the backward pass is added to the graph, and in eager mode
it is computed at once *and* recorded — which is why gradients are differentiable again.
"""

from __future__ import annotations

import numpy as np

from .. import tree
from ..errors import MissingRuleError, ReplicateError
from ..numpy import as_array, cast, ones_like, zeros_like
from .core import Array, current_trace
from .devices import backward_pass, gradient_of
from .pieces import Cotangent
from .primitives import get, is_float
from .vjp_rules import VJP


def _as_target(x) -> Array:
    if isinstance(x, Array):
        return x
    if hasattr(x, "read"):  # a Variable: differentiate w.r.t. its current value
        return x.read()
    raise ReplicateError(f"grad: cannot differentiate with respect to {type(x).__name__}; "
                         "pass Arrays or Variables")


def _topo_order(roots: list, targets: set, stop=frozenset()) -> tuple[list, dict]:
    """Arrays reachable backwards from ``roots`` in topological order, and which depend on a
    target; the walk does not go past the values in ``stop``."""
    order, relevant, seen = [], {}, set()
    stack = [(y, False) for y in reversed(roots)]
    while stack:
        a, expanded = stack.pop()
        if expanded:
            hit = a.id in targets
            if not hit and a.node is not None and a.id not in stop:
                for i in a.node.inputs:  # (a loop, not any(...): a generator per value costs)
                    if relevant.get(i.id, False):
                        hit = True
                        break
            relevant[a.id] = hit
            order.append(a)
            continue
        if a.id in seen:
            continue
        seen.add(a.id)
        stack.append((a, True))
        if a.node is not None and a.id not in stop:
            for i in a.node.inputs:
                if i.id not in seen:
                    stack.append((i, False))
    return order, relevant


def backward(y: Array, xs: list, y_grad: Array) -> list:
    """Cotangents of ``xs`` given the cotangent ``y_grad`` of ``y`` (None where unconnected)."""
    with backward_pass(xs):  # (model parallelism: each gradient on the device of its op)
        return _backward([y], xs, [y_grad])


def backward_region(ys: list, xs: list, y_grads: list, inputs: list) -> list:
    """Cotangents of ``xs`` given those of the outputs ``ys`` of a region whose inputs are
    ``inputs`` (``xs`` among them): the walk stops there (``rp.remat``'s recomputation, inside
    the backward pass of the step)."""
    return _backward(ys, xs, y_grads, frozenset(x.id for x in inputs))


def _backward(ys: list, xs: list, y_grads: list, stop=frozenset()) -> list:
    placing = getattr(current_trace(), "placement", None) is not None
    targets = {x.id for x in xs}
    order, relevant = _topo_order(ys, targets, stop)
    cts = {}  # id -> Cotangent
    for y, y_grad in zip(ys, y_grads):
        cts.setdefault(y.id, Cotangent()).add_dense(y_grad)
    for a in reversed(order):
        # a cotangent is used once, here (eager: its array goes now, not at the end of the pass)
        acc = cts.get(a.id) if a.id in targets else cts.pop(a.id, None)
        if acc is None or a.node is None or not relevant[a.id] or a.id in stop:
            continue  # (a value in ``stop`` is where the walk ends: its node is not entered)
        node = a.node
        spec = get(node.prim)
        if not spec.differentiable:
            continue
        g = acc.value(a.shape)
        if a.id in targets:  # (read again at the end)
            cts[a.id] = Cotangent()
            cts[a.id].add_dense(g)
        x = node.inputs[0] if node.inputs else None
        if node.prim == "getitem" and len(node.inputs) == 1 and not placing \
                and relevant.get(x.id, False) and is_float(x.dtype):
            # a basic-index piece: joined with its siblings when the whole's cotangent is read
            cts.setdefault(x.id, Cotangent()).add_piece(node.attrs["index"], g)
            continue
        rule = VJP.get(node.prim)
        if rule is None:
            raise MissingRuleError(f"no vjp rule for {node.prim}")
        needs = tuple(relevant.get(i.id, False) and is_float(i.dtype) for i in node.inputs)
        if placing:  # model parallelism: the gradient goes where the op ran
            with gradient_of(node):
                in_cts = rule(g, a, needs, *node.inputs, **node.attrs)
        else:
            in_cts = rule(g, a, needs, *node.inputs, **node.attrs)
        for inp, need, ct in zip(node.inputs, needs, in_cts):
            if not need or ct is None:
                continue
            if ct.shape != inp.shape:
                raise AssertionError(f"vjp of {node.prim} gave {ct.shape} for {inp.shape}")
            acc = cts.get(inp.id)
            if acc is None:
                acc = cts[inp.id] = Cotangent()
            acc.add_dense(ct)
    return [cts[x.id].value(x.shape) if x.id in cts else None for x in xs]


def grad(y, wrt, y_grad=None):
    """Gradient of ``y`` with respect to ``wrt`` (an Array, Variable, or a nest of them).

    ``y`` must be a scalar unless ``y_grad`` (its cotangent) is given. Works in eager and graph
    mode; the result is differentiable again (grad-of-grad).

    >>> import replicate as rp, replicate.numpy as rnp
    >>> x = rnp.asarray(3.0)
    >>> y = x * x * x
    >>> dy = rp.grad(y, x)
    >>> float(dy), float(rp.grad(dy, x))
    (27.0, 18.0)
    """
    y = as_array(y)
    if not is_float(y.dtype):
        raise ReplicateError(f"grad: the output must be floating point, got {y.dtype}")
    if y_grad is None:
        if y.size != 1:
            raise ReplicateError(f"grad: the output has shape {y.shape}; reduce it to a scalar "
                                 "(e.g. .mean()) or pass y_grad")
        y_grad = ones_like(y)
    else:
        y_grad = cast(as_array(y_grad), y.dtype)
        if y_grad.shape != y.shape:
            raise ReplicateError(f"grad: y_grad shape {y_grad.shape} != output shape {y.shape}")
    leaves, treedef = tree.flatten(wrt)
    xs = [_as_target(x) for x in leaves]
    for x in xs:
        if not is_float(x.dtype):  # (its gradient would be 0 whatever the function: JAX's error)
            raise ReplicateError(
                f"grad: cannot differentiate with respect to an array of {x.dtype} {x.shape}: only "
                "float values have gradients; cast it to a float first (rnp.cast(x, "
                "'float32')) — a float array handed in as integers (np.array([1, 2, 3])) is "
                "the usual cause")
    cts = backward(y, xs, y_grad)
    out = [ct if ct is not None else zeros_like(x) for ct, x in zip(cts, xs)]
    return tree.unflatten(treedef, out)


def value_and_grad(fn, wrt=None, has_aux=False):
    """``fn``'s value and its gradient.

    With ``wrt=None`` the gradient is taken with respect to ``fn``'s first argument (a nest);
    otherwise with respect to ``wrt`` (e.g. ``model.parameters()``). With ``has_aux`` ``fn``
    returns ``(value, aux)`` and the result is ``((value, aux), grads)``.

    >>> import replicate as rp, replicate.numpy as rnp
    >>> v, g = rp.value_and_grad(lambda x: (x ** 2).sum())(np.array([1.0, 2.0]))
    >>> float(v), g.tolist()
    (5.0, [2.0, 4.0])
    """
    def wrapped(*args):
        if wrt is None:
            if not args:
                raise ReplicateError("value_and_grad: fn needs an argument to differentiate")
            first = tree.tree_map(as_array, args[0])
            out = fn(first, *args[1:])
            targets = first
        else:
            out = fn(*args)
            targets = wrt
        value = out[0] if has_aux else out
        grads = grad(value, targets)
        return out, grads

    return wrapped


__all__ = ["grad", "value_and_grad", "backward", "backward_region", "np"]
