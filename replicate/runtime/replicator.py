"""``Replicator``: run one replica's ``step_fn`` on every replica of every process."""

from __future__ import annotations

import sys
import traceback
import warnings
from dataclasses import replace

import numpy as np

from .. import state, tree
from ..backends import get_backend
from ..compiler import compile_step
from ..context import ReplicaContext, replica_scope
from ..errors import (
    CollectiveMismatchError,
    ReplicateError,
    at_user_line,
    function_location,
    source_line,
    user_frame,
    user_traceback,
)
from ..function import as_options, check_mode, to_numpy
from ..graph.aval import AVal
from ..graph.trace import signature
from ..numpy import as_array
from ..step import batch_leaves, gather_outputs
from . import nan_check, watchdog
from .agree import OUTPUTS, STEP, SYNC, agree, digest
from .callbacks import MetricsLog, Progress
from .checkpoint import restore as restore_checkpoint
from .checks import BatchChecker, checked_step_fn, leaf_paths, warn_many_signatures
from .comm import world
from .schedule import Schedules

OUTPUT_REDUCTIONS = ("mean", "sum", "per_replica")


def _aval(x):
    x = np.asarray(x)
    return AVal(tuple(x.shape), x.dtype)


class Replicator:
    """Run ``step_fn`` on ``replicas_per_rank`` replicas in each of the MPI processes.

    ``input_fn(ctx)`` is called once per replica with its :class:`ReplicaContext` and yields that
    replica's batches. ``step_fn(batch)`` is one training step of one replica; inside it
    ``rp.replica_id()``, ``rp.num_replicas()`` and the collectives are available.

    ``run(steps)`` returns one entry per step: ``step_fn``'s output nest with each leaf reduced
    over all replicas — the mean (``outputs="mean"``, the default), the sum, or stacked in replica
    order (``outputs="per_replica"``, shape ``(R, ...)``). It is identical on every rank.

    Modes: ``"graph"`` (define-and-run: traced once per input signature, all local replicas in one
    graph, collectives rewritten into in-process combines plus one MPI call) and ``"eager"``
    (define-by-run: ops run at once, collectives call MPI at once; one replica per process).

    Failure handling: ``check_finite=True`` raises ``rp.NonFiniteError`` at the first step whose
    outputs hold NaN or Inf (graph mode names the op that produced it); ``collective_timeout``
    (seconds; default ``$REPLICATE_COLLECTIVE_TIMEOUT`` or 300; 0: none) is how long a
    cross-process call may wait before the job is aborted with a report of the missing ranks.

    >>> import numpy as np, replicate as rp
    >>> w = rp.Variable(np.zeros(2), name="w")
    >>> def input_fn(ctx):
    ...     while True:
    ...         yield np.full(2, ctx.replica_id + 1.0)
    >>> def step_fn(x):
    ...     w.assign(w + rp.all_reduce(x, "mean"))
    ...     return {"x": x.sum()}
    >>> hist = rp.Replicator(input_fn, step_fn, replicas_per_rank=2).run(steps=3)
    >>> w.numpy().tolist(), float(hist[-1]["x"])
    ([4.5, 4.5], 3.0)
    """

    def __init__(self, input_fn, step_fn, *, mode: str = "graph", backend: str = "numpy",
                 replicas_per_rank: int = 1, outputs: str = "mean", options=None, comm=None,
                 check_finite: bool = False, collective_timeout: float | None = None):
        if not callable(input_fn) or not callable(step_fn):
            raise ReplicateError("Replicator(input_fn, step_fn): both must be callables")
        if not isinstance(replicas_per_rank, (int, np.integer)) or replicas_per_rank < 1:
            raise ReplicateError(f"replicas_per_rank must be a positive int, got "
                                 f"{replicas_per_rank!r}")
        if outputs not in OUTPUT_REDUCTIONS:
            raise ReplicateError(f"outputs must be one of {OUTPUT_REDUCTIONS}, got {outputs!r}")
        if not isinstance(check_finite, (bool, np.bool_)):
            raise ReplicateError(f"check_finite must be True or False, got {check_finite!r}")
        if collective_timeout is not None:
            collective_timeout = watchdog.parse_timeout(collective_timeout, "collective_timeout")
        self.mode = check_mode(mode)
        if self.mode == "eager" and replicas_per_rank != 1:
            raise ReplicateError(
                "eager mode runs one replica per process (ChainerMN-style); use "
                "replicas_per_rank=1 and more processes (mpiexec -n N), or graph mode for "
                "several replicas per process")
        self.backend = get_backend(backend)
        self.options = as_options(options)
        self.input_fn, self.step_fn = input_fn, checked_step_fn(step_fn)
        self.k = int(replicas_per_rank)
        self.outputs = outputs
        self.check_finite = bool(check_finite)
        self._check_batches = BatchChecker(input_fn)
        self.comm = comm or world()
        if collective_timeout is not None:
            watchdog.set_timeout(collective_timeout)
        self.rank, self.num_ranks = self.comm.rank, self.comm.size
        self.num_replicas = self.k * self.num_ranks
        self.contexts = [ReplicaContext(self.rank * self.k + r, self.num_replicas, self.rank,
                                        self.num_ranks, r, self.k) for r in range(self.k)]
        self.cache: dict = {}
        self.trace_count = 0
        self.step = 0
        self._iterators = None
        self._synced: set[int] = set()
        self._schedules = Schedules(self.comm)  # graph mode: what the ranks compiled
        self._step_key = None  # graph mode: this step's cache key

    # -- the loop -------------------------------------------------------------------------------
    def run(self, steps: int | None = None, *, callbacks=(), progress: bool = False,
            metrics: str | None = None) -> list:
        """Run ``steps`` steps (or until the input runs out); return the reduced outputs.

        ``callbacks``: objects called as ``cb(replicator, step, outputs)`` after every step on
        every rank (see ``rp.callbacks``: ``Every``, ``Checkpoint``). ``progress``: a tqdm bar on
        rank 0. ``metrics``: a JSONL file that rank 0 appends each step's scalar outputs to.
        """
        if steps is not None and steps < 0:
            raise ReplicateError(f"steps must be >= 0, got {steps}")
        if self._iterators is None:
            self._iterators = [iter(self.input_fn(ctx)) for ctx in self.contexts]
        callbacks = list(callbacks)
        if metrics:
            callbacks.append(MetricsLog(metrics))
        bar = Progress(total=steps and self.step + steps) if progress else None
        if bar:
            callbacks.append(bar)
        history = []
        try:
            while steps is None or len(history) < steps:
                watchdog.set_step(self.step + 1, "input")
                batches = self._next_batches()
                if batches is None:
                    break
                watchdog.set_step(self.step + 1, "step")
                outputs = self._run_step(batches)
                if self.check_finite:
                    nan_check.check(self, outputs, self.step + 1)
                history.append(outputs)
                self.step += 1
                watchdog.set_step(self.step, "callbacks")
                for cb in callbacks:
                    cb(self, self.step, outputs)
        except (CollectiveMismatchError, ReplicateError) as e:
            at_user_line(e)
            if getattr(e, "consistent", False) or self.num_ranks == 1:
                raise
            self._abort()
        except Exception:
            if self.num_ranks == 1:
                raise
            self._abort()
        finally:
            if bar:
                bar.close()
        return history

    def restore(self, path: str, state) -> int:
        """Load a checkpoint into ``state`` (a nest of Variables) on every rank and continue
        from its step: the input functions restart with ``ctx.start_step`` set to it (which
        ``rp.shard_batches`` honours). Call before ``run``; returns the step.

        ``path`` may be a ``{step}`` pattern (as given to ``rp.callbacks.Checkpoint``): the
        newest intact checkpoint is used, and each newer corrupt one is skipped with a
        warning."""
        info = restore_checkpoint(path, state, comm=self.comm)
        self.step = int(info["step"])
        self.contexts = [replace(ctx, start_step=self.step) for ctx in self.contexts]
        self._iterators = None
        self._synced.clear()
        return self.step

    def _abort(self):
        """One rank failed: print its traceback (the user's frames) with its rank and step, and
        end the whole job (the other ranks would wait for this one forever)."""
        kind, error, tb = sys.exc_info()
        where = f"at step {watchdog.TRACKER.step} ({watchdog.TRACKER.phase})"
        print(f"[replicate] rank {self.rank} failed {where}; aborting the job:\n"
              + "".join(traceback.format_exception(kind, error, user_traceback(tb))),
              file=sys.stderr, flush=True)
        self.comm.abort(1)

    def _next_batches(self):
        """Every replica's next batch, or None where any replica on any rank has run out.

        One tagged exchange per step (``agree``): every rank sends how many of its replicas
        got a batch and, in graph mode, the fingerprint of the collective schedule compiled for
        its batch signature (0: not compiled yet). When a rank compiles anew (its batches
        changed shape) or the ranks' compiled steps differ, every rank compares schedules this
        step (``_graph_step``) instead of one rank's check meeting another's step."""
        batches = []
        for it in self._iterators:
            try:
                batches.append(next(it))
            except StopIteration:
                batches.append(None)
        self._check_batches(batches, self.step + 1, self.contexts)
        have = sum(b is not None for b in batches)
        fp = 0
        if self.mode == "graph" and have == self.k:
            self._step_key = tuple(signature(b) for b in batches)
            fp = self._schedules.fingerprint(self._step_key)
        if self.num_ranks == 1:
            counts = [have]
        else:
            rows = agree(self.comm, STEP, 0, have, fp, describe=self._describe_step_start)
            counts = [row[2] for row in rows]
        if min(counts) == self.k:
            if self.num_ranks > 1:
                self._schedules.after_step_start({row[3] for row in rows})
            return batches
        if max(counts) > 0:
            warnings.warn(f"input ran out on some replicas at step {self.step} (replicas with "
                          f"data per rank: {counts}); all replicas stop here",
                          stacklevel=3)
        return None

    def _describe_step_start(self):
        return (f"the start of step {self.step + 1} (its input check, before step_fn) in "
                f"Replicator.run at {source_line(user_frame())}")

    def _run_step(self, batches):
        if self.mode == "eager":
            results = [self._eager_step(batches[0])]
        else:
            results = self._graph_step(batches)
        return self._reduce_outputs(results)

    # -- eager ----------------------------------------------------------------------------------
    def _eager_step(self, batch):
        previous = state.eager_read_hook
        state.eager_read_hook = self._sync_variable
        try:
            with replica_scope(self.contexts[0]):
                out = self.step_fn(tree.tree_map(as_array, batch))
        finally:
            state.eager_read_hook = previous
        leaves, treedef = tree.flatten(out)
        self._out_tree = treedef
        return [to_numpy(x) for x in leaves]

    def _sync_variable(self, var):
        if id(var) not in self._synced:
            self._synced.add(id(var))
            if self.num_ranks > 1:
                what = f"{var.name!r} ({AVal(var.value.shape, var.value.dtype)})"
                agree(self.comm, SYNC, digest(what), describe=lambda: (
                    f"the first read of variable {what} (broadcast from rank 0) at "
                    f"{source_line(user_frame())}"))
            var.load(self.comm.bcast(var.value, 0))

    # -- graph ----------------------------------------------------------------------------------
    def _graph_step(self, batches):
        key = self._step_key
        step = self.cache.get(key)
        if step is None:
            step = self.cache[key] = self._compile(batches, key)
            warn_many_signatures(len(self.cache), self.step + 1)
        else:  # another rank compiles now, or runs another compiled step: compare schedules
            self._schedules.reused(key, lambda at: self._describe_batches(batches, at))
        for var in step.graph.meta.variables:
            self._sync_variable(var)
        results = step(batch_leaves(batches), keep_inputs=self.check_finite)
        if self.check_finite:  # the NaN finder re-runs this step's graph on these inputs
            self._last_step = (step.graph, step.last_inputs)
        self._out_tree = step.graph.meta.out_tree
        return results

    def _compile(self, batches, key):
        self.trace_count += 1
        step, error = None, None
        try:
            step = compile_step(self.step_fn, batches, self.contexts, backend=self.backend,
                                options=self.options, num_ranks=self.num_ranks, rank=self.rank)
        except ReplicateError as e:
            error = e
        self._schedules.compiled(key, step.schedule if step else [], error,
                                 self._describe_batches(batches, self.step + 1), self.step + 1)
        return step

    def _describe_batches(self, batches, compiled_at):
        """(this rank's batch signature, when its step was compiled, where input_fn is): named
        when the ranks' schedules differ at a step where their batches differ too."""
        texts = []
        for b in batches:
            leaves, treedef = tree.flatten(b)
            paths = leaf_paths(treedef) if len(leaves) > 1 else [""]
            texts.append(", ".join(f"batch{p} {_aval(x)}" for p, x in zip(paths, leaves)))
        if len(set(texts)) == 1:
            text = texts[0] + (" on every replica" if len(texts) > 1 else "")
        else:
            text = "; ".join(f"replica {r}: {t}" for r, t in enumerate(texts))
        when = ("compiled for it now" if compiled_at == self.step + 1 else
                f"its step was compiled at step {compiled_at}")
        return text, when, f"input_fn {function_location(self.input_fn)}"

    def compiled_graph(self):
        """The most recently compiled step graph (for inspection and printing)."""
        return self._last_compiled().graph

    def executable(self):
        """The most recently compiled step as the backend runs it (``.graph`` after the
        optimisation passes, ``.kernels``)."""
        return self._last_compiled().executable

    def _last_compiled(self):
        if not self.cache:
            raise ReplicateError("nothing compiled yet: run at least one step in graph mode")
        return list(self.cache.values())[-1]

    # -- outputs --------------------------------------------------------------------------------
    def _reduce_outputs(self, results):
        """results: per local replica, a list of leaves -> one nest reduced over all replicas.

        Eager mode first agrees on what is gathered (a tagged exchange): a rank still in a
        collective that the others do not call meets it as a mismatch. (Graph mode compared
        the outputs with the collective schedule when it compiled the step.)"""
        if self.mode == "eager" and self.num_ranks > 1:
            what = ", ".join(str(_aval(x)) for x in results[0])
            agree(self.comm, OUTPUTS, digest(f"{self._out_tree}|{what}"), describe=lambda: (
                f"the end of step {self.step + 1}: gathering the outputs ({what}) of step_fn "
                f"{function_location(self.step_fn)}"))
        reduced = []
        for everyone in gather_outputs(self.comm, results):  # (R, ...) per leaf, one exchange
            if self.outputs == "per_replica":
                reduced.append(everyone)
            elif self.outputs == "sum":
                reduced.append(everyone.sum(0))
            else:
                reduced.append(everyone.mean(0))
        return tree.unflatten(self._out_tree, reduced)
