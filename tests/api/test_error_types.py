"""Errors keep their type (issue 13): a dtype an op cannot accept is a ``DTypeError`` (a
``TypeError``, as in NumPy), never a ``ShapeError``; a collective where replicas cannot be laid
out is a ``ReplicaContextError``; and an error one rank meets while compiling reaches every rank
with its class (a ``CollectiveMismatchError`` stays one), the other ranks' message naming the
failing rank."""

from __future__ import annotations

import json

import numpy as np
import pytest

import replicate as rp
import replicate.numpy as rnp
from conftest import have_mpi, mpirun, report
from replicate.context import ReplicaContext, replica_scope
from replicate.errors import class_name, error_of_class
from replicate.graph.core import bind

B = np.array([True, False])
F = np.array([1.0, 2.0])
I = np.array([1, 2])

DTYPE_CASES = {
    "neg of a bool": (lambda b, f, i: -b, "neg and sign need numbers"),
    "sign of a bool": (lambda b, f, i: rnp.sign(b), "neg and sign need numbers"),
    "bool minus bool": (lambda b, f, i: b - b, "cannot subtract bools"),
    "float op of an int": (lambda b, f, i: bind("exp", i), "needs a floating-point operand"),
    "operand dtypes differ": (lambda b, f, i: bind("add", f, rnp.cast(f, "float32")),
                              "operand dtypes differ"),
    "invert of floats": (lambda b, f, i: ~f, r"invert \(~\) needs integers or bools"),
    "select on a float": (lambda b, f, i: bind("select", f, f, f), "condition must be bool"),
    "cast to complex": (lambda b, f, i: rnp.cast(f, np.complex128), "cannot cast to complex128"),
    "float index array": (lambda b, f, i: f[rnp.cast(f, "float64") * 0],
                          "index arrays must be integers"),
    "float NumPy index array": (lambda b, f, i: f[np.array([0.5])],
                                "index arrays must be integers"),
    "int to a negative power": (lambda b, f, i: rnp.power(i, -1), "negative integer powers"),
}


@pytest.mark.parametrize("mode", ["eager", "graph"])
@pytest.mark.parametrize("case", sorted(DTYPE_CASES))
def test_dtype_problems_are_dtype_errors(case, mode):
    fn, match = DTYPE_CASES[case]
    if mode == "eager":
        def call():
            return fn(rnp.asarray(B), rnp.asarray(F), rnp.asarray(I))
    else:
        call = lambda: rp.function(fn)(B, F, I)  # noqa: E731
    with pytest.raises(rp.DTypeError, match=match) as e:
        call()
    assert isinstance(e.value, TypeError) and isinstance(e.value, rp.ReplicateError)
    assert not isinstance(e.value, rp.ShapeError)


def test_shape_problems_stay_shape_errors():
    with pytest.raises(rp.ShapeError, match="do not broadcast"):
        rnp.asarray(np.ones(3)) + rnp.asarray(np.ones(4))


@pytest.mark.parametrize("mode", ["eager", "graph"])
def test_collectives_outside_one_replica_per_process_are_replica_context_errors(mode):
    """Two replicas claimed in one process without a Replicator to lay them out."""
    def fn(x):
        with replica_scope(ReplicaContext(replica_id=0, num_replicas=2)):
            return rp.all_reduce(x, "sum")

    with pytest.raises(rp.ReplicaContextError, match="one replica per process") as e:
        rp.function(fn, mode=mode)(np.ones(3))
    assert isinstance(e.value, ValueError) and not isinstance(e.value, rp.ShapeError)


def test_new_error_classes_are_exported():
    for name in ("DTypeError", "ReplicaContextError"):
        assert name in rp.__all__ and issubclass(getattr(rp, name), rp.ReplicateError)


def test_an_error_is_rebuilt_from_its_class_name():
    for cls in (rp.CollectiveMismatchError, rp.ShapeError, rp.DTypeError, rp.CheckpointError,
                rp.ReplicaContextError, rp.ReplicateError):
        rebuilt = error_of_class(class_name(cls("why")), "rank 1 failed: why")
        assert type(rebuilt) is cls and str(rebuilt) == "rank 1 failed: why"
    other = error_of_class(class_name(KeyError("k")), "m")  # not a library error: named instead
    assert type(other) is rp.ReplicateError and str(other) == "KeyError: m"


# -- a compile error on one rank of two ---------------------------------------------------------
@pytest.mark.mpi
@pytest.mark.skipif(not have_mpi(), reason="needs mpi4py and mpiexec (mpich wheel)")
@pytest.mark.parametrize("scenario,kind,match", [
    ("mismatch", "CollectiveMismatchError", "replicas disagree about collective #0"),
    ("dtype", "DTypeError", "neg and sign need numbers"),
])
def test_compile_error_on_one_rank_reaches_every_rank_with_its_type(tmp_path, scenario, kind,
                                                                     match):
    """tests/runtime/programs/compile_error_mpi.py: rank 1's step fails to compile (its two replicas
    call different collectives, or it negates a bool); both ranks raise ``kind``, rank 0's
    message naming rank 1 and the line."""
    out = str(tmp_path / scenario)
    result = mpirun("compile_error_mpi.py", scenario, out, check=True)
    seen = {}
    for rank in (0, 1):
        with open(f"{out}.rank{rank}.json") as f:
            seen[rank] = json.load(f)
        assert seen[rank] is not None, (rank, report(result))
        assert seen[rank]["type"] == kind and seen[rank]["consistent"], (rank, seen[rank])
        assert match in seen[rank]["message"], (rank, seen[rank])
        assert "compile_error_mpi.py:" in seen[rank]["message"], (rank, seen[rank])
    assert seen[0]["message"].startswith("rank 1 failed to compile the step: ")
    assert not seen[1]["message"].startswith("rank ")
