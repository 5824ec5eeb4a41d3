"""Render a graph as text, one line per node (in the spirit of a jaxpr).

    { lambda x:f32[4,3] w:f32[3] .
        a:f32[4] = matmul x b
        ...
      in (c) }

A placeholder collective (``all_reduce`` & co. before the rewrite) prints as
``collective[kind='all_reduce' ...]``: it is not communication yet. With logical devices a node
placed on device d prints as ``matmul@d``.
"""

from __future__ import annotations

import numpy as np

from .primitives import REGISTRY, shown_attrs


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


def format_graph(graph, indent: str = "", gen=None, names=None) -> str:
    gen = gen or _names()
    names = {} if names is None else names

    def name(a):
        if a.id not in names:
            names[a.id] = next(gen)
        return names[a.id]

    def typed(a):
        return f"{name(a)}:{a.aval}"

    lines = [indent + "{ lambda " + " ".join(typed(x) for x in graph.inputs) + " ."]
    for node in graph.nodes:
        attrs = {k: v for k, v in shown_attrs(node.attrs).items() if k != "body"}
        prim = node.prim
        spec = REGISTRY.get(prim)
        if spec is not None and spec.placeholder:  # not communication yet: say so
            attrs, prim = {"kind": prim, **attrs}, "collective"
        device = getattr(node.placed, "device", None)
        if device is not None and node.prim != "transfer":  # model parallelism: where it runs
            prim = f"{prim}@{device}"
        text = ""
        if attrs:
            text = "[" + " ".join(f"{k}={_fmt_attr(v)}" for k, v in attrs.items()) + "]"
        args = " ".join(name(i) for i in node.inputs)
        lines.append(f"{indent}    {typed(node.out)} = {prim}{text} {args}".rstrip())
        if "body" in node.attrs:  # a fused group: its body, indented below it
            lines.append(format_graph(node.attrs["body"].graph, indent + "      ", gen, names))
    lines.append(indent + "  in (" + ", ".join(name(o) for o in graph.outputs) + ") }")
    return "\n".join(lines)
