"""No process a test started outlives the test run, even when the run is interrupted (Ctrl-C,
SIGINT) or terminated (SIGTERM).

Every child process a test starts carries a tag in its environment, ``REPLICATE_TEST_JOB=
SESSION.WORKER.JOB`` (``conftest.child_env`` and ``conftest.run`` put it there). The tag is what
finds an MPI job's processes: each job starts in a session of its own, but hydra's proxy and every
rank call ``setsid`` too, so killing the job's process group reaches ``mpiexec`` alone; the
environment, which hydra hands on to the ranks, reaches them all.

- ``conftest.run`` kills its job's tagged processes when the job ends, however it ends (a
  timeout, ``KeyboardInterrupt``);
- an xdist worker kills its own jobs' processes when it finishes;
- the run's main process (the xdist controller, or plain ``pytest``) kills every tagged process
  of the session at its end (``pytest_unconfigure`` and ``atexit``) and on SIGTERM, before it
  dies of the signal as it would have.
"""

from __future__ import annotations

import atexit
import itertools
import os
import signal
import time
import uuid

VAR = "REPLICATE_TEST_JOB"
SESSION_VAR = "REPLICATE_TEST_SESSION"  # set in the main process; the xdist workers inherit it
# A nested pytest (a test that runs pytest) starts a session of its own: child_env leaves
# SESSION_VAR out of its children's environment.
SESSION = os.environ.get(SESSION_VAR) or uuid.uuid4().hex[:16]
os.environ[SESSION_VAR] = SESSION
WORKER = os.environ.get("PYTEST_XDIST_WORKER", "main")
_COUNT = itertools.count()


def worker_tag() -> str:
    return f"{SESSION}.{WORKER}."


def new_job_tag() -> str:
    """The tag of one job of this worker (``SESSION.WORKER.N``)."""
    return f"{worker_tag()}{next(_COUNT)}"


def tagged(prefix: str) -> list[int]:
    """Processes (this user's; zombies have no environment) whose ``VAR`` starts with
    ``prefix``."""
    needle = f"\0{VAR}={prefix}".encode()
    found = []
    for name in os.listdir("/proc"):
        if not name.isdigit() or int(name) == os.getpid():
            continue
        try:
            with open(f"/proc/{name}/environ", "rb") as f:
                if needle in b"\0" + f.read():
                    found.append(int(name))
        except OSError:  # gone, or another user's
            continue
    return found


def kill_tagged(prefix: str, patience: float = 2.0) -> list[int]:
    """SIGKILL every process tagged ``prefix...``, again until none is left (a dying
    ``mpiexec`` may still be starting ranks) or ``patience`` seconds passed; returns the pids
    killed."""
    killed: list[int] = []
    deadline = time.monotonic() + patience
    while True:
        found = tagged(prefix)
        for pid in found:
            try:
                os.kill(pid, signal.SIGKILL)
                killed.append(pid)
            except OSError:
                pass
        if not found or time.monotonic() > deadline:
            return killed
        time.sleep(0.02)


def kill_job(proc, tag: str):
    """End one job: its session (``proc`` was started with ``start_new_session``), then every
    process that carries exactly its ``tag``."""
    if proc.poll() is None:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except OSError:
            pass
    kill_tagged(tag + "\0")


def end_of_run():
    kill_tagged(worker_tag() if WORKER != "main" else f"{SESSION}.")


def install():
    """At the end of this process (and on SIGTERM), kill what its tests started: a worker its
    own jobs, the main process every job of the session."""
    atexit.register(end_of_run)
    try:
        previous = signal.getsignal(signal.SIGTERM)
    except ValueError:  # not the main thread
        return
    if getattr(previous, "_replicate_cleanup", False):
        return

    def on_sigterm(signum, frame):
        end_of_run()
        if callable(previous):
            previous(signum, frame)
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGTERM)  # die of it, as without this handler

    on_sigterm._replicate_cleanup = True
    try:
        signal.signal(signal.SIGTERM, on_sigterm)
    except ValueError:
        pass
