"""Gradient (VJP) rules, one per differentiable primitive, written with ``replicate.numpy``.

A rule is ``rule(g, out, needs, *inputs, **attrs) -> cotangent per input`` where ``g`` is the
cotangent of ``out`` and ``needs[i]`` says whether input i's cotangent is wanted (a rule may return
None for inputs not needed). Because the rules use the library's own ops, they run eagerly or are
traced like any other code, and they are differentiable themselves.
"""

from __future__ import annotations

import math

import numpy as np

from .. import numpy as rnp
from .collectives import bind_collective
from .core import bind, concrete
from .devices import move
from .linalg_vjp import RULES as LINALG_RULES
from .primitives import RuleTable, parse_einsum


def unbroadcast(g, shape):
    """Sum ``g`` down to ``shape`` (undo NumPy broadcasting)."""
    shape = tuple(shape)
    if g.shape == shape:
        return g
    lead = g.ndim - len(shape)
    axes = tuple(range(lead)) + tuple(
        lead + i for i, d in enumerate(shape) if d == 1 and g.shape[lead + i] != 1)
    return rnp.reshape(rnp.sum(g, axis=axes), shape)


def _keepdims_shape(x, axes):
    return tuple(1 if i in axes else d for i, d in enumerate(x.shape))


def _reduce_sum(g, out, needs, x, axes):
    return (rnp.broadcast_to(rnp.reshape(g, _keepdims_shape(x, axes)), x.shape),)


def _picked(g, chosen, tie):
    """``g`` where ``chosen``, ``g / 2`` where ``tie``, 0 elsewhere (a NaN operand: 0)."""
    return g * (rnp.cast(chosen, g.dtype) + 0.5 * rnp.cast(tie, g.dtype))


def _reduce_extremum(g, out, needs, x, axes):
    keep = _keepdims_shape(x, axes)
    mask = rnp.cast(rnp.equal(x, rnp.reshape(out, keep)), g.dtype)
    share = mask / rnp.sum(mask, axis=axes, keepdims=True)  # ties share the gradient equally
    return (share * rnp.reshape(g, keep),)


def _reduce_prod(g, out, needs, x, axes):
    # d out / d x_i is the product of the other entries: of those before it times those after
    # it (two running products along the reduced axes laid end to end) — no division, so exact
    # with zeros, infinities and NaNs (out / x_i gave NaN for an infinite entry). Second
    # derivatives go through cumprod's rule.
    keep = _keepdims_shape(x, axes)
    if x.size == 0:
        return (rnp.zeros_like(x),)
    kept = [i for i in range(x.ndim) if i not in axes]
    order = kept + sorted(axes)
    moved = rnp.transpose(x, order)
    flat = rnp.reshape(moved, moved.shape[:len(kept)] + (-1,))
    one = rnp.ones(flat.shape[:-1] + (1,), x.dtype)

    def exclusive(v):  # the product of the entries before each, along the last axis
        return rnp.concatenate([one, bind("cumprod", v, axis=v.ndim - 1)[..., :-1]], -1)
    others = exclusive(flat) * rnp.flip(exclusive(rnp.flip(flat, -1)), -1)
    others = rnp.transpose(rnp.reshape(others, moved.shape), np.argsort(order).tolist())
    return (rnp.reshape(g, keep) * others,)


def _cumprod(g, out, needs, x, axis):
    # d out_j / d x_i (j >= i) is the product of x_0..x_j but x_i. Before the first zero z of
    # the row that is out_j / x_i, and out_j = 0 from z on: sum_{j>=i} g_j out_j / x_i. At z it
    # is the running product with x_z read as 1; after z every such product holds x_z = 0.
    def rest(v):  # sum over j >= i
        return bind("cumsum", v, axis=axis, reverse=True)

    zero = rnp.equal(x, 0)
    seen = bind("cumsum", rnp.cast(zero, np.int64), axis=axis, reverse=False)
    before, first = seen == 0, zero & (seen == 1)
    at_first = rest(g * bind("cumprod", rnp.where(first, 1, x), axis=axis))
    return (rnp.where(before, rest(g * out) / rnp.where(before, x, 1),
                      rnp.where(first, at_first, 0.0)),)


def _sort(g, out, needs, x, axis):
    # each sorted value's cotangent goes back to the entry it came from (the stable order's)
    key = []
    for i, n in enumerate(x.shape):
        if i == axis:
            key.append(rnp.argsort(x, axis=axis))
        else:
            key.append(concrete(np.arange(n).reshape([n if j == i else 1 for j in range(x.ndim)])))
    return (bind("scatter_add", g, *key, index=tuple(("array", i) for i in range(x.ndim)),
                 shape=x.shape),)


def _binary(fa, fb):
    def rule(g, out, needs, a, b):
        return (unbroadcast(fa(g, out, a, b), a.shape) if needs[0] else None,
                unbroadcast(fb(g, out, a, b), b.shape) if needs[1] else None)

    return rule


def _known(x):
    """``x``'s value where it is known while tracing (eager values, constants), else None."""
    if x.value is not None:
        return x.value
    return x.node.attrs["value"] if x.node is not None and x.node.prim == "const" else None


def _pow_base(g, out, a, b):
    """``b a**(b-1)``, and 0 where ``b`` is 0 (``0 * 0**-1`` would be NaN at ``a = 0``: JAX's
    and PyTorch's 0). There the base is made 1, so that no derivative of this is NaN either
    (``x**2``'s third at 0 went through ``x**0``); an exponent known nonzero takes the plain
    formula."""
    known = _known(b)
    if known is not None and np.all(np.asarray(known) != 0):
        return g * b * a ** (b - 1.0)
    zero = b == 0
    return rnp.where(zero, 0.0, g * b * rnp.where(zero, 1.0, a) ** (b - 1.0))


def _pow_exponent(g, out, a, b):
    """``a**b log(a)``: 0 at ``a = 0`` (JAX's, the limit for ``b > 0``; the base made 1 there, so
    no derivative of this is NaN), NaN for a negative or NaN base (JAX's and PyTorch's: its
    logarithm), never a number that hides it."""
    zero = a == 0
    return rnp.where(zero, 0.0, g * out * rnp.log(rnp.where(zero, 1.0, a)))


def _select(g, out, needs, c, a, b):
    zero = rnp.zeros((), g.dtype)
    return (None,
            unbroadcast(rnp.where(c, g, zero), a.shape) if needs[1] else None,
            unbroadcast(rnp.where(c, zero, g), b.shape) if needs[2] else None)


def _concatenate(g, out, needs, *xs, axis):
    cts, start = [], 0
    for x in xs:
        index = (slice(None),) * axis + (slice(start, start + x.shape[axis]),)
        cts.append(g[index])
        start += x.shape[axis]
    return cts


def _pad(g, out, needs, x, widths, value):
    return (g[tuple(slice(lo, lo + d) for (lo, _), d in zip(widths, x.shape))],)


def _getitem(g, out, needs, x, *idx, index):
    return (bind("scatter_add", g, *idx, index=index, shape=x.shape),) + (None,) * len(idx)


def _scatter_add(g, out, needs, upd, *idx, index, shape):
    return (bind("getitem", g, *idx, index=index),) + (None,) * len(idx)


def _matmul(g, out, needs, a, b):
    return (unbroadcast(rnp.matmul(g, rnp.swapaxes(b, -1, -2)), a.shape) if needs[0] else None,
            _matmul_rhs_grad(g, a, b) if needs[1] else None)


def _matmul_rhs_grad(g, a, b):
    """The gradient of ``a @ b`` for ``b``. A matrix ``b`` shared by a stack ``a`` (a layer's
    weight under a batch of sequences) gets one matrix product over every row of the stack,
    ``a(rows, K)^T @ g(rows, N)``, not a product per stack entry summed after: one BLAS call
    and no stack of partial products to write and read back."""
    if b.ndim == 2 and a.ndim > 2:
        rows = -1 if a.size else 0
        return rnp.matmul(rnp.swapaxes(rnp.reshape(a, (rows, a.shape[-1])), 0, 1),
                          rnp.reshape(g, (rows, g.shape[-1])))
    return unbroadcast(rnp.matmul(rnp.swapaxes(a, -1, -2), g), b.shape)


def _einsum(g, out, needs, *xs, subscripts):
    ins, out_term = parse_einsum(subscripts)
    cts = []
    for i, (term, x) in enumerate(zip(ins, xs)):
        if not needs[i]:
            cts.append(None)
            continue
        others = [t for j, t in enumerate(ins) if j != i]
        keep = "".join(c for c in term if c in out_term or any(c in t for t in others))
        ops = [g] + [xj for j, xj in enumerate(xs) if j != i]
        ct = rnp.einsum(",".join([out_term] + others) + "->" + keep, *ops)
        if keep != term:  # letters summed only inside this operand: broadcast back
            ct = rnp.broadcast_to(rnp.reshape(ct, tuple(
                d if c in keep else 1 for c, d in zip(term, x.shape))), x.shape)
        cts.append(ct)
    return cts


# -- attention's weights: the softmax's gradient on the kept weights, then two matmuls ----------
def _attention_weights(g, out, needs, q, k, *mask, scale, causal, masking):
    ds = out * (g - rnp.sum(g * out, axis=-1, keepdims=True))  # (masked: p = 0, so ds = 0)
    return (unbroadcast(rnp.matmul(ds, k) * scale, q.shape) if needs[0] else None,
            unbroadcast(rnp.matmul(rnp.swapaxes(ds, -1, -2), q) * scale, k.shape)
            if needs[1] else None,
            *([unbroadcast(ds, mask[0].shape) if masking == "add" and needs[2] else None]
              if mask else []))


# -- convolution: each of the three is linear in each operand, its gradients the other two -------
def _conv2d(g, out, needs, x, w, **geometry):
    return (bind("conv2d_input_grad", g, w, size=x.shape[2:], **geometry) if needs[0] else None,
            bind("conv2d_weight_grad", x, g, kernel=w.shape[2:], **geometry) if needs[1] else None)


def _conv2d_input_grad(z, out, needs, g, w, size, **geometry):
    # <z, input_grad(g, w)> = <conv2d(z, w), g>
    return (bind("conv2d", z, w, **geometry) if needs[0] else None,
            bind("conv2d_weight_grad", z, g, kernel=w.shape[2:], **geometry) if needs[1] else None)


def _conv2d_weight_grad(v, out, needs, x, g, kernel, **geometry):
    # <v, weight_grad(x, g)> = <conv2d(x, v), g>
    return (bind("conv2d_input_grad", g, v, size=x.shape[2:], **geometry) if needs[0] else None,
            bind("conv2d", x, v, **geometry) if needs[1] else None)


def _cast(g, out, needs, x, dtype):
    return (rnp.cast(g, x.dtype),)


def _unary(fn):
    return lambda g, out, needs, x: (fn(g, out, x),)


# -- collectives: the gradient of a collective is a collective again (as psum's transpose is psum)
def _all_reduce(g, out, needs, x, *, num_replicas, replica, seq, op):
    ids = dict(num_replicas=num_replicas, replica=replica)
    if op in ("sum", "mean"):
        return (bind_collective("all_reduce", g, op=op, **ids),)
    mask = rnp.cast(rnp.equal(x, out), g.dtype)
    return (bind_collective("all_reduce", g, op="sum", **ids) * mask,)


def _all_gather(g, out, needs, x, *, num_replicas, replica, seq, axis, tiled):
    total = bind_collective("all_reduce", g, op="sum", num_replicas=num_replicas,
                            replica=replica)
    if tiled:
        n = x.shape[axis]
        index = (slice(None),) * axis + (slice(replica * n, (replica + 1) * n),)
    else:
        index = (slice(None),) * axis + (replica,)
    return (total[index],)


def _broadcast(g, out, needs, x, *, num_replicas, replica, seq, root):
    total = bind_collective("all_reduce", g, op="sum", num_replicas=num_replicas,
                            replica=replica)
    # (a select, not a Python branch: every replica traces the same step, so every process
    # plans the same gradient buckets from it — ``replicate_collectives.upstream_collectives``)
    return (rnp.where(replica == root, total, rnp.zeros_like(total)),)


def _reduce_scatter(g, out, needs, x, *, num_replicas, replica, seq, op, axis):
    if op not in ("sum", "mean"):
        raise NotImplementedError(f"gradient of reduce_scatter({op!r})")
    full = bind_collective("all_gather", g, axis=axis, tiled=True, num_replicas=num_replicas,
                           replica=replica)
    return (full / num_replicas if op == "mean" else full,)


def _permute(g, out, needs, x, *, num_replicas, replica, seq, shift):
    return (bind_collective("permute", g, shift=-shift, num_replicas=num_replicas,
                            replica=replica),)


def _custom_vjp(g, out, needs, value, *args, rule):
    """``rp.custom_vjp``: the user's ``bwd`` gives the arguments' cotangents; none reaches the
    value's own graph (the forward's internals)."""
    return (None, *rule.cotangents(g, needs[1:], args))


def _remat(g, out, needs, value, *args, rule):
    """``rp.remat``: the function run again on copies of its inputs, and walked back (the
    forward's internals, the value's own graph, are never entered)."""
    return (None, *rule.cotangents(g, needs[1:], args))


VJP = RuleTable("vjp", {
    "custom_vjp": _custom_vjp,
    "remat": _remat,
    "remat_barrier": lambda g, out, needs, x, after: (g, None),
    "branch_input": lambda g, out, needs, x, taken: (
        rnp.where(taken, g, rnp.zeros((), g.dtype)), None),
    "neg": _unary(lambda g, out, x: -g),
    "abs": _unary(lambda g, out, x: g * rnp.sign(x)),
    "exp": _unary(lambda g, out, x: g * out),
    "log": _unary(lambda g, out, x: g / x),
    "log1p": _unary(lambda g, out, x: g / (x + 1.0)),
    "expm1": _unary(lambda g, out, x: g * (out + 1.0)),
    "sqrt": _unary(lambda g, out, x: g * 0.5 / out),
    "rsqrt": _unary(lambda g, out, x: g * -0.5 * out / x),
    "tanh": _unary(lambda g, out, x: g * (1.0 - out * out)),
    "logistic": _unary(lambda g, out, x: g * out * (1.0 - out)),
    "sin": _unary(lambda g, out, x: g * rnp.cos(x)),
    "cos": _unary(lambda g, out, x: -g * rnp.sin(x)),
    "tan": _unary(lambda g, out, x: g * (1.0 + out * out)),
    "sinh": _unary(lambda g, out, x: g * rnp.cosh(x)),
    "cosh": _unary(lambda g, out, x: g * rnp.sinh(x)),
    "arcsin": _unary(lambda g, out, x: g * rnp.rsqrt((1.0 - x) * (1.0 + x))),
    "arccos": _unary(lambda g, out, x: -g * rnp.rsqrt((1.0 - x) * (1.0 + x))),
    "arctan": _unary(lambda g, out, x: g / (1.0 + x * x)),
    "arcsinh": _unary(lambda g, out, x: g * rnp.rsqrt(x * x + 1.0)),
    "arccosh": _unary(lambda g, out, x: g * rnp.rsqrt((x - 1.0) * (x + 1.0))),
    "arctanh": _unary(lambda g, out, x: g / ((1.0 - x) * (1.0 + x))),
    "log2": _unary(lambda g, out, x: g / (x * math.log(2.0))),
    "log10": _unary(lambda g, out, x: g / (x * math.log(10.0))),
    "erf": _unary(lambda g, out, x: g * (2.0 / math.sqrt(math.pi)) * rnp.exp(-(x * x))),
    "add": _binary(lambda g, o, a, b: g, lambda g, o, a, b: g),
    "sub": _binary(lambda g, o, a, b: g, lambda g, o, a, b: -g),
    "mul": _binary(lambda g, o, a, b: g * b, lambda g, o, a, b: g * a),
    "div": _binary(lambda g, o, a, b: g / b, lambda g, o, a, b: -g * o / b),
    # mod = a - b q with q = floor(a / b), read back from the result (exact where a / b rounds
    # onto an integer that the quotient is not)
    # d atan2(a, b) = (b da - a db) / (a^2 + b^2)
    "arctan2": _binary(lambda g, o, a, b: g * b / (a * a + b * b),
                       lambda g, o, a, b: -g * a / (a * a + b * b)),
    # d logaddexp = sigmoid(a - b) da + sigmoid(b - a) db: from the operands, not the rounded
    # output (exp(a - out) in float16 lost 15 % at |a| ~ 1000: out's unit is 0.5 there)
    "logaddexp": _binary(lambda g, o, a, b: g * rnp.sigmoid(a - b),
                         lambda g, o, a, b: g * rnp.sigmoid(b - a)),
    "mod": _binary(lambda g, o, a, b: g, lambda g, o, a, b: -g * rnp.round((a - o) / b)),
    # copysign: +-g (the sign bits of a and b equal or not); b's sign bit alone counts: 0 for b
    "copysign": _binary(lambda g, o, a, b: rnp.where(rnp.signbit(a) == rnp.signbit(b), g, -g),
                        lambda g, o, a, b: rnp.zeros_like(g)),
    # d hypot = (a da + b db) / hypot; 0 at the origin (a subgradient, as the 2-norm's)
    "hypot": _binary(lambda g, o, a, b: g * a / rnp.where(o == 0, 1.0, o),
                     lambda g, o, a, b: g * b / rnp.where(o == 0, 1.0, o)),
    "pow": _binary(_pow_base, _pow_exponent),
    # maximum, minimum: the operand picked gets g; at a tie each gets g / 2 (PyTorch's and JAX's
    # rule, the central difference's, and reduce_max's: tied elements share). ``rp.nn.relu``
    # has its own rule, 0 at 0 (eager_kernels.py)
    "maximum": _binary(lambda g, o, a, b: _picked(g, a > b, a == b),
                       lambda g, o, a, b: _picked(g, a < b, a == b)),
    "minimum": _binary(lambda g, o, a, b: _picked(g, a < b, a == b),
                       lambda g, o, a, b: _picked(g, a > b, a == b)),
    "select": _select,
    "cast": _cast,
    "reduce_sum": _reduce_sum,
    "reduce_max": _reduce_extremum,
    "reduce_min": _reduce_extremum,
    "reduce_prod": _reduce_prod,
    "cumsum": lambda g, out, needs, x, axis, reverse: (
        bind("cumsum", g, axis=axis, reverse=not reverse),),
    "cumprod": _cumprod,
    "sort": _sort,
    "reshape": lambda g, out, needs, x, shape: (rnp.reshape(g, x.shape),),
    "transpose": lambda g, out, needs, x, perm: (rnp.transpose(g, tuple(np.argsort(perm))),),
    "broadcast_to": lambda g, out, needs, x, shape: (unbroadcast(g, x.shape),),
    "concatenate": _concatenate,
    "pad": _pad,
    "getitem": _getitem,
    "scatter_add": _scatter_add,
    "matmul": _matmul,
    "einsum": _einsum,
    "conv2d": _conv2d,
    "attention_weights": _attention_weights,
    "conv2d_input_grad": _conv2d_input_grad,
    "conv2d_weight_grad": _conv2d_weight_grad,
    **LINALG_RULES,  # solve, cholesky, qr, svd, eigh, det, slogdet (``linalg_vjp.py``)
    "all_reduce": _all_reduce,
    "all_gather": _all_gather,
    "broadcast": _broadcast,
    "reduce_scatter": _reduce_scatter,
    "permute": _permute,
    # model parallelism: the gradient of a move between logical devices moves back
    "transfer": lambda g, out, needs, x, *, src, dst: (move(g, dst, src),),
})
