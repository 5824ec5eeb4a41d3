"""A bounded wait in MPI start-up, so that a plain ``mpiexec -n N python script.py`` cannot hang.

MPI's start-up (``MPI_Init``) waits for every rank of the job. A rank that fails before it
imports ``replicate`` (an ``ImportError``, a typo above the imports) never arrives, and the
others would wait there forever: ``mpiexec`` ends the job only when a rank dies abnormally.
``python -m replicate`` (and ``python -m replicate.launch``, which uses it) initialises MPI before
the script's first line, so no rank can fail before it; for a script run directly, ``comm.world``
brackets ``MPI_Init`` with ``watch()``:

* each rank leaves a mark, ``rank-R``, in a folder of this user shared by the ranks of one
  ``mpiexec`` on this host (named after the process that started them, hydra's proxy);
* a small watcher process (``startup_watch.py``, no package import) waits for the rank to be up;
  after ``REPLICATE_STARTUP_TIMEOUT`` seconds (default 120; 0: wait forever) it prints which
  ranks never arrived on this host and how to run the script so that cannot happen, and ends
  the rank. Every waiting rank ends so, and ``mpiexec`` with them.

Under ``replicate.launch`` the launcher watches start-up itself (it ends a job within seconds of
a rank's death), so nothing is started there."""

from __future__ import annotations

import os
import subprocess
import sys

from . import status
from .heartbeat import env_seconds

ENV = "REPLICATE_STARTUP_TIMEOUT"
DEFAULT = 120.0
WATCHER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "startup_watch.py")


def timeout(environ=None) -> float:
    """Seconds a rank waits in MPI start-up (0: no bound)."""
    return env_seconds(ENV, DEFAULT, environ)


class _Watch:
    def __init__(self, child, mark):
        self.child, self.mark = child, mark

    def done(self) -> None:
        """MPI is up: the watcher goes, and the mark (and its folder, once empty)."""
        if self.child is not None:
            self.child.stdin.close()
            try:
                self.child.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self.child.kill()
        if self.mark is not None:
            for remove in (os.unlink, os.rmdir):
                try:
                    remove(self.mark if remove is os.unlink else os.path.dirname(self.mark))
                except OSError:
                    pass


def _env_int(*keys):
    for key in keys:
        value = os.environ.get(key, "")
        if value.isdigit():
            return int(value)
    return None


def watch() -> _Watch:
    """Start watching this rank's MPI start-up (see the module's docstring); ``done()`` after."""
    seconds = timeout()
    rank = _env_int("PMI_RANK", "OMPI_COMM_WORLD_RANK", "PMIX_RANK")
    size = _env_int("PMI_SIZE", "OMPI_COMM_WORLD_SIZE")
    if (not seconds or os.environ.get(status.ENV) or rank is None or not size or size < 2
            or "mpi4py.MPI" in sys.modules):  # (MPI may be up already: nothing to wait for)
        return _Watch(None, None)
    folder = os.path.join("/tmp", f"replicate-startup-{os.geteuid()}-{os.getppid()}")
    mark = None
    try:
        os.makedirs(folder, mode=0o700, exist_ok=True)
        if status.own_folder(folder):
            mark = os.path.join(folder, f"rank-{rank}")
            os.close(os.open(mark, os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW, 0o600))
    except OSError:
        mark = None
    child = subprocess.Popen(
        [sys.executable, "-I", "-S", WATCHER, str(os.getpid()), str(seconds), str(rank),
         str(size), folder], stdin=subprocess.PIPE, close_fds=True)
    return _Watch(child, mark)


__all__ = ["DEFAULT", "ENV", "timeout", "watch"]
