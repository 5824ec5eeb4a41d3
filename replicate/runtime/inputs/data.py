"""Sharding an in-memory dataset over replicas.

Every epoch the whole dataset is shuffled with the same seed on every replica; each global batch
of ``num_replicas * batch_size`` rows is cut into consecutive slices, replica i taking the i-th. So
R replicas with batch B see exactly the rows one replica with batch R*B would see.

Uneven last batch (``remainder``):

* ``"drop"`` (default): the rows that do not fill a whole global batch are left out of the epoch.
* ``"pad"``: the last global batch is filled up with repeated rows and every batch gets a trailing
  float mask (1 for real rows, 0 for padding) to weight the loss with. A replica's part of the
  last batch may hold no real row at all: divide by the mask's sum over all replicas
  (``rp.all_reduce(mask.sum(), "sum")``), not by its own (0: NaN).

Either way every replica yields the same number of batches, so no replica can run out early.
"""

from __future__ import annotations

import warnings

import numpy as np

from ... import tree
from ...errors import ReplicateError


def shard_batches(data, batch_size: int, ctx=None, *, seed: int = 0, epochs: int | None = 1,
                  shuffle: bool = True, remainder: str = "drop", start_step: int | None = None):
    """Yield this replica's batches of ``data`` (a nest of arrays with a common first axis).

    ``ctx`` is the replica context given to ``input_fn`` (None: a single replica).
    ``epochs=None`` repeats forever. ``start_step`` skips that many batches (for resuming); by
    default it is ``ctx.start_step``, which a Replicator restored from a checkpoint sets.

    >>> import numpy as np
    >>> from replicate.context import ReplicaContext
    >>> ctx = ReplicaContext(replica_id=1, num_replicas=2)
    >>> [b.tolist() for b in shard_batches(np.arange(8), 2, ctx, shuffle=False)]
    [[2, 3], [6, 7]]
    """
    batches = _shard_batches(data, batch_size, ctx, seed, epochs, shuffle, remainder, start_step)
    return _Batches(batches, _count(data, batch_size, ctx, epochs, remainder, start_step))


class _Batches:
    """``shard_batches``' iterator; ``total_steps``: how many batches it has still to yield
    (None: forever), which ``run(progress=True)`` shows as the bar's total."""

    def __init__(self, batches, total_steps):
        self._batches, self.total_steps = batches, total_steps

    def __iter__(self):
        return self

    def __next__(self):
        batch = next(self._batches)
        if self.total_steps:
            self.total_steps -= 1
        return batch


def warn_other_replicas(info: dict, replicas: int, step: int) -> None:
    """A warning when a checkpoint written by a run of another number of replicas is restored:
    the input restarts at its step (``ctx.start_step``), which counts global batches — with
    another global batch the position lands elsewhere in the data (examples skipped or
    seen twice). Elastic jobs keep it fixed: ``Replicator(num_replicas=R)``."""
    saved = (info.get("meta") or {}).get("replicas")
    if saved is not None and saved != replicas:
        warnings.warn(f"this checkpoint was written by a run of {saved} replicas, restored into "
                      f"{replicas}: the input restarts at step {step}, which counts global "
                      f"batches — with another global batch size it lands elsewhere in the data "
                      "(examples skipped or seen twice). Keep the global batch: "
                      "Replicator(num_replicas=...) fixes the replica count", stacklevel=3)


def progress_total(steps, done: int, iterators, prefetcher=None, pending: bool = False):
    """A progress bar's total: ``steps`` more than ``done``, else what the replicas' iterators
    (``shard_batches``) say they yield (None: unknown), plus the batches drawn and not used yet
    (by the ``prefetcher``, or ``pending`` from a stopped run)."""
    if steps is not None:
        return done + steps
    left = prefetcher.ahead(steps_left) if prefetcher is not None else steps_left(iterators)
    return None if left is None else done + left + pending


def steps_left(iterators) -> int | None:
    """The batches the fewest-left of ``iterators`` still yields (``shard_batches`` iterators
    count them); None when any does not know."""
    known = [getattr(it, "total_steps", None) for it in iterators]
    return None if not known or None in known else min(known)


def _count(data, batch_size, ctx, epochs, remainder, start_step):
    leaves = tree.flatten(data)[0]
    if epochs is None or not leaves or batch_size <= 0 or remainder not in ("drop", "pad"):
        return None  # (forever, or an error that the first batch raises)
    start = start_step if start_step is not None else 0 if ctx is None else ctx.start_step
    per_epoch = steps_per_epoch(len(leaves[0]), batch_size, 1 if ctx is None else ctx.num_replicas,
                                remainder)
    return max(per_epoch * epochs - start, 0)


def _shard_batches(data, batch_size, ctx, seed, epochs, shuffle, remainder, start_step):
    leaves, treedef = tree.flatten(data)
    if not leaves:
        raise ReplicateError("shard_batches: no arrays given")
    leaves = [np.asarray(x) for x in leaves]
    n = len(leaves[0])
    if any(len(x) != n for x in leaves):
        raise ReplicateError("shard_batches: arrays have different lengths: "
                             f"{[len(x) for x in leaves]}")
    if remainder not in ("drop", "pad"):
        raise ReplicateError(f"shard_batches: remainder must be 'drop' or 'pad', got {remainder!r}")
    if batch_size <= 0:
        raise ReplicateError(f"shard_batches: batch_size must be positive, got {batch_size}")
    if start_step is None:
        start_step = 0 if ctx is None else ctx.start_step
    rid = 0 if ctx is None else ctx.replica_id
    R = 1 if ctx is None else ctx.num_replicas
    global_batch = R * batch_size
    steps = n // global_batch if remainder == "drop" else -(-n // global_batch)
    if steps == 0:
        raise ReplicateError(f"shard_batches: {n} rows cannot fill one global batch of "
                             f"{R} replicas x {batch_size}")
    epoch, step = 0, 0
    while epochs is None or epoch < epochs:
        order = (np.random.default_rng([seed, epoch]).permutation(n) if shuffle
                 else np.arange(n))
        mask_all = np.ones(steps * global_batch, np.float32)
        if steps * global_batch > n:  # pad: repeat rows from the start, masked out
            extra = steps * global_batch - n
            order = np.concatenate([order, np.resize(order, extra)])
            mask_all[n:] = 0.0
        for s in range(steps):
            if step >= start_step:
                lo = s * global_batch + rid * batch_size
                idx = order[lo:lo + batch_size]
                batch = tree.unflatten(treedef, [x[idx] for x in leaves])
                if remainder == "pad":
                    batch = (batch, mask_all[lo:lo + batch_size])
                yield batch
            step += 1
        epoch += 1


def steps_per_epoch(n: int, batch_size: int, num_replicas: int, remainder: str = "drop") -> int:
    """Global steps in one pass over ``n`` rows, as ``shard_batches`` takes them: the last partial
    global batch dropped (``remainder="drop"``) or padded (``"pad"``)."""
    g = batch_size * num_replicas
    return n // g if remainder == "drop" else -(-n // g)
