"""2-D convolution as three primitives: the convolution and its two gradients.

* ``conv2d(x, w)``: NCHW input ``x``, OIHW weights ``w``, the cross-correlation of
  ``torch.nn.functional.conv2d`` (one group);
* ``conv2d_input_grad(g, w)``: the transpose of ``x -> conv2d(x, w)`` applied to ``g``, of the
  input's spatial ``size`` (the transposed convolution);
* ``conv2d_weight_grad(x, g)``: the transpose of ``w -> conv2d(x, w)`` applied to ``g``, of the
  weights' spatial ``kernel``.

All three share the geometry attributes: ``stride`` (sh, sw), ``padding`` ((top, bottom),
(left, right)), non-negative, and ``dilation`` (dh, dw). Each is linear in each operand, so the
gradient of each is the other two with the same geometry (``vjp_rules.py``): closed under
differentiation, to any order.

This module holds their shape rules and their reference rows, written for any NumPy-like array
module with ``lib.stride_tricks.as_strided`` (NumPy, CuPy): im2col is a strided view of the
padded input copied once into (N, C*KH*KW, OH*OW), the convolution one batched GEMM (``matmul``)
on it; the input gradient is one GEMM and a col2im that adds each kernel offset's slice into the
result (no scatter); the weight gradient one GEMM against the im2col of the input.

>>> import numpy as np
>>> conv2d_row(np)(np.ones((1, 1, 3, 3)), np.ones((1, 1, 2, 2)), stride=(1, 1),
...                padding=((0, 0), (0, 0)), dilation=(1, 1)).tolist()
[[[[4.0, 4.0], [4.0, 4.0]]]]
"""

from __future__ import annotations

import numpy as np

from ..errors import ShapeError
from .aval import AVal
from .shape_rules import _same_dtype


def out_size(size, kernel, stride, padding, dilation) -> tuple:
    """The output's spatial size: per axis ``(n + lo + hi - d (k - 1) - 1) // s + 1``, or a
    number below 1 where the dilated window is larger than the padded input."""
    return tuple((n + lo + hi - d * (k - 1) - 1) // s + 1 if n + lo + hi >= d * (k - 1) + 1
                 else 0 for n, k, s, (lo, hi), d in zip(size, kernel, stride, padding, dilation))


def _check_geometry(stride, padding, dilation):
    if len(stride) != 2 or len(dilation) != 2 or len(padding) != 2 or \
            any(len(p) != 2 for p in padding):
        raise ShapeError(f"conv geometry: stride {stride}, padding {padding}, dilation "
                         f"{dilation} are not pairs")
    if min(stride) < 1 or min(dilation) < 1 or min(min(p) for p in padding) < 0:
        raise ShapeError(f"conv geometry: stride {stride} and dilation {dilation} must be "
                         f"positive, padding {padding} non-negative")


def _rank4(*avals):
    for a in avals:
        if len(a.shape) != 4:
            raise ShapeError(f"a 2-D convolution's operands are of rank 4, got {a.shape}")


def _output(x_shape, kernel, stride, padding, dilation):
    if min(kernel) < 1:
        raise ShapeError(f"the window {tuple(kernel)} must be at least 1 x 1")
    size = out_size(x_shape[2:], kernel, stride, padding, dilation)
    if min(size) < 1:
        raise ShapeError(f"window {tuple(kernel)} (dilation {tuple(dilation)}) is larger than "
                         f"the padded input {x_shape[2:]} (padding {padding})")
    return size


def conv2d_shape(x, w, *, stride, padding, dilation):
    _rank4(x, w)
    _check_geometry(stride, padding, dilation)
    if x.shape[1] != w.shape[1]:
        raise ShapeError(f"input {x.shape} (NCHW) and weight {w.shape} (OIHW) do not fit")
    size = _output(x.shape, w.shape[2:], stride, padding, dilation)
    return AVal((x.shape[0], w.shape[0]) + size, _same_dtype(x, w))


def conv2d_input_grad_shape(g, w, *, size, stride, padding, dilation):
    _rank4(g, w)
    _check_geometry(stride, padding, dilation)
    x_shape = (g.shape[0], w.shape[1]) + tuple(size)
    out = _output(x_shape, w.shape[2:], stride, padding, dilation)
    if g.shape[1] != w.shape[0] or tuple(g.shape[2:]) != out:
        raise ShapeError(f"{g.shape} is not the shape of a convolution of {x_shape} with weights "
                         f"{w.shape} (its output is {(g.shape[0], w.shape[0]) + out})")
    return AVal(x_shape, _same_dtype(g, w))


def conv2d_weight_grad_shape(x, g, *, kernel, stride, padding, dilation):
    _rank4(x, g)
    _check_geometry(stride, padding, dilation)
    out = _output(x.shape, kernel, stride, padding, dilation)
    if g.shape[0] != x.shape[0] or tuple(g.shape[2:]) != out:
        raise ShapeError(f"{g.shape} is not the shape of a convolution of {x.shape} with a "
                         f"{tuple(kernel)} kernel (its output is {(x.shape[0], g.shape[1]) + out})")
    return AVal((g.shape[1], x.shape[1]) + tuple(kernel), _same_dtype(x, g))


# -- the reference rows ---------------------------------------------------------------------------
def _padded(xp, x, padding):
    (top, bottom), (left, right) = padding
    if not (top or bottom or left or right):
        return x
    n, c, h, w = x.shape
    out = xp.zeros((n, c, h + top + bottom, w + left + right), x.dtype)
    out[:, :, top:top + h, left:left + w] = x
    return out


def _windows(xp, x, kernel, stride, padding, dilation):
    """The im2col view of ``x``: (N, C, KH, KW, OH, OW), element ``[n, c, a, b, i, j]`` the padded
    input at row ``i * sh + a * dh``, column ``j * sw + b * dw``; no copy but the padding."""
    x = _padded(xp, x, padding)
    (kh, kw), (sh, sw), (dh, dw) = kernel, stride, dilation
    oh, ow = out_size(x.shape[2:], kernel, stride, ((0, 0), (0, 0)), dilation)
    s_n, s_c, s_h, s_w = x.strides
    return xp.lib.stride_tricks.as_strided(
        x, (x.shape[0], x.shape[1], kh, kw, oh, ow),
        (s_n, s_c, s_h * dh, s_w * dw, s_h * sh, s_w * sw))


# A batch is processed in chunks of images whose im2col (or col2im) block is about this many
# bytes: the copy into the block and the GEMM reading it then stay in cache instead of going
# through memory twice. bench/conv.py's second convolution (a 451 KiB im2col per image), 1 thread,
# 2-core AMD EPYC (1 MiB L2 a core): forward 9.7 ms in one chunk, 7.6-7.8 ms in chunks of 0.5 to
# 2 MiB (the GEMM alone: 7.3), 13 ms in chunks of 4 MiB and more. On a device (CuPy) the whole
# batch is one chunk.
CHUNK_BYTES = 1 << 20


def _chunks(xp, n, image_bytes):
    """(start, end) of the batch's chunks (one empty chunk for an empty batch)."""
    step = max(1, CHUNK_BYTES // max(image_bytes, 1) if xp.__name__ == "numpy" else n)
    return [(i, min(n, i + step)) for i in range(0, n, step)] or [(0, 0)]


def _im2col(xp, view):
    """Per chunk of the batch: (start, end, its im2col as (images, C*KH*KW, OH*OW)), copied into
    one reused block (no copy where the view is contiguous: a 1x1 window, stride 1)."""
    n, c, kh, kw, oh, ow = view.shape
    k, p = c * kh * kw, oh * ow
    chunks = _chunks(xp, n, k * p * view.itemsize)
    if view.flags.c_contiguous:
        for i, j in chunks:
            yield i, j, view[i:j].reshape(j - i, k, p)
        return
    block = xp.empty((chunks[0][1],) + view.shape[1:], view.dtype)
    for i, j in chunks:
        cols = block[:j - i]
        xp.copyto(cols, view[i:j])
        yield i, j, cols.reshape(j - i, k, p)


def conv2d_row(xp):
    def conv2d(x, w, stride, padding, dilation):
        """One GEMM per image, (O, C*KH*KW) @ (C*KH*KW, OH*OW), written into NCHW (measured
        faster than one (N*OH*OW, C*KH*KW) GEMM and the transposes it needs)."""
        n, (o, c, kh, kw) = x.shape[0], w.shape
        view = _windows(xp, x, (kh, kw), stride, padding, dilation)
        oh, ow = view.shape[4:]
        out = xp.empty((n, o, oh * ow), xp.result_type(x, w))
        weights = w.reshape(o, c * kh * kw)
        for i, j, cols in _im2col(xp, view):
            xp.matmul(weights, cols, out=out[i:j])
        return out.reshape(n, o, oh, ow)
    return conv2d


def _spans(size, kernel, stride, padding, dilation, out):
    """Per kernel offset along one axis: (first output index, end, first input index) of the
    outputs whose window row at that offset falls inside the input (not in the padding)."""
    (lo, _), spans = padding, []
    for a in range(kernel):
        first = max(0, -(-(lo - a * dilation) // stride))
        end = min(out, (lo + size - 1 - a * dilation) // stride + 1)
        spans.append((first, end, a * dilation + first * stride - lo) if first < end else None)
    return spans


def _col2im(dx, share, spans, stride):
    """For each kernel offset (a, b): ``share(target, a, b, rows, columns)`` adds the offset's
    share of the outputs ``[rows, columns]`` into ``target``, the strided rows and columns of
    ``dx`` they came from."""
    (rows, columns), (sh, sw) = spans, stride
    for a, r in enumerate(rows):
        for b, q in enumerate(columns):
            if r is None or q is None:
                continue
            (i0, i1, h0), (j0, j1, w0) = r, q
            share(dx[:, :, h0:h0 + (i1 - i0 - 1) * sh + 1:sh, w0:w0 + (j1 - j0 - 1) * sw + 1:sw],
                  a, b, slice(i0, i1), slice(j0, j1))


def conv2d_input_grad_row(xp):
    def conv2d_input_grad(g, w, size, stride, padding, dilation):
        """col2im: per chunk of images one GEMM gives every kernel offset's contribution, (images,
        KH, KW, C, OH, OW) (each offset's share a contiguous block per image: faster to add than
        (images, C, KH, KW, OH, OW)), added into the strided rows and columns it came from. With
        one output channel (``avg_pool2d``) the share is ``g`` times the weight: no GEMM. Where
        the windows do not overlap (pooling) each input element gets one share: written, not
        added."""
        n, o, oh, ow = g.shape
        c, kh, kw = w.shape[1:]
        spans = (_spans(size[0], kh, stride[0], padding[0], dilation[0], oh),
                 _spans(size[1], kw, stride[1], padding[1], dilation[1], ow))
        overlap = any(s < d * (k - 1) + 1 for s, d, k in zip(stride, dilation, (kh, kw)))
        dx = xp.zeros((n, c) + tuple(size), xp.result_type(g, w))
        if o == 1:
            def weighted(target, a, b, i, j):
                part, weight = g[:, :, i, j], w[:, :, a, b].reshape(1, c, 1, 1)
                if overlap:
                    target += part * weight
                else:
                    xp.multiply(part, weight, out=target)
            _col2im(dx, weighted, spans, stride)
            return dx

        def share(target, a, b, i, j):
            if overlap:
                target += cols[:, a, b, :, i, j]
            else:
                xp.copyto(target, cols[:, a, b, :, i, j])
        wt = xp.ascontiguousarray(w.transpose(2, 3, 1, 0)).reshape(kh * kw * c, o)
        chunks = _chunks(xp, n, kh * kw * c * oh * ow * dx.itemsize)
        block = xp.empty((chunks[0][1], kh * kw * c, oh * ow), dx.dtype)
        phased = overlap and max(stride) > 1
        for i, j in chunks:
            cols = xp.matmul(wt, g[i:j].reshape(j - i, o, oh * ow), out=block[:j - i])
            cols = cols.reshape(j - i, kh, kw, c, oh, ow)
            if phased:
                _col2im_phased(xp, dx[i:j], cols, spans, stride)
            else:
                _col2im(dx[i:j], share, spans, stride)
        return dx
    return conv2d_input_grad


def _col2im_phased(xp, dx, cols, spans, stride):
    """col2im of strided, overlapping windows: each kernel offset's share is added into the
    stride's phase it lands in (the input's rows ``p::sh`` and columns ``q::sw``: a contiguous
    array, where adding into ``dx``'s strided view was the cost), and each phase is copied into
    ``dx`` at the end. Every element gets the same additions, from zero, in the same order as
    ``_col2im`` gives it: the same values to the bit (bench/conv.py's stride-2 input gradient,
    1 thread: 3.0 -> 2.2 ms)."""
    (rows, columns), (sh, sw), (h, w) = spans, stride, dx.shape[2:]
    phases = {}
    for a, r in enumerate(rows):
        for b, q in enumerate(columns):
            if r is None or q is None:
                continue
            (i0, i1, h0), (j0, j1, w0) = r, q
            key = (h0 % sh, w0 % sw)
            phase = phases.get(key)
            if phase is None:
                phase = phases[key] = xp.zeros(dx.shape[:2] + (-(-(h - key[0]) // sh),
                                                               -(-(w - key[1]) // sw)), dx.dtype)
            phase[:, :, h0 // sh:h0 // sh + i1 - i0, w0 // sw:w0 // sw + j1 - j0] += \
                cols[:, a, b, :, i0:i1, j0:j1]
    for (p, q), phase in phases.items():
        dx[:, :, p::sh, q::sw] = phase


def conv2d_weight_grad_row(xp):
    def conv2d_weight_grad(x, g, kernel, stride, padding, dilation):
        """Per chunk of images one GEMM per image, the im2col of x (C*KH*KW, OH*OW) against g
        transposed (OH*OW, O), summed over the images and transposed (measured 25-30 % faster
        than g (O, OH*OW) against the im2col transposed, on bench/conv.py's shapes)."""
        (n, o, oh, ow), c = g.shape, x.shape[1]
        view = _windows(xp, x, kernel, stride, padding, dilation)
        return _weight_grad(xp, _im2col(xp, view), g.reshape(n, o, oh * ow),
                            (o, c) + tuple(kernel))
    return conv2d_weight_grad


def _weight_grad(xp, chunks, g, shape):
    """The weight gradient from the im2col's ``chunks`` (start, end, cols) and ``g`` as (N, O,
    OH*OW): per chunk one GEMM per image summed over the images, the chunks added in order."""
    dw = None
    for i, j, cols in chunks:
        part = xp.matmul(cols, g[i:j].transpose(0, 2, 1)).sum(axis=0)
        dw = part if dw is None else xp.add(dw, part, out=dw)
    return dw.T.reshape(shape)


# -- eager mode's convolution layer (nn/eager_kernels.py): the im2col kept for the backward ------
def conv2d_keeping_cols(x, w, stride, padding, dilation):
    """NumPy: the ``conv2d`` row's result (the same GEMMs on the same chunks: the same bits) and
    the whole im2col it made, (N, C*KH*KW, OH*OW), for ``conv2d_weight_grad_from_cols``."""
    n, (o, c, kh, kw) = x.shape[0], w.shape
    view = _windows(np, x, (kh, kw), stride, padding, dilation)
    oh, ow = view.shape[4:]
    k, p = c * kh * kw, oh * ow
    out = np.empty((n, o, p), np.result_type(x, w))
    cols = view.reshape(n, k, p) if view.flags.c_contiguous else np.empty((n, k, p), x.dtype)
    weights = w.reshape(o, k)
    for i, j in _chunks(np, n, k * p * view.itemsize):
        if not view.flags.c_contiguous:
            np.copyto(cols[i:j].reshape(view[i:j].shape), view[i:j])
        np.matmul(weights, cols[i:j], out=out[i:j])
    return out.reshape(n, o, oh, ow), cols


def conv2d_weight_grad_from_cols(cols, g, kernel):
    """NumPy: the ``conv2d_weight_grad`` row's result from an im2col made already (the same
    chunks and ops: the same bits)."""
    n, o = g.shape[:2]
    chunks = ((i, j, cols[i:j]) for i, j in _chunks(np, n, cols[0].nbytes))
    return _weight_grad(np, chunks, g.reshape(n, o, -1),
                        (o, cols.shape[1] // (kernel[0] * kernel[1])) + tuple(kernel))


ROWS = {"conv2d": conv2d_row, "conv2d_input_grad": conv2d_input_grad_row,
        "conv2d_weight_grad": conv2d_weight_grad_row}

__all__ = ["ROWS", "conv2d_input_grad_shape", "conv2d_keeping_cols", "conv2d_shape",
           "conv2d_weight_grad_from_cols", "conv2d_weight_grad_shape", "out_size"]
