"""The transfer rewrite: one logical device's part of a model-parallel step.

Every process of a replica traced the whole step (every device's ops, in ``pipeline_order``);
process d keeps what runs on device d, with what crosses devices made concrete:

* a ``transfer`` from d becomes ``send`` (to the process of its destination), one to d becomes
  ``recv``; others are dropped. The ``recv`` is kept even where its value is not used: the
  peer sends it anyway;
* nodes placed on d are kept, floating nodes (made from Variables and constants only) where d
  needs them;
* the step's results and Variable updates leave every process: at the end of the step d sends
  what it made to every other device of the replica, then receives what they made — so every
  process ends the step holding every result and every Variable's new value (the next step, a
  checkpoint, a ``v.numpy()`` read the same values everywhere). An update is sent once (the
  replicas' updates are one value after the gradient exchange: ``merge_updates`` checks it on
  the device that makes it).

The point-to-point operations form one chain (each takes the previous one's result as an
extra operand) in the order of the whole step, so a pass that reorders nodes cannot reorder
them: with non-blocking sends, every device receiving in that one global order cannot
deadlock.
"""

from __future__ import annotations

from ..core import Graph, bind
from ..primitives import REGISTRY
from ..rebuild import Rebuilder
from .pipeline import device_of


def split_devices(graph: Graph, device: int, m: int, comm: str | None = None) -> Graph:
    """The part of ``graph`` (the whole step, every node placed) that logical device ``device``
    of ``m`` runs; ``comm``: the label of the communicator of the replica's processes (its
    ranks are the devices)."""
    meta = graph.meta
    K, nr = meta.replicas, meta.num_results
    owner = {o.id: device_of(graph, o) for o in graph.outputs}
    live = {o.id for o in graph.outputs if owner[o.id] in (None, device)}
    kept = set()
    for node in reversed(graph.nodes):
        spec = REGISTRY[node.prim]
        placed = None if node.placed is None else node.placed.device
        if node.prim == "transfer":
            if node.attrs["src"] == device:
                live.add(node.inputs[0].id)
            if device in (node.attrs["src"], node.attrs["dst"]):
                kept.add(id(node))
            continue
        if placed == device or placed is None and (node.out.id in live or spec.effect):
            kept.add(id(node))
            live.update(x.id for x in node.inputs)

    rb = Rebuilder(graph)
    chain = [None]  # the last point-to-point op

    def p2p(prim, *args, **attrs):
        out = bind(prim, *args, *([chain[0]] if chain[0] is not None else []), comm=comm,
                   **attrs)
        chain[0] = out
        return out

    def tagged(where, emit):
        start = len(rb.trace.nodes)
        out = emit()
        for new in rb.trace.nodes[start:]:
            new.where = where
        return out

    with rb:
        for node in graph.nodes:
            if id(node) not in kept:
                continue
            if node.prim != "transfer":
                rb.copy(node)
                continue
            src, dst = node.attrs["src"], node.attrs["dst"]
            if src == device:
                p2p("send", rb.get(node.inputs[0]), dst=dst)
            else:
                x = node.inputs[0]
                rb.subst[node.out.id] = p2p("recv", src=src, shape=x.shape, dtype=x.dtype)
            rb.trace.nodes[-1].where = node.where
        # every result and (once) every update, everywhere: this device sends what it made,
        # then receives the rest (sends do not block, so no device waits for another's turn)
        ends = [x for x in graph.outputs[:nr * K]] + \
            [graph.outputs[nr * K + v * K] for v in range(len(meta.updated))]
        for x in ends:
            if owner[x.id] == device:
                value = rb.get(x)
                for d in range(m):
                    if d != device:
                        tagged(x.node and x.node.where, lambda: p2p("send", value, dst=d))
        received = {}
        for x in ends:
            if owner[x.id] not in (None, device):
                received[x.id] = tagged(x.node and x.node.where, lambda: p2p(
                    "recv", src=owner[x.id], shape=x.shape, dtype=x.dtype))
        outputs = [received[x.id] if x.id in received else rb.get(x)
                   for x in graph.outputs[:nr * K]]
        for v in range(len(meta.updated)):
            block = graph.outputs[nr * K + v * K: nr * K + (v + 1) * K]
            if block[0].id in received:
                outputs.extend([received[block[0].id]] * K)
            else:
                outputs.extend(rb.get(x) for x in block)
    return rb.finish(outputs)


__all__ = ["split_devices"]
