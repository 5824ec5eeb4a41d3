"""``Replicator.evaluate``: run an evaluation step over a whole data set on every replica, the
replicas' and steps' outputs added up.

The evaluation runs on a second ``Replicator`` made once per ``step_fn`` with the training
one's settings (mode, backend, replicas, communicator, options): the same Variables (the model
is shared, not copied), its compiled step kept from one evaluation to the next (an evaluation
every epoch traces once), and its input made anew at every call."""

from __future__ import annotations

import numpy as np

from ... import tree
from ...errors import ReplicateError
from ..inputs.data import shard_batches


def evaluate(rep, input_fn, step_fn, *, batch_size=None, model=None):
    """``Replicator.evaluate``: run ``step_fn`` over all of ``input_fn``'s batches on every
    replica; return its outputs summed over the replicas and the steps (the same on every
    rank), so return sums (correct answers, examples) and divide them afterwards.

    ``input_fn`` may be the data itself (a nest of arrays with ``batch_size``): each replica
    then gets ``(batch, mask)``, every example once over all replicas, the last global batch
    padded with mask 0 (``rp.shard_batches(..., epochs=1, shuffle=False, remainder="pad")``).
    ``model``: in eval mode for the evaluation (``Dropout`` off, ``BatchNorm``'s running
    statistics), its training flag restored afterwards. Call it on every rank alike."""
    if not callable(input_fn):  # a nest of arrays: every example once over all replicas
        data = input_fn
        if batch_size is None:
            raise ReplicateError("evaluate(data, step_fn): give batch_size (per replica) with "
                                 "arrays, or an input_fn(ctx)")
        input_fn = lambda ctx: shard_batches(  # noqa: E731
            data, batch_size, ctx, epochs=1, shuffle=False, remainder="pad", start_step=0)
    cache = rep.__dict__.setdefault("_evaluators", {})
    entry = cache.get(step_fn)
    if entry is None:
        current = [input_fn]
        evaluator = type(rep)(
            lambda ctx: current[0](ctx), step_fn, mode=rep.mode, backend=rep.backend.name,
            replicas_per_rank=rep.k, outputs="sum", options=rep.options, comm=rep.comm,
            check_sync=False, prefetch=rep.prefetch, logical_devices=rep.layout.m,
            micro_batches=rep.layout.micro)
        entry = cache[step_fn] = (evaluator, current)
    evaluator, current = entry
    current[0] = input_fn
    evaluator.restart_input()
    training = None if model is None else model.training
    if model is not None:
        model.eval()
    try:
        history = evaluator.run()
    finally:
        if training is not None:
            model.train(training)
    if not history:
        raise ReplicateError("evaluate: the input gave no batch")
    leaves = [tree.flatten(h)[0] for h in history]
    total = [np.sum([np.asarray(step[i]) for step in leaves], axis=0)
             for i in range(len(leaves[0]))]
    return tree.unflatten(tree.flatten(history[0])[1], total)
