"""JAX lowering of every primitive that runs on the device (all but communication).

The table is the reference rows (``graph/reference.py``) applied to ``jax.numpy``: one
definition per primitive for both. Each rule takes JAX (or, for constants, NumPy) arrays and the
node's attributes and returns a JAX array; ``apply`` casts the result to the node's dtype where
JAX's promotion differs from the IR's (a sum of bools, say). Where JAX differs by default it is
told to match NumPy: integer ``div`` floors (the shared row), matmuls run at full precision (no
TF32 on GPUs), random numbers come from the same counter-based hash, bit for bit.

Integer edge cases follow NumPy, not XLA: an integer divided by 0 is 0 (XLA's is -1, all ones
unsigned), and an integer to a negative integer power raises NumPy's ``ValueError`` (XLA gives a
number) through a ``checkify`` check that the backend turns into the error (``POW_CHECKS``).

>>> import numpy as np
>>> from replicate.backends.jax_impl import JAX
>>> np.asarray(JAX["div"](np.array([7, -7]), np.array([2, 2]))).tolist()
[3, -4]
"""

from __future__ import annotations

import jax

jax.config.update("jax_enable_x64", True)  # the library computes in float64 a lot

import jax.numpy as jnp  # noqa: E402
from jax import lax  # noqa: E402
from jax.experimental import checkify  # noqa: E402

from ..graph import attention, reference  # noqa: E402
from ..graph.index_bounds import bounds_message, index_axes  # noqa: E402
from ..graph.interpret import describe_node, eval_graph  # noqa: E402
from ..graph.linalg import PARTS as linalg_parts  # noqa: E402
from ..graph.primitives import REGISTRY, index_tuple  # noqa: E402
from .cuda_ops import POW_MESSAGE  # noqa: E402

# the NumPy reference multiplies in full float32/float64; so do we (XLA may pick TF32 on GPUs)
PRECISION = lax.Precision.HIGHEST


def _div(a, b):
    """The reference's ``div``; an integer divided by 0 is 0, as NumPy's (with its warning)
    gives on every platform. (XLA defines it as -1, all ones for unsigned integers. Its
    remainder by 0 is already NumPy's 0, and the most negative integer // -1 wraps in both.)"""
    if jnp.issubdtype(jnp.result_type(a), jnp.floating):
        return jnp.true_divide(a, b)
    zero = jnp.asarray(b) == 0
    return jnp.where(zero, 0, jnp.floor_divide(a, jnp.where(zero, 1, b)))


def _cast(x, dtype):
    """The reference's cast. On a GPU, XLA drops a narrowing float cast that a widening one
    follows (its excess-precision simplification: float64 -> float32 -> float64 came back
    unrounded, seen on an H200): there the narrowed value passes an optimisation barrier, so
    the rounding asked for happens (NumPy's bits). On a CPU nothing is dropped."""
    x = jnp.asarray(x)
    out = x.astype(dtype)
    if jnp.issubdtype(x.dtype, jnp.floating) and jnp.issubdtype(out.dtype, jnp.floating) and \
            out.dtype.itemsize < x.dtype.itemsize and jax.default_backend() != "cpu":
        out = lax.optimization_barrier(out)
    if x.dtype == jnp.bool_ and jnp.issubdtype(out.dtype, jnp.floating):
        # a mask: XLA's simplifier rewrites ``mask * x`` into a select, which gives 0 where
        # NumPy's product gives NaN (x NaN or inf, the mask off) or -0.0
        out = lax.optimization_barrier(out)
    return out


def pow_checked(node) -> bool:
    """Whether ``node`` (or a member of a fused group) is an integer power whose exponent can
    be negative: NumPy raises there, so the JAX backend checks it (``checkify.user_checks``)."""
    if node.prim == "fused":
        return any(pow_checked(n) for n in node.attrs["body"].graph.nodes)
    return (node.prim == "pow" and node.out.aval.dtype.kind in "iu"
            and node.inputs[1].aval.dtype.kind == "i")


def _check_pow(node, exponent):
    """A checkify check (the segment runs under ``checkify``): NumPy's message, then the note
    naming the op and the user's line (braces doubled: checkify formats the message)."""
    note = f"  raised by {describe_node(node)} (in the compiled step)"
    message = POW_MESSAGE + "\n" + note.replace("{", "{{").replace("}", "}}")
    checkify.check(jnp.all(jnp.asarray(exponent) >= 0), message)


def _check_nonnegative(node, idx):
    """Checkify checks that the index arrays of ``node`` marked ``NONNEGATIVE`` (class labels,
    embedding ids) hold no negative index (XLA would count it from the end); the backend
    raises the ``IndexError``, naming the first such index."""
    shape = node.inputs[0].aval.shape if node.prim == "getitem" else node.attrs["shape"]
    for ax, i, n, low in index_axes(shape, node.attrs["index"], idx):
        if low == 0:
            flat = jnp.asarray(i).reshape(-1)
            first = flat[jnp.argmax(flat < 0)]
            message = bounds_message(-1, ax, n, 0).replace("index -1 ", "index {} ", 1)
            checkify.check(jnp.all(flat >= 0), message, first)


def nonnegative_checked(checked: set, apply):
    """``apply`` that first checks the marked index arrays of the nodes whose ids are in
    ``checked`` (a segment under ``checkify.user_checks``; see ``_check_nonnegative``)."""
    def run(node, args):
        if id(node) in checked:
            _check_nonnegative(node, args[1:])
        return apply(node, args)
    return run


def _scatter_add(g, *idx, index, shape):
    if not idx:  # basic indexing only: a pad, not a scatter (checkify's scatter check fails on
        return _pad_into(g, index, shape)  # index-free scatters; XLA likes pads better anyway)
    return jnp.zeros(shape, jnp.result_type(g)).at[index_tuple(index, idx)].add(g)


def _pad_into(g, index, shape):
    """``zeros(shape)`` with ``g`` placed where ``zeros(shape)[index]`` selects (ints, slices,
    None, Ellipsis): every selected position is distinct, so this is the scatter-add."""
    entries = list(index)
    if any(e[0] == "ellipsis" for e in entries):
        at = next(i for i, e in enumerate(entries) if e[0] == "ellipsis")
        used = sum(e[0] in ("int", "slice") for e in entries)
        entries[at:at + 1] = [("slice", None, None, None)] * (len(shape) - used)
    used = sum(e[0] in ("int", "slice") for e in entries)
    entries += [("slice", None, None, None)] * (len(shape) - used)
    config, dim, axis = [], 0, 0  # axis: in g
    for e in entries:
        if e[0] == "none":  # an axis of size 1 that the index added
            g = jnp.squeeze(g, axis)
            continue
        size = shape[dim]
        if e[0] == "int":
            i = e[1] % size
            g = jnp.expand_dims(g, axis)
            config.append((i, size - i - 1, 0))
        else:
            start, stop, step = slice(*e[1:]).indices(size)
            count = len(range(start, stop, step))
            if count == 0:
                return jnp.zeros(shape, jnp.result_type(g))
            if step < 0:  # the same positions in ascending order
                g = jnp.flip(g, axis)
                start, step = start + (count - 1) * step, -step
            last = start + (count - 1) * step
            config.append((start, size - last - 1, step - 1))
        dim, axis = dim + 1, axis + 1
    return lax.pad(g, jnp.zeros((), jnp.result_type(g)), config)


def _wide_result(*xs) -> dict:
    """float16/bfloat16 products accumulate in (and return) float32, as the NumPy reference
    does; ``apply`` rounds the result to the node's dtype. XLA on a CPU also runs such a dot with
    its bf16 kernel only when the result is float32 (a bf16 result is upcast to a float32 dot:
    bench/RESULTS.md, "Mixed precision")."""
    if all(jnp.result_type(x) in (jnp.bfloat16, jnp.float16) for x in xs):
        return {"preferred_element_type": jnp.float32}
    return {}


# -- convolution: lax.conv_general_dilated, and the transposes JAX's autodiff would write
def _conv(lhs, rhs, specs, **kw):
    return lax.conv_general_dilated(lhs, rhs, dimension_numbers=specs, precision=PRECISION,
                                    **kw, **_wide_result(lhs, rhs))


def _single_channel(channels) -> bool:
    """One input and one output channel (``avg_pool2d``'s per-channel convolution with a window
    of ones): XLA's CPU convolution is slow there (a GEMM of width 1), so the rows below write
    it as one strided slice per kernel offset, which XLA fuses into one loop."""
    return tuple(channels) == (1, 1)


def _widen(*xs):
    if all(jnp.result_type(x) in (jnp.bfloat16, jnp.float16) for x in xs):
        return [x.astype(jnp.float32) for x in xs]
    return list(xs)


def _offsets(kernel, stride, dilation, out):
    """Per kernel offset (a, b): the strided slice of the padded input it reads."""
    for a in range(kernel[0]):
        for b in range(kernel[1]):
            start = (a * dilation[0], b * dilation[1])
            yield a, b, start, tuple(s + (o - 1) * t + 1 for s, o, t in zip(start, out, stride))


def _pad_hw(x, padding):
    return lax.pad(x, jnp.zeros((), x.dtype), [(0, 0, 0), (0, 0, 0)] + [(lo, hi, 0) for lo, hi
                                                                       in padding])


def _conv2d(x, w, stride, padding, dilation):
    if _single_channel(w.shape[:2]):
        x, w = _widen(x, w)
        x, n = _pad_hw(x, padding), x.shape[0]
        out = [(x.shape[i + 2] - dilation[i] * (w.shape[i + 2] - 1) - 1) // stride[i] + 1
               for i in range(2)]
        return sum(w[0, 0, a, b] * lax.slice(x, (0, 0) + start, (n, 1) + end, (1, 1) + stride)
                   for a, b, start, end in _offsets(w.shape[2:], stride, dilation, out))
    return _conv(x, w, ("NCHW", "OIHW", "NCHW"), window_strides=stride, padding=padding,
                 rhs_dilation=dilation)


def _conv2d_input_grad(g, w, size, stride, padding, dilation):
    """A convolution of ``g`` dilated by the stride with the flipped kernel, its features swapped
    (weights read as IOHW), padded so that the output is ``size``."""
    if _single_channel(w.shape[:2]):  # each offset's share placed by a pad (interior: the stride)
        g, w = _widen(g, w)
        total = 0
        for a, b, start, _ in _offsets(w.shape[2:], stride, dilation, g.shape[2:]):
            config = [(0, 0, 0), (0, 0, 0)]
            for lo_hi, n, o, s, first in zip(padding, size, g.shape[2:], stride, start):
                low = first - lo_hi[0]
                config.append((low, n - low - (o - 1) * s - 1, s - 1))
            total = total + lax.pad(g * w[0, 0, a, b], jnp.zeros((), g.dtype), config)
        return total
    pads = []
    for n, o, k, s, (lo, _), d in zip(size, g.shape[2:], w.shape[2:], stride, padding, dilation):
        before = d * (k - 1) - lo
        pads.append((before, n + d * (k - 1) - (o - 1) * s - 1 - before))
    return _conv(g, jnp.flip(w, (2, 3)), ("NCHW", "IOHW", "NCHW"), window_strides=(1, 1),
                 padding=pads, lhs_dilation=stride, rhs_dilation=dilation)


def _conv2d_weight_grad(x, g, kernel, stride, padding, dilation):
    """A convolution of ``x`` with ``g`` over the batch (batch and features swapped), the
    stride as the kernel's dilation and the dilation as the stride."""
    if _single_channel((x.shape[1], g.shape[1])):
        x, g = _widen(x, g)
        x, n = _pad_hw(x, padding), x.shape[0]
        sums = [jnp.sum(g * lax.slice(x, (0, 0) + start, (n, 1) + end, (1, 1) + stride))
                for _, _, start, end in _offsets(kernel, stride, dilation, g.shape[2:])]
        return jnp.stack(sums).reshape((1, 1) + tuple(kernel))
    pads = [(lo, (o - 1) * s + d * (k - 1) + 1 - n - lo) for n, o, k, s, (lo, _), d in
            zip(x.shape[2:], g.shape[2:], kernel, stride, padding, dilation)]
    return _conv(x, g, ("CNHW", "IOHW", "CNHW"), window_strides=dilation, padding=pads,
                 rhs_dilation=stride)


def _scan(fn):
    """A cumulative sum/product: float16/bfloat16 accumulate in float32 (one rounding per
    element, as the reference)."""
    def run(x, axis, reverse=False):
        wide = jnp.result_type(x) in (jnp.float16, jnp.bfloat16)
        return fn(x.astype(jnp.float32) if wide else x, axis=axis, reverse=reverse)
    return run


def _top_k_indices(x, k):
    """``lax.top_k``'s indices, with -0.0 equal to 0.0 and every NaN largest, as the reference
    (top_k orders floats totally: -0.0 below 0.0, a NaN with its sign bit set smallest)."""
    x = jnp.asarray(x)
    if jnp.issubdtype(x.dtype, jnp.floating):
        x = jnp.where(x == 0, jnp.zeros((), x.dtype), jnp.where(jnp.isnan(x), jnp.nan, x))
    return lax.top_k(x, k)[1]


def _swaps_last_two(x) -> bool:
    """Graph value ``x`` is a ``transpose`` of its operand's last two axes (``swapaxes(a, -1,
    -2)``, ``a.T`` of a matrix: how the matmul gradients read their operands)."""
    if x.node is None or x.node.prim != "transpose":
        return False
    perm = tuple(x.node.attrs["perm"])
    n = len(perm)
    return n >= 2 and perm == tuple(range(n - 2)) + (n - 1, n - 2)


def _row_major(x):
    """``x`` copied into row-major memory. XLA lays a transpose's result out transposed (it is a
    bitcast); the barrier keeps the flat copy from being folded back into the dot."""
    return lax.optimization_barrier(x.reshape(-1)).reshape(x.shape)


def _bf16_matmul(node, a, b):
    """A bfloat16 product in the form XLA's CPU bf16 dot kernel (YNNPACK) takes, or None. That
    kernel runs a dot whose operands are row-major in memory and whose left operand contracts its
    last axis; XLA upcasts every other bf16 dot to float32 (its operand_upcaster pass), which is
    what the gradient products ``g @ swapaxes(w)`` and ``swapaxes(x) @ g`` became. So a
    transposed left operand is copied row-major (a copy of the activations: far cheaper than the
    float32 dot), and a transposed right operand of a matrix product is read untransposed with
    its last axis contracted (the kernel takes that as it is). Values are unchanged: the same
    float32 accumulation, rounded by ``apply``. bench/RESULTS.md, "Mixed precision"."""
    if a.ndim < 2 or b.ndim < 2 or not (jnp.result_type(a) == jnp.result_type(b)
                                         == jnp.bfloat16):
        return None
    left, right = (_swaps_last_two(x) for x in node.inputs)
    if not (left or right):
        return None
    if left:
        a = _row_major(a)
    if right and a.ndim == b.ndim == 2:
        return lax.dot_general(a, b.T, (((1,), (1,)), ((), ())), precision=PRECISION,
                               preferred_element_type=jnp.float32)
    return jnp.matmul(a, _row_major(b) if right else b, precision=PRECISION,
                      preferred_element_type=jnp.float32)


def apply(node, args):
    """Run ``node``'s rule on ``args``, with the result in the node's dtype."""
    if node.prim == "pow" and pow_checked(node):
        _check_pow(node, args[1])
    if node.prim == "matmul":
        value = _bf16_matmul(node, *args)
        if value is not None:
            return value.astype(node.out.aval.dtype)
    return reference.apply(JAX, node, args)


def _fused(*xs, body):
    """A fused group (from the NumPy pipeline's fusion pass): its body, op by op; XLA fuses."""
    return eval_graph(body.graph, xs, apply)[0]


def _in_float32(fn):
    """``fn`` computed in float32 for float16/bfloat16 operands, rounded once by ``apply``:
    ``jax.numpy``'s ``log2``, ``logaddexp``, the inverse and hyperbolic functions are several
    XLA ops, each rounding to the low dtype (bfloat16 ``logaddexp`` was off by more than an
    ulp; XLA rounds a single op such as ``exp`` once). The linear algebra too: LAPACK has no
    float16."""
    def run(*xs, **attrs):
        if any(jnp.result_type(x) in (jnp.float16, jnp.bfloat16) for x in xs):
            xs = [jnp.asarray(x, jnp.float32) for x in xs]
        return fn(*xs, **attrs)
    return run


def _attention_weights(q, k, *mask, scale, causal, masking):
    """``graph/attention.py``'s row in ``jax.numpy`` (no arrays written in place), in float32
    for float16/bfloat16 operands (rounded once by ``apply``)."""
    if jnp.result_type(q) in (jnp.float16, jnp.bfloat16):
        q, k = jnp.asarray(q, jnp.float32), jnp.asarray(k, jnp.float32)
    s = jnp.matmul(q, jnp.swapaxes(k, -1, -2), precision=PRECISION) * scale
    if masking == "add":
        s = s + mask[0]
    keep = jnp.asarray(attention.causal_keep(s.shape[-2], s.shape[-1])) if causal else None
    if masking == "keep":
        keep = mask[0] if keep is None else jnp.logical_and(keep, mask[0])
    if keep is not None:
        s = jnp.where(keep, s, -jnp.inf)
    s = jnp.exp(s - jnp.max(s, axis=-1, keepdims=True))
    return s / jnp.sum(s, axis=-1, keepdims=True)


def _sign(x):
    """NumPy's sign: +0.0 for -0.0 (XLA keeps the zero's sign)."""
    out = jnp.sign(x)
    return jnp.where(out == 0, jnp.zeros((), out.dtype), out) if jnp.issubdtype(
        out.dtype, jnp.floating) else out


def _mod(a, b):
    """NumPy's remainder: a float remainder of 0 takes the divisor's sign (XLA: the
    dividend's)."""
    out = jnp.remainder(a, b)
    if not jnp.issubdtype(out.dtype, jnp.floating):
        return out
    return jnp.where(out == 0, jnp.copysign(jnp.zeros((), out.dtype), b), out)


# the reference rows applied to jax.numpy, and where JAX must be told to match NumPy
JAX = reference.table(jnp, "jax", {
    "sign": _sign,
    "mod": _mod,
    "div": _div,
    "cast": _cast,
    "logistic": jax.nn.sigmoid,
    "stop_gradient": jnp.asarray,  # JAX never differentiates here: the IR has the gradient
    # rp.remat: XLA merges equal ops too; the barrier keeps the recomputation its own
    "remat_barrier": lambda x, after: lax.optimization_barrier((x, after))[0],
    "scatter_add": _scatter_add,
    "erf": lax.erf,
    "cumsum": _scan(lax.cumsum),
    "cumprod": _scan(lax.cumprod),
    "top_k_indices": _top_k_indices,
    "matmul": lambda a, b: jnp.matmul(a, b, precision=PRECISION, **_wide_result(a, b)),
    "einsum": lambda *xs, subscripts: jnp.einsum(subscripts, *xs, precision=PRECISION,
                                                 **_wide_result(*xs)),
    "conv2d": _conv2d,
    "attention_weights": _attention_weights,
    "conv2d_input_grad": _conv2d_input_grad,
    "conv2d_weight_grad": _conv2d_weight_grad,
    "fused": _fused,  # groups made by the NumPy pipeline's fusion pass, should one come here
})
for _name in [n for n in JAX if n in REGISTRY and REGISTRY[n].host]:
    del JAX[_name]  # communication runs on the host (local_reduce is a device op: it stays)
# NumPy's cholesky and eigh read the lower triangle; jax.numpy's by default (a + a.T) / 2
JAX["cholesky"] = lambda a: jnp.linalg.cholesky(a, symmetrize_input=False)
JAX["eigh"] = lambda a, part: jnp.linalg.eigh(a, symmetrize_input=False)[linalg_parts[part]]
for _name in ("tan", "sinh", "cosh", "arcsin", "arccos", "arctan", "arcsinh", "arccosh",
              "arctanh", "arctan2", "log2", "log10", "logaddexp", "floor_divide", "hypot", "solve",
              "cholesky", "qr", "svd", "eigh", "det", "slogdet"):
    JAX[_name] = _in_float32(JAX[_name])


def missing_rules() -> list[str]:
    """Primitives that run on the device but have no JAX rule (the table test checks it)."""
    return [f"no jax rule for {name}" for name, prim in sorted(REGISTRY.items())
            if not prim.host and name not in JAX]


__all__ = ["JAX", "PRECISION", "apply", "missing_rules", "pow_checked"]
