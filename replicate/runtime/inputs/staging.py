"""Batches copied to the device on the prefetch thread, ahead of their step.

With input prefetch on (``Replicator(..., prefetch=n)``) and a device backend (``cupy``,
``jax``), the prefetch thread copies each batch it draws to the device as well — CuPy: on a
stream of its own, recording an event after the copies; JAX: ``jax.device_put`` — so the copy
overlaps the step before it. The step's thread waits for that event before its kernels read the
batch (``Staged.take``); the host batch stays beside it for everything else (the signature,
errors that describe the batch, eager mode). The backend is known once the first step is
compiled: batches drawn before that (the first ones) go up on the step's thread, as with
``prefetch=0``, which uploads every batch there. A batch the backend cannot stage (a copy that
fails) goes up on the step's thread too.

>>> b = Batches([1, 2]); b.staged is None and b == [1, 2]
True
"""

from __future__ import annotations

from ...step import batch_leaves


class Batches(list):
    """Every local replica's batch (a list), with ``staged``: its leaves on the device, or
    None."""

    staged = None


def stage(batches: list, stager) -> list:
    """``batches`` with their leaves copied up by ``stager`` (``Executable.stage``), if any."""
    if stager is None or any(b is None for b in batches):
        return batches
    out = Batches(batches)
    try:
        out.staged = stager(batch_leaves(batches))
    except Exception:  # noqa: BLE001 - not stageable: copied up by the step, which names it
        out.staged = None
    return out


def run_step(step, batches, prefetcher, keep_inputs: bool):
    """``step.run`` on ``batches``: their staged device leaves where the prefetch thread made
    them (waiting for their copy first), else the host leaves. Tells ``prefetcher`` how to
    stage the batches it draws next (the step's backend)."""
    if prefetcher is not None:
        prefetcher.stager = getattr(step.executable, "stage", None)
    staged = getattr(batches, "staged", None)
    if staged is None:
        return step.run(batch_leaves(batches), keep_inputs=keep_inputs)
    try:
        return step.run(staged.take(), keep_inputs=keep_inputs)
    finally:
        staged.release()


__all__ = ["Batches", "run_step", "stage"]
