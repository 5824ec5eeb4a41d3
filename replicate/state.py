"""``Variable``: state that step code reads and updates, in eager and graph mode alike.

In eager mode a read gives a concrete array and ``assign`` replaces the value at once. In graph
mode the first read of a variable becomes a graph input and the last ``assign`` a graph output;
the compiled step writes it back after each call.

>>> import replicate as rp
>>> w = rp.Variable([1.0, 2.0], name="w")
>>> w.assign(w * 2)
>>> w.numpy().tolist()
[2.0, 4.0]
"""

from __future__ import annotations

import itertools
import threading
import weakref

import numpy as np

from . import habits
from .dtypes import as_dtype, is_supported
from .errors import NumpyConversionError, PlacementError, ReplicateError, source_line, user_frame
from .graph.core import Array, concrete, current_trace, numpy_array_ufunc, numpy_function_error
from .interop import from_foreign, is_foreign
from .numpy import _install_operators, as_array, cast

_counter = itertools.count()
_serial = itertools.count()
_live: weakref.WeakValueDictionary = weakref.WeakValueDictionary()  # creation order -> Variable

# Hooks on Variable access, each belonging to the thread that set it (thread-local: a step's
# hooks never run for a read on another thread — the input-prefetch thread, a user's logger):
# * ``hooks.read``: called with each variable on an eager read while a Replicator's eager step
#   runs (it syncs values from rank 0);
# * ``hooks.write``: called with each variable before an eager write while a Replicator runs
#   (with check_finite it keeps the old value: a step whose update is not finite is taken back);
# * ``hooks.observers``: called with each variable read (traced or eager), innermost last:
#   rp.custom_vjp finds the Variables its fwd reads without taking them as arguments;
# * ``hooks.input``: set on the input-prefetch thread (runtime/inputs/prefetch.py), called with
#   each variable read there, where the value may be steps old;
# * ``hooks.values``: this thread's own values of some variables, ``{id(var): array}``: an actor
#   thread (runtime/actors/pool.py) acts with a published copy of the parameters while the
#   learner updates the variables; eager reads, ``numpy()`` and compiled calls see these;
# * ``hooks.region``: an ``rp.remat`` region (``remat.py``) being run or recomputed, innermost
#   (it hands on to the one outside): it hears each read with the value, and may give another
#   (a recomputation reads what the forward read), and each assign, which it may keep.
# None is a class attribute: a thread-local lacking an attribute raises and catches an
# AttributeError in getattr (0.36 us against 0.04; an eager step reads these ~100 times).
class _Hooks(threading.local):
    read = write = input = values = region = None
    observers = ()


hooks = _Hooks()


def read_observers() -> list:
    """This thread's ``hooks.observers`` list."""
    if "observers" not in hooks.__dict__:  # (this thread's own list; the class's is ())
        hooks.observers = []
    return hooks.observers


def value_of(var) -> np.ndarray:
    """The value this thread reads for ``var``: its own copy (``hooks.values``) or the
    variable's current value."""
    own = getattr(hooks, "values", None)
    value = own.get(id(var)) if own else None
    return var.value if value is None else value


def note_input_thread_reads(variables) -> None:
    """``variables`` are read (a compiled call reads their values directly): on the prefetch
    thread, its hook hears of each."""
    hook = getattr(hooks, "input", None)
    if hook is not None:
        for var in variables:
            hook(var)


class Variable:
    """A named, mutable array (a model parameter, optimiser slot or random-generator key).

    Under a ``Replicator`` a variable is one value on every replica and rank: rank 0's value is
    broadcast on first use, and a step that would update it from per-replica data without a
    collective is refused (``rp.DivergenceError``); the ranks' copies are compared at
    checkpoints and at the end of ``run``. ``local=True`` makes it each process's own instead
    (not broadcast, not compared): per-process statistics, an actor's own state. A checkpoint
    holds rank 0's copy of a local variable, and ``restore`` gives every rank that copy.

    ``per_replica=True`` gives every replica its own value (tf.distribute's ``ON_READ``
    variables): inside ``step_fn`` each replica reads and writes its own (an RNN state carried
    across steps, a metric accumulator, a gradient-accumulation buffer); outside, ``numpy()``
    returns this process's replicas' values stacked ``(k, ...)``; ``assign`` outside a step sets
    every local replica. A checkpoint holds every replica's value, and restores them to the same
    replicas (a different number of replicas is a ``CheckpointError``)."""

    def __init__(self, value, name: str | None = None, dtype=None, *, local: bool = False,
                 per_replica: bool = False):
        if is_foreign(value):  # a CuPy, JAX or PyTorch array: its values, on the host
            value = from_foreign(value)
        value = np.array(value.numpy() if isinstance(value, (Array, Variable)) else value,
                         dtype=None if dtype is None else as_dtype(dtype))
        if not is_supported(value.dtype):
            raise ReplicateError(f"Variable of dtype {value.dtype}: the dtypes are bool, "
                                 "integers and floats (float16, bfloat16, float32, float64)")
        if local and per_replica:
            raise ReplicateError("a Variable is local=True (one per process) or per_replica=True "
                                 "(one per replica), not both")
        self.name = name or f"var{next(_counter)}"
        self.local = bool(local)
        self.per_replica = bool(per_replica)
        # per replica: (replicas in this process, ...); until a step uses it, the one starting
        # value every replica begins from (leading axis 1, ``_fresh``)
        self._device = None  # (Device, array): the value in a device backend's memory
        self._away = None  # model parallelism: (where it lives, shape, dtype) while not here
        self.home = None  # model parallelism: where it lives (set by runtime/variables/owners.py)
        # sharded optimiser state (wrap_optimizer(shard=True)): ``value`` is this process's flat
        # slice, cut by this ``graph.passes.shard_state.ShardLayout``; ``shape`` the whole one's
        self.shard = None
        self.value = value[None].copy() if per_replica else value
        self._fresh = self.per_replica
        self._eager: Array | None = None
        self._created = user_frame()  # (file, line) of the user's code that made it
        _live[next(_serial)] = self

    @property
    def created_at(self) -> str:
        """'file:line: code' of the user's code that created this variable."""
        return source_line(self._created)

    # -- where the value lives ------------------------------------------------------------------
    # A device backend's step (cupy) keeps the value in device memory between steps: ``_device``
    # holds it and ``_host`` is None until something on the host reads ``value`` (a checkpoint,
    # ``numpy()``, an eager step, a sync check), which copies it down once; a write on the host
    # drops the device copy, and the next device step copies the new value up once.
    @property
    def value(self) -> np.ndarray:
        """The value as a NumPy array (copied from the device if a device step wrote it)."""
        if self._host is None:
            device, array = self._device if self._away is None else self._elsewhere()
            self._host = device.to_host(array)
        return self._host

    @value.setter
    def value(self, value) -> None:
        self._host, self._device, self._away = value, None, None

    @property
    def held(self):
        """The newest value where it is (a NumPy or a device array), without copying."""
        if self._away is not None:
            self._elsewhere()
        return self._host if self._host is not None else self._device[1]

    # Model parallelism: a Variable that lives on one logical device of a replica (a parameter,
    # its optimiser state) is updated there only; on the replica's other processes it holds no
    # value (``release``) until a sync point gives it the current one (``load``): the end of
    # ``Replicator.run``, a checkpoint (``runtime/variables/owners.py``). Reading it meanwhile is
    # an error.
    def release(self, where: str) -> None:
        """Drop this process's copy: the current value lives ``where`` (for the error)."""
        if self._away is None:
            self._away = (where, self.shape, self.dtype)
        self._host, self._device, self._eager = None, None, None

    @property
    def released(self) -> str | None:
        """Where the value lives while this process holds none (model parallelism), or None."""
        return None if self._away is None else self._away[0]

    def _elsewhere(self):
        raise PlacementError(
            f"Variable {self.name!r} lives on {self._away[0]}: with model parallelism "
            "(Replicator(logical_devices=m)) its update stays on that device, and this process "
            "holds no current value of it between the steps of Replicator.run. Read it after "
            "run() returns (every process then holds every Variable), from a checkpoint "
            "(rp.checkpoint.save / rp.callbacks.Checkpoint, called on every rank, gather it), "
            "or on that device's process.")

    @property
    def on_device(self):
        """The ``Device`` holding the newest value, or None when the host holds it."""
        return self._device[0] if self._host is None and self._device is not None else None

    def device_value(self, device):
        """The value in ``device``'s memory: copied up once, then kept there."""
        if self._device is None or self._device[0] is not device:
            self._device = (device, device.to_device(self.value))
        return self._device[1]

    # (a per-replica variable: one replica's value)
    shape = property(lambda self: self._away[1] if self._away is not None else
                     self.shard.shape if self.shard is not None else
                     self.held.shape[1:] if self.per_replica else self.held.shape)
    dtype = property(lambda self: self._away[2] if self._away is not None else self.held.dtype)
    ndim = property(lambda self: len(self.shape))
    size = property(lambda self: int(np.prod(self.shape, dtype=np.int64)))

    @property
    def shared(self) -> bool:
        """One value on every replica and rank (not ``local``, ``per_replica`` or sharded)."""
        return not (self.local or self.per_replica or self.shard is not None)

    def bind_replicas(self, k: int) -> None:
        """A per-replica variable used by a step of ``k`` replicas in this process: a fresh one
        gives each replica the starting value; one that holds values of another number of
        replicas is an error (they would be dropped or invented)."""
        if self.held.shape[0] == k:
            return
        if not self._fresh:
            raise ReplicateError(
                f"per-replica Variable {self.name!r} holds the values of {self.held.shape[0]} "
                f"replica(s) in this process; a step of {k} replica(s) per process uses it. "
                f"Create it anew (or assign it outside a step) for another layout "
                f"(created at {self.created_at})")
        self.value = np.repeat(self.value[:1], k, axis=0)

    def read(self) -> Array:
        """The current value as an Array (a graph input when traced)."""
        for observe in getattr(hooks, "observers", ()):
            observe(self)
        region = getattr(hooks, "region", None)
        return self._read() if region is None else region.read(self, self._read)

    def _read(self) -> Array:
        trace = current_trace()
        if trace is not None:
            return trace.read_variable(self)
        note_input_thread_reads((self,))
        sync = getattr(hooks, "read", None)
        if sync is not None:
            sync(self)
        own = getattr(hooks, "values", None)
        if own and id(self) in own:  # an actor's published copy (not the learner's value)
            return concrete(own[id(self)])
        if self.shard is not None:
            raise ReplicateError(
                f"Variable {self.name!r} is sharded optimiser state (wrap_optimizer(shard=True)): "
                "this process holds only its slice, which a compiled step updates — eager mode "
                "cannot read it. Train in graph mode (Replicator(mode='graph'), the default, or "
                "rp.function), or use shard=False.")
        if self._eager is None:
            if self.per_replica:  # eager mode: one replica per process
                self.bind_replicas(1)
                self._eager = concrete(self.value[0])
            else:
                self._eager = concrete(self.value)
        return self._eager

    def assign(self, new) -> None:
        """Replace the value (shape must match; the dtype is kept)."""
        held, region = self._host, getattr(hooks, "region", None)
        if type(new) is np.ndarray and held is not None and (new.dtype, new.shape) == (
                held.dtype, held.shape) and region is None and current_trace() is None \
                and not self.per_replica and self.shard is None:
            return self._write(new)  # (an eager update's own array: nothing to convert)
        new = as_array(new)
        if new.shape != self.shape:
            raise ReplicateError(
                f"assign to variable {self.name!r}: shape {new.shape} != {self.shape}")
        if new.dtype != self.value.dtype:
            new = cast(new, self.value.dtype)
        if region is not None and region.assign(self, new):
            return
        trace = current_trace()
        if trace is not None:
            trace.write_variable(self, new)
            return
        if self.per_replica:  # (outside a step: every replica of this process)
            self._write(np.repeat(new.value[None], self.value.shape[0], axis=0))
            self._fresh = False
        elif self.shard is not None:  # (outside a step: this process's slice of it)
            self._write(self.shard.part(new.value))
        else:
            self._write(new.value)

    def _write(self, value: np.ndarray) -> None:
        """An eager write of ``value`` (this variable's shape and dtype, on the host)."""
        remember = getattr(hooks, "write", None)
        if remember:  # (False: a Replicator without check_finite)
            remember(self)
        self._host, self._device, self._away, self._eager = value, None, None, None

    def load(self, value, device=None, in_place: bool = False) -> None:
        """Replace the value from outside any step (a compiled step writing its update back, a
        checkpoint restored): the next eager read starts a fresh tape leaf. A per-replica
        variable takes its local replicas' values stacked, ``(k, ...)``. ``device``: ``value``
        is an array in that device's memory (a device step's update), kept there — with
        ``in_place`` written into the device buffer the variable already has (same shape and
        dtype, a device that can: ``write_into``), so it keeps one buffer from step to step."""
        on_device = device is not None and device.is_array(value)
        old, own = self._device, in_place and on_device and hasattr(device, "write_into")
        if own and old is not None and old[0] is device and \
                (old[1].shape, old[1].dtype) == (value.shape, value.dtype):
            if old[1] is not value:
                device.write_into(old[1], value)
            value = old[1]
        elif own:  # a buffer of its own from now on: never one that the caller holds
            value = value.copy()
        if self.per_replica:
            value = value if on_device else np.asarray(value)
            if tuple(value.shape[1:]) != self.shape:
                raise ReplicateError(f"load into per-replica Variable {self.name!r}: values "
                                     f"{value.shape} are not (replicas,) + {self.shape}")
            self._fresh = False
        if on_device:
            self._host, self._device, self._away = None, (device, value), None
        else:
            self.value = value
        self._eager = None

    def restart(self, value) -> None:
        """A per-replica variable: make ``value`` the starting value of every replica again
        (as if no step had used it)."""
        value = np.asarray(value, self.dtype)
        if value.shape != self.shape:
            raise ReplicateError(f"restart of {self.name!r}: shape {value.shape} != {self.shape}")
        self.value, self._fresh, self._eager = value[None].copy(), True, None

    def numpy(self) -> np.ndarray:
        """The current value (outside a traced step: inside one it would be a constant). A
        per-replica variable: this process's replicas' values stacked ``(k, ...)`` in local
        replica order (before a step used it, its starting value, ``(1, ...)``)."""
        if current_trace() is not None:
            self._refuse_in_trace("w.numpy()")
        note_input_thread_reads((self,))
        return value_of(self)

    # -- Python conversions read the value (graph mode: the tracer error at the user's line); an
    # object's default truthiness would make ``if flag:`` always true --------------------------
    def __bool__(self):
        return bool(self.read())

    def __int__(self):
        return int(self.read())

    def __float__(self):
        return float(self.read())

    def __index__(self):
        return self.read().__index__()

    # -- NumPy: np.asarray(w) outside a traced step; NumPy functions on a Variable refuse -------
    def __array__(self, dtype=None, copy=None):
        if current_trace() is not None:
            self._refuse_in_trace("conversion to a NumPy array")
        value = value_of(self)
        return value if dtype is None else value.astype(dtype)

    def _refuse_in_trace(self, what):
        loc = source_line(user_frame(skip_numpy=True))
        raise NumpyConversionError(
            f"{what} of Variable {self.name!r} inside a traced step at {loc}\n"
            "  Its current value would be baked into the compiled step as a constant: every "
            "later call would see this value, not the Variable's.\n"
            "  Read it through rnp ops (import replicate.numpy as rnp; rnp.tanh(w), w * x, "
            "rnp.asarray(w)), or convert it outside the step (np.asarray(w), w.numpy()).")

    def __array_ufunc__(self, ufunc, method, *inputs, **kwargs):
        return numpy_array_ufunc(self, ufunc, method, inputs, kwargs)

    def __array_function__(self, func, types, args, kwargs):
        raise numpy_function_error(func, self)

    # -- NumPy's conveniences on the current value; PyTorch's habits answered (habits.py) -------
    def item(self):
        return np.asarray(self).item()

    def tolist(self):
        return np.asarray(self).tolist()

    def __format__(self, spec: str) -> str:
        return format(np.asarray(self), spec) if spec else repr(self)

    __getattr__ = habits.answers(habits.COMMON)
    __call__ = habits.not_callable  # (opt.step())

    def __repr__(self) -> str:
        kind = ", per_replica=True" if self.per_replica else ", local=True" if self.local else ""
        where = f", on {self.on_device.name}" if self.on_device is not None else \
            f", lives on {self.released}" if self.released else ""
        return f"Variable({self.name!r}, shape={self.shape}, dtype={self.dtype}{kind}{where})"


_install_operators(Variable)  # w + 1, w @ x, ... on a Variable read it


def live_variables() -> list:
    """Every Variable alive in this process, in the order they were created."""
    return [var for _, var in sorted(_live.items())]
