"""Test configuration: make the package importable from a plain checkout (no install needed), and
the one helper every multi-process test uses to run a command under ``mpiexec`` with a hard
timeout (a hang fails the test instead of blocking the suite).

    from conftest import mpirun, needs_mpi
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import subprocess
import sys
import time

# Under pytest-xdist (README: ``pytest -n 2``) each worker is one of the machine's cores: one
# BLAS thread each (a spinning BLAS pool beside the other worker slows both many times over).
# Set before anything imports NumPy.
if os.environ.get("PYTEST_XDIST_WORKER"):
    for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ.setdefault(_var, "1")

# Every compile in the suite validates the graph after each pass (``replicate/compiler.py``);
# os.environ, so the multi-process programs and every other child process inherit it.
os.environ["REPLICATE_VALIDATE"] = "1"

import numpy as np  # noqa: E402
import pytest  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)
HERE = os.path.join(ROOT, "tests")
PROGRAMS = os.path.join(HERE, "runtime", "programs")
MPIEXEC = os.path.join(os.path.dirname(sys.executable), "mpiexec")
TIMEOUT = 60
# The programs are run under mpiexec, top to bottom as a user's script is: the doctest collection
# must not import them (startup_mpi.py's first lines run before any import; gpu_transport_mpi.py
# and stall_nccl_mpi.py set REPLICATE_STANDIN_DEVICES / REPLICATE_TRANSPORT in os.environ at
# import, which every later child process of the worker then inherited). They hold no tests.
collect_ignore_glob = ["runtime/programs/*.py"]

# Without a GPU the cupy backend's tests run against a CuPy stand-in (tests/cupy_standin.py:
# device arrays backed by NumPy, kernels checked against CuPy's own parameter parsing); where
# CuPy sees a GPU they run on it. REPLICATE_CUPY_STANDIN=0 turns the stand-in off;
# REPLICATE_CUPY_STANDIN=gpu-view keeps it but has every test take its GPU path.
if HERE not in sys.path:
    sys.path.insert(0, HERE)
# JAX on a GPU: no preallocation of most of the device, deterministic ops (unless set already)
from replicate.launch import gpu_environment  # noqa: E402

gpu_environment(os.environ)
import cupy_standin  # noqa: E402
import job_cleanup  # noqa: E402  (no process of a test outlives the run: tests/job_cleanup.py)

CUPY_STANDIN = cupy_standin.install()


def column(backend: str) -> str:
    """A backend's name in test ids: ``cupy-standin`` where the cupy backend runs on the CuPy
    stand-in. Its kernels evaluate each fused group with the NumPy reference rows, so such a test
    checks the backend's host logic (dtypes, shapes, buffers, launches) and compares the
    reference with itself: the generated CUDA expressions are checked by ``test_cuda_host.py``
    (compiled with g++) and ``test_cupy_kernels.py`` (NVRTC), their numbers on a GPU only."""
    return "cupy-standin" if backend == "cupy" and cupy_standin.ACTIVE else backend


def pytest_configure(config):
    job_cleanup.install()
    if not os.environ.get("PYTEST_XDIST_WORKER"):  # once, before the workers start
        compile_bytecode()


def compile_bytecode():
    """Compile the package, the tests and the examples to bytecode (their ``__pycache__``
    folders, git-ignored) before anything runs. The suite starts a few hundred processes (every
    rank of every multi-process test imports the package), and where ``PYTHONDONTWRITEBYTECODE``
    is set — as in CI's containers — each would compile every module from its source again:
    0.16 s of the package's 0.37-s import, a quarter of the multi-process tests' time. Reading
    bytecode is allowed whatever that variable says. A tree that cannot be written is left as
    it is."""
    import compileall

    for folder in ("replicate", "tests", "examples"):
        compileall.compile_dir(os.path.join(ROOT, folder), quiet=2, workers=1)


def pytest_unconfigure(config):
    job_cleanup.end_of_run()


def pytest_report_header(config):
    if cupy_standin.ACTIVE:
        return ["cupy: the CuPy stand-in (no GPU): fused groups run the NumPy reference rows, "
                "so the cupy-standin parity tests compare the reference with itself"]
    return []


def have_mpi() -> bool:
    try:
        import mpi4py  # noqa: F401
    except ImportError:
        return False
    return os.path.exists(MPIEXEC)


# ``pytestmark = needs_mpi`` in a module whose every test runs under mpiexec
needs_mpi = [pytest.mark.mpi,
             pytest.mark.skipif(not have_mpi(), reason="needs mpi4py and mpiexec (mpich wheel)")]


def optional_torch(what: str = "the comparison with PyTorch"):
    """``(torch or None, a skip mark for the tests that need it)``: PyTorch is in the ``bench``
    extra, not ``test``, so CI runs without it and only the comparisons with it skip (imported
    here on request, never by every process that imports this module)."""
    try:
        import torch
    except ImportError:
        torch = None
    return torch, pytest.mark.skipif(torch is None, reason=f"needs torch (bench extra): {what}")


def child_env(blas_threads: int | None = 1, **extra) -> dict:
    """The environment of a child process: the checkout and ``tests/`` importable (a test module
    run as a program imports ``harness`` and this ``conftest``), ``blas_threads`` BLAS threads
    (None: leave it to the launcher), unbuffered output, no debug printing, this worker's
    ``job_cleanup`` tag; plus ``extra``."""
    path = [HERE, ROOT, os.environ.get("PYTHONPATH", "")]  # HERE first: ROOT has a conftest too
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(path), PYTHONUNBUFFERED="1")
    env.pop(job_cleanup.SESSION_VAR, None)  # a pytest run by a test has a session of its own
    env[job_cleanup.VAR] = job_cleanup.worker_tag() + "child"
    if blas_threads is not None:
        env.update(OMP_NUM_THREADS=str(blas_threads), OPENBLAS_NUM_THREADS=str(blas_threads))
    env.pop("REPLICATE_DEBUG", None)
    env.update({k: str(v) for k, v in extra.items()})
    return env


class _Cores:
    """Who may use the machine's cores under pytest-xdist (README: ``pytest -n 2``): an
    in-process test holds them shared with the other worker's test; a multi-process job (its
    ranks busy-poll MPI) holds them alone, so two jobs never overlap and no in-process test
    runs beside one (with one beside it, a 1-s MPI test took 90 s). Two ``flock``s: ``cores``
    (shared/exclusive) and ``gate``, which a job takes first so that new tests wait behind it
    instead of starving it. A no-op without xdist."""

    def __init__(self):
        self.on = bool(os.environ.get("PYTEST_XDIST_WORKER"))
        if self.on:
            key = hashlib.sha1(ROOT.encode()).hexdigest()[:12]
            base = os.path.join(os.environ.get("TMPDIR", "/tmp"), f"replicate-tests-{key}")
            self.gate, self.cores = open(base + ".gate", "a"), open(base + ".cores", "a")
        self.shared = False  # this worker's test holds the cores shared

    def _through_gate(self, mode):
        fcntl.flock(self.gate, fcntl.LOCK_EX)
        try:
            fcntl.flock(self.cores, mode)
        finally:
            fcntl.flock(self.gate, fcntl.LOCK_UN)

    @contextlib.contextmanager
    def share(self):
        if not self.on:
            yield
            return
        self._through_gate(fcntl.LOCK_SH)
        self.shared = True
        try:
            yield
        finally:
            self.shared = False
            fcntl.flock(self.cores, fcntl.LOCK_UN)

    @contextlib.contextmanager
    def alone(self):
        if not self.on:
            yield
            return
        shared = self.shared
        fcntl.flock(self.cores, fcntl.LOCK_UN)  # never wait for the gate holding the cores
        self._through_gate(fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(self.cores, fcntl.LOCK_SH if shared else fcntl.LOCK_UN)


CORES = _Cores()


@pytest.fixture(autouse=True)
def _share_the_cores():
    with CORES.share():
        yield


def exclusive():
    """The machine to this worker alone while a multi-process job runs (see ``_Cores``); the
    hard timeouts of the job count from inside, never the wait."""
    return CORES.alone()


JOB_LOG = os.environ.get("REPLICATE_TESTS_JOB_LOG")


def run(cmd, *, cwd=PROGRAMS, timeout=TIMEOUT, env=None, check=False, job=True):
    """Run ``cmd`` in its own session with a hard timeout: on a hang the job (mpiexec and every
    rank it started) is killed and the test fails; so is it when the test is interrupted
    (``job_cleanup``: the ranks are found by their environment's tag). Returns a
    ``CompletedProcess`` with ``.seconds`` (wall time) added; ``check``: also fail on a nonzero
    exit. ``job``: ``cmd`` starts several processes (``mpiexec``, the launcher, a pytest run, a
    script that starts any of those), so it holds the machine alone (``exclusive``);
    ``job=False`` for one plain Python process, which shares the cores as an in-process test
    does (the ``--help`` of every entry, the documentation's blocks, the one-process soaks)."""
    env = dict(env or child_env())
    tag = env[job_cleanup.VAR] = job_cleanup.new_job_tag()
    with exclusive() if job else contextlib.nullcontext():
        t0 = time.monotonic()
        proc = subprocess.Popen(cmd, cwd=cwd, env=env, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True, start_new_session=True)
        try:
            out, err = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            job_cleanup.kill_job(proc, tag)
            out, err = proc.communicate()
            pytest.fail(f"hang: {' '.join(map(str, cmd))} did not finish in {timeout} s\n"
                        f"--- stdout\n{out}\n--- stderr\n{err}")
        finally:
            job_cleanup.kill_job(proc, tag)
    result = subprocess.CompletedProcess(cmd, proc.returncode, out, err)
    result.seconds = time.monotonic() - t0
    if JOB_LOG:  # where the suite's time goes: docs/development/tests.md
        with open(JOB_LOG, "a") as f:
            f.write(f"{result.seconds:.2f}\t{int(job)}\t"
                    f"{os.environ.get('PYTEST_CURRENT_TEST', '?').rsplit(' ', 1)[0]}\t"
                    f"{' '.join(map(str, cmd))[:200]}\n")
    if check:
        assert result.returncode == 0, report(result)
    return result


def mpirun(*args, n=2, launcher=False, timeout=TIMEOUT, cwd=PROGRAMS, env=None, check=False):
    """``mpiexec -n n python ARGS`` (or ``python -m replicate.launch -n n ARGS``)."""
    if launcher:
        cmd = [sys.executable, "-m", "replicate.launch", "-n", str(n), *args]
    else:
        cmd = [MPIEXEC, "-n", str(n), sys.executable, *args]
    return run(cmd, cwd=cwd, timeout=timeout, env=env, check=check)


def report(result) -> str:
    return (f"{' '.join(map(str, result.args))}\nexit {result.returncode}\n--- stdout\n"
            f"{result.stdout}\n--- stderr\n{result.stderr}")


def load_both(path):
    """Rank 0's and rank 1's saved arrays, which must be bitwise identical."""
    r0, r1 = dict(np.load(path)), dict(np.load(path + ".rank1.npz"))
    assert set(r0) == set(r1)
    for key in r0:
        np.testing.assert_array_equal(r0[key], r1[key], err_msg=f"ranks differ in {key}")
        assert r0[key].tobytes() == r1[key].tobytes(), f"ranks differ bitwise in {key}"
    return r0


def checkpoint_files(folder) -> list[str]:
    """The sorted names in ``folder`` but the lock a checkpoint pattern's saving job holds
    (``.<name>.lock``, see ``replicate/runtime/variables/runs.py``)."""
    return sorted(f for f in os.listdir(folder) if not f.endswith(".lock"))


def held_back(monkeypatch, seconds, fail_at=None):
    """Each checkpoint write starts ``seconds`` late (an asynchronous checkpoint's next steps run
    while it is in flight); the one of step ``fail_at`` then fails as a full disk would."""
    import replicate as rp
    from replicate.runtime.variables import checkpoint

    save = checkpoint.save

    def late_save(path, state, step=0, **kw):
        time.sleep(seconds)
        if step == fail_at:
            raise rp.CheckpointError(f"cannot write checkpoint {path!r}: OSError: disk full")
        save(path, state, step=step, **kw)

    monkeypatch.setattr(checkpoint, "save", late_save)


SHM_MARK = "mpich-shm-mapped:"  # a line a test program prints: ``... mpich-shm-mapped: PATHS``


def shm_mapped(result) -> set[str]:
    """The MPICH shared-memory files (``/dev/shm/mpich_shm_*``) a job's ranks printed they had
    mapped (``replicate.runtime.job.mpi_shm.mapped()``, after ``SHM_MARK``)."""
    found = set()
    for line in result.stdout.splitlines():
        if SHM_MARK in line:
            found.update(line.split(SHM_MARK, 1)[1].split())
    return found


def assert_no_shm_left(result):
    """None of the shared-memory files the job's ranks printed outlives the job (MPICH removes
    them only in ``MPI_Finalize``; an aborted job's ranks, or the launcher, must)."""
    left = sorted(p for p in shm_mapped(result) if os.path.exists(p))
    assert not left, f"the job left its shared memory behind: {left}\n{report(result)}"


def orphans(token):
    """Processes still running whose command line holds ``token``."""
    found = []
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                if token.encode() in f.read():
                    found.append(int(pid))
        except OSError:
            continue
    return found


def assert_no_orphans(token):
    deadline = time.monotonic() + 2.0
    while orphans(token) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not orphans(token), f"processes left behind: {orphans(token)}"
