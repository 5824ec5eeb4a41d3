"""``rp.remat(fn)``: rematerialisation (``jax.checkpoint``, ``torch.utils.checkpoint``) — ``fn``'s
intermediate values are not kept for the backward pass but computed again there.

>>> import replicate as rp, replicate.numpy as rnp
>>> def block(x):
...     return rnp.tanh(rnp.tanh(x)) * x
>>> x = rnp.asarray([0.5, 2.0])
>>> again = rp.grad(rnp.sum(rp.remat(block)(x)), x)
>>> again.tolist() == rp.grad(rnp.sum(block(x)), x).tolist()
True

``fn`` takes and returns nests of arrays (other leaves pass through: a Module, a flag) and may
read Variables (a module's parameters) and close over values; ``rp.remat(module)`` and a method
decorated with ``@rp.remat`` work alike. In both modes; the gradient is the plain one, bitwise
(the same ops on the same values, walked back in the same order; when an input of ``fn`` is also
used outside it, its cotangents are added in another order: equal to rounding), and
differentiable again.

How it works. The call runs ``fn`` once and gives each floating-point output leaf a ``remat``
node (``custom_vjp``'s kind: several outputs hand their cotangents to the first, so ``fn`` runs
again once) whose inputs are the output's value and the region's inputs: the array arguments,
what its Variable reads gave, and the values it closed over. The gradient walk does not enter the
region: at the ``remat`` node it runs ``fn`` again on copies of those inputs (``remat_barrier``
nodes, each taken after the cotangent that starts the region's backward pass) and walks that
recomputation back to the copies (``autodiff.backward_region``). In graph mode the forward's
intermediates therefore have their last use inside the forward, so the memory plan of the NumPy
backend (``graph.meta.memory_plan``) frees them there, and the recomputed ones live during the
region's backward only. CSE merges equal ops on equal inputs: the copies are new values, so the
recomputation is never merged back into the forward (a value ``fn`` closes over is not copied:
ops on it alone may be; pass it as an argument). In eager mode the result's tape node holds the
inputs, not the intermediates, which are freed when ``fn`` returns.

While ``fn`` runs again, its Variable reads give what they gave the first time (a random key the
step has advanced since too: the same dropout mask), its assigns are not made again (running
statistics, a key), and ``autocast`` is what it was.
"""

from __future__ import annotations

import contextlib
import functools

from . import state, tree
from .dtypes import autocast, autocast_dtype
from .errors import ReplicateError
from .graph.autodiff import backward_region
from .graph.core import Array, bind, concrete, current_trace, next_id
from .graph.primitives import is_float
from .numpy import zeros, zeros_like


def _copy(x: Array, after: Array) -> Array:
    """The recomputation's own copy of the region's input ``x``, made after ``after``."""
    return bind("remat_barrier", x, after)


def _read(x):
    """A Variable's current value as an Array; anything else as it is."""
    return x.read() if hasattr(x, "read") and not isinstance(x, Array) else x


class _Region:
    """The Variable accesses of one call (``state.hooks.region`` while it runs). The first run
    records what each Variable's first read gave; a recomputation (``replay``) reads a copy of
    that, or what it assigned since, and keeps its assigns here instead of making them."""

    def __init__(self):
        self.first: dict[int, Array] = {}  # id(var) -> what its first read gave
        self.written: set[int] = set()  # the first run assigned it (before any read)
        self.replay: dict | None = None  # recomputing: id(var) -> what a read gives now
        self.copies: dict[int, Array] = {}  # recomputing: id(var) -> the copy of ``first``
        self.after: Array | None = None  # recomputing: what the copies come after
        self.outer = None  # the region this one runs inside

    def read(self, var, fetch):
        if self.outer is not None:
            fetch = functools.partial(self.outer.read, var, fetch)
        vid = id(var)
        if self.replay is None:
            value = fetch()
            if vid not in self.first and vid not in self.written:
                self.first[vid] = value
            return value
        if vid not in self.replay:
            if vid in self.first:
                self.copies[vid] = _copy(self.first[vid], self.after)
            self.replay[vid] = self.copies[vid] if vid in self.copies else fetch()
        return self.replay[vid]

    def assign(self, var, value) -> bool:
        """Whether the assign is kept here (not made)."""
        if self.replay is None:
            self.written.add(id(var))
            return self.outer is not None and self.outer.assign(var, value)
        self.replay[id(var)] = value
        return True

    @contextlib.contextmanager
    def running(self, after=None):
        """Run inside (``after``: recomputing, its copies made after it)."""
        self.outer = getattr(state.hooks, "region", None)
        if after is not None:
            self.replay, self.copies, self.after = {}, {}, after
        state.hooks.region = self
        try:
            yield
        finally:
            state.hooks.region, self.outer = self.outer, None
            self.replay, self.after = None, None


class _Call:
    """One call of a remat function: what running it again needs, and the cotangents of its
    outputs gathered so far in a gradient walk. Holds its inputs, never its intermediates."""

    def __init__(self, fn, leaves, treedef, region, amp, out_tree, out_avals, closed):
        self.fn, self.leaves, self.treedef = fn, leaves, treedef
        self.region, self.amp, self.closed = region, amp, closed
        self.out_tree, self.out_avals = out_tree, out_avals
        self.pending: dict[int, Array] = {}  # output index -> its cotangent, until fn runs

    @property
    def name(self) -> str:
        return getattr(self.fn, "__name__", type(self.fn).__name__)

    def inputs(self) -> list:
        """The ``remat`` node's inputs after the value: arguments, reads, closed-over values."""
        return ([x for x in self.leaves if isinstance(x, Array)]
                + list(self.region.first.values()) + self.closed)

    def recompute(self, cts: dict, needs, after) -> list:
        """Run ``fn`` again on copies of its inputs and walk it back: one cotangent (or None)
        per input, from the outputs' cotangents ``cts``."""
        region = self.region
        leaves = [_copy(x, after) if isinstance(x, Array) else x for x in self.leaves]
        args, kwargs = tree.unflatten(self.treedef, leaves)
        with region.running(after), autocast(self.amp):
            result = self.fn(*args, **kwargs)
        copies, region.copies = region.copies, {}
        outputs, out_tree = tree.flatten(tree.tree_map(_read, result))
        avals = [x.aval if isinstance(x, Array) else None for x in outputs]
        if out_tree != self.out_tree or avals != self.out_avals:
            raise ReplicateError(f"rp.remat({self.name}): run again, it returned other outputs "
                                 "than the first time; the function must compute the same "
                                 "thing from the same inputs")
        roots, grads = [], []
        for i, (y, aval) in enumerate(zip(outputs, avals)):
            if aval is not None and is_float(aval.dtype):
                roots.append(y)
                g = cts.get(i)
                grads.append(zeros(aval.shape, aval.dtype) if g is None else g)
        uses = ([x for x in leaves if isinstance(x, Array)]
                + [copies.get(vid) for vid in region.first] + self.closed)
        xs = [x for x, need in zip(uses, needs) if need and x is not None]
        found = iter(backward_region(roots, xs, grads, [x for x in uses if x is not None]))
        return [next(found) if need and x is not None else None for x, need in zip(uses, needs)]


class _Rule:
    """The ``rule`` attribute of one ``remat`` node: output ``index`` of ``call``. The first
    floating-point output's node has the region's inputs and runs ``fn`` again; every other
    output's node has that first output as its input: the walk reaches them first, and they
    hand their cotangents over (``custom.CustomRule``'s way)."""

    def __init__(self, call, index, gather):
        self.call, self.index, self.gather = call, index, gather

    def __repr__(self):
        return f"<remat {self.call.name} output {self.index}>"

    def cotangents(self, g, needs, inputs):
        call = self.call
        if self.gather:
            call.pending[self.index] = g
            return [zeros_like(inputs[0]) if needs[0] else None]
        cts, call.pending = {**call.pending, self.index: g}, {}
        if not any(needs):
            return [None] * len(inputs)
        return call.recompute(cts, needs, after=g)


def _closed_over(outputs, known: set, start: int) -> list:
    """The values made before the call (ids below ``start``) that its outputs depend on without
    passing through ``known`` (its arguments and reads): what ``fn`` closed over."""
    found, seen, stack = [], set(known), list(outputs)
    while stack:
        a = stack.pop()
        if a.id in seen:
            continue
        seen.add(a.id)
        if a.id < start:
            found.append(a)
        elif a.node is not None:
            stack.extend(a.node.inputs)
    return found


def _call(fn, args, kwargs):
    trace = current_trace()
    if trace is not None and trace.placement is not None:
        raise ReplicateError("rp.remat is not supported with logical devices (model "
                             "parallelism) yet: its recomputation would not be placed")
    leaves, treedef = tree.flatten((args, kwargs))
    region, amp = _Region(), autocast_dtype()
    start = next_id()
    with region.running():
        result = fn(*args, **kwargs)
    outputs, out_tree = tree.flatten(tree.tree_map(_read, result))
    known = {x.id for x in leaves if isinstance(x, Array)} | {
        x.id for x in region.first.values()}
    closed = _closed_over([x for x in outputs if isinstance(x, Array)], known, start)
    call = _Call(fn, leaves, treedef, region, amp, out_tree,
                 [x.aval if isinstance(x, Array) else None for x in outputs], closed)
    inputs, wrapped, first = call.inputs(), [], None
    for i, leaf in enumerate(outputs):
        if isinstance(leaf, Array):
            if trace is None:  # eager: off the tape, which keeps the inputs only
                leaf = concrete(leaf.value)
            if is_float(leaf.dtype) and first is None:
                leaf = first = bind("remat", leaf, *inputs, rule=_Rule(call, i, gather=False))
            elif is_float(leaf.dtype):
                leaf = bind("remat", leaf, first, rule=_Rule(call, i, gather=True))
        wrapped.append(leaf)
    return tree.unflatten(out_tree, wrapped)


def remat(fn):
    """``fn`` whose intermediate values are computed again for the backward pass instead of
    kept (see the module's docstring): memory for compute, the gradient unchanged.

    >>> import replicate as rp
    >>> layer = rp.nn.Linear(4, 4)
    >>> y = rp.remat(layer)(rp.numpy.ones((2, 4)))   # a Module, a method, a function
    """
    if not callable(fn):
        raise ReplicateError(f"rp.remat needs a function or a module, got {type(fn).__name__}")

    @functools.wraps(fn, updated=())
    def rematerialised(*args, **kwargs):
        return _call(fn, args, kwargs)

    return rematerialised


__all__ = ["remat"]
