"""Things that happen around ``Replicator.run``: progress bar, metrics log, periodic callbacks.

A callback is any object with ``__call__(replicator, step, outputs)``; it runs on **every** rank
after each step (``outputs`` are the replica-reduced outputs, identical on all ranks), so a callback
that communicates (evaluation with collectives, a checkpoint) stays consistent.
"""

from __future__ import annotations

import json
import os

import numpy as np

from ...errors import ReplicateError
from ..variables import checkpoint, runs
from ..variables.background import BackgroundWriter


def scalars(outputs) -> dict:
    """The scalar leaves of an output nest as {dotted name: float}."""
    out = {}

    def walk(x, prefix):
        if isinstance(x, dict):
            for k in sorted(x):
                walk(x[k], f"{prefix}{k}.")
        elif isinstance(x, (list, tuple)):
            for i, v in enumerate(x):
                walk(v, f"{prefix}{i}.")
        else:
            a = np.asarray(x)
            if a.size == 1:  # also (1,)-shaped leaves, e.g. per-replica outputs of 1 replica
                out[prefix.rstrip(".") or "value"] = float(a.reshape(()))

    walk(outputs, "")
    return out


class Every:
    """Call ``fn(replicator, step, outputs)`` every ``n`` steps (step counts from 1)."""

    def __init__(self, n: int, fn):
        self.n, self.fn = int(n), fn

    def __call__(self, rep, step, outputs):
        if step % self.n == 0:
            self.fn(rep, step, outputs)


class Checkpoint:
    """Save ``state`` every ``every`` steps to ``path_pattern.format(step=...)``; keep the last
    ``keep`` files (0: all) of this run, counting the ones it wrote before a restart.

    The files name their run (``runs.py``): the first save under a pattern that holds another
    run's files is refused unless this job continues that run — it restored from one of them,
    or names it with ``run=ID`` (``info["run"]`` of its files; ``self.run`` once saved) — and
    rotation deletes only this run's files.

    ``asynchronous=True``: the state is copied at the step boundary and written by a thread
    while training goes on (``runtime/variables/background.py``: the same file and guarantees;
    one write in flight, the next save waits for it; ``Replicator.run`` waits for the last one
    at its end, or before it raises a step's error, and a failed write raises there or at the
    next save, on every rank). The copy's buffers (the state's size) are allocated when the
    callback is made, on a thread, so that no save maps fresh memory on the step's thread.

    Resume with ``Replicator.restore(path_pattern, state)``: it takes the newest intact file (a
    truncated or corrupt one is skipped with a warning), so keep at least 2."""

    def __init__(self, path_pattern: str, state, every: int, keep: int = 3,
                 run: str | None = None, asynchronous: bool = False):
        if int(every) < 1 or int(keep) < 0:
            raise ReplicateError(f"Checkpoint: every must be >= 1 and keep >= 0, got every="
                                 f"{every!r}, keep={keep!r}")
        self.pattern, self.state, self.every, self.keep = path_pattern, state, int(every), keep
        self.run = run  # this run's id: given, or settled at the first save
        self.written: list[str] | None = None  # oldest first; found on disk at the first save
        self.asynchronous = bool(asynchronous)
        # (its copy's buffers allocated now, off the step's thread: background.py)
        self.writer = BackgroundWriter(state=state) if self.asynchronous else None
        self._staged = False  # the layout a step gives the state: staged at the first call

    def __call__(self, rep, step, outputs):
        if self.writer is not None and not self._staged:
            self._staged = True
            self.writer.stage(self.state)
        if step % self.every:
            return
        if self.written is None:
            self._claim(rep, step)
        path = self.pattern.format(step=step)
        verify = getattr(rep, "check_sync", True) is not False
        meta = {"replicas": getattr(rep, "num_replicas", None)}  # (a restore compares it)
        if not self.asynchronous:
            checkpoint.save(path, self.state, step=step, comm=rep.comm, run=self.run,
                            verify=verify, meta=meta)
            self._rotate(rep.rank, path)
            return
        self.writer.connect(rep.comm)
        self.writer.submit(path, self.state, step, verify, run=self.run, meta=meta,
                           then=lambda: self._rotate(rep.rank, path))

    def wait(self) -> None:
        """Wait for an asynchronous write in flight; raise its error."""
        if self.writer is not None:
            self.writer.wait()

    def _rotate(self, rank, path):
        if rank == 0:
            if path in self.written:  # a fixed name ("last.npz") was just overwritten: keep it
                self.written.remove(path)
            self.written.append(path)
            while self.keep and len(self.written) > self.keep:
                runs.remove_own(self.written.pop(0), self.run)

    def _claim(self, rep, step) -> None:
        """This run's id (rank 0 looks at the pattern's files; every rank gets its answer, or
        the same ``CheckpointError``) and the files it wrote before ``step``."""
        found, self.written = None, []
        if rep.rank == 0:
            try:
                found = runs.claim(self.pattern, self.run)
                self.written = [p for s, p in reversed(checkpoint.step_files(self.pattern))
                                if s < step and runs.run_of(p) == found]
            except ReplicateError as e:
                found = e
        if rep.comm.size > 1:
            found = rep.comm.bcast_obj(found, 0)
        if isinstance(found, Exception):
            self.written = None
            found.consistent = True  # every rank raises it
            raise found
        self.run = found


def settle(callbacks) -> None:
    """Wait for every callback's work in flight (an asynchronous checkpoint's write), then raise
    the first one's error, if any. ``Replicator.run`` calls it at its end, and before it raises
    an error every rank raises (a step refused, say): a write still in flight then ends before
    ``run`` does, and its error is raised instead (with the run's own error as its context),
    never dropped — the error the synchronous save would have raised at that save's step."""
    error = None
    for cb in callbacks:
        if callable(getattr(cb, "wait", None)):
            try:
                cb.wait()
            except Exception as e:  # noqa: BLE001 - the others are waited for first
                error = error or e
    if error is not None:
        raise error


class MetricsLog:
    """Append each step's scalar outputs to a JSONL file (rank 0 only)."""

    def __init__(self, path: str):
        self.path = path

    def __call__(self, rep, step, outputs):
        if rep.rank != 0:
            return
        folder = os.path.dirname(os.path.abspath(self.path))
        os.makedirs(folder, exist_ok=True)
        with open(self.path, "a") as f:
            f.write(json.dumps({"step": step, **scalars(outputs)}) + "\n")


class Progress:
    """A tqdm bar on rank 0 with step, steps/s and the latest scalar outputs."""

    def __init__(self, total=None, every: int = 1):
        self.total, self.every, self.bar = total, every, None

    def __call__(self, rep, step, outputs):
        if rep.rank != 0:
            return
        if self.bar is None:
            from tqdm.auto import tqdm

            self.bar = tqdm(total=self.total, initial=step - 1, unit="step", dynamic_ncols=True)
        self.bar.update(1)
        if step % self.every == 0:
            self.bar.set_postfix({k: f"{v:.4g}" for k, v in scalars(outputs).items()},
                                 refresh=False)

    def close(self):
        if self.bar is not None:
            self.bar.close()
            self.bar = None


__all__ = ["Checkpoint", "Every", "MetricsLog", "Progress", "scalars", "settle"]
