"""Contractions (matmul, einsum), convolution (and its transpose) and pooling.

Convolution is a primitive with its two gradients (``graph/conv.py``): ``conv2d`` binds it,
``conv_transpose2d`` binds its input gradient and ``avg_pool2d`` convolves each channel with a
window of ones. ``max_pool2d`` is a composition (pad, strided slices, max), its gradient from the
same rule table as everything else.
"""

from __future__ import annotations

import numpy as np

from ..dtypes import is_float
from ..errors import ReplicateError
from ..graph.conv import out_size
from ..graph.core import bind
from ..graph.primitives import parse_einsum
from ._base import as_array, autocast_operands, float_operand, promote
from ._elementwise import equal, multiply, where
from ._reductions import argmax
from ._reductions import max as reduce_max
from ._reductions import sum as reduce_sum
from ._shape import broadcast_to, concatenate, expand_dims, pad, reshape, squeeze


def matmul(a, b):
    """Matrix product with NumPy semantics (1-D operands, broadcast batch dimensions).

    >>> import replicate.numpy as rnp
    >>> rnp.matmul(rnp.ones((2, 3)), rnp.ones(3)).tolist()
    [3.0, 3.0]
    """
    a, b = autocast_operands(*promote(a, b))
    if a.ndim == 0 or b.ndim == 0:
        raise ReplicateError("matmul: operands must have at least one dimension; use multiply")
    va, vb = a.ndim == 1, b.ndim == 1
    if va:
        a = expand_dims(a, 0)
    if vb:
        b = expand_dims(b, -1)
    out = bind("matmul", a, b)
    if va:
        out = squeeze(out, -2)
    if vb:
        out = squeeze(out, -1)
    return out


def dot(a, b):
    """Dot product with NumPy's semantics: ``matmul`` for 1-D and 2-D operands and for a 1-D or
    2-D ``b``; otherwise a sum over the last axis of ``a`` and the second-to-last of ``b``, with
    no batch broadcasting (``np.dot``, not ``np.matmul``); a 0-d operand multiplies.

    >>> import replicate.numpy as rnp
    >>> rnp.dot(rnp.ones((2, 3, 4)), rnp.ones((5, 4, 6))).shape
    (2, 3, 5, 6)
    """
    a, b = promote(a, b)
    if a.ndim == 0 or b.ndim == 0:
        return multiply(a, b)
    if a.ndim == 1 or b.ndim <= 2:
        return matmul(a, b)
    letters = iter("abcdefghijlmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ")  # "k" is contracted
    ta = "".join(next(letters) for _ in range(a.ndim - 1))
    tb = "".join(next(letters) for _ in range(b.ndim - 2))
    j = next(letters)
    return einsum(f"{ta}k,{tb}k{j}->{ta}{tb}{j}", a, b)


def einsum(subscripts, *operands):
    """Einstein summation for the common cases (no ellipsis, no repeated index in one operand).

    >>> import replicate.numpy as rnp
    >>> rnp.einsum("ij,j->i", rnp.ones((2, 3)), rnp.ones(3)).tolist()
    [3.0, 3.0]
    """
    operands = autocast_operands(*promote(*operands))
    subscripts = subscripts.replace(" ", "")
    if "." in subscripts:
        raise ReplicateError("einsum: ellipsis is not supported; spell out the axes")
    if "->" not in subscripts:
        letters = subscripts.replace(",", "")
        subscripts += "->" + "".join(sorted(c for c in set(letters) if letters.count(c) == 1))
    ins, _ = parse_einsum(subscripts)
    for term in ins:
        if len(set(term)) != len(term):
            raise ReplicateError(f"einsum: repeated index in term {term!r} (traces/diagonals) "
                                 "is not supported")
    return bind("einsum", *operands, subscripts=subscripts)


def _pair(v, name):
    t = (v, v) if np.isscalar(v) else tuple(v)
    if len(t) != 2 or any(int(i) < 0 for i in t):
        raise ReplicateError(f"{name} must be a non-negative int or a pair, got {v!r}")
    return tuple(int(i) for i in t)


def _windows(x, kernel, stride, padding, dilation, pad_value=0.0):
    """Stack the kernel-offset views of an NCHW input: (N, C, KH*KW, OH, OW)."""
    if x.ndim != 4:
        raise ReplicateError(f"expected an NCHW input, got shape {x.shape}")
    (kh, kw), (sh, sw), (ph, pw), (dh, dw) = kernel, stride, padding, dilation
    if sh == 0 or sw == 0 or dh == 0 or dw == 0:
        raise ReplicateError("stride and dilation must be positive")
    if kh <= 0 or kw <= 0:
        raise ReplicateError(f"the window {kernel} must be at least 1 x 1")
    x = pad(x, ((0, 0), (0, 0), (ph, ph), (pw, pw)), pad_value)
    h, w = x.shape[2], x.shape[3]
    oh, ow = (h - dh * (kh - 1) - 1) // sh + 1, (w - dw * (kw - 1) - 1) // sw + 1
    if oh <= 0 or ow <= 0:
        raise ReplicateError(f"window {kernel} (dilation {dilation}) is larger than the padded "
                             f"input {(h, w)}")
    views = []
    for i in range(kh):
        for j in range(kw):
            r, c = i * dh, j * dw
            view = x[:, :, r:r + sh * (oh - 1) + 1:sh, c:c + sw * (ow - 1) + 1:sw]
            views.append(expand_dims(view, 2))
    return concatenate(views, axis=2), (oh, ow)


def _geometry(stride, padding, dilation):
    stride, padding = _pair(stride, "stride"), _pair(padding, "padding")
    dilation = _pair(dilation, "dilation")
    if 0 in stride or 0 in dilation:
        raise ReplicateError("stride and dilation must be positive")
    return dict(stride=stride, padding=tuple((p, p) for p in padding), dilation=dilation)


def _check_window(size, kernel, geometry):
    """The errors of a window that does not fit (the shape rule's, said at the user's call)."""
    if kernel[0] <= 0 or kernel[1] <= 0:
        raise ReplicateError(f"the window {tuple(kernel)} must be at least 1 x 1")
    size = tuple(n + lo + hi for n, (lo, hi) in zip(size, geometry["padding"]))
    if min(out_size(size, kernel, geometry["stride"], ((0, 0), (0, 0)),
                    geometry["dilation"])) <= 0:
        raise ReplicateError(f"window {tuple(kernel)} (dilation {geometry['dilation']}) is "
                             f"larger than the padded input {size}")


def conv2d(x, w, stride=1, padding=0, dilation=1):
    """2-D cross-correlation, NCHW input and OIHW weights (as ``torch.nn.functional.conv2d``):
    the ``conv2d`` primitive (im2col and a GEMM in NumPy, ``lax.conv_general_dilated`` in JAX).

    >>> import replicate.numpy as rnp
    >>> rnp.conv2d(rnp.ones((1, 1, 4, 4)), rnp.ones((2, 1, 3, 3)), padding=1).shape
    (1, 2, 4, 4)
    """
    x, w = autocast_operands(*promote(x, w))
    if w.ndim != 4 or x.ndim != 4 or w.shape[1] != x.shape[1]:
        raise ReplicateError(f"conv2d: input {x.shape} (NCHW) and weight {w.shape} (OIHW) "
                             "do not fit")
    geometry = _geometry(stride, padding, dilation)
    _check_window(x.shape[2:], w.shape[2:], geometry)
    return bind("conv2d", x, w, **geometry)


def conv_transpose2d(x, w, stride=1, padding=0, output_padding=0, dilation=1):
    """Transposed 2-D convolution (the gradient of ``conv2d`` with respect to its input), NCHW
    input and weights of shape (in, out, kH, kW), as ``torch.nn.functional.conv_transpose2d``
    (one group): the output is ``(H - 1) * stride - 2 * padding + dilation * (kH - 1) +
    output_padding + 1`` high (and wide, likewise).

    The ``conv2d_input_grad`` primitive: a GEMM and col2im in NumPy, a convolution with input
    dilation in JAX. The rows ``output_padding`` adds past the padding's crop receive nothing:
    zeros.

    >>> import replicate.numpy as rnp
    >>> rnp.conv_transpose2d(rnp.ones((1, 1, 2, 2)), rnp.ones((1, 1, 2, 2)), stride=2).tolist()
    [[[[1.0, 1.0, 1.0, 1.0], [1.0, 1.0, 1.0, 1.0], [1.0, 1.0, 1.0, 1.0], [1.0, 1.0, 1.0, 1.0]]]]
    """
    x, w = autocast_operands(*promote(x, w))
    if w.ndim != 4 or x.ndim != 4 or w.shape[0] != x.shape[1]:
        raise ReplicateError(f"conv_transpose2d: input {x.shape} (NCHW) and weight {w.shape} "
                             "(in, out, kH, kW) do not fit")
    geometry = _geometry(stride, padding, dilation)
    stride, dilation = geometry["stride"], geometry["dilation"]
    padding, extra = _pair(padding, "padding"), _pair(output_padding, "output_padding")
    if any(e >= max(s, d) for e, s, d in zip(extra, stride, dilation)):
        raise ReplicateError(f"output_padding {extra} must be smaller than the stride {stride} "
                             f"or the dilation {dilation}")
    if w.shape[2] <= 0 or w.shape[3] <= 0:
        raise ReplicateError(f"the window {w.shape[2:]} must be at least 1 x 1")
    size = [(i - 1) * s - 2 * p + d * (k - 1) + e + 1 for i, s, p, d, k, e in
            zip(x.shape[2:], stride, padding, dilation, w.shape[2:], extra)]
    if min(size) <= 0:
        raise ReplicateError(f"conv_transpose2d: the output would be {tuple(size)}")
    # the convolution whose input gradient this is: padding (p, p - e) maps ``size`` onto x's
    # H, W; where e > p the last e - p rows get no contribution and are padded on as zeros
    short = [max(e - p, 0) for e, p in zip(extra, padding)]
    geometry["padding"] = tuple((p, max(p - e, 0)) for p, e in zip(padding, extra))
    out = bind("conv2d_input_grad", x, w, size=tuple(n - t for n, t in zip(size, short)),
               **geometry)
    if any(short):
        out = pad(out, ((0, 0), (0, 0), (0, short[0]), (0, short[1])))
    return out


def max_pool2d(x, kernel_size, stride=None, padding=0):
    """Max pooling over NCHW windows (padding counts as -inf, or the lowest integer); a
    window's gradient goes to its first maximum (row-major; NaN counts as the maximum), as
    PyTorch's."""
    x = as_array(x)
    kernel = _pair(kernel_size, "kernel_size")
    if is_float(x.dtype):
        lowest = -np.inf
    else:
        lowest = 0 if x.dtype.kind == "b" else np.iinfo(x.dtype).min
    cols, _ = _windows(x, kernel, _pair(stride or kernel_size, "stride"),
                       _pair(padding, "padding"), (1, 1), pad_value=lowest)
    if not is_float(x.dtype):
        return reduce_max(cols, axis=2)
    # a window's gradient goes whole to its first maximum (PyTorch's rule; ``max``'s own would
    # share it among tied entries): the entry a one-hot of the window's argmax picks, the others
    # filled with -0.0 (x + -0.0 is x for every x: the sum is the maximum, to the bit)
    first = equal(as_array(np.arange(cols.shape[2]).reshape(-1, 1, 1)),
                  expand_dims(argmax(cols, axis=2), 2))
    return reduce_sum(where(first, cols, as_array(-0.0, cols.dtype)), axis=2)


def avg_pool2d(x, kernel_size, stride=None, padding=0):
    """Average pooling over NCHW windows (padding counts as zeros, as in PyTorch's default): each
    channel convolved with a window of ones, over the window's size. An integer or bool input
    averages in float64 (as ``mean``)."""
    x = float_operand(x)
    if x.ndim != 4:
        raise ReplicateError(f"expected an NCHW input, got shape {x.shape}")
    kh, kw = _pair(kernel_size, "kernel_size")
    geometry = _geometry(_pair(stride or kernel_size, "stride"), padding, 1)
    _check_window(x.shape[2:], (kh, kw), geometry)
    n, c, h, wd = x.shape
    oh, ow = out_size((h, wd), (kh, kw), **geometry)
    ones = broadcast_to(as_array(1, x.dtype), (1, 1, kh, kw))
    sums = bind("conv2d", reshape(x, (n * c, 1, h, wd)), ones, **geometry)
    return reshape(sums, (n, c, oh, ow)) / (kh * kw)
