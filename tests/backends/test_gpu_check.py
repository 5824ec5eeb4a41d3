"""The rehearsal of ``bench/gpu_check.sh``, the one command the first GPU run is: every step of it
runs here, without a GPU, on the CuPy stand-in seen as a GPU (``REPLICATE_CUPY_STANDIN=gpu-view``:
the tests take the paths they take on a GPU machine, reading only what the backend records), so
the script cannot rot between GPU runs.

The cupy test modules run whole in that view (the "GPU view" of the suite): a test that passes
only by reading the stand-in's internals fails here. The op and float16 harnesses, the oracle
with 2 and 4 replicas and the 2-rank parity are narrowed to a slice (CI has 2 cores): the script
runs them whole on the GPU.
"""

from __future__ import annotations

import os
import sys

import pytest

from conftest import ROOT, child_env, have_mpi, run

SCRIPT = os.path.join(ROOT, "bench", "gpu_check.sh")
CUPY_MODULES = ("test_cupy_kernels or test_cupy_scatter or test_device_state or test_cuda_codegen "
                "or test_cupy_graph or test_cuda_blas or test_cuda_raw")
STEPS = ("versions", "parity suites", "oracle", "NCCL: a 1-rank communicator",
         "NCCL: 2 ranks on one GPU")

pytestmark = [pytest.mark.mpi,
              pytest.mark.skipif(not have_mpi(), reason="needs mpi4py and mpiexec (mpich wheel)")]


def _rehearse(tmp_path, select, steps=None, tests=None):
    """Run the script (``conftest.run``: the machine to this test alone, a hard timeout); its
    own pytest workers coordinate the cores through lock files of their own (``TMPDIR``)."""
    out, tmp = tmp_path / "out", tmp_path / "tmp"
    out.mkdir()
    tmp.mkdir()
    env = child_env(OUT=str(out), TMPDIR=str(tmp), GPU_CHECK_REHEARSAL=1,
                    GPU_CHECK_PYTHON=sys.executable, GPU_CHECK_WORKERS=2, GPU_CHECK_ORACLE=1,
                    GPU_CHECK_SELECT=select, **({"GPU_CHECK_STEPS": steps} if steps else {}),
                    **({"GPU_CHECK_TESTS": tests} if tests else {}))
    for var in ("PYTEST_XDIST_WORKER", "PYTEST_XDIST_TESTRUNUID", "PYTEST_CURRENT_TEST"):
        env.pop(var, None)
    result = run(["bash", SCRIPT], cwd=ROOT, env=env, timeout=400)
    return result, (out / "summary.txt").read_text(), out


def test_the_gpu_check_passes_on_the_stand_in_seen_as_a_gpu(tmp_path):
    result, summary, out = _rehearse(tmp_path, f"{CUPY_MODULES} or (cupy and relu) or "
                                               "(two_processes and cupy)")
    log = result.stdout[-6000:] + result.stderr[-3000:]
    assert result.returncode == 0, log
    lines = summary.splitlines()
    assert len(lines) == len(STEPS), summary
    for line, name in zip(lines, STEPS):
        assert line.startswith(name) and " passed " in line, summary
    assert (out / "junit.xml").exists() and (out / "gpu_check.log").exists()
    # the cupy modules ran whole, as on a GPU: what only the stand-in checks said so
    assert "a GPU is here" in result.stdout and " 0 skipped" not in result.stdout


def test_a_test_that_skips_for_another_reason_fails_the_check(tmp_path):
    """On a GPU machine nothing may skip but what only the stand-in or a compiler can check: a
    skip for anything else (a missing package, say) fails the parity step, and so the check;
    one that says "a GPU is here" does not."""
    module = tmp_path / "test_rehearsed_skips.py"
    module.write_text("import pytest\n\n\ndef test_allowed():\n"
                      "    pytest.skip('a GPU is here: only the stand-in checks this')\n\n\n"
                      "def test_not_allowed():\n"
                      "    pytest.skip('an optional package is missing')\n")
    result, summary, _ = _rehearse(tmp_path, "allowed", steps="parity", tests=str(module))
    assert result.returncode == 1, result.stdout[-3000:]
    assert "skipped on a GPU machine" in result.stdout, result.stdout[-3000:]
    assert "an optional package is missing" in result.stdout
    assert "only the stand-in checks this" not in result.stdout.split("gpu_check: 2 tests")[-1]
    parity = next(line for line in summary.splitlines() if line.startswith("parity"))
    assert "FAILED" in parity, summary
