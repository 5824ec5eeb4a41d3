"""The communication thread: bucketed all-reduces run here while the step goes on computing.

``comm_start`` (a graph node) hands a flat buffer to the one thread and returns a handle;
``comm_wait`` blocks until that bucket is reduced. The thread takes buckets strictly in the order
they were started, which is the same on every rank (it is the compiled graph's order), so the
reductions stay fixed-order and reproducible. It talks on its own duplicate of the replicas'
communicator (the world, or an ``ActorLearner``'s learners), so its traffic never mixes with
collectives the main thread issues meanwhile.

An exchange whose wait comes before anything else computes (bucketing marks it ``inline``: a
cross-replica BatchNorm's statistics, the step's last bucket) has nothing to overlap with: handing
it to the thread only adds two thread switches and a second busy thread beside the step's. It
runs on the caller's thread instead, over the thread's communicator, when the thread is idle —
every exchange started before it has completed — so each communicator still sees the exchanges
in the one order every rank agrees on, whichever thread runs them. (Whether the thread is idle
differs between ranks; the order does not.)
"""

from __future__ import annotations

import queue
import threading

import numpy as np

from ... import profile
from .comm import group

_threads: dict = {}  # communicator label -> its communication thread
_lock = threading.Lock()


class Handle:
    """A bucket in flight: ``result()`` waits for it and returns the reduced buffer."""

    __slots__ = ("_done", "_value", "_error")

    def __init__(self):
        self._done = threading.Event()
        self._value = None
        self._error = None

    def result(self):
        self._done.wait()
        if self._error is not None:
            raise self._error
        return self._value


class CommThread:
    def __init__(self, comm):
        self.comm = comm
        self.jobs: queue.SimpleQueue = queue.SimpleQueue()
        # jobs handed to the thread, and those it has finished (each written by one side only):
        # equal when the thread is idle, waiting for the next
        self.submitted = self.finished = 0
        self.inlined = 0  # exchanges run on the caller's thread (``submit(inline=True)``)
        self._submitting = threading.Lock()  # (one submitter at a time sees the thread idle)
        self.thread = threading.Thread(target=self._loop, name="replicate-comm", daemon=True)
        self.thread.start()

    def submit(self, fn, *args, kind: str = "allreduce", inline: bool = False) -> Handle:
        """Run ``fn(comm, *args)`` on the thread (``kind``: the profiler's name for it); with
        ``inline``, now on this thread if the thread is idle (see the module's docstring)."""
        handle = Handle()
        with self._submitting:
            if inline and self.finished == self.submitted:
                self.inlined += 1
                self._run(handle, fn, args, f"{kind} (inline)")
                return handle
            self.submitted += 1
            self.jobs.put((handle, fn, args, kind))
        return handle

    def _run(self, handle, fn, args, label):
        profiler = profile.active()
        start = profiler.now() if profiler is not None else 0
        try:
            handle._value = fn(self.comm, *args)
        except BaseException as e:  # handed to whoever waits for this bucket
            handle._error = e
        if profiler is not None:
            profiler.add(label, "communication", start, profiler.now(),
                         bytes=int(getattr(args[0], "nbytes", 0)))
        handle._done.set()

    def _loop(self):
        while True:
            handle, fn, args, kind = self.jobs.get()
            try:
                self._run(handle, fn, args, f"{kind} (communication thread)")
            finally:
                self.finished += 1  # (after its last MPI call: the caller may use the comm)


def comm_thread(label: str | None = None) -> CommThread:
    """The process's communication thread for a communicator (started on first use, on a
    duplicate of it; ``None``: the replicas' communicator — the world, or an ``ActorLearner``'s
    learners — else a group of processes of model parallelism)."""
    comm = group(label)
    with _lock:
        if comm.label not in _threads:
            _threads[comm.label] = CommThread(comm.dup())
        return _threads[comm.label]


def start_allreduce(x, op: str, inplace: bool = False, comm: str | None = None,
                    inline: bool = False) -> Handle:
    """Reduce ``x`` on the communication thread (over ``x`` itself if ``inplace``: a bucket;
    ``inline``: on this thread if the communication thread is idle, ``CommThread.submit``).

    ``x`` may be a list of arrays: a bucket left unpacked (its parts, as the JAX backend
    hands them over, see ``backends/jax_host.py``), reduced over themselves; the handle's result
    is that list."""
    if isinstance(x, list):
        return comm_thread(comm).submit(reduce_parts, x, op, inline=inline)
    return comm_thread(comm).submit(lambda c, x: c.allreduce(x, op, inplace), x, inline=inline)


PACK_BELOW = 1 << 20  # parts of an unpacked bucket smaller than this travel packed together


def reduce_parts(comm, parts: list, op: str) -> list:
    """Reduce each of ``parts`` (writeable C-contiguous arrays of one dtype) over itself, as
    one packed bucket of them would be: every element is combined the same way (the reductions
    are elementwise and fixed-order), so the bits are the packed bucket's. The small parts go
    together in one packed exchange, each large one in its own: the large ones are never
    copied. (So the exchanges are not the packed bucket's, which goes in pieces of the
    communicator's chunk size: every rank must reduce a bucket the same way, as parts or
    packed.)"""
    small = [p for p in parts if p.nbytes < PACK_BELOW]
    if len(small) < 2:  # (a lone small part goes as it is)
        small = []
    if small:
        packed = comm.allreduce(np.concatenate([p.reshape(-1) for p in small]), op, True)
        offset = 0
        for p in small:
            p[...] = packed[offset:offset + p.size].reshape(p.shape)
            offset += p.size
    together = {id(p) for p in small}
    for p in parts:
        if id(p) in together:
            continue
        reduced = comm.allreduce(p, op, True)
        if not (reduced.ctypes.data == p.ctypes.data and reduced.strides == p.strides):
            p[...] = reduced
    return parts
