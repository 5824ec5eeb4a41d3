"""float16 and bfloat16 arithmetic in float32, for a backend whose kernels lack them (NumPy).

Every node that computes (not one that only moves data: reshape, transpose, getitem, ...) with a
float16 or bfloat16 operand or result is rewritten into casts of those operands to float32, the
op in float32, and one cast of the result back: each op rounds once, as in eager mode (the
reference table widens the same way) and as XLA does on a CPU. The casts are ordinary nodes, so
fusion folds them into the kernels around them.

>>> import numpy as np, replicate as rp, replicate.numpy as rnp, replicate.dtypes as dt
>>> f = rp.function(lambda x: rnp.exp(x).sum())
>>> x = np.ones(4, dt.bfloat16)
>>> float(f(x)), f(x).dtype
(10.875, dtype(bfloat16))
"""

from __future__ import annotations

import numpy as np

from ...dtypes import LOW_PRECISION
from ..aval import AVal
from ..core import Array, Graph, Node, bind
from ..primitives import REGISTRY
from ..rebuild import Rebuilder
from ..reference import uniform_bits

F32 = np.dtype(np.float32)


def _low(aval) -> bool:
    return aval.dtype in LOW_PRECISION


def widen(graph: Graph) -> Graph:
    todo = [n for n in graph.nodes if not REGISTRY[n.prim].moves and not REGISTRY[n.prim].host
            and n.prim != "fused" and (_low(n.out.aval) or any(_low(i.aval) for i in n.inputs))]
    if not todo:
        return graph
    todo = {id(n) for n in todo}
    rb = Rebuilder(graph)
    casts: dict = {}  # id of a low-precision value -> its float32 cast (one per value)

    def widened(x):
        if x.id not in casts:
            casts[x.id] = bind("cast", x, dtype=F32)
        return casts[x.id]

    with rb:
        for node in graph.nodes:
            if id(node) not in todo:
                rb.copy(node)
                continue
            inputs = [rb.get(i) for i in node.inputs]
            inputs = [widened(x) if _low(x.aval) else x for x in inputs]
            wide = _wide_attrs(node)
            out_aval = AVal(node.out.aval.shape, F32) if _low(node.out.aval) else node.out.aval
            new = Node(node.prim, tuple(inputs), wide, node.where)
            out = Array(out_aval, node=new, trace=rb.trace)
            new.out = out
            rb.trace.record(new)
            if out_aval is not node.out.aval:
                out = bind("cast", out, dtype=node.out.aval.dtype)
                out.node.where = node.where
            rb.subst[node.out.id] = out
    return rb.finish()


def _wide_attrs(node):
    """The node's attributes with a float16/bfloat16 ``dtype`` attribute (random draws) made
    float32 — a uniform keeping its dtype's random bits (``bits``: in float32 they round to no
    value at 1.0 again, outside its ``[0, 1)``)."""
    dtype = node.attrs.get("dtype")
    if dtype is not None and np.dtype(dtype) in LOW_PRECISION:
        wide = {**node.attrs, "dtype": F32}
        if node.prim == "random_uniform":
            wide["bits"] = uniform_bits(dtype)
        return wide
    return node.attrs
