"""The two-level all-reduce: within each host first, one buffer per host across the network.

Found at start-up from MPI's shared-memory split (``Split_type(COMM_TYPE_SHARED)``): the ranks
of each host, and for each local rank ``j`` the ranks with local rank ``j`` on every host (the
``cross`` communicator). Used when there are several hosts, several ranks on each, the same
number on every host, and each host's ranks consecutive in rank order (``-ppn``, a hostfile's
``host:n`` lines); otherwise the flat path of ``comm.py`` runs.

A reduction of ``x`` then goes in three stages, each over a slice of the buffer that local rank
``j`` owns:

1. within the host (shared memory): an all-to-all hands local rank ``j`` slice ``j`` of every
   local rank's buffer;
2. across the hosts, a chain in host order: host 0 combines its rows and sends the partial to
   host 1, which adds its own rows in local-rank order and sends it on; the last host holds the
   result, which goes back down the chain. Each slice goes in pieces of ``network_chunk_bytes``,
   so the hosts work on different pieces at once and the links carry each piece once each way;
3. within the host: the slices are all-gathered.

Every element is therefore combined in rank order, left to right, as the flat path combines it
(``combine``): the result is bitwise the flat path's, on every rank. Each link carries the
buffer once each way, however many ranks share the host (the flat path sends each rank's share).

Settings (``configure``, or the environment at start-up): ``two_level`` (``REPLICATE_TWO_LEVEL``,
default on), ``local_chunk_bytes`` (the pieces each of the three stages handles at a time,
``REPLICATE_LOCAL_CHUNK``, 4 MB), ``network_chunk_bytes`` (a piece of the chain,
``REPLICATE_NETWORK_CHUNK``, 1 MB), ``network_compress`` (``None``, ``"bfloat16"`` or
``"float16"``: float buffers cross the network in that type, each partial rounded to it before
it leaves a host, and the result too, so every rank holds the same bits —
``REPLICATE_NETWORK_COMPRESS``; this changes the result, so it is off by default). A step's
``compress`` option (bucketing) casts before both levels; this one only on the network.
"""

from __future__ import annotations

import os
import socket
from dataclasses import dataclass, replace

import numpy as np

from ...dtypes import as_dtype, is_float
from ...errors import ReplicateError

UFUNC = {"sum": np.add, "max": np.maximum, "min": np.minimum}
_FORWARD, _BACK = 1, 2  # the chain's message tags (on the levels' own communicators)


def combine(rows, op: str, out=None) -> np.ndarray:
    """``rows[0] op rows[1] op ...``, left to right (into ``out`` if given): IEEE-exact like MPI's
    own two-operand sum (``np.sum`` starts from +0.0 and turns ``-0.0 + -0.0`` into ``+0.0``)."""
    ufunc = UFUNC[op]
    if out is None:
        out = np.array(rows[0])  # (a copy, and an array also where the rows are 0-d)
    else:
        out[...] = rows[0]
    for row in rows[1:]:
        ufunc(out, row, out=out)
    return out


@dataclass(frozen=True)
class Settings:
    two_level: bool = True
    local_chunk_bytes: int = 4 << 20
    network_chunk_bytes: int = 1 << 20
    network_compress: str | None = None


def _from_environment(environ) -> Settings:
    def number(name, default):
        value = environ.get(name, "").strip()
        if not value:
            return default
        if not value.isdigit() or int(value) < 1:
            raise ReplicateError(f"{name} must be a positive number of bytes, got {value!r}")
        return int(value)

    flag = environ.get("REPLICATE_TWO_LEVEL", "1").strip()
    if flag not in ("0", "1"):
        raise ReplicateError(f"REPLICATE_TWO_LEVEL must be 0 or 1, got {flag!r}")
    return _checked(Settings(flag == "1", number("REPLICATE_LOCAL_CHUNK", 4 << 20),
                             number("REPLICATE_NETWORK_CHUNK", 1 << 20),
                             environ.get("REPLICATE_NETWORK_COMPRESS", "").strip() or None))


def _checked(s: Settings) -> Settings:
    if s.network_compress not in (None, "bfloat16", "float16"):
        raise ReplicateError(f"network_compress must be None, 'bfloat16' or 'float16', got "
                             f"{s.network_compress!r}")
    for name in ("local_chunk_bytes", "network_chunk_bytes"):
        if int(getattr(s, name)) < 1:
            raise ReplicateError(f"{name} must be at least 1 byte, got {getattr(s, name)!r}")
    return s


SETTINGS = [Settings()]  # the settings in force (read at each reduction)


def configure(**changes) -> Settings:
    """Change the two-level reduction's settings (see the module's docstring), the same on
    every rank; returns the previous ones."""
    previous = SETTINGS[0]
    SETTINGS[0] = _checked(replace(previous, **changes))
    return previous


def settings() -> Settings:
    return SETTINGS[0]


def _bytes(x: np.ndarray) -> np.ndarray:
    return x.reshape(-1).view(np.uint8)


class Levels:
    """This rank's place among the hosts: its host's communicator (``local``) and the chain of
    the ranks with its local rank on every host (``cross``, ranked in host order)."""

    def __init__(self, MPI, local, cross):  # noqa: N803 - the module's name
        self.MPI, self.local, self.cross = MPI, local, cross
        self.local_rank, self.local_size = local.Get_rank(), local.Get_size()
        self.host, self.hosts = cross.Get_rank(), cross.Get_size()

    @classmethod
    def find(cls, MPI, comm):  # noqa: N803
        """(local rank, local size, Levels or None, each rank's host: (its first rank, its
        name)) of ``comm`` (a collective call)."""
        rank = comm.Get_rank()
        local = comm.Split_type(MPI.COMM_TYPE_SHARED, key=rank)
        lr, ls = local.Get_rank(), local.Get_size()
        first = local.allreduce(rank, op=MPI.MIN)  # (the host's first rank)
        place = comm.allgather((rank - lr == first, ls, (first, socket.gethostname())))
        hosts = [host for _, _, host in place]
        blocks = all(ok for ok, _, _ in place) and len({size for _, size, _ in place}) == 1
        if not (blocks and 1 < ls < len(place)):  # (a decision every rank reaches alike)
            local.Free()
            return lr, ls, None, hosts
        cross = comm.Split(lr, comm.Get_rank())
        return lr, ls, cls(MPI, local, cross), hosts

    def dup(self):
        return Levels(self.MPI, self.local.Dup(), self.cross.Dup())

    def allreduce(self, x: np.ndarray, op: str, out: np.ndarray) -> None:
        """``out`` = the rank-ordered combination of every rank's ``x`` (flat, C-contiguous;
        ``out`` may be ``x``)."""
        n, item, lsize = x.size, x.itemsize, self.local_size
        bounds = np.linspace(0, n, lsize + 1).astype(np.int64)
        counts = np.diff(bounds)
        mine = int(counts[self.local_rank])
        rows = np.empty((lsize, mine), x.dtype)
        self.local.Alltoallv(
            [_bytes(x), (counts * item).tolist(), (bounds[:-1] * item).tolist(), self.MPI.BYTE],
            [_bytes(rows), [mine * item] * lsize, [i * mine * item for i in range(lsize)],
             self.MPI.BYTE])
        part = np.empty(mine, x.dtype)
        self._chain(rows, op, part)
        self.local.Allgatherv([_bytes(part), self.MPI.BYTE],
                              [_bytes(out), (counts * item).tolist(),
                               (bounds[:-1] * item).tolist(), self.MPI.BYTE])

    def _chain(self, rows: np.ndarray, op: str, out: np.ndarray) -> None:
        """``out`` = the hosts' rows combined in host order: received from the previous host,
        this host's rows added, sent on; the last host's result comes back down the chain. A
        middle host handles whichever piece arrives first, a partial going up or a result
        coming back, so results flow back while partials still come in (in order, a host
        passed every partial up before the first result back: twice the chain's time)."""
        s = settings()
        wire = as_dtype(s.network_compress) if (
            s.network_compress and is_float(out.dtype) and out.itemsize > 2) else out.dtype
        step = max(1, s.network_chunk_bytes // out.itemsize)
        h, last, ufunc = self.host, self.hosts - 1, UFUNC[op]
        starts = range(0, out.size, step)
        up, sent, inbox = {}, [], []  # piece -> its send up; sends back; (request, buf, kind, i)

        def partial(i, piece):  # this host's rows added to the partial ``piece`` holds
            lo = starts[i]
            for row in rows:
                ufunc(piece, row[lo:lo + step], out=piece)

        def leave(i, piece):  # the piece in the wire's type, then up the chain (or back down)
            if wire != out.dtype:
                piece[...] = piece.astype(wire)
            if h < last:
                up[i] = self._send(piece, wire, h + 1, _FORWARD)
            elif h > 0:
                sent.append(self._send(piece, wire, h - 1, _BACK))

        for i, lo in enumerate(starts):
            if h == 0:
                combine(rows[:, lo:lo + step], op, out[lo:lo + step])
                leave(i, out[lo:lo + step])
            else:
                inbox.append((*self._irecv(out[lo:lo + step].size, wire, h - 1, _FORWARD),
                              "up", i))
            if h < last:
                inbox.append((*self._irecv(out[lo:lo + step].size, wire, h + 1, _BACK),
                              "back", i))
        ready, turn = {}, {"up": 0, "back": 0}  # arrived, not yet handled; the next to handle
        while inbox:
            _, buf, kind, i = inbox.pop(self.MPI.Request.Waitany([r[0] for r in inbox]))
            ready[kind, i] = buf
            # each stream in piece order (a later, smaller piece can arrive first, and what is
            # sent on must keep the order the next host's receives were posted in)
            while (kind, turn[kind]) in ready:
                i = turn[kind]
                buf, turn[kind] = ready.pop((kind, i)), i + 1
                piece = out[starts[i]:starts[i] + step]
                if kind == "up":
                    piece[...] = buf
                    partial(i, piece)
                    leave(i, piece)
                    continue
                up[i][0].Wait()  # (the partial went up before its result overwrites it)
                piece[...] = buf
                if h > 0:
                    sent.append(self._send(piece, wire, h - 1, _BACK))
        self.MPI.Request.Waitall([r for r, _ in sent + list(up.values())])

    def _irecv(self, size, wire, source, tag):
        buf = np.empty(size, wire)
        return self.cross.Irecv(_bytes(buf), source=source, tag=tag), buf

    def _send(self, piece, wire, dest, tag):
        buf = piece if wire == piece.dtype else piece.astype(wire)  # (kept alive until sent)
        return self.cross.Isend(_bytes(buf), dest=dest, tag=tag), buf

    def free(self):
        self.local.Free()
        self.cross.Free()


SETTINGS[0] = _from_environment(os.environ)

__all__ = ["Levels", "Settings", "combine", "configure", "settings"]
