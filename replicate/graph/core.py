"""The IR: typed values (``Array``), nodes, graphs, and ``bind``, the one entry point of every op.

An ``Array`` is either *concrete* (eager mode: it holds a NumPy value) or *symbolic* (graph mode:
it belongs to a ``Trace`` and only has a shape and dtype). Either way ``array.node`` is the node
that produced it, so the same graph walk serves as the eager tape and as the traced program.
"""

from __future__ import annotations

import itertools
import threading
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import numpy as np

from ..errors import ReplicateError, TracerConversionError, source_line, user_frame


class AVal(NamedTuple):
    """Abstract value: what the IR knows about an array before it exists."""

    shape: tuple
    dtype: np.dtype

    def __str__(self) -> str:
        return f"{dtype_short(self.dtype)}[{','.join(map(str, self.shape))}]"


_SHORT = {"float16": "f16", "bfloat16": "bf16", "float32": "f32", "float64": "f64", "int8": "i8",
          "int32": "i32", "int64": "i64", "uint8": "u8", "uint32": "u32", "bool": "bool"}


def dtype_short(dtype) -> str:
    return _SHORT.get(np.dtype(dtype).name, np.dtype(dtype).name)


_ids = itertools.count()


class Node:
    """One primitive application: ``out = prim(*inputs, **attrs)``."""

    __slots__ = ("prim", "inputs", "attrs", "out", "where", "__weakref__")

    def __init__(self, prim: str, inputs: tuple, attrs: dict, where=None):
        self.prim = prim
        self.inputs = inputs
        self.attrs = attrs
        self.out: Array | None = None
        self.where = where  # (file, line) of the user's call, recorded in graph mode

    def __repr__(self) -> str:
        return f"Node({self.prim}, {len(self.inputs)} inputs)"


class Array:
    """The library's array type: concrete (eager) or symbolic (traced)."""

    __slots__ = ("aval", "node", "value", "trace", "id", "__weakref__")
    __array_priority__ = 100  # so ndarray <op> Array defers to Array's reflected operators

    def __init__(self, aval: AVal, node: Node | None = None, value=None, trace=None):
        self.aval = aval
        self.node = node
        self.value = value
        self.trace = trace
        self.id = next(_ids)

    # -- metadata ---------------------------------------------------------------------------
    @property
    def shape(self) -> tuple:
        return self.aval.shape

    @property
    def dtype(self) -> np.dtype:
        return self.aval.dtype

    @property
    def ndim(self) -> int:
        return len(self.aval.shape)

    @property
    def size(self) -> int:
        return int(np.prod(self.aval.shape, dtype=np.int64))

    @property
    def symbolic(self) -> bool:
        return self.value is None

    def __len__(self) -> int:
        if not self.shape:
            raise TypeError("len() of a 0-d array")
        return self.shape[0]

    def __repr__(self) -> str:
        if self.symbolic:
            return f"Array({self.aval}, traced)"
        return f"Array({np.array2string(self.value, precision=4)}, dtype={self.dtype})"

    def numpy(self) -> np.ndarray:
        """The concrete value (eager mode only)."""
        self._need_concrete("numpy()")
        return self.value

    # -- conversions that need a concrete value -----------------------------------------------
    def _need_concrete(self, what: str):
        if self.symbolic:
            loc = source_line(user_frame())
            raise TracerConversionError(
                f"{what} of a traced value at {loc}\n"
                f"  In graph mode (define-and-run) values are symbolic while the step is traced, "
                f"so Python cannot branch on them or convert them.\n"
                f"  Use rnp.where(cond, a, b) or rp.cond(pred, true_fn, false_fn, ...) for a "
                f"traced choice, or run this step in eager mode (mode='eager') for Python "
                f"control flow.")

    def __bool__(self):
        self._need_concrete("bool()")
        return bool(self.value)

    def __int__(self):
        self._need_concrete("int()")
        return int(self.value)

    def __float__(self):
        self._need_concrete("float()")
        return float(self.value)

    def __index__(self):
        self._need_concrete("use as a Python index")
        return int(self.value)

    def __array__(self, dtype=None, copy=None):
        self._need_concrete("conversion to a NumPy array")
        return self.value if dtype is None else self.value.astype(dtype)

    def item(self):
        self._need_concrete("item()")
        return self.value.item()

    def tolist(self):
        self._need_concrete("tolist()")
        return self.value.tolist()

    def __hash__(self):
        return object.__hash__(self)

    def __iter__(self):
        for i in range(len(self)):
            yield self[i]


@dataclass
class Graph:
    """A traced program: inputs, nodes in execution order, outputs."""

    inputs: list
    nodes: list
    outputs: list
    meta: dict = field(default_factory=dict)

    def __str__(self) -> str:
        from .printer import format_graph

        return format_graph(self)


# ---------------------------------------------------------------------------------------------
# The active interpreter: a graph trace (record nodes) or none (eager: compute now).

_local = threading.local()


def current_trace():
    return getattr(_local, "trace", None)


def set_trace(trace):
    previous = current_trace()
    _local.trace = trace
    return previous


def concrete(value, dtype=None) -> Array:
    """Wrap a NumPy value as a concrete (eager) leaf array."""
    value = np.asarray(value, dtype=dtype)
    return Array(AVal(tuple(value.shape), value.dtype), value=value)


_tables: dict = {}


def _load_tables():
    from ..backends.numpy_impl import IMPL
    from .primitives import REGISTRY

    _tables.update(registry=REGISTRY, impl=IMPL)


def bind(prim: str, *inputs: Array, **attrs: Any) -> Array:
    """Apply a primitive: record a node in the active trace, or compute it now (eager)."""
    if not _tables:
        _load_tables()
    spec = _tables["registry"].get(prim)
    if spec is None:
        from .primitives import get

        spec = get(prim)  # raises MissingRuleError
    avals = [x.aval for x in inputs]
    try:
        aval = spec.shape_rule(*avals, **attrs)
    except ReplicateError:
        raise
    except Exception as e:  # a shape rule rejected its operands: report at the user's line
        loc = source_line(user_frame())
        shapes = ", ".join(str(a) for a in avals)
        raise ReplicateError(f"{prim}({shapes}) at {loc}: {e}") from None
    trace = getattr(_local, "trace", None)
    if trace is not None:
        inputs = tuple(trace.lift(x) for x in inputs)
        node = Node(prim, inputs, attrs, user_frame())
        out = Array(aval, node=node, trace=trace)
        node.out = out
        trace.record(node)
        return out
    values = [x.value for x in inputs]
    if any(v is None for v in values):
        raise ReplicateError(
            f"a traced value escaped its trace and was used at {source_line(user_frame())}; "
            "return it from the traced function instead")
    value = _tables["impl"][prim](*values, **attrs)
    if type(value) is not np.ndarray:
        value = np.asarray(value)
    if value.dtype != aval.dtype:
        value = value.astype(aval.dtype)
    node = Node(prim, tuple(inputs), attrs)
    out = Array(aval, node=node, value=value)
    node.out = out
    return out
