"""The process-level API: which process this is, and exchanges of NumPy values between the
processes outside a step (``rp.host``).

Inside ``step_fn`` the collectives (``rp.all_reduce``, ...) combine every *replica*'s values;
outside a step — before training, between epochs, for an evaluation or a log line — these
combine every *process*'s NumPy values (Horovod's ``hvd.allreduce`` on host tensors,
``torch.distributed.all_reduce``, JAX's ``multihost_utils``). Each call starts with the tagged
header of every runtime exchange (``agree.py``): processes making different calls (another
shape, another op, one process calling ``barrier`` and another ``all_reduce``) all raise
``CollectiveMismatchError`` naming each process's call and line, never a hang; the watchdog's
``collective_timeout`` covers a process that never comes.

>>> import numpy as np, replicate as rp
>>> rp.process_index(), rp.process_count(), rp.is_main_process()
(0, 1, True)
>>> rp.host.all_reduce(np.array([1.0, 2.0]), "mean").tolist()
[1.0, 2.0]
>>> rp.host.all_gather(np.float32(3)).tolist()
[3.0]
"""

from __future__ import annotations

import numpy as np

from ... import state
from ...context import current as current_replica
from ...dtypes import LOW_PRECISION, is_float, is_supported
from ...errors import ReplicaContextError, ReplicateError, source_line, user_frame
from ...graph.aval import AVal
from ...graph.core import Array, current_trace
from .agree import HOST, agree, digest
from .comm import world

OPS = ("sum", "mean", "max", "min")


def process_index() -> int:
    """This process's index (its MPI rank), 0 .. ``process_count() - 1``."""
    return world().rank


def process_count() -> int:
    """The number of processes in the job (1 without ``mpiexec``)."""
    return world().size


def is_main_process() -> bool:
    """True on process 0 (the one that prints, plots and writes files alone)."""
    return world().rank == 0


def barrier() -> None:
    """Wait until every process has come here (outside a step)."""
    comm = _outside_step("rp.barrier()")
    if comm.size > 1:
        where = source_line(user_frame())
        agree(comm, HOST, digest("barrier"), describe=lambda: f"rp.barrier() at {where}")


def all_reduce(x, op: str) -> np.ndarray:
    """Every process's ``x`` (a NumPy array or number, the same shape and dtype everywhere)
    combined: ``"sum"``, ``"mean"``, ``"max"`` or ``"min"`` — no default, as Horovod averages
    and ``torch.distributed`` sums; the same result on every process (combined in process order,
    so bitwise equal everywhere). A ``"sum"`` of bools counts them (int64, NumPy's ``sum``)."""
    if op not in OPS:
        raise ReplicateError(f"rp.host.all_reduce: op must be one of {OPS}, got {op!r}")
    x = _value(x, "all_reduce")
    if op == "mean" and not is_float(x.dtype):
        raise ReplicateError(f"rp.host.all_reduce(..., 'mean') of {x.dtype} values: cast to a "
                             "float first (the mean of integers is not an integer)")
    if op == "sum" and x.dtype == np.bool_:
        x = x.astype(np.int64)  # a sum of bools counts them (NumPy's sum), not their or
    comm = _agreed(f"all_reduce({_aval(x)}, op={op!r})")
    if comm.size == 1:
        return x.copy()
    # (float16/bfloat16: summed in float32 and rounded once, as the replica collectives do)
    out = comm.allreduce(wide_for_sum(x, op).reshape(-1), "sum" if op == "mean" else op)
    out = out.reshape(x.shape) / comm.size if op == "mean" else out.reshape(x.shape)
    return out.astype(x.dtype, copy=False)


def wide_for_sum(x, op):
    """A float16/bfloat16 sum is taken in float32 and rounded once (as the collectives do)."""
    return x.astype(np.float32) if x.dtype in LOW_PRECISION and op in ("sum", "mean") else x


def all_gather(x) -> np.ndarray:
    """Every process's ``x`` stacked in process order: shape ``(process_count(), *x.shape)``."""
    x = _value(x, "all_gather")
    comm = _agreed(f"all_gather({_aval(x)})")
    return comm.allgather(x.reshape(-1)).reshape((comm.size,) + x.shape)


def all_gather_object(obj) -> list:
    """Every process's ``obj`` (any picklable Python object: a list of episode returns, a dict
    of counts; each process's may differ in size) as a list in process order, as
    ``torch.distributed.all_gather_object`` and Horovod's ``allgather_object``."""
    comm = _agreed("all_gather_object(...)")
    return comm.allgather_obj(obj)


def broadcast(x, root: int = 0) -> np.ndarray:
    """Process ``root``'s ``x`` on every process (the others' ``x`` give only its shape and
    dtype, which must match)."""
    comm = _outside_step("rp.host.broadcast")
    if isinstance(root, bool) or not isinstance(root, (int, np.integer)) \
            or not 0 <= root < comm.size:
        raise ReplicateError(f"rp.host.broadcast: root must be a process index in "
                             f"0..{comm.size - 1}, got {root!r}")
    x = _value(x, "broadcast")
    _agreed(f"broadcast({_aval(x)}, root={int(root)})")
    return comm.bcast(x, int(root))


# -- checks -------------------------------------------------------------------------------------
def on_input_thread() -> bool:
    """True on a prefetch thread (running ``input_fn`` ahead of the steps; it sets
    ``state.hooks.input``, ``runtime/inputs/prefetch.py``)."""
    return getattr(state.hooks, "input", None) is not None


def refuse_exchange(what: str) -> None:
    """``rp.host`` exchanges are refused on the prefetch thread."""
    if on_input_thread():
        raise ReplicateError(
            f"{what} in input_fn after its first batch, with prefetch on: input_fn runs on a "
            "background thread then, and the exchange would run concurrently with the steps' "
            "collectives. Exchange before the first yield (that part runs on the main thread), "
            "or pass Replicator(..., prefetch=0)")


def _outside_step(what: str):
    refuse_exchange(what)
    if current_trace() is not None or current_replica() is not None:
        raise ReplicaContextError(
            f"{what} inside a step: the host exchanges combine processes' NumPy values outside "
            "step_fn; inside it use the replica collectives (rp.all_reduce, rp.all_gather, "
            "rp.broadcast)")
    return world()


def _value(x, what: str) -> np.ndarray:
    if hasattr(x, "read") or isinstance(x, Array):
        x = x.numpy()
    value = np.asarray(x)
    if not is_supported(value.dtype):
        raise ReplicateError(f"rp.host.{what}: NumPy arrays or numbers of bool, integer or float "
                             f"dtype, got {type(x).__name__} of dtype {value.dtype}")
    return value if value.flags.c_contiguous else value.copy(order="C")  # (keeps 0-d as 0-d)


def _aval(x) -> str:
    return str(AVal(tuple(x.shape), x.dtype))


def _agreed(call: str):
    """Every process makes this call (or each raises naming every process's call)."""
    comm = _outside_step(f"rp.host.{call.split('(')[0]}")
    if comm.size > 1:
        where = source_line(user_frame())
        agree(comm, HOST, digest(call), describe=lambda: f"rp.host.{call} at {where}")
    return comm


__all__ = ["all_gather", "all_reduce", "barrier", "broadcast", "is_main_process",
           "process_count", "process_index"]
