"""Asynchronous checkpoints: the state copied at a step boundary, written by a thread of its own.

``rp.callbacks.Checkpoint(..., asynchronous=True)`` hands each save to a :class:`BackgroundWriter`.
At the step boundary the main thread only waits for the previous write (one in flight at a
time), raises its error if it failed, and copies the state's values into buffers kept from the
last save (a memory copy: no page faults after the first save). The thread then calls the
ordinary ``checkpoint.save`` on that copy, so the file is the synchronous save's, with all of
its guarantees: written atomically by rank 0 (a temporary file, fsync, rename — a process killed
mid-write leaves the previous checkpoint as it was), the ranks' copies compared first (diverged
state is a ``DivergenceError``, nothing written), sharded state gathered, and the same error on
every rank when the write fails. The copy is taken where the synchronous save would write, after
the step was committed: with ``check_finite`` a non-finite step was refused before it. The
thread talks over its own duplicate of the replicas' communicator, so its exchanges never mix
with the training's. ``wait()`` (``Replicator.run`` calls it at its end) waits for the last
write and raises its error.
"""

from __future__ import annotations

import copy
import threading

import numpy as np

from ... import profile
from ...errors import ReplicateError
from ...state import Variable
from . import checkpoint


class BackgroundWriter:
    """One checkpoint write at a time, on a thread, over a duplicate of ``comm``."""

    def __init__(self, comm):
        self.comm = comm.dup() if comm.size > 1 else comm
        self._thread: threading.Thread | None = None
        self._error: BaseException | None = None
        self._buffers: dict = {}  # (path in the state nest) -> the array the copy goes into

    def submit(self, path: str, state, step: int, verify: bool = True, then=None,
               run: str | None = None) -> None:
        """Copy ``state`` now; write it to ``path`` (naming ``run``) on the thread, then call
        ``then()``."""
        self.wait()
        frozen = self._copy(state, "")
        self._thread = threading.Thread(target=self._write, name=f"checkpoint {path}",
                                        args=(path, frozen, step, verify, then, run))
        self._thread.start()

    def wait(self) -> None:
        """Wait for the write in flight; raise its error (the same on every rank)."""
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        error, self._error = self._error, None
        if error is not None:
            raise error

    def _write(self, path, frozen, step, verify, then, run):
        try:
            with profile.span("checkpoint write (background)", "checkpoint"):
                checkpoint.save(path, frozen, step=step, comm=self.comm, verify=verify, run=run)
            if then is not None:
                then()
        except BaseException as e:  # noqa: BLE001 - raised by the next submit or wait
            self._error = e

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


__all__ = ["BackgroundWriter"]
