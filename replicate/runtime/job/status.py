"""Each rank's status record, kept for ``replicate.launch``: did every rank finish its script?

MPICH's ``mpiexec`` cannot tell a rank that finished from one that left early with exit code 0
(``os._exit(0)`` mid-run ends the others silently and ``mpiexec`` returns 0). So the launcher
gives the ranks a folder (``REPLICATE_LAUNCH_DIR``), and the bootstrap (``python -m replicate``)
of each rank keeps a small fixed-size record there, ``rank-<R>``, memory-mapped: its pid and host,
how far it got (``STARTED``: the interpreter runs; ``RUNNING``: MPI is up; ``DONE``: the script
finished; ``FAILED``: it failed and ended the job), its exit code and the step it is at (one
memory store per step, no system call). After ``mpiexec`` returns, the launcher reads every
record: a rank that is not ``DONE`` left early, whatever ``mpiexec`` returned. Each rank also
holds a connection to the launcher's socket in that folder, which the kernel closes when the
process ends: the order of the closes tells the rank that left from those mpiexec then killed.

A rank on another host makes a folder of the same path there (private to the user) and keeps its
record in it; the launcher fetches those records when the job has ended (``launch/remote.py``).
A folder that is a link, another user's, or writable by others gets no record, and no record is
opened through a link (``own_folder``, ``O_NOFOLLOW``).
"""

from __future__ import annotations

import fcntl
import mmap
import os
import socket
import stat
import struct

ENV = "REPLICATE_LAUNCH_DIR"
SOCKET = "ranks.sock"  # the launcher's: each rank connects, the kernel closes it at the end
STARTED, RUNNING, DONE, FAILED = 1, 2, 3, 4
STATE_NAMES = {STARTED: "started", RUNNING: "running", DONE: "done", FAILED: "failed"}
NO_STEP = -1
_FORMAT = "<4siiiq64s200s"  # magic, pid, state, exit code, step, host, why (a failure's line)
_MAGIC = b"RPST"
SIZE = struct.calcsize(_FORMAT)
_STEP_OFFSET = struct.calcsize("<4siii")
_WHY_OFFSET, _WHY_SIZE = struct.calcsize("<4siiiq64s"), 200


class Record:
    """This rank's record, written in place (a memory map of the file)."""

    def __init__(self, path: str):
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
        try:
            os.ftruncate(fd, SIZE)
            self._map = mmap.mmap(fd, SIZE)
        finally:
            os.close(fd)
        self.pid = os.getpid()
        self.state, self.code = STARTED, 0
        host = socket.gethostname().encode()[:64]
        struct.pack_into(_FORMAT, self._map, 0, _MAGIC, self.pid, STARTED, 0, NO_STEP, host, b"")

    def set_reason(self, text: str) -> None:
        """Why this rank failed, in one line (a traceback's last: the exception); the first
        reason stands."""
        if self._map[_WHY_OFFSET] == 0:
            line = text.encode(errors="replace")[:_WHY_SIZE - 1]
            self._map[_WHY_OFFSET:_WHY_OFFSET + len(line)] = line

    def set_step(self, step) -> None:
        struct.pack_into("<q", self._map, _STEP_OFFSET, NO_STEP if step is None else int(step))

    def set_state(self, state: int, code: int = 0) -> None:
        if self.state in (DONE, FAILED):  # the first verdict stands (an abort after a failure)
            return
        self.state, self.code = state, int(code)
        struct.pack_into("<ii", self._map, struct.calcsize("<4si"), state, int(code))


_RECORD: Record | None = None


def own_folder(folder) -> bool:
    """``folder`` is a folder (not a link) of this user that no other user may write to."""
    try:
        st = os.lstat(folder)
    except (OSError, TypeError):
        return False
    return stat.S_ISDIR(st.st_mode) and st.st_uid == os.geteuid() and not st.st_mode & 0o022


def open_record(rank) -> Record | None:
    """This process's record in the launcher's folder, once per process; None when not started
    by ``replicate.launch`` (no folder), or the folder is not the user's own."""
    global _RECORD
    folder = os.environ.get(ENV)
    if _RECORD is None and folder and not os.path.lexists(folder):
        try:  # another host than the launcher's: the folder is made here (``launch/remote.py``)
            os.mkdir(folder, 0o700)
        except OSError:
            pass
    if _RECORD is None and folder and own_folder(folder):
        try:
            _RECORD = Record(os.path.join(folder, f"rank-{int(rank)}"))
        except OSError:
            return None
        _connect(os.path.join(folder, SOCKET), rank)
    return _RECORD


_LINK: list = []  # the connection to the launcher (a descriptor), kept open to the end


def _connect(path: str, rank) -> None:
    """Tell the launcher this process is rank ``rank``; the kernel closes the connection when
    the process ends, however it ends (the launcher learns which rank ended first)."""
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as link:
            link.connect(path)
            link.sendall(f"{int(rank)}\n".encode())
            _LINK.append(_above_pmi(link.fileno()))
    except OSError:
        return
    os.register_at_fork(after_in_child=_forget)


def _above_pmi(link: int) -> int:
    """A duplicate of ``link`` (the caller closes its own) numbered above hydra's PMI
    connection (``PMI_FD``), so that this connection is released after the link when the
    process ends: hydra kills the other ranks the moment the PMI connection closes, and the
    launcher must see this rank's link close before theirs to name it. A dead process's files
    are released through task work, which Linux (5.x and later) runs last-queued first, and they
    are queued in descriptor order: the higher descriptor is released first. (With the link
    below ``PMI_FD``, as inherited descriptors made it, hydra's kill raced this rank's own
    release, and the launcher named a rank hydra killed in about half the runs.)"""
    try:
        pmi = int(os.environ.get("PMI_FD", ""))
        os.fstat(pmi)
    except (ValueError, OSError):
        pmi = 0
    return fcntl.fcntl(link, fcntl.F_DUPFD_CLOEXEC, pmi + 1)


def _forget() -> None:
    """In a forked child (an input worker): the record and the link are the parent's."""
    global _RECORD
    _RECORD = None
    for fd in _LINK:
        os.close(fd)
    _LINK.clear()


def record() -> Record | None:
    return _RECORD


def set_step(step) -> None:
    if _RECORD is not None:
        _RECORD.set_step(step)


def set_state(state: int, code: int = 0) -> None:
    if _RECORD is not None and os.getpid() == _RECORD.pid:
        _RECORD.set_state(state, code)


def set_reason(text: str) -> None:
    """Record why this rank fails: the last non-empty line of ``text`` (a report or traceback,
    its ``[rank R]`` prefix dropped), for the launcher's restart log."""
    if _RECORD is None or os.getpid() != _RECORD.pid:
        return
    lines = [line for line in text.strip().splitlines() if line.strip()]
    if lines:
        last = lines[-1]
        if last.startswith("[rank ") and "] " in last:
            last = last.split("] ", 1)[1]
        _RECORD.set_reason(last.strip())


def read(folder: str) -> dict[int, dict]:
    """{rank: {"pid", "state", "code", "step", "host", "why"}} of every record in ``folder``."""
    found = {}
    for name in os.listdir(folder):
        if not name.startswith("rank-") or not name[5:].isdigit():
            continue
        try:
            fd = os.open(os.path.join(folder, name), os.O_RDONLY | os.O_NOFOLLOW)
            try:
                raw = os.read(fd, SIZE)
            finally:
                os.close(fd)
        except OSError:
            continue
        if len(raw) != SIZE:
            continue
        magic, pid, state, code, step, host, why = struct.unpack(_FORMAT, raw)
        if magic != _MAGIC:
            continue
        found[int(name[5:])] = {"pid": pid, "state": state, "code": code,
                                "step": None if step == NO_STEP else step,
                                "host": host.rstrip(b"\0").decode(errors="replace"),
                                "why": why.split(b"\0", 1)[0].decode(errors="replace")}
    return found


__all__ = ["ENV", "STARTED", "RUNNING", "DONE", "FAILED", "open_record", "own_folder", "read",
           "set_reason", "set_step", "set_state"]
