"""Graph mode: record a Python function as a ``Graph``.

A ``Trace`` collects the nodes created while it is active. Concrete arrays and Python numbers that
meet traced values become ``const`` nodes; variables become graph inputs on first read and graph
outputs on assignment. One trace can hold several replicas' subgraphs (the Replicator traces
``step_fn`` once per local replica into the same trace); variable updates are kept per replica.
"""

from __future__ import annotations

import contextlib

import numpy as np

from .. import tree
from ..errors import ReplicateError
from .aval import AVal
from .core import Array, Node, set_trace


class Trace:
    def __init__(self):
        self.nodes: list[Node] = []
        self.inputs: list[Array] = []
        self.input_names: list[str] = []
        self.variables: list = []  # variables read or written, in first-touch order
        self._var_input: dict[int, Array] = {}
        self._var_current: dict[tuple, Array] = {}  # (replica, id(var)) -> latest value
        self._lifted: dict[int, tuple] = {}
        self.replica = 0
        self._collective_seq: dict[int, int] = {}

    def next_collective_seq(self) -> int:
        """The index of the next collective this replica records (matched across replicas)."""
        n = self._collective_seq.get(self.replica, 0)
        self._collective_seq[self.replica] = n + 1
        return n

    # -- building --------------------------------------------------------------------------
    def new_input(self, aval: AVal, name: str) -> Array:
        x = Array(aval, trace=self)
        self.inputs.append(x)
        self.input_names.append(name)
        return x

    def record(self, node: Node) -> None:
        self.nodes.append(node)

    def lift(self, x: Array) -> Array:
        """Bring a value into this trace: concrete arrays become ``const`` nodes."""
        if x.trace is self:
            return x
        if x.symbolic:
            raise ReplicateError("a traced value from another trace leaked into this one; "
                                 "pass it in as an argument instead")
        hit = self._lifted.get(x.id)
        if hit is not None:
            return hit[1]
        node = Node("const", (), {"value": x.value})
        out = Array(x.aval, node=node, trace=self)
        node.out = out
        self.nodes.append(node)
        self._lifted[x.id] = (x, out)  # keep x alive so its id is not reused
        return out

    # -- variables ---------------------------------------------------------------------------
    def _touch(self, var):
        if id(var) not in self._var_input:
            aval = AVal(tuple(var.value.shape), var.value.dtype)
            self._var_input[id(var)] = self.new_input(aval, var.name)
            self.variables.append(var)

    def read_variable(self, var) -> Array:
        self._touch(var)
        return self._var_current.get((self.replica, id(var)), self._var_input[id(var)])

    def write_variable(self, var, value: Array) -> None:
        self._touch(var)
        self._var_current[(self.replica, id(var))] = self.lift(value)

    def variable_input(self, var) -> Array:
        return self._var_input[id(var)]

    def writes(self, var, replicas: int) -> list:
        """The final value each of ``replicas`` replicas wrote into ``var`` (None: no write)."""
        return [self._var_current.get((r, id(var))) for r in range(replicas)]


@contextlib.contextmanager
def active(trace: Trace):
    previous = set_trace(trace)
    try:
        yield trace
    finally:
        set_trace(previous)


def signature(args) -> tuple:
    """The cache key of a call: nest structure plus (shape, dtype) of each leaf."""
    leaves, treedef = tree.flatten(args)
    return treedef, tuple(_leaf_key(x) for x in leaves)


def _leaf_key(x):
    if isinstance(x, (str, bytes)):
        return ("static", x)
    value = np.asarray(x.numpy() if hasattr(x, "numpy") else x)
    if value.dtype.kind in "cOUSVMm":  # complex, objects, strings, records, dates
        raise ReplicateError(f"cannot pass {type(x).__name__} of dtype {value.dtype} into a "
                             "traced function: the dtypes are bool, integers and floats")
    return (tuple(value.shape), value.dtype.str)


def trace_inputs(trace: Trace, args, prefix="arg"):
    """Create graph inputs for the array leaves of ``args``; return the traced nest."""
    leaves, treedef = tree.flatten(args)
    traced = []
    for i, x in enumerate(leaves):
        if isinstance(x, (str, bytes)):
            traced.append(x)
            continue
        value = np.asarray(x.numpy() if hasattr(x, "numpy") else x)
        traced.append(trace.new_input(AVal(tuple(value.shape), value.dtype), f"{prefix}{i}"))
    return tree.unflatten(treedef, traced)
