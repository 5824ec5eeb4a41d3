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
from ..dtypes import is_supported
from ..errors import DTypeError, ReplicateError, user_frame
from ..interop import from_foreign, is_foreign
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
        self._var_where: dict[tuple, tuple] = {}  # (replica, id(var)) -> the assign's line
        self.varying: set[int] = set()  # ids of values that differ per replica by construction
        self.dependents: dict[int, object] = {}  # objects whose Python state the trace read
        self._lifted: dict[int, tuple] = {}
        self.replica = 0
        self.replicas = 1  # local replicas traced into this trace (trace_step sets it)
        self._var_read: dict[tuple, Array] = {}  # (replica, id(var)) -> a per-replica read
        self._var_by_id: dict[int, object] = {}
        self._collective_seq: dict[int, int] = {}
        self.placement = None  # model parallelism: a ``graph.devices.Placement``

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
            if getattr(var, "per_replica", False):  # input (k, ...): replica r reads row r
                var.bind_replicas(self.replicas)
            shape = var.held.shape if getattr(var, "per_replica", False) else var.shape
            aval = AVal(tuple(shape), var.dtype)  # (not .value: another device may hold it)
            self._var_input[id(var)] = self.new_input(aval, var.name)
            self._var_by_id[id(var)] = var
            self.variables.append(var)

    def read_variable(self, var) -> Array:
        self._touch(var)
        return self.variable_value(id(var))

    def _initial(self, vid: int) -> Array:
        """What the current replica reads of a variable it has not written yet."""
        x = self._var_input[vid]
        if not getattr(self._var_by_id[vid], "per_replica", False):
            return x
        key = (self.replica, vid)
        if key not in self._var_read:
            self._var_read[key] = x[self.replica]
        return self._var_read[key]

    def write_variable(self, var, value: Array) -> None:
        self._touch(var)
        self._var_current[(self.replica, id(var))] = self.lift(value)
        self._var_where[(self.replica, id(var))] = user_frame()

    def write_location(self, var, replica: int):
        """Where replica ``replica`` last assigned ``var`` (file, line), or None."""
        return self._var_where.get((replica, id(var)))

    # -- traced control flow: the current replica's variable writes as a unit ---------------
    def branch_state(self) -> dict:
        """The current replica's variable writes so far ({id(var): (value, where)})."""
        r = self.replica
        return {vid: (value, self._var_where.get((r, vid)))
                for (rep, vid), value in self._var_current.items() if rep == r}

    def set_branch_state(self, writes: dict) -> None:
        """Make ``writes`` (from ``branch_state``) the current replica's writes."""
        r = self.replica
        for key in [key for key in self._var_current if key[0] == r]:
            del self._var_current[key]
            self._var_where.pop(key, None)
        for vid, (value, where) in writes.items():
            self._var_current[(r, vid)] = value
            if where is not None:
                self._var_where[(r, vid)] = where

    def variable_value(self, vid: int) -> Array:
        """The current replica's value of the variable with id ``vid`` (written or read)."""
        current = self._var_current.get((self.replica, vid))
        return current if current is not None else self._initial(vid)

    # -- what else the trace depends on ------------------------------------------------------
    def mark_varying(self, x: Array) -> None:
        """``x`` differs per replica although it comes from no batch (a replica-folded key)."""
        self.varying.add(x.id)

    def depends_on(self, obj) -> None:
        """The trace read Python-level state of ``obj`` (a module's train/eval flag, an
        optimiser's learning rate): the compiled step is reused only while it is unchanged."""
        self.dependents.setdefault(id(obj), obj)

    def variable_input(self, var) -> Array:
        return self._var_input[id(var)]

    def writes(self, var, replicas: int) -> list:
        """The final value each of ``replicas`` replicas wrote into ``var`` (None: no write)."""
        return [self._var_current.get((r, id(var))) for r in range(replicas)]

    def replica_values(self, var) -> list:
        """Each replica's final value of per-replica ``var`` (what it wrote, else what it
        read)."""
        out, current = [], self.replica
        for r in range(self.replicas):
            self.replica = r
            out.append(self.variable_value(id(var)))
        self.replica = current
        return out


@contextlib.contextmanager
def active(trace: Trace):
    previous = set_trace(trace)
    try:
        yield trace
    finally:
        set_trace(previous)


def signature(args) -> tuple:
    """The cache key of a call: nest structure plus (shape, dtype) of each leaf."""
    return signature_of(*tree.flatten(args))


def signature_of(leaves, treedef) -> tuple:
    """``signature`` of a nest already flattened (``tree.flatten``)."""
    return treedef, tuple(_leaf_key(x) for x in leaves)


def _leaf_key(x):
    if isinstance(x, (str, bytes)):
        return ("static", x)
    value = _described(x)
    if value is None:
        value = from_foreign(x) if is_foreign(x) else np.asarray(
            x.numpy() if hasattr(x, "numpy") else x)
    if not is_supported(value.dtype):  # complex, objects, strings, records, dates
        raise DTypeError(f"cannot pass {type(x).__name__} of dtype {value.dtype} into a "
                         "traced function: the dtypes are bool, integers and floats")
    return (tuple(value.shape), value.dtype.str)


def _described(x):
    """A foreign array's shape and dtype, read without copying its values (a device array's
    would come through the host), or None when it does not say them in NumPy's terms."""
    if not is_foreign(x):
        return None
    try:
        return AVal(tuple(int(n) for n in x.shape), np.dtype(x.dtype))
    except (AttributeError, TypeError):  # a PyTorch dtype is not a NumPy one
        return None


def trace_inputs(trace: Trace, args, prefix="arg"):
    """Create graph inputs for the array leaves of ``args``; return the traced nest."""
    leaves, treedef = tree.flatten(args)
    traced = []
    for i, x in enumerate(leaves):
        if isinstance(x, (str, bytes)):
            traced.append(x)
            continue
        if is_foreign(x):  # a JAX, PyTorch, CuPy array (its shape and dtype: no copy)
            x = _described(x) or from_foreign(x)
        if hasattr(x, "shape") and hasattr(x, "dtype"):  # no value needed (nor read)
            aval = AVal(tuple(x.shape), np.dtype(x.dtype))
        else:
            value = np.asarray(x)
            aval = AVal(tuple(value.shape), value.dtype)
        traced.append(trace.new_input(aval, f"{prefix}{i}"))
    return tree.unflatten(treedef, traced)
