"""Asynchronous checkpoints: the state copied at a step boundary, written by a thread of its own.

``rp.callbacks.Checkpoint(..., asynchronous=True)`` hands each save to a :class:`BackgroundWriter`.
At the step boundary the main thread only waits for the previous write (one in flight at a
time), raises its error if it failed, and copies the state's values into buffers kept from save
to save (a memory copy). The buffers are allocated and their pages mapped beforehand, on a
thread of their own (``stage``: when the callback is made, again when a step first shows the
state's layout): mapping fresh memory costs more than the copy (on the bench's VM, 0.07-1 s for
200 MB against 0.04 s), so the first save would otherwise block several times longer than the
later ones. A layout that changes later (a buffer of the wrong shape) is allocated by the copy
itself. A state given as an object with ``.variables()`` is expanded at the step boundary too
(never read by the thread: the live Variables move on). The thread then calls the
ordinary ``checkpoint.save`` on that copy, so the file is the synchronous save's, with all of
its guarantees: written atomically by rank 0 (a temporary file, fsync, rename — a process killed
mid-write leaves the previous checkpoint as it was), the ranks' copies compared first (diverged
state is a ``DivergenceError``, nothing written), sharded state gathered, and the same error on
every rank when the write fails. The copy is taken where the synchronous save would write, after
the step was committed: with ``check_finite`` a non-finite step was refused before it. The
thread talks over its own duplicate of the replicas' communicator, so its exchanges never mix
with the training's. ``wait()`` (``Replicator.run`` calls it at its end, and before it
raises an error of a step) waits for the last write and raises its error.
"""

from __future__ import annotations

import copy
import mmap
import threading

import numpy as np

from ... import profile
from ...errors import ReplicateError
from ...state import Variable
from . import checkpoint


class BackgroundWriter:
    """One checkpoint write at a time, on a thread, over a duplicate of ``comm``."""

    def __init__(self, comm=None, state=None):
        self.comm = None
        self._thread: threading.Thread | None = None
        self._error: BaseException | None = None
        self._buffers: dict = {}  # (path in the state nest) -> the array the copy goes into
        self._staged: dict = {}  # (path in the state nest) -> (shape, dtype) asked of staging
        self._staging: list[threading.Thread] = []
        if comm is not None:
            self.connect(comm)
        if state is not None:
            self.stage(state)

    def connect(self, comm) -> None:
        """The replicas' communicator (every rank calls it alike: it is duplicated)."""
        if self.comm is None:
            self.comm = comm.dup() if comm.size > 1 else comm

    def stage(self, state) -> None:
        """Allocate and map the buffers a copy of ``state`` as it is now goes into, on a
        thread (``submit`` waits for it): only those not asked for already with this shape."""
        wanted = {}
        for prefix, held in _layout(_nest(state), ""):
            key = (tuple(held.shape), np.dtype(held.dtype))
            if self._staged.get(prefix) != key:
                self._staged[prefix] = wanted[prefix] = key
        if wanted:
            thread = threading.Thread(target=self._allocate, args=(wanted,), daemon=True,
                                      name="checkpoint staging")
            self._staging.append(thread)
            thread.start()

    def submit(self, path: str, state, step: int, verify: bool = True, then=None,
               run: str | None = None, meta: dict | None = None) -> None:
        """Copy ``state`` now; write it to ``path`` (naming ``run``) on the thread, then call
        ``then()``."""
        self.wait()
        while self._staging:
            self._staging.pop(0).join()
        frozen = self._copy(_nest(state), "")
        self._thread = threading.Thread(target=self._write, name=f"checkpoint {path}",
                                        args=(path, frozen, step, verify, then, run, meta))
        self._thread.start()

    def wait(self) -> None:
        """Wait for the write in flight; raise its error (the same on every rank)."""
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        error, self._error = self._error, None
        if error is not None:
            raise error

    def _write(self, path, frozen, step, verify, then, run, meta=None):
        try:
            with profile.span("checkpoint write (background)", "checkpoint"):
                checkpoint.save(path, frozen, step=step, comm=self.comm, verify=verify, run=run,
                                meta=meta)
            if then is not None:
                then()
        except BaseException as e:  # noqa: BLE001 - raised by the next submit or wait
            self._error = e

    def _allocate(self, wanted: dict) -> None:
        for prefix, (shape, dtype) in wanted.items():
            buffer = _mapped(shape, dtype)
            if self._staged.get(prefix) == (shape, dtype):  # (not asked for anew meanwhile)
                self._buffers[prefix] = buffer

    def _copy(self, nest, prefix):
        if isinstance(nest, dict):
            return {k: self._copy(v, f"{prefix}{k}/") for k, v in nest.items()}
        if isinstance(nest, (list, tuple)):
            return type(nest)(self._copy(v, f"{prefix}{i}/") for i, v in enumerate(nest))
        if not isinstance(nest, Variable):
            return nest  # (save names what it cannot write)
        if nest.released is not None or nest.home is not None:
            raise ReplicateError(
                f"Checkpoint(asynchronous=True) with model parallelism: Variable {nest.name!r} "
                "lives on one logical device; use asynchronous=False")
        value = nest.value
        buffer = self._buffers.get(prefix)
        if buffer is None or buffer.shape != value.shape or buffer.dtype != value.dtype:
            buffer = self._buffers[prefix] = np.empty_like(value)
        np.copyto(buffer, value)
        twin = copy.copy(nest)  # (not a live Variable: no step reads it)
        twin.value, twin._eager = buffer, None
        return twin


def _mapped(shape, dtype) -> np.ndarray:
    """An array of fresh memory with every page mapped now: in one call where Linux has
    ``MAP_POPULATE`` (steadier than a fault per page: 60-100 ms for 200 MB on the bench's VM,
    against 30-500 ms), each page touched otherwise."""
    nbytes = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
    populate = getattr(mmap, "MAP_POPULATE", 0)
    if populate and nbytes >= mmap.PAGESIZE:
        memory = mmap.mmap(-1, nbytes, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS | populate)
        return np.frombuffer(memory, dtype).reshape(shape)
    buffer = np.empty(shape, dtype)
    buffer.reshape(-1).view(np.uint8)[::mmap.PAGESIZE] = 0
    return buffer


def _nest(state):
    """The nest of Variables ``checkpoint.save`` writes (an object's ``.variables()``)."""
    return state.variables() if callable(getattr(state, "variables", None)) else state


def _layout(nest, prefix):
    """(path, the array now held) for each Variable of ``nest`` whose value this process holds."""
    if isinstance(nest, dict):
        for k, v in nest.items():
            yield from _layout(v, f"{prefix}{k}/")
    elif isinstance(nest, (list, tuple)):
        for i, v in enumerate(nest):
            yield from _layout(v, f"{prefix}{i}/")
    elif isinstance(nest, Variable) and nest.released is None and nest.home is None:
        yield prefix, nest.held


__all__ = ["BackgroundWriter"]
