"""What a job lets other users reach: its network listeners and its shared memory.

MPICH's ranks and its ``mpiexec`` (hydra) trust whoever connects: the ranks' UCX listeners carry
the job's messages (pickled objects among them) and hydra's control port ends the job on a few
bytes. So, around ``MPI_Init`` (``comm.world``):

* ``before_mpi``: when every rank of the job runs on this machine (hydra's ``MPI_LOCALNRANKS``
  equals ``PMI_SIZE``), UCX leaves out its network transports (``UCX_TLS=^tcp,ib``: shared
  memory and CUDA remain, no TCP listener at all) unless the user set ``UCX_TLS``; and the
  listening sockets this process inherited from ``mpiexec`` (hydra's control port: it listens
  on every interface, and its ranks inherit the socket) are noted;
* ``after_mpi``: once MPI is up every process manager's proxy has connected, so a socket filter
  that drops every packet is attached to those inherited listeners — the port stays open in
  ``ss`` but nobody can connect any more (the kernel drops the SYN) — and the MPICH
  shared-memory files this rank mapped are checked to be this user's own
  (``mpi_shm.check_own``) before the job's first message; otherwise a ``ReplicateError`` says
  why.

A job ``replicate.launch`` starts on one machine runs under its own process manager
(``launch/forker.py``), which listens on nothing: there is no control port to close.
A job over several machines still needs network listeners between its ranks (restrict them with
``UCX_NET_DEVICES``/``UCX_TLS``); see docs/guides/failure-behaviour.md.
"""

from __future__ import annotations

import ctypes
import os
import socket
import struct

from ...errors import ReplicateError
from . import mpi_shm

LOCAL_TLS = "^tcp,ib"  # every transport but the network's (shared memory, CUDA IPC remain)
_SO_ATTACH_FILTER = 26  # (Linux's number; absent from the socket module)
_inherited: list = []


def one_machine(environ) -> bool:
    """Every rank of the job is on this machine (as hydra says; False when unknown)."""
    size, local = environ.get("PMI_SIZE", ""), environ.get("MPI_LOCALNRANKS", "")
    return size.isdigit() and size == local


def listeners() -> list:
    """The listening TCP sockets this process inherited from hydra's ``mpiexec`` (each a new
    ``socket`` on a duplicate of the descriptor): held by this rank's parent (hydra's proxy) and
    by its parent ``mpiexec``, but not by whoever started ``mpiexec`` (a socket that process
    leaked is someone else's, left alone)."""
    proxy = os.getppid()
    server = _parent(proxy)
    if _name(proxy) != "hydra_pmi_proxy" or not _name(server).startswith("mpiexec"):
        return []
    theirs = _sockets(server) - _sockets(_parent(server))
    found = []
    for fd, inode in _sockets_of_fds("self").items():
        if inode not in theirs or inode not in _sockets(proxy):
            continue
        try:
            sock = socket.socket(fileno=os.dup(fd))
        except OSError:
            continue
        try:
            if sock.family in (socket.AF_INET, socket.AF_INET6) and \
                    sock.getsockopt(socket.SOL_SOCKET, socket.SO_ACCEPTCONN):
                found.append(sock)
                continue
        except OSError:
            pass
        sock.close()
    return found


def _sockets_of_fds(pid) -> dict[int, str]:
    """{descriptor: "socket:[inode]"} of process ``pid``'s sockets ({} where unreadable)."""
    found = {}
    try:
        fds = os.listdir(f"/proc/{pid}/fd")
    except OSError:
        return found
    for fd in fds:
        try:
            link = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue
        if link.startswith("socket:"):
            found[int(fd)] = link
    return found


def _sockets(pid) -> set[str]:
    return set(_sockets_of_fds(pid).values()) if pid else set()


def _name(pid) -> str:
    try:
        with open(f"/proc/{pid}/comm") as f:
            return f.read().strip()
    except OSError:
        return ""


def _parent(pid) -> int:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return int(f.read().rsplit(")", 1)[1].split()[1])
    except (OSError, IndexError, ValueError):
        return 0


def before_mpi(environ=os.environ) -> None:
    """Before ``MPI_Init``: shared-memory transports for a one-machine job; note the inherited
    listeners."""
    if one_machine(environ) and not environ.get("UCX_TLS"):
        environ["UCX_TLS"] = LOCAL_TLS
    _inherited.extend(listeners())


def close_to_all(sock) -> None:
    """Drop every packet that reaches listening socket ``sock`` (and every process that shares
    it): no connection can be made any more; the connections made stay."""
    drop = ctypes.create_string_buffer(struct.pack("HBBI", 0x06, 0, 0, 0))  # BPF: return 0
    program = struct.pack("HL", 1, ctypes.addressof(drop))
    sock.setsockopt(socket.SOL_SOCKET, _SO_ATTACH_FILTER, program)


def after_mpi() -> None:
    """Once ``MPI_Init`` has returned: close the inherited listeners to new connections and
    check the shared memory this rank mapped; ``ReplicateError`` when it is not its own."""
    while _inherited:
        sock = _inherited.pop()
        try:
            close_to_all(sock)
        except OSError:
            pass
        finally:
            sock.close()
    problems = mpi_shm.check_own()
    if problems:
        raise ReplicateError(
            "MPI's shared memory is not this job's own, so another user could read or change "
            "its messages; stopping before any is sent: " + "; ".join(problems) + ". Remove the "
            "file(s), or ask who made them, and start the job again.")


__all__ = ["LOCAL_TLS", "after_mpi", "before_mpi", "close_to_all", "listeners", "one_machine"]
