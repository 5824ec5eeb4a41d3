"""Multi-process tests: each runs ``mpiexec -n 2 python <program>`` with a hard timeout, so a hang
fails the test instead of blocking the suite.

The programs live in tests/runtime/programs/: oracle.py (training), collectives_mpi.py (every
collective), comm_mpi.py (the communicator's reductions) and failures_mpi.py (ranks that misbehave).
"""

import os
import sys

import numpy as np
import pytest

from conftest import PROGRAMS, assert_no_shm_left, load_both, mpirun, needs_mpi, shm_mapped

sys.path.insert(0, PROGRAMS)
import collective_cases as cc  # noqa: E402
import oracle  # noqa: E402

pytestmark = needs_mpi


def _ok(result):
    assert result.returncode == 0, (f"exit {result.returncode}\n--- stdout\n{result.stdout}\n"
                                    f"--- stderr\n{result.stderr}")


# -- the communicator ------------------------------------------------------------------------------
def test_communicator_reductions_are_bitwise_rank_ordered():
    """Every reduction path (gathered, MPI's Allreduce, all-to-all split, in pieces) gives bitwise
    the left-to-right combination of the ranks' buffers, signed zeros included, on every rank."""
    result = mpirun("comm_mpi.py")
    _ok(result)
    assert "ok" in result.stdout


# -- the oracle across processes -------------------------------------------------------------------
@pytest.mark.parametrize("k,mode,opt", [(1, "graph", "sgd"), (1, "graph", "adam"),
                                        (2, "graph", "sgd"), (2, "graph", "adam"),
                                        (1, "eager", "sgd"), (1, "eager", "adam")])
def test_oracle_two_processes(tmp_path, k, mode, opt):
    out = str(tmp_path / "params.npz")
    _ok(mpirun("oracle.py", out, "--k", str(k), "--mode", mode, "--opt", opt, "--steps", "10"))
    got = load_both(out)
    R, B = 2 * k, 8
    ref, ref_losses = oracle.train(1, opt=opt, steps=10, batch=R * B)
    for name in ref:
        assert got[name].dtype == np.float64
        np.testing.assert_allclose(got[name], ref[name], rtol=1e-6, atol=1e-12, err_msg=name)
    np.testing.assert_allclose(got["losses"], ref_losses, rtol=1e-6)


def test_oracle_through_the_launcher(tmp_path):
    out = str(tmp_path / "params.npz")
    _ok(mpirun("oracle.py", out, "--k", "2", "--opt", "adam", launcher=True))
    got = load_both(out)
    ref, _ = oracle.train(1, opt="adam", steps=10, batch=4 * 8)
    for name in ref:
        np.testing.assert_allclose(got[name], ref[name], rtol=1e-6, atol=1e-12, err_msg=name)


# -- every collective across processes -----------------------------------------------------------
@pytest.mark.parametrize("k,mode", [(1, "graph"), (2, "graph"), (1, "eager")])
def test_collectives_two_processes(tmp_path, k, mode):
    out = str(tmp_path / "collectives.npz")
    _ok(mpirun("collectives_mpi.py", out, "--k", str(k), "--mode", mode))
    got = load_both(out)
    R = 2 * k
    cases = cc.cases(R)
    assert len(cases) >= 16
    for name, kind, attrs in cases:
        X, C = cc.make_data(kind, attrs, R)
        np.testing.assert_allclose(got[f"{name}.y"], cc.ref_forward(kind, attrs, X),
                                   rtol=1e-12, atol=1e-12, err_msg=f"{name} forward")
        np.testing.assert_allclose(got[f"{name}.g"], cc.ref_grad(kind, attrs, X, C),
                                   rtol=1e-12, atol=1e-12, err_msg=f"{name} gradient")
        if mode == "graph":
            assert int(got[f"{name}.trace_count"]) == 1


# -- failures end the whole job, with a clear message, never a hang -------------------------------
def _line(marker):
    with open(os.path.join(PROGRAMS, "failures_mpi.py")) as f:
        hits = [i for i, line in enumerate(f, 1) if line.rstrip().endswith(f"# {marker}")]
    assert len(hits) == 1
    return hits[0]


def _report(result):
    return f"exit {result.returncode}\n--- stdout\n{result.stdout}\n--- stderr\n{result.stderr}"


@pytest.mark.parametrize("mode", ["graph", "eager"])
def test_cross_process_collective_mismatch(mode):
    result = mpirun("failures_mpi.py", "mismatch-kind", "--mode", mode)
    report = _report(result)
    assert result.returncode != 0, report
    assert "finished" not in result.stdout, report  # no rank carried on as if nothing happened
    # a clear error on both ranks: the error type and both source lines
    assert result.stderr.count("CollectiveMismatchError") >= 2, report
    for marker in ("MARK rank1-gather", "MARK all-reduce"):
        assert f"failures_mpi.py:{_line(marker)}" in result.stderr, (marker, report)


@pytest.mark.parametrize("mode", ["graph", "eager"])
def test_cross_process_shape_mismatch(mode):
    result = mpirun("failures_mpi.py", "mismatch-shape", "--mode", mode)
    report = _report(result)
    assert result.returncode != 0, report
    assert "finished" not in result.stdout, report
    assert "CollectiveMismatchError" in result.stderr, report
    assert f"failures_mpi.py:{_line('MARK all-reduce')}" in result.stderr, report


def test_function_calls_agree_on_their_collectives_across_processes():
    """A graph-mode rp.function whose collective spans the processes (called in an eager step):
    operands that differ between the ranks are a CollectiveMismatchError on every rank naming
    both, from the header every call sends first, not an MPI error."""
    result = mpirun("failures_mpi.py", "function-shape", "--mode", "eager")
    report = _report(result)
    assert result.returncode != 0, report
    assert "finished" not in result.stdout and "truncated" not in result.stderr, report
    assert result.stderr.count("CollectiveMismatchError") >= 2, report
    assert "rank 0: mpi_allreduce[op=sum,size=2] f64[4]" in result.stderr, report
    assert "rank 1: mpi_allreduce[op=sum,size=2] f64[5]" in result.stderr, report
    assert f"failures_mpi.py:{_line('MARK function-all-reduce')}" in result.stderr, report


@pytest.mark.parametrize("scenario,mode", [("step-raises", "graph"), ("step-raises", "eager"),
                                           ("input-raises", "graph"), ("input-raises", "eager")])
def test_exception_on_one_rank_ends_the_job(scenario, mode):
    result = mpirun("failures_mpi.py", scenario, "--mode", mode)
    report = _report(result)
    assert result.returncode != 0, report
    assert "failed on rank 1" in result.stderr, report
    assert "rank 1" in result.stderr, report
    # the failing rank does not go on running the user's code after the failed run
    assert "rank 1 finished" not in result.stdout, report
    assert_no_shm_left(result)


@pytest.mark.skipif(not os.path.exists("/proc/self/maps"),
                    reason="needs /proc/self/maps (Linux) to find MPICH's shared-memory files")
def test_an_aborted_job_leaves_no_shared_memory_behind():
    """MPICH removes its file in /dev/shm (2 MB per job) only in MPI_Finalize: a job that ends by
    MPI_Abort (a step that raises on rank 1) would leave it until the machine restarts. The
    aborting rank removes the names of the files it has mapped before MPI_Abort."""
    result = mpirun("failures_mpi.py", "step-raises", "--mode", "eager")
    assert result.returncode != 0, _report(result)
    assert "failed on rank 1" in result.stderr, _report(result)
    assert result.stdout.count("mpich-shm-mapped:") == 2, _report(result)
    assert shm_mapped(result), _report(result)  # the files the ranks had mapped...
    assert_no_shm_left(result)  # ...are gone


def test_exception_outside_the_replicator_ends_the_job():
    """Plain Python code that raises on rank 1 while rank 0 waits in a collective."""
    result = mpirun("failures_mpi.py", "raises-outside")
    report = _report(result)
    assert result.returncode != 0, report
    assert "rank 1 failed outside the Replicator" in result.stderr, report
    assert_no_shm_left(result)


@pytest.mark.parametrize("mode,k", [("graph", 1), ("graph", 2), ("eager", 1)])
def test_input_running_out_on_one_rank_stops_every_rank(mode, k):
    result = mpirun("failures_mpi.py", "runs-out", "--mode", mode, "--k", str(k))
    _ok(result)
    assert result.stderr.count("input ran out") == 2, _report(result)  # a warning on each rank
    for rank in (0, 1):
        assert f"rank {rank} finished 5 steps" in result.stdout, _report(result)


# -- the step's outputs: gathered per step, or deferred to one exchange --------------------------
def test_deferred_outputs_equal_per_step_outputs():
    """Without a callback reading them, a run's outputs are gathered in one exchange per up to
    LIMIT steps instead of one per step: the same values, dtypes and order (the program also
    counts the exchanges)."""
    result = mpirun("outputs_mpi.py")
    _ok(result)
    assert result.stdout.count("OK") == 2, result.stdout
