"""What the Replicator accepts from user code, checked where it enters: batches from ``input_fn``
and outputs of ``step_fn``. A bad one is an ``InputError`` naming the user's function (its file
and line), the replica, the step and the place in the nest — not a failure deep inside.

* A batch is a nest (dicts, lists, tuples) of numeric or boolean arrays (or numbers). Its
  structure is fixed by the first step; shapes and dtypes may change (each new signature compiles
  once in graph mode — ``max_signatures`` distinct ones before a warning).
* ``step_fn`` returns a nest of arrays (``rp.numpy`` arrays, Variables, NumPy arrays, numbers).
"""

from __future__ import annotations

import functools
import numbers
import warnings

import numpy as np

from ... import tree
from ...dtypes import is_supported
from ...errors import InputError, ReplicateError, function_location
from ...graph.aval import AVal
from ...graph.core import Array

MAX_SIGNATURES = 8

OUTPUT_REDUCTIONS = {"mean": lambda a: a.mean(0), "sum": lambda a: a.sum(0),
                     "per_replica": lambda a: a}  # of (R, ...) per output leaf


def leaf_paths(treedef, prefix="") -> list[str]:
    """The path of every leaf of a flattened nest, e.g. ``["[0]", "['y'][1]"]``."""
    if treedef == tree.LEAF:
        return [prefix or "(the whole value)"]
    kind = treedef[0]
    if kind == "none":
        return []
    if kind == "dict":
        keys = treedef[1]
    else:
        keys = range(treedef[1])
    out = []
    for key, sub in zip(keys, treedef[2]):
        out.extend(leaf_paths(sub, f"{prefix}[{key!r}]"))
    return out


def first_problem(leaves, treedef):
    """The first leaf that is not a numeric or boolean array, as ``(problem, path)``; None if
    every leaf is one (the paths are spelled out only then: this runs every step)."""
    for i, leaf in enumerate(leaves):
        problem = _leaf_problem(leaf)
        if problem:
            return problem, leaf_paths(treedef)[i]
    return None


def _leaf_problem(x) -> str | None:
    if isinstance(x, (Array, np.ndarray, np.generic, numbers.Number)) or hasattr(x, "read"):
        dtype = getattr(x, "dtype", None)
        if dtype is not None and not is_supported(dtype):
            return f"an array of dtype {np.dtype(dtype)}"
        return None
    try:
        value = np.asarray(x)
    except Exception:  # noqa: BLE001 - ragged lists and stranger things
        return f"a {type(x).__name__} that is not an array"
    if not is_supported(value.dtype):
        return f"a {type(x).__name__} (dtype {value.dtype})"
    return None


class BatchChecker:
    """Checks every replica's batch of every step (cheap: a flatten and a type test per leaf)."""

    def __init__(self, input_fn):
        self.input_fn = input_fn
        self.treedef = None
        self.first_step = None

    def __call__(self, batches, step, contexts):
        for batch, ctx in zip(batches, contexts):
            if batch is None:
                continue
            leaves, treedef = tree.flatten(batch)

            def where():  # (only on an error: finding the source line costs ~0.2 ms)
                return (f"input_fn {function_location(self.input_fn)} yielded, for replica "
                        f"{ctx.replica_id} at step {step},")
            if not leaves:
                raise InputError(f"{where()} a batch without arrays: {batch!r}")
            found = first_problem(leaves, treedef)
            if found:
                raise InputError(f"{where()} {found[0]} at batch{found[1]}: batches must be "
                                 "nests (dict, list, tuple) of numeric or boolean arrays")
            if self.treedef is None:
                self.treedef, self.first_step = treedef, step
                warn_identical(batches, self.input_fn)
            elif treedef != self.treedef:
                raise InputError(
                    f"{where()} a batch of another structure than at step {self.first_step}:\n"
                    f"  step {self.first_step}: {_structure(self.treedef)}\n"
                    f"  step {step}: {_structure(treedef)}\n"
                    "Every batch must have the same nest structure (shapes may change).")


def warn_identical(batches, input_fn) -> None:
    """A warning when this process's replicas were all handed the same first batch (NumPy
    arrays, equal bit for bit): ``rp.shard_batches(data, B)`` without ``ctx`` gives every
    replica the same rows, and R replicas then train as one on a batch R times smaller."""
    if len(batches) < 2 or any(b is None for b in batches):
        return
    first = tree.flatten(batches[0])[0]
    for other in batches[1:]:
        leaves = tree.flatten(other)[0]
        if not all(type(a) is np.ndarray and type(b) is np.ndarray and a.dtype == b.dtype
                   and np.array_equal(a, b) for a, b in zip(first, leaves)):
            return
    warnings.warn(f"input_fn {function_location(input_fn)} gave all {len(batches)} replicas "
                  "the same first batch: did it leave out ctx (rp.shard_batches(data, "
                  "batch_size, ctx)) or the replica's own slice? Replicas fed the same data "
                  "compute the same gradients", stacklevel=2)


def _structure(treedef) -> str:
    return str(tree.unflatten(treedef, ["*"] * len(leaf_paths(treedef)))).replace("'*'", "*")


def warn_many_signatures(count: int, step: int) -> None:
    if count == MAX_SIGNATURES + 1:
        warnings.warn(f"the step has been compiled for {count} different input signatures (batch "
                      f"shapes or dtypes) by step {step}; each compiles anew and stays cached. "
                      "Give batches constant shapes (rp.shard_batches(remainder='drop' or 'pad'))",
                      stacklevel=4)


def aval_of(x) -> AVal:
    x = np.asarray(x)
    return AVal(tuple(x.shape), x.dtype)


def describe_batches(batches, now: bool, compiled_at: int, input_fn):
    """(this rank's batch signature, when its step was compiled, where input_fn is): named
    when the ranks' schedules differ at a step where their batches differ too."""
    texts = []
    for b in batches:
        leaves, treedef = tree.flatten(b)
        paths = leaf_paths(treedef) if len(leaves) > 1 else [""]
        texts.append(", ".join(f"batch{p} {aval_of(x)}" for p, x in zip(paths, leaves)))
    if len(set(texts)) == 1:
        text = texts[0] + (" on every replica" if len(texts) > 1 else "")
    else:
        text = "; ".join(f"replica {r}: {t}" for r, t in enumerate(texts))
    when = "compiled for it now" if now else f"its step was compiled at step {compiled_at}"
    return text, when, f"input_fn {function_location(input_fn)}"


def checked_step_fn(step_fn):
    """``step_fn`` whose result is checked to be a nest of arrays (in both modes)."""

    @functools.wraps(step_fn)
    def step(batch):
        out = step_fn(batch)
        found = first_problem(*tree.flatten(out))
        if found:
            raise InputError(f"step_fn {function_location(step_fn)} returned {found[0]} at "
                             f"output{found[1]}: return a nest (dict, list, tuple) of arrays, "
                             "e.g. {'loss': loss}")
        return out

    return step


def check_arguments(input_fn, step_fn, replicas_per_rank, outputs, check_finite, check_sync):
    """``Replicator``'s arguments: a ``ReplicateError`` naming the first one that is wrong."""
    if not callable(input_fn) or not callable(step_fn):
        raise ReplicateError("Replicator(input_fn, step_fn): both must be callables")
    if not isinstance(replicas_per_rank, (int, np.integer)) or replicas_per_rank < 1:
        raise ReplicateError(f"replicas_per_rank must be a positive int, got "
                             f"{replicas_per_rank!r}")
    if outputs not in OUTPUT_REDUCTIONS:
        raise ReplicateError(f"outputs must be one of {tuple(OUTPUT_REDUCTIONS)}, got "
                             f"{outputs!r}")
    if not isinstance(check_finite, (bool, np.bool_)):
        raise ReplicateError(f"check_finite must be True or False, got {check_finite!r}")
    if not isinstance(check_sync, (bool, np.bool_)) and not (
            isinstance(check_sync, (int, np.integer)) and check_sync > 0):
        raise ReplicateError(f"check_sync must be True, False or a number of steps > 0, got "
                             f"{check_sync!r}")
