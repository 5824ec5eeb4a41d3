"""MPICH's shared-memory files, removed when a job does not end by ``MPI_Finalize``.

MPICH maps a file per job and machine, ``/dev/shm/mpich_shm_<job>_<node>`` (2 MB for two ranks;
``mpich_vci_<job>_<node>`` too with several VCIs), and removes its name in ``MPI_Finalize``. A
job that ends by ``MPI_Abort`` (how a failing rank ends the job) or by a signal never does: the
file holds its memory until the machine restarts (a day of a test suite that aborts jobs on
purpose left thousands). So:

* a rank about to call ``MPI_Abort`` removes the names of the MPICH files it has mapped, found in
  ``/proc/self/maps`` (``unlink_mapped``). Every process keeps its mapping — only the name goes,
  and the kernel frees the memory once the last process of the job has ended;
* a rank started by ``replicate.launch`` writes the files it has mapped once MPI is up (name and
  inode) into the launcher's folder (``record``), and the launcher removes those still there
  when the job has ended (``remove_recorded``): a rank killed by a signal, or ended by
  ``mpiexec`` after another rank died, runs no cleanup of its own. Only a file with the recorded
  name *and* inode on this machine goes, never another job's (``identify`` and ``remove_same``:
  also for whoever kills a rank it knows, ``identify(f"/proc/{pid}/maps")`` first).

Best effort: without ``/proc`` (macOS), or on any error, nothing is removed and nothing raised.

MPICH also attaches to a file of that name that already exists, whoever made it; the name follows
from ``mpiexec``'s pid, so another user can make it first and read the job's messages.
``check_own`` (called by ``exposure.after_mpi`` before the job's first message) says what is
wrong with each file this rank mapped: not this user's, open to others, or older than the job.
"""

from __future__ import annotations

import os
import socket

from . import status

PREFIXES = ("mpich_shm_", "mpich_vci_")  # the names MPICH's POSIX shared memory (ch4) gives
SHM_DIR = "/dev/shm/"


def mapped(maps: str = "/proc/self/maps") -> list[str]:
    """The MPICH shared-memory files this process has mapped that still have their name
    (a removed one is listed with `` (deleted)``), sorted; [] where ``maps`` cannot be read.

    >>> mapped("/no/such/maps")
    []
    """
    try:
        with open(maps, errors="surrogateescape") as f:  # (any file name round-trips)
            lines = f.read().splitlines()
    except OSError:
        return []
    found = set()
    for line in lines:
        fields = line.split(None, 5)
        path = fields[5] if len(fields) == 6 else ""
        name = path[len(SHM_DIR):]
        if path.startswith(SHM_DIR) and name.startswith(PREFIXES) and "/" not in name \
                and not path.endswith(" (deleted)"):
            found.add(path)
    return sorted(found)


def unlink_mapped() -> list[str]:
    """Remove the names of the MPICH shared-memory files this process has mapped (called just
    before ``MPI_Abort``); the paths removed. Never raises."""
    removed = []
    try:
        for path in mapped():
            try:
                os.unlink(path)
                removed.append(path)
            except OSError:
                continue
    except Exception:  # noqa: BLE001, S110 - cleanup must never mask the failure being reported
        pass
    return removed


def identify(maps: str = "/proc/self/maps") -> list[tuple[str, int]]:
    """(path, inode) of each file ``mapped`` finds (``maps`` of another process of the same
    user: ``/proc/PID/maps``), for ``remove_same`` once that process has ended."""
    found = []
    for path in mapped(maps):
        try:
            found.append((path, os.stat(path).st_ino))
        except OSError:
            continue
    return found


def remove_same(entries) -> list[str]:
    """Remove each ``(path, inode)`` of ``identify`` that is still there as the same file (the
    inode too: never another job's file that took the name since); the paths removed. Call it
    once the processes that mapped them have ended. Never raises."""
    removed = []
    for path, inode in entries:
        name = os.path.basename(path)
        if os.path.dirname(path) + "/" != SHM_DIR or not name.startswith(PREFIXES):
            continue
        try:
            if os.stat(path).st_ino == int(inode):
                os.unlink(path)
                removed.append(path)
        except (OSError, ValueError):
            continue
    return removed


def _started(pid: int) -> float | None:
    """When process ``pid`` started (seconds since the epoch); None where unknown."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            ticks = int(f.read().rsplit(")", 1)[1].split()[19])
        with open("/proc/stat") as f:
            boot = next(int(line.split()[1]) for line in f if line.startswith("btime "))
        return boot + ticks / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError, StopIteration):
        return None


SLACK = 2.0  # seconds: the boot time /proc gives is whole seconds


def check_own(maps: str = "/proc/self/maps", since: float | None = None) -> list[str]:
    """What is wrong with each MPICH shared-memory file ``maps`` lists: mapped but removed, its
    name now another file, another user's, readable or writable by others, or made before
    ``since`` (default: when this process's parent — the process manager that started the
    job's ranks here — started). [] when all are this user's own."""
    try:
        with open(maps, errors="surrogateescape") as f:
            lines = f.read().splitlines()
    except OSError:
        return []
    since = _started(os.getppid()) if since is None else since
    problems, seen = [], set()
    for line in lines:
        fields = line.split(None, 5)
        path = fields[5] if len(fields) == 6 else ""
        name = path[len(SHM_DIR):]
        if not path.startswith(SHM_DIR) or not name.startswith(PREFIXES) or path in seen:
            continue
        seen.add(path)
        if path.endswith(" (deleted)"):
            problems.append(f"{path[:-10]} was removed after MPI opened it")
            continue
        try:
            st = os.stat(path, follow_symlinks=False)
        except OSError as e:
            problems.append(f"{path} cannot be checked ({e.strerror})")
            continue
        if str(st.st_ino) != fields[4]:
            problems.append(f"{path} is no longer the file MPI opened")
        elif st.st_uid != os.geteuid():
            problems.append(f"{path} belongs to uid {st.st_uid}, not to this job's user "
                            f"(uid {os.geteuid()}): another user made it first")
        elif st.st_mode & 0o077:
            problems.append(f"{path} has mode {st.st_mode & 0o777:o}: other users may open it")
        elif since is not None and st.st_ctime < since - SLACK:
            problems.append(f"{path} is older than this job: another job left it")
    return problems


def _file(folder: str, rank) -> str:
    return os.path.join(folder, f"shm-{int(rank)}")


def record(folder: str | None, rank) -> None:
    """Write ``host inode path`` of each MPICH file this process has mapped into ``folder``
    (the launcher's), for ``remove_recorded``. Never raises."""
    if not folder or rank is None or not status.own_folder(folder):
        return
    try:
        host = socket.gethostname()
        lines = [f"{host} {inode} {path}\n" for path, inode in identify()]
        if lines:
            fd = os.open(_file(folder, rank), os.O_WRONLY | os.O_CREAT | os.O_TRUNC
                         | os.O_NOFOLLOW, 0o600)
            with os.fdopen(fd, "w") as f:
                f.writelines(lines)
    except Exception:  # noqa: BLE001, S110 - best effort: the job runs the same without it
        pass


def remove_recorded(folder: str) -> list[str]:
    """After the job has ended: remove the files its ranks on this machine recorded that are
    still there as the same file (a job that ended by ``MPI_Finalize`` left none); the paths
    removed. Never raises."""
    entries = set()
    try:
        host, names = socket.gethostname(), os.listdir(folder)
    except Exception:  # noqa: BLE001 - best effort: the job's exit code stands
        return []
    for name in names:
        try:
            if name.startswith("shm-"):
                fd = os.open(os.path.join(folder, name), os.O_RDONLY | os.O_NOFOLLOW)
                with os.fdopen(fd) as f:
                    fields = [line.rstrip("\n").split(" ", 2) for line in f]
                entries.update((e[2], e[1]) for e in fields if len(e) == 3 and e[0] == host)
        except Exception:  # noqa: BLE001, S112 - a record that is not a file of ours: skipped
            continue
    return remove_same(sorted(entries))


__all__ = ["mapped", "unlink_mapped", "identify", "remove_same", "record", "remove_recorded",
           "check_own"]
