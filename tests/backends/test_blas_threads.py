"""The per-process BLAS thread limit (issue 13): each loaded BLAS is judged by the variables *it*
reads, so ``MKL_NUM_THREADS=1 mpiexec -n 2`` still limits NumPy's OpenBLAS to its share of the
cores (OpenBLAS ignores the MKL variable; left alone it runs one thread per core in every process
and the job runs tens of times slower)."""

from __future__ import annotations

import json
import os

import pytest

from conftest import child_env, have_mpi, mpirun, report
from replicate.launch import share_threads
from replicate.runtime.communication.comm import BLAS_THREAD_VARIABLES, blas_thread_limits


def _lib(api, threads=8, user_api="blas"):
    return {"user_api": user_api, "internal_api": api, "filepath": f"/lib/{api}.so",
            "prefix": f"lib{api}", "num_threads": threads}


LIBS = [_lib("openblas"), _lib("mkl"), _lib("blis"), _lib("openmp", user_api="openmp")]


@pytest.mark.parametrize("environ,left_alone", [
    ({}, set()),
    ({"MKL_NUM_THREADS": "1"}, {"mkl"}),  # the MKL variable says nothing to OpenBLAS
    ({"OPENBLAS_NUM_THREADS": "4"}, {"openblas"}),
    ({"GOTO_NUM_THREADS": "4"}, {"openblas"}),
    ({"BLIS_NUM_THREADS": "4"}, {"blis"}),
    ({"MKL_DOMAIN_NUM_THREADS": "MKL_BLAS=4"}, set()),  # no leading count: not a choice here
    ({"OMP_NUM_THREADS": "4"}, {"openblas", "mkl", "blis"}),  # every BLAS reads it
    ({"MKL_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "3"}, {"openblas", "mkl"}),
    ({"OPENBLAS_NUM_THREADS": "", "MKL_NUM_THREADS": "0"}, set()),  # empty or 0: ignored
])
def test_each_blas_is_left_alone_only_for_its_own_variables(environ, left_alone):
    limits = blas_thread_limits(LIBS, environ, 2)
    limited = {api for api in ("openblas", "mkl", "blis") if f"/lib/{api}.so" in limits}
    assert limited == {"openblas", "mkl", "blis"} - left_alone
    assert all(n == 2 for n in limits.values())
    assert "/lib/openmp.so" not in limits  # OpenMP runtimes are not BLAS thread pools


def test_every_known_blas_reads_omp_num_threads():
    assert all(v[-1] == "OMP_NUM_THREADS" for v in BLAS_THREAD_VARIABLES.values())


def test_limits_only_lower_and_never_below_one():
    libs = [_lib("openblas", threads=1), _lib("mkl", threads=2), _lib("blis", threads=3)]
    assert blas_thread_limits(libs, {}, 2) == {"/lib/blis.so": 2}
    assert blas_thread_limits(libs, {}, 0) == {"/lib/mkl.so": 1, "/lib/blis.so": 1}


def test_an_unknown_blas_is_limited_unless_omp_num_threads_is_set():
    libs = [_lib("flexiblas")]
    assert blas_thread_limits(libs, {"MKL_NUM_THREADS": "1"}, 1) == {"/lib/flexiblas.so": 1}
    assert blas_thread_limits(libs, {"OMP_NUM_THREADS": "3"}, 1) == {}


def test_the_launcher_sets_only_what_the_user_left_unset():
    share = str(max(1, (os.cpu_count() or 1) // 2))
    env = {"MKL_NUM_THREADS": "1"}
    share_threads(env, 2)
    assert env == {"MKL_NUM_THREADS": "1", "OMP_NUM_THREADS": share,
                   "OPENBLAS_NUM_THREADS": share, "BLIS_NUM_THREADS": share}
    env = {"OMP_NUM_THREADS": "3"}  # the user's choice for every library: nothing overrides it
    share_threads(env, 2)
    assert env == {"OMP_NUM_THREADS": "3"}


# -- under mpiexec -n 2 ------------------------------------------------------------------------
def _blas_env(**chosen):
    env = child_env(blas_threads=None)
    for var in {v for names in BLAS_THREAD_VARIABLES.values() for v in names}:
        env.pop(var, None)
    env.update(chosen)
    return env


def _threads(out, result):
    """{rank: {internal_api: num_threads}} as each rank of the program wrote it."""
    threads = {}
    for rank in (0, 1):
        path = f"{out}.rank{rank}.json"
        assert os.path.exists(path), report(result)
        with open(path) as f:
            written = json.load(f)
        assert written["size"] == 2, report(result)
        threads[rank] = {lib["internal_api"]: lib["num_threads"] for lib in written["blas"]}
    return threads


@pytest.mark.parametrize("chosen", ["MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"])
@pytest.mark.mpi
@pytest.mark.skipif(not have_mpi(), reason="needs mpi4py and mpiexec (mpich wheel)")
def test_openblas_under_mpiexec_follows_only_its_own_variables(tmp_path, chosen):
    """``MKL_NUM_THREADS=1``: OpenBLAS (NumPy's BLAS) still gets its share (cores // 2);
    ``OPENBLAS_NUM_THREADS=<cores>``: the user's choice is kept."""
    cores = os.cpu_count() or 1
    value = "1" if chosen == "MKL_NUM_THREADS" else str(cores)
    out = str(tmp_path / "blas")
    result = mpirun("blas_threads.py", out, env=_blas_env(**{chosen: value}), check=True)
    expect = max(1, cores // 2) if chosen == "MKL_NUM_THREADS" else cores
    for rank, libs in _threads(out, result).items():
        assert "openblas" in libs, report(result)  # the NumPy wheel's BLAS
        assert libs["openblas"] == expect, (rank, libs, report(result))
