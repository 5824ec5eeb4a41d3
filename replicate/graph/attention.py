"""Attention's weights as one primitive: ``attention_weights(q, k[, mask])``.

``softmax(q @ k^T * scale, masked)`` over the keys' axis, for ``q`` (..., L, E) and ``k``
(..., S, E) (leading axes broadcast) — (..., L, S). ``scaled_dot_product_attention`` is this
primitive and one ``matmul`` with the values, so the weights a backward pass needs are a value
of the graph (kept, never recomputed) and the values' product differentiates as any matmul.

Attributes: ``scale`` (a float), ``causal`` (query i attends keys j <= i, top-left aligned),
``masking``: ``"none"``, ``"keep"`` (a third operand, boolean, True where a query may attend a
key) or ``"add"`` (a third operand added to the scores: a float bias, with a gradient). A query
that may attend no key gets nan, as a softmax over nothing.

One row per backend: the reference below (NumPy and CuPy: the scores computed once into a
fresh array and every later pass done in place in it), JAX's in ``backends/jax_impl.py``; the
gradient (``vjp_rules.py``) is written with ``replicate.numpy`` ops on the kept weights —
``ds = p * (g - sum(g * p))``, then two matmuls — so it is differentiable again.

>>> import numpy as np
>>> weights_row(np)(np.zeros((2, 1)), np.zeros((3, 1)), scale=1.0, causal=True,
...                 masking="none").round(3).tolist()
[[1.0, 0.0, 0.0], [0.5, 0.5, 0.0]]
"""

from __future__ import annotations

import numpy as np

from ..errors import ShapeError
from .aval import AVal
from .shape_rules import _same_dtype

MASKING = ("none", "keep", "add")


def weights_shape(q, k, *mask, scale, causal, masking):
    if masking not in MASKING:
        raise ShapeError(f"attention_weights: masking is one of {MASKING}, got {masking!r}")
    if len(mask) != (masking != "none"):
        raise ShapeError(f"attention_weights: masking={masking!r} takes "
                         f"{'a mask operand' if masking != 'none' else 'no mask operand'}")
    if len(q.shape) < 2 or len(k.shape) < 2 or q.shape[-1] != k.shape[-1]:
        raise ShapeError(f"attention_weights: query (..., L, E) and key (..., S, E), got "
                         f"{q.shape} and {k.shape}")
    dtype = _same_dtype(q, k)
    if np.dtype(dtype).kind != "f" and str(dtype) != "bfloat16":
        raise ShapeError(f"attention_weights: query and key are floats, got {dtype}")
    shape = tuple(np.broadcast_shapes(q.shape[:-2], k.shape[:-2])) + (q.shape[-2], k.shape[-2])
    if mask:
        m = mask[0]
        if masking == "keep" and m.dtype != np.bool_:
            raise ShapeError(f"attention_weights: a 'keep' mask is boolean, got {m.dtype}")
        try:
            if np.broadcast_shapes(m.shape, shape) != shape:
                raise ValueError
        except ValueError:
            raise ShapeError(f"attention_weights: the mask {m.shape} does not broadcast to the "
                             f"scores {shape}") from None
    return AVal(shape, dtype)


def causal_keep(length: int, source: int, xp=np):
    """Query i attends keys j <= i (PyTorch's ``is_causal``, top-left aligned); an ``xp``
    array."""
    return xp.arange(source)[None, :] <= xp.arange(length)[:, None]


def weights_row(xp):
    """The reference: the scores into a fresh array, then scale, mask, shift, exp and normalise
    in place (NumPy and CuPy)."""
    def run(q, k, *mask, scale, causal, masking):
        s = xp.matmul(q, xp.swapaxes(k, -1, -2))  # a fresh array: the scores
        s *= s.dtype.type(scale)
        if masking == "add":  # (the mask broadcasts to the scores: the shape rule says so)
            xp.add(s, mask[0], out=s, casting="unsafe")
        # (made by ``xp``: on a device, no copy up per call, none under a CUDA graph's capture)
        keep = causal_keep(s.shape[-2], s.shape[-1], xp) if causal else None
        if masking == "keep":
            keep = mask[0] if keep is None else xp.logical_and(keep, mask[0])
        if keep is not None:
            s = xp.where(keep, s, -xp.inf).astype(s.dtype, copy=False)
        s -= s.max(axis=-1, keepdims=True)
        xp.exp(s, out=s)
        s /= s.sum(axis=-1, keepdims=True)
        return s
    return run


__all__ = ["MASKING", "causal_keep", "weights_row", "weights_shape"]
