"""The transfer rewrite: one logical device's part of a model-parallel step.

Every process of a replica traced the whole step (every device's ops, in ``pipeline_order``);
process d keeps what runs on device d, with what crosses devices made concrete:

* a ``transfer`` from d becomes ``send`` (to the process of its destination), one to d becomes
  ``recv``; others are dropped. The ``recv`` is kept even where its value is not used: the
  peer sends it anyway;
* nodes placed on d are kept, floating nodes (made from Variables and constants only) where d
  needs them;
* a Variable that lives on one device (``pipeline.homes``: updated there, read nowhere else —
  a parameter and its optimiser state) stays there: its update is an output of that device's
  part only, and the other devices' parts neither read it (its input is removed: they are not
  fed its value) nor receive its update (``meta.fed``: the Variables fed, ``meta.homes``:
  ``(Variable, device)`` of those that live on one device; ``runtime/variables/owners.py`` keeps
  their values where they live);
* the step's results, and the updates of the other Variables made on one device but read on
  others (a loss scale), leave every process: at the end of the step d sends what it made to
  every other device of the replica, then receives what they made — so every process ends the
  step holding every result. An update is sent once (the replicas' updates are one value after
  the gradient exchange: ``merge_updates`` checks it on the device that makes it).

The point-to-point operations form one chain (each takes the previous one's result as an
extra operand) in the order of the whole step, so a pass that reorders nodes cannot reorder
them: with non-blocking sends, every device receiving in that one global order cannot
deadlock.
"""

from __future__ import annotations

from ..core import Graph, bind
from ..primitives import REGISTRY
from ..rebuild import Rebuilder
from .pipeline import device_of, homes


def split_devices(graph: Graph, device: int, m: int, comm: str | None = None) -> Graph:
    """The part of ``graph`` (the whole step, every node placed) that logical device ``device``
    of ``m`` runs; ``comm``: the label of the communicator of the replica's processes (its
    ranks are the devices)."""
    meta = graph.meta
    K, nr = meta.replicas, meta.num_results
    owner = {o.id: device_of(graph, o) for o in graph.outputs}
    home = homes(graph, K)
    mine = [home.get(id(v), device) == device for v in meta.updated]  # updates made here
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
            [graph.outputs[nr * K + v * K] for v, var in enumerate(meta.updated)
             if id(var) not in home]
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
            if not mine[v]:
                continue
            if block[0].id in received:
                outputs.extend([received[block[0].id]] * K)
            else:
                outputs.extend(rb.get(x) for x in block)
    part = rb.finish(outputs)
    return _without_inputs(part, graph, home, device, mine)


def _without_inputs(part: Graph, graph: Graph, home: dict, device: int, mine: list) -> Graph:
    """``part`` without the inputs of the Variables that live on other devices (nothing here
    reads them: ``homes`` found them read on their device only)."""
    meta = graph.meta
    first = len(graph.inputs) - len(meta.variables)
    elsewhere = {first + i for i, var in enumerate(meta.variables)
                 if home.get(id(var), device) != device}
    dropped = {x.id for i, x in enumerate(part.inputs) if i in elsewhere}
    for node in part.nodes:
        if any(x.id in dropped for x in node.inputs):  # (cannot happen: homes says so)
            raise AssertionError(f"split_devices: {node.prim} on device {device} reads a "
                                 "Variable that lives on another device")
    keep = [i for i in range(len(part.inputs)) if i not in elsewhere]
    names = part.meta.input_names
    fed = [var for var in meta.variables if home.get(id(var), device) == device]
    return Graph([part.inputs[i] for i in keep], part.nodes, part.outputs, part.meta.copy(
        input_names=None if names is None else [names[i] for i in keep], fed=fed,
        updated=[var for var, keep in zip(meta.updated, mine) if keep],
        homes=tuple((var, home[id(var)]) for var in
                    {id(v): v for v in meta.variables + meta.updated}.values() if id(var) in home)))


__all__ = ["split_devices"]
