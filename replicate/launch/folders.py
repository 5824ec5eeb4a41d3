"""The launcher's folder in ``/tmp``: the ranks' records (``runtime/job/status.py``), its socket
and MPICH's recorded files; private to the user (``mkdtemp``), locked while its launcher lives.
A launcher killed outright leaves it; the next launch by the same user removes it
(``remove_dead_folders``) once no launcher holds its lock and none of its ranks here runs."""

from __future__ import annotations

import fcntl
import os
import shutil
import socket
import tempfile
import time

from ..runtime.job import mpi_shm, status

FOLDER_PREFIX = "replicate-launch-"
LOCK = "launcher.lock"  # held by the launcher while it lives (the kernel lets go when it dies)
YOUNG = 60.0  # seconds: a folder without its lock may be a launcher's that is just starting


def make_folder() -> tuple[str, int]:
    """A new private folder for the ranks' records (``mkdtemp``: mode 0700) and the lock this
    launcher holds on it (the descriptor)."""
    folder = tempfile.mkdtemp(prefix=FOLDER_PREFIX)
    fd = os.open(os.path.join(folder, LOCK), os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW
                 | os.O_CLOEXEC, 0o600)
    fcntl.flock(fd, fcntl.LOCK_EX)
    return folder, fd


def remove_dead_folders(base: str | None = None) -> list[str]:
    """Remove the folders that launchers of this user killed outright left in ``base`` (the
    temporary folder): no launcher holds its lock and none of its ranks on this machine runs;
    with them the MPICH files those ranks recorded. The folders removed; never raises."""
    base = base or tempfile.gettempdir()
    removed = []
    try:
        names = [n for n in os.listdir(base) if n.startswith(FOLDER_PREFIX)]
    except OSError:
        return removed
    for name in names:
        folder = os.path.join(base, name)
        if not status.own_folder(folder) or not _dead(folder):
            continue
        mpi_shm.remove_recorded(folder)
        shutil.rmtree(folder, ignore_errors=True)
        removed.append(folder)
    return removed


def _dead(folder: str) -> bool:
    try:
        fd = os.open(os.path.join(folder, LOCK), os.O_RDONLY | os.O_NOFOLLOW)
    except FileNotFoundError:  # (an older launcher's folder, or one being made: old enough,
        try:  # and none of its ranks alive — an older launcher holds no lock while it lives)
            if time.time() - os.lstat(folder).st_mtime <= YOUNG:
                return False
        except OSError:
            return False
    except OSError:
        return False
    else:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            return False  # its launcher lives
        finally:
            os.close(fd)
    host = socket.gethostname()
    return not any(rec["host"] == host and _alive(rec["pid"])
                   for rec in status.read(folder).values())


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # (another user's process: the pid was reused)
        return False
    return True


__all__ = ["FOLDER_PREFIX", "LOCK", "make_folder", "remove_dead_folders"]
