"""The IR: typed values (``Array``), nodes, graphs, and ``bind``, the one entry point of every op.

An ``Array`` is either *concrete* (eager mode: it holds a NumPy value) or *symbolic* (graph mode:
it belongs to a ``Trace`` and only has a shape and dtype). Either way ``array.node`` is the node
that produced it, so the same graph walk serves as the eager tape and as the traced program. (A
traced node also points at its output, ``node.out``; an eager one does not, so the tape holds no
reference cycle and reference counting frees each step's arrays as soon as they are dropped.)
"""

from __future__ import annotations

import dataclasses
import itertools
import math
import threading
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .. import habits as _habits
from .. import profile as _profile
from ..errors import (
    NumpyConversionError,
    ReplicateError,
    TracerConversionError,
    source_line,
    user_frame,
)
from .aval import AVal, dtype_short
from .primitives import REGISTRY, get
from .printer import format_graph
from .reference import IMPL

__all__ = ["AVal", "Array", "Graph", "GraphMeta", "Node", "bind", "concrete", "current_trace",
           "dtype_short", "next_id", "numpy_array_ufunc", "numpy_function_error",
           "register_op_namespace", "set_trace"]


_ids = itertools.count()


class Node:
    """One primitive application: ``out = prim(*inputs, **attrs)``."""

    __slots__ = ("prim", "inputs", "attrs", "out", "where", "placed", "__weakref__")

    def __init__(self, prim: str, inputs: tuple, attrs: dict, where=None, placed=None):
        self.prim = prim
        self.inputs = inputs
        self.attrs = attrs
        self.out: Array | None = None
        self.where = where  # (file, line) of the user's call, recorded in graph mode
        self.placed = placed  # model parallelism: its logical device (``graph/devices.py``)

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
        return math.prod(self.aval.shape)

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
    def _need_concrete(self, what: str, error=TracerConversionError,
                       why="so Python cannot branch on them or convert them",
                       advice="Use rnp.where(cond, a, b) or rp.cond(pred, true_fn, false_fn, ...) "
                              "for a traced choice, or run this step in eager mode "
                              "(mode='eager') for Python control flow"):
        if self.symbolic:
            loc = source_line(user_frame(skip_numpy=True))
            raise error(
                f"{what} of a traced value at {loc}\n"
                f"  In graph mode (define-and-run) values are symbolic while the step is traced, "
                f"{why}.\n  {advice}.")

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

    # -- NumPy: np.asarray(x) converts an eager value; NumPy functions on library values refuse --
    def __array__(self, dtype=None, copy=None):
        self._need_concrete(
            "conversion to a NumPy array", NumpyConversionError, f"and {_WHY}",
            "Compute with the rnp function of the same name (import replicate.numpy as rnp; "
            "rnp.where(cond, a, b) or rp.cond(...) for a traced choice) and return the value "
            "from the step to read it, or run this step in eager mode (mode='eager')")
        return self.value if dtype is None else self.value.astype(dtype)

    def __array_ufunc__(self, ufunc, method, *inputs, **kwargs):
        return numpy_array_ufunc(self, ufunc, method, inputs, kwargs)

    def __array_function__(self, func, types, args, kwargs):
        raise numpy_function_error(func, self)

    __getattr__ = _habits.answers(_habits.COMMON)  # (loss.backward(), x.to(device), ...)

    def __format__(self, spec: str) -> str:  # f"{x:.4f}": NumPy's formatting of the value
        return _habits.format_value(self.value, spec, self)

    def item(self):
        self._need_concrete("item()")
        return self.value.item()

    def tolist(self):
        self._need_concrete("tolist()")
        return self.value.tolist()

    # -- DLPack: the value, zero-copy, to np.from_dlpack, jax.dlpack, torch.from_dlpack ---------
    def __dlpack__(self, *, stream=None, max_version=None, dl_device=None, copy=None):
        """The Array API's DLPack export (a concrete value, in host memory: ``stream`` must be
        None); the keywords as NumPy takes them."""
        self._need_concrete("DLPack export")
        given = {"stream": stream, "max_version": max_version, "dl_device": dl_device,
                 "copy": copy}
        return np.asarray(self.value).__dlpack__(
            **{k: v for k, v in given.items() if v is not None})

    def __dlpack_device__(self):
        return (1, 0)  # kDLCPU, device 0: a concrete value lives in host memory

    def __hash__(self):
        return object.__hash__(self)

    def __iter__(self):
        for i in range(len(self)):
            yield self[i]


# ---------------------------------------------------------------------------------------------
# NumPy functions on library values (np.tanh(x), np.mean(x), np.where(c, x, 0), ...) refuse, in
# both modes: in eager mode NumPy would return an ndarray off the tape (its gradient silently
# zero), in graph mode it cannot trace. ``ndarray <op> x`` is the exception: NumPy's binary
# operators call their ufunc (np.multiply) on an operand that defines ``__array_ufunc__``, so the
# ufuncs behind the Array operators are answered by the rnp op, as ``x.__rmul__`` would be.

_WHY = "NumPy functions neither record gradients in eager mode nor trace in graph mode"
_RNP_ALIASES = {"absolute": "abs"}  # NumPy's name -> replicate.numpy's, where they differ

# Filled by replicate.numpy when it is imported (the op namespace sits above this module): the
# names it exports, for "use rnp.<name>(...)", and the rnp op behind each operator ufunc.
_rnp_names: frozenset = frozenset()
_operator_ufuncs: dict = {}


def register_op_namespace(names, operator_ufuncs: dict) -> None:
    """Called by ``replicate.numpy`` at import: its exported function names and
    ``{np.multiply: rnp.multiply, ...}`` for the ufuncs behind the Array operators."""
    global _rnp_names, _operator_ufuncs
    _rnp_names = frozenset(names)
    _operator_ufuncs = dict(operator_ufuncs)


def numpy_array_ufunc(subject, ufunc, method, inputs, kwargs):
    """The body of ``__array_ufunc__`` for Array and Variable: ``ndarray <op> x`` gets the rnp op,
    every other ufunc call refuses (``numpy_function_error``)."""
    op = _operator_ufuncs.get(ufunc)
    if op is not None and method == "__call__" and len(inputs) == 2 and not kwargs:
        return op(*inputs)
    raise numpy_function_error(ufunc, subject, method)


def _numpy_function_name(func, method: str) -> tuple[str, str | None]:
    """('np.linalg.norm', None) or ('np.tanh', 'tanh'): how to print ``func`` and the name of its
    replicate.numpy equivalent, if replicate.numpy has one."""
    name = getattr(func, "__name__", None) or repr(func)
    module = getattr(func, "__module__", None) or "numpy"
    sub = module[len("numpy."):] if module.startswith("numpy.") else ""
    top = not sub or sub.startswith("_")
    shown = "np." + ("" if top else sub + ".") + name
    if method != "__call__":
        return f"{shown}.{method}", None
    rnp_name = _RNP_ALIASES.get(name, name)
    return shown, (rnp_name if top and rnp_name in _rnp_names else None)


def numpy_function_error(func, subject, method: str = "__call__") -> NumpyConversionError:
    """The error for a NumPy function (ufunc or ``__array_function__``) called on ``subject``, an
    Array or a Variable: which function, the user's line, why, and what to write instead."""
    shown, rnp_name = _numpy_function_name(func, method)
    loc = source_line(user_frame(skip_numpy=True))
    use = (f"Use rnp.{rnp_name}(...) (import replicate.numpy as rnp)" if rnp_name else
           f"replicate.numpy has no {shown[3:]}: write it with rnp ops "
           f"(import replicate.numpy as rnp)")
    if isinstance(subject, Array):
        what = "a traced value" if subject.symbolic else "a replicate array"
        if not subject.symbolic:
            use += ", or x.numpy() for the value without gradient"
    else:  # a Variable
        what = f"Variable {getattr(subject, 'name', '?')!r}"
        use += (". Inside a step read a Variable through rnp ops; outside a step "
                f"{shown}(w.numpy()) works on its current value")
    return NumpyConversionError(f"{shown}() called on {what} at {loc}\n"
                                f"  {_WHY}, so the result would silently lose the gradient "
                                f"(eager) or fail to trace (graph).\n"
                                f"  {use}.")


@dataclass
class GraphMeta:
    """What a graph's inputs and outputs mean, for whoever feeds and reads them.

    ``input_names``: one per input (printing, error messages). A traced step also records
    ``variables`` (the Variables its last inputs read, in order), ``updated`` (the Variables its
    last outputs write back, in order), ``num_results`` and ``out_tree`` (how many leading
    outputs are per replica step results and their nest structure), ``replicas`` (k) and
    ``collective_schedule`` (the cross-process exchanges as written, which the ranks compare).
    ``guards``: the Python-level state the trace read (``replicate.dependency``), which must be
    unchanged for the step to be reused; ``divergent``: the updated variables whose new value
    depends on per-replica data that no collective combined (``(variable, where, source)``);
    ``pipeline``: with logical devices, the schedule of each (``passes/pipeline.py``);
    ``fed``: the Variables a device's part is fed (None: ``variables``; the others live on other
    devices) and ``homes``: ``(Variable, device)`` of each that lives on one device
    (``passes/split_devices.py``).
    A backend may attach its own plan (``memory_plan``). Read as attributes or, like a dict,
    ``meta["updated"]``."""

    input_names: list | None = None
    variables: list = field(default_factory=list)
    updated: list = field(default_factory=list)
    num_results: int = 0
    out_tree: Any = None
    replicas: int = 1
    collective_schedule: list | None = None
    memory_plan: Any = None
    guards: tuple = ()
    divergent: tuple = ()
    pipeline: str | None = None  # model parallelism: each device's schedule, one line each
    fed: list | None = None
    homes: tuple = ()

    def __getitem__(self, key):
        if key not in _META_FIELDS:
            raise KeyError(key)
        return getattr(self, key)

    def get(self, key, default=None):
        value = getattr(self, key, None) if key in _META_FIELDS else None
        return default if value is None else value

    def copy(self, **changes) -> GraphMeta:
        return dataclasses.replace(self, **changes)


_META_FIELDS = frozenset(f.name for f in dataclasses.fields(GraphMeta))


@dataclass
class Graph:
    """A traced program: inputs, nodes in execution order, outputs (and what they mean)."""

    inputs: list
    nodes: list
    outputs: list
    meta: GraphMeta = field(default_factory=GraphMeta)

    def __str__(self) -> str:
        return format_graph(self)


# ---------------------------------------------------------------------------------------------
# The active interpreter: a graph trace (record nodes) or none (eager: compute now).

class _Local(threading.local):
    trace = None  # (a class default: eager mode's lookup raises and catches nothing)


_local = _Local()


def current_trace():
    return _local.trace


def set_trace(trace):
    previous = current_trace()
    _local.trace = trace
    return previous


def next_id() -> int:
    """An id no Array has yet: every Array made after this call has a larger one (``rp.remat``
    tells the values a function made from those it was given or found)."""
    return next(_ids)


def concrete(value, dtype=None) -> Array:
    """Wrap a NumPy value as a concrete (eager) leaf array."""
    if type(value) is not np.ndarray or dtype is not None:
        value = np.asarray(value, dtype=dtype)
    return Array(_aval(AVal, (value.shape, value.dtype)), value=value)


_aval = tuple.__new__  # (``AVal(shape, dtype)`` less the NamedTuple's Python-level __new__)


def bind(prim: str, *inputs: Array, **attrs: Any) -> Array:
    """Apply a primitive: record a node in the active trace, or compute it now (eager)."""
    spec = REGISTRY.get(prim)
    if spec is None:
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
    trace = _local.trace
    if trace is not None:
        inputs = tuple(trace.lift(x) for x in inputs)
        placed = None
        if trace.placement is not None:  # model parallelism: place it, move what crosses
            placed, inputs = trace.placement.place(trace, prim, inputs, attrs)
        node = Node(prim, inputs, attrs, user_frame(), placed)
        out = Array(aval, node=node, trace=trace)
        node.out = out
        trace.record(node)
        return out
    values = [x.value for x in inputs]
    for v in values:
        if v is None:
            raise ReplicateError(
                f"a traced value escaped its trace and was used at "
                f"{source_line(user_frame())}; return it from the traced function instead")
    profiler = _profile.active()
    if profiler is None:
        value = IMPL[prim](*values, **attrs)
    else:  # eager mode, op by op
        start = profiler.now()
        value = IMPL[prim](*values, **attrs)
        profiler.add(prim, "communication" if spec.host else "compute", start, profiler.now(),
                     line=source_line(user_frame()))
    if type(value) is not np.ndarray:
        value = np.asarray(value)
    if value.dtype != aval.dtype:
        value = value.astype(aval.dtype)
    # the tape links outputs to their nodes and nodes to their inputs only: a node that pointed
    # back at its output (node.out, as in a graph) would make every eager array part of a
    # reference cycle, freed by the garbage collector some steps later instead of at once
    return Array(aval, Node(prim, inputs, attrs), value)
