"""Render a graph as text, one line per node (in the spirit of a jaxpr).

    { lambda x:f32[4,3] w:f32[3] .
        a:f32[4] = matmul x b
        ...
      in (c) }
"""

from __future__ import annotations

import numpy as np


def _names():
    i = 0
    while True:
        n, s = i, ""
        while True:
            s = chr(ord("a") + n % 26) + s
            n = n // 26 - 1
            if n < 0:
                break
        yield s
        i += 1


def _fmt_attr(v) -> str:
    if isinstance(v, np.ndarray):
        if v.size <= 4:
            return np.array2string(v, precision=4, separator=",").replace("\n", "")
        return f"<{v.dtype}{list(v.shape)}>"
    if isinstance(v, np.dtype):
        return v.name
    return repr(v)


def format_graph(graph) -> str:
    gen, names = _names(), {}

    def name(a):
        if a.id not in names:
            names[a.id] = next(gen)
        return names[a.id]

    def typed(a):
        return f"{name(a)}:{a.aval}"

    lines = ["{ lambda " + " ".join(typed(x) for x in graph.inputs) + " ."]
    for node in graph.nodes:
        attrs = {k: v for k, v in node.attrs.items()}
        text = ""
        if attrs:
            text = "[" + " ".join(f"{k}={_fmt_attr(v)}" for k, v in attrs.items()) + "]"
        args = " ".join(name(i) for i in node.inputs)
        lines.append(f"    {typed(node.out)} = {node.prim}{text} {args}".rstrip())
    lines.append("  in (" + ", ".join(name(o) for o in graph.outputs) + ") }")
    return "\n".join(lines)
