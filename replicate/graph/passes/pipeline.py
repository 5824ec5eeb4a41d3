"""Model parallelism on the whole traced step, before it is split by device.

The step of one replica was traced K = k·M times (k local replicas, M micro-batches each) with
every node placed on a logical device (``graph/devices.py``). Here, while every replica's and
every device's subgraph still exists:

* ``check_placement``: the traced replicas agree where things run — the n-th transfer of each
  (source, destination, shape), each collective's device, each result's and update's device —
  or ``CollectiveMismatchError`` names the lines; a parameter (a Variable the step differentiates
  and updates) is read only on the device that updates it, or ``PlacementError`` names both
  lines (other Variables — a loss scale, the step counter — may be read anywhere: a Variable
  updated on one device and read on another gets its update sent there);
* ``homes``: the Variables that live on one device (updated there, read nowhere else: a
  parameter, its optimiser state), which ``split_devices`` keeps there;
* ``pipeline_order`` (after the collective rewrite): the GPipe schedule — the forward pass of
  every micro-batch, then their backward passes (last micro-batch first), then what needs them
  all (the gradient exchange, the update) — as one order of the whole graph, which every
  device's part keeps;
* ``placement_schedule``: the transfers and collectives of a replica, with their devices and
  lines, which the processes compare before anything is exchanged;
* ``describe_pipeline``: the schedule of each device in one line (``F0 F1 B1 B0 U``).
"""

from __future__ import annotations

from ...errors import CollectiveMismatchError, PlacementError, source_line
from ..core import Graph
from ..primitives import REGISTRY

_PER_REPLICA = ("seq", "replica", "num_replicas")


def device_of(graph: Graph, x) -> int | None:
    """Where ``x`` is made: its node's device; a batch input lives on device 0, a Variable (and
    a constant or a value made from them only) on every device (None)."""
    if x.node is not None:
        return None if x.node.placed is None else x.node.placed.device
    return 0 if x.id in batch_ids(graph) else None


def batch_ids(graph: Graph) -> set:
    return {x.id for x in graph.inputs[:len(graph.inputs) - len(graph.meta.variables)]}


def _line(node) -> str:
    return source_line(node.where) if node is not None and node.where else "<unknown line>"


def _who(r: int, micro: int) -> str:
    return f"local replica {r}" if micro == 1 else \
        f"local replica {r // micro} micro-batch {r % micro}"


def _per_replica(graph: Graph, K: int) -> list[list]:
    """Per traced replica, its placement in order: (what, node) for every transfer and
    collective, then the device of every result leaf and of every update."""
    rows: list[list] = [[] for _ in range(K)]
    for node in graph.nodes:
        spec = REGISTRY[node.prim]
        if node.placed is None or not (node.prim == "transfer" or spec.placeholder):
            continue
        aval = node.inputs[0].aval
        if node.prim == "transfer":
            what = f"transfer from device {node.attrs['src']} to {node.attrs['dst']} of {aval}"
        else:
            attrs = ", ".join(f"{k}={v!r}" for k, v in sorted(node.attrs.items())
                              if k not in _PER_REPLICA)
            what = f"{node.prim}({aval}{', ' if attrs else ''}{attrs}) on device " \
                   f"{node.placed.device}"
        rows[node.placed.replica].append((what, node))
    meta, nr = graph.meta, graph.meta.num_results
    for r in range(K):
        for i, x in enumerate(graph.outputs[r * nr:(r + 1) * nr]):
            rows[r].append((f"result {i} on device {device_of(graph, x)}", x.node))
    for v, var in enumerate(meta.updated):
        for r, x in enumerate(graph.outputs[nr * K + v * K: nr * K + (v + 1) * K]):
            rows[r].append((f"the update of {var.name!r} on device {device_of(graph, x)}",
                            x.node))
    return rows


def check_placement(graph: Graph, micro: int = 1, parameters=frozenset()) -> list:
    """Raise unless the traced replicas agree on where everything runs and no parameter (a
    Variable the step differentiates and updates: ``parameters``, the ids of its graph inputs)
    is read on two devices; return replica 0's placement (``(what, node)`` in order)."""
    K = graph.meta.replicas
    rows = _per_replica(graph, K)
    for r in range(1, K):
        for i in range(max(len(rows[0]), len(rows[r]))):
            a = rows[0][i] if i < len(rows[0]) else ("nothing", None)
            b = rows[r][i] if i < len(rows[r]) else ("nothing", None)
            if a[0] != b[0]:
                raise CollectiveMismatchError(
                    f"the replicas disagree about the placement of the step (item #{i}):\n"
                    f"  {_who(0, micro)}: {a[0]} at {_line(a[1])}\n"
                    f"  {_who(r, micro)}: {b[0]} at {_line(b[1])}\n"
                    "Every replica (and micro-batch) must place the same ops on the same logical "
                    "devices: choose the device with a number that is the same for all, not "
                    "with rp.replica_id().")
    _check_variables(graph, K, parameters)
    return rows[0]


def readers(graph: Graph) -> tuple[dict, dict]:
    """Which devices read each value: ``({value id: devices}, {(value id, device): the first
    node, in program order, that reads it there})``. A placed node reads its inputs on its
    device (a transfer on its source's); a floating node on every device that needs its value
    (an effect or a result that floats: every device)."""
    need: dict[int, set] = {}
    reader: dict[tuple, object] = {}
    everywhere = {d for n in graph.nodes if n.placed is not None and n.placed.device is not None
                  for d in [n.placed.device]}
    for o in graph.outputs:
        if device_of(graph, o) is None:
            need.setdefault(o.id, set()).update(everywhere)
    for node in reversed(graph.nodes):
        placed = node.placed.device if node.placed is not None else None
        if node.prim == "transfer":
            devices = {node.attrs["src"]}
        elif placed is not None:
            devices = {placed}
        else:
            devices = need.get(node.out.id, set()) | (everywhere if REGISTRY[node.prim].effect
                                                      else set())
        for x in node.inputs:
            need.setdefault(x.id, set()).update(devices)
            for d in devices:  # (walking backwards: the last one written is the first read)
                reader[(x.id, d)] = node
    return need, reader


def _variable_inputs(graph: Graph) -> dict:
    """{id(Variable): the graph input that reads it}."""
    meta = graph.meta
    var_inputs = graph.inputs[len(graph.inputs) - len(meta.variables):]
    return {id(var): x for var, x in zip(meta.variables, var_inputs)}


def homes(graph: Graph, K: int) -> dict:
    """``{id(Variable): device}`` for each Variable that lives on one device: updated there
    (not floating) and read nowhere else — a parameter, its optimiser state. Its value is needed
    only there, so its update is not sent to the other devices (``split_devices``)."""
    meta, nr = graph.meta, graph.meta.num_results
    need, _ = readers(graph)
    read_of = _variable_inputs(graph)
    out = {}
    for v, var in enumerate(meta.updated):
        owner = device_of(graph, graph.outputs[nr * K + v * K])
        x = read_of.get(id(var))
        if owner is not None and (x is None or need.get(x.id, set()) <= {owner}):
            out[id(var)] = owner
    return out


def _check_variables(graph: Graph, K: int, parameters) -> None:
    meta, nr = graph.meta, graph.meta.num_results
    need, reader = readers(graph)
    read_of = _variable_inputs(graph)
    for v, var in enumerate(meta.updated):
        update = graph.outputs[nr * K + v * K]
        owner = device_of(graph, update)
        x = read_of.get(id(var))
        if owner is None or x is None or x.id not in parameters:
            continue
        others = sorted(need.get(x.id, set()) - {owner})
        if others:
            devices = sorted(need[x.id])
            reads = " and ".join(f"{d} (first at {_line(reader[(x.id, d)])})" for d in devices)
            raise PlacementError(
                f"parameter {var.name!r} is updated on logical device {owner} (at "
                f"{_line(update.node)}) and read on logical device{'s' * (len(devices) > 1)} "
                f"{reads}. A Variable the step differentiates and updates lives on one logical "
                "device: the ops that read it, its gradient and its update run there. Put every "
                "op that reads it under the same rp.logical_device(i) (weights tied across "
                "devices are not supported).")


def placement_schedule(rows: list) -> list:
    """``check_placement``'s rows as ``(text, line)``: what every process must agree on."""
    return [(what, _line(node)) for what, node in rows]


def _key(node, micro: int) -> tuple:
    placed = node.placed
    if placed is None:
        return (0, 0, 0)
    j = placed.replica % micro
    return (1, micro - 1 - j, 0) if placed.backward else (0, j, 0)


def pipeline_order(graph: Graph, micro: int) -> Graph:
    """The GPipe order: nodes sorted by (phase, micro-batch), each no earlier than its inputs.

    Run after the collective rewrite. A node's key is the largest of its own (forward of
    micro-batch j: ``(0, j, 0)``; backward: ``(1, M-1-j, 0)``) and its inputs' keys; the
    in-process combine of the replicas' values (``local_reduce``) is one level above its
    operands, so it follows every micro-batch's backward pass. Sorting by (key, position) is a
    valid order since no node's key is below its inputs' (a transfer sorts right after the node
    whose value it moves, so a device sends as soon as it has the value)."""
    index = {id(n): i for i, n in enumerate(graph.nodes)}
    key: dict[int, tuple] = {}
    for node in graph.nodes:
        top = max([_key(node, micro)] + [key[x.id] for x in node.inputs if x.id in key])
        key[node.out.id] = top[:2] + (top[2] + 1,) if node.prim == "local_reduce" else top

    def position(n):
        source = n.inputs[0].node if n.prim == "transfer" else None
        return index[id(n)] if id(source) not in index else index[id(source)] + 0.5

    nodes = sorted(graph.nodes, key=lambda n: (key[n.out.id], position(n)))
    return Graph(graph.inputs, nodes, graph.outputs, graph.meta.copy())


def describe_pipeline(graph: Graph, m: int, micro: int) -> str:
    """Each device's schedule in one line, in ``pipeline_order``: ``F<j>``/``B<j>`` for the
    forward/backward ops of micro-batch j, ``U`` for the forward ops that need gradients (the
    gradient exchange and the update)."""
    after: set = set()  # values made from gradients
    for node in graph.nodes:
        if node.placed is not None and node.placed.backward or \
                any(x.id in after for x in node.inputs):
            after.add(node.out.id)
    lines = []
    for d in range(m):
        runs: list[str] = []
        for node in graph.nodes:
            placed = node.placed
            if placed is None or placed.device != d or node.prim == "transfer":
                continue
            j = placed.replica % micro
            label = f"B{j}" if placed.backward else \
                "U" if any(x.id in after for x in node.inputs) else f"F{j}"
            if not runs or runs[-1] != label:
                runs.append(label)
        lines.append(f"device {d}: {' '.join(runs)}")
    return "\n".join(lines)


__all__ = ["batch_ids", "check_placement", "describe_pipeline", "device_of", "homes",
           "pipeline_order", "placement_schedule", "readers"]
