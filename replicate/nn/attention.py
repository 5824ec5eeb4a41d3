"""Attention: ``scaled_dot_product_attention`` — the primitive ``attention_weights`` (scores,
mask and softmax in one op, ``graph/attention.py``; its weights kept for the backward pass) and
one ``matmul`` with the values — and ``MultiheadAttention`` on it; both modes, every backend."""

from __future__ import annotations

import math

import numpy as np

from .. import numpy as rnp
from ..errors import ReplicateError
from ..graph.attention import causal_keep
from ..graph.core import bind
from ..state import Variable
from . import init
from .eager_kernels import attention_weights
from .layers import Linear
from .module import Module


def scaled_dot_product_attention(query, key, value, mask=None, is_causal=False, scale=None, *,
                                 attn_mask=None):
    """``softmax(query @ key^T * scale + mask) @ value`` over the last two axes, as
    ``torch.nn.functional.scaled_dot_product_attention``: ``query`` (..., L, E), ``key``
    (..., S, E), ``value`` (..., S, Ev), leading axes broadcast, result (..., L, Ev).

    ``scale`` defaults to ``1 / sqrt(E)``. ``mask`` (PyTorch's ``attn_mask``, also accepted
    under that name) broadcasts to (..., L, S): a boolean mask marks with True the keys a query
    may attend (PyTorch's convention for this function), a float mask is added to the scores.
    ``is_causal=True``: query i attends keys j <= i (PyTorch's top-left alignment when
    L != S); it may not be combined with a mask, as in PyTorch. A query that may attend no key
    gets nan, as the scores' softmax over nothing. No dropout.

    >>> import numpy as np, replicate.numpy as rnp
    >>> q = k = rnp.zeros((3, 2), np.float64); v = rnp.asarray(np.arange(3.0)[:, None])
    >>> scaled_dot_product_attention(q, k, v, is_causal=True).tolist()
    [[0.0], [0.5], [1.0]]
    """
    if attn_mask is not None:
        if mask is not None:
            raise ReplicateError("scaled_dot_product_attention: give mask or attn_mask, not both")
        mask = attn_mask
    query, key, value = (rnp.as_array(t) for t in (query, key, value))
    if query.ndim < 2 or key.ndim < 2 or value.ndim < 2:
        raise ReplicateError(f"scaled_dot_product_attention: inputs are (..., T, d), got "
                             f"{query.shape}, {key.shape}, {value.shape}")
    if query.shape[-1] != key.shape[-1] or key.shape[-2] != value.shape[-2]:
        raise ReplicateError(f"scaled_dot_product_attention: query {query.shape}, key "
                             f"{key.shape} and value {value.shape} do not fit")
    scale = 1.0 / math.sqrt(query.shape[-1]) if scale is None else float(scale)
    if is_causal and mask is not None:
        raise ReplicateError("scaled_dot_product_attention: is_causal=True takes no mask")
    masks, masking = (), "none"
    if mask is not None:
        mask = rnp.as_array(mask)
        masking = "keep" if mask.dtype == np.bool_ else "add"
        masks = (mask if masking == "keep" else rnp.cast(mask, query.dtype),)
    if masking == "none":  # (eager mode: one kernel)
        weights = attention_weights(query, key, scale, bool(is_causal))
    else:
        weights = bind("attention_weights", query, key, *masks, scale=scale,
                       causal=bool(is_causal), masking=masking)
    return rnp.matmul(weights, value)


class MultiheadAttention(Module):
    """Multi-head attention, as ``torch.nn.MultiheadAttention`` (``kdim = vdim = embed_dim``,
    no dropout): one packed in-projection ``in_proj_weight``/``in_proj_bias`` for query, key
    and value, ``num_heads`` heads of ``embed_dim // num_heads`` through
    ``scaled_dot_product_attention``, and an out-projection ``out_proj`` (an ``rp.nn.Linear``).

    The parameter names are PyTorch's; the weights are stored (in, out) as every
    ``rp.nn.Linear``'s, the transposes of PyTorch's: ``in_proj_weight`` is (E, 3E), query then
    key then value columns; copy ``torch_mha.in_proj_weight.T`` into it (and
    ``out_proj.weight.T``).

    ``forward(query, key=None, value=None, attn_mask=None, is_causal=False)``: ``key`` and
    ``value`` default to ``query`` (self-attention); inputs (B, T, E) with ``batch_first=True``
    (the default here; PyTorch's is False), (T, B, E) otherwise, or unbatched (T, E). Returns
    ``(output, None)``, PyTorch's tuple with ``need_weights=False``, so ``out, _ = mha(x, x, x)``
    ports unchanged. ``attn_mask`` (L, S) or (B * num_heads, L, S) follows *this module's*
    PyTorch convention: a boolean True marks a position that may NOT be attended (the opposite
    of ``scaled_dot_product_attention``'s), a float mask is added. ``is_causal=True`` applies the
    causal mask by itself, and together with an ``attn_mask`` applies both (PyTorch asks for the
    mask too and takes the flag as a hint that the mask is causal, which it may then drop).

    >>> import numpy as np, replicate as rp
    >>> mha = rp.nn.MultiheadAttention(8, 2)
    >>> out, _ = mha(np.ones((3, 5, 8), np.float32), is_causal=True)
    >>> out.shape, sorted(mha.parameters())
    ((3, 5, 8), ['in_proj_bias', 'in_proj_weight', 'out_proj.bias', 'out_proj.weight'])
    """

    def __init__(self, embed_dim, num_heads, bias=True, batch_first=True, *, rng=None,
                 dtype=np.float32):
        super().__init__()
        if embed_dim % num_heads:
            raise ReplicateError(f"MultiheadAttention: embed_dim {embed_dim} is not divisible "
                                 f"by num_heads {num_heads}")
        self.embed_dim, self.num_heads, self.batch_first = embed_dim, num_heads, batch_first
        self.in_proj_weight = Variable(init.glorot_uniform((embed_dim, 3 * embed_dim), rng=rng,
                                                           dtype=dtype))
        self.in_proj_bias = Variable(np.zeros(3 * embed_dim, dtype)) if bias else None
        # PyTorch's: the out-projection a default Linear's weight, every bias zero
        self.out_proj = Linear(embed_dim, embed_dim, bias, bias_fn=init.zeros, rng=rng,
                               dtype=dtype)

    def _project(self, x, part):
        e = self.embed_dim
        w = self.in_proj_weight.read()[:, part * e:(part + 1) * e]
        y = rnp.matmul(x, w)
        if self.in_proj_bias is not None:
            y = y + self.in_proj_bias.read()[part * e:(part + 1) * e]
        return y

    def _heads(self, x):
        b, t, _ = x.shape
        x = rnp.reshape(x, (b, t, self.num_heads, self.embed_dim // self.num_heads))
        return rnp.transpose(x, (0, 2, 1, 3))

    def _mask(self, attn_mask, batch):
        mask = rnp.as_array(attn_mask)
        if mask.dtype == np.bool_:
            mask = rnp.logical_not(mask)  # this module's True = masked; sdpa's True = attend
        if mask.ndim == 3:
            if mask.shape[0] != batch * self.num_heads:
                raise ReplicateError(f"MultiheadAttention: a 3-D attn_mask is (B * num_heads, "
                                     f"L, S), got {mask.shape} for B={batch}")
            mask = rnp.reshape(mask, (batch, self.num_heads) + mask.shape[1:])
        elif mask.ndim != 2:
            raise ReplicateError(f"MultiheadAttention: attn_mask is (L, S) or "
                                 f"(B * num_heads, L, S), got {mask.shape}")
        return mask

    def forward(self, query, key=None, value=None, attn_mask=None, is_causal=False):
        query = rnp.as_array(query)
        key = query if key is None else rnp.as_array(key)
        value = key if value is None else rnp.as_array(value)
        unbatched = query.ndim == 2
        if unbatched:
            query, key, value = (rnp.expand_dims(t, 0) for t in (query, key, value))
        elif not self.batch_first:
            query, key, value = (rnp.swapaxes(t, 0, 1) for t in (query, key, value))
        if query.ndim != 3 or query.shape[-1] != self.embed_dim:
            raise ReplicateError(f"MultiheadAttention({self.embed_dim}): got input "
                                 f"{query.shape}")
        if key is query and value is query:  # self-attention: one packed projection
            qkv = rnp.matmul(query, self.in_proj_weight.read())
            if self.in_proj_bias is not None:
                qkv = qkv + self.in_proj_bias.read()
            q, k, v = rnp.split(qkv, 3, axis=-1)
        else:
            q, k, v = (self._project(t, i) for i, t in enumerate((query, key, value)))
        mask = None if attn_mask is None else self._mask(attn_mask, query.shape[0])
        if is_causal and mask is not None:
            causal = causal_keep(q.shape[1], k.shape[1])
            mask = (rnp.logical_and(mask, causal) if mask.dtype == np.bool_
                    else rnp.where(causal, mask, -np.inf))
            is_causal = False
        out = scaled_dot_product_attention(self._heads(q), self._heads(k), self._heads(v),
                                           mask, is_causal)
        b, _, t, _ = out.shape
        out = self.out_proj(rnp.reshape(rnp.transpose(out, (0, 2, 1, 3)), (b, t, self.embed_dim)))
        if unbatched:
            out = rnp.squeeze(out, 0)
        elif not self.batch_first:
            out = rnp.swapaxes(out, 0, 1)
        return out, None
