"""``Replicator``: run one replica's ``step_fn`` on every replica of every process."""

from __future__ import annotations

import sys
import warnings
import weakref
from dataclasses import replace

import numpy as np

from ... import profile as profiling
from ... import state, tree
from ...backends import get_backend
from ...context import replica_scope
from ...errors import CollectiveMismatchError, ReplicateError, at_user_line, source_line, user_frame
from ...function import as_options, check_mode, to_numpy
from ...graph.aval import AVal
from ...graph.trace import signature
from ...numpy import as_array
from ...step import StepCache
from ..checks import nan_check, sync_check
from ..checks.config import Settings, agree_config
from ..checks.entry import (
    BatchChecker,
    check_arguments,
    checked_step_fn,
    describe_batches,
    warn_many_signatures,
)
from ..communication.agree import STEP, SYNC, agree, digest
from ..communication.comm import world
from ..communication.schedule import Schedules
from ..inputs import prefetch, staging
from ..inputs.data import progress_total, warn_other_replicas
from ..inputs.prefetch import parse_prefetch
from ..job import hooks, watchdog
from ..variables.checkpoint import restore as restore_checkpoint
from . import evaluation, updates
from .callbacks import MetricsLog, Progress, settle
from .inspection import Inspection
from .layout import Layout, per_rank
from .outputs import Deferred, Gathering, reduce_outputs


class Replicator(Inspection):
    """Run ``step_fn`` on ``replicas_per_rank`` replicas in each of the MPI processes (or on
    ``num_replicas`` in all: the same job on any process count that divides it, ``layout.py``).

    ``input_fn(ctx)`` is called once per replica with its :class:`ReplicaContext` and yields that
    replica's batches. ``step_fn(batch)`` is one training step of one replica; inside it
    ``rp.replica_id()``, ``rp.num_replicas()`` and the collectives are available.

    ``run(steps)`` returns one entry per step (per update with ``accumulate=n``: ``updates.py``):
    ``step_fn``'s outputs, each leaf reduced over all replicas — the mean (the default), the sum
    (``outputs="sum"``) or stacked (``"per_replica"``, ``(R, ...)``) — the same on every rank.

    Modes: ``"graph"`` (define-and-run: traced once per input signature, all local replicas in one
    graph, collectives rewritten into in-process combines plus one MPI call) and ``"eager"``
    (define-by-run: ops run at once, collectives call MPI at once; one replica per process).

    Failure handling: ``check_finite=True`` raises ``rp.NonFiniteError`` at the first step whose
    outputs or variable updates hold NaN or Inf, before the update is written (graph mode names
    the op that produced it); ``check_sync`` compares the ranks' copies of the variables at
    every checkpoint and at the end of ``run`` (``True``, the default), also every N steps (an
    int N), or never (``False``): ``rp.DivergenceError`` names the first that differs;
    ``collective_timeout`` (seconds; default ``$REPLICATE_COLLECTIVE_TIMEOUT`` or 300; 0: none)
    is how long a cross-process call may wait before the job is aborted with a report of the
    missing ranks. ``prefetch``: steps of input made ahead on a background thread (default 2;
    0 for input that must see the latest parameters, on-policy RL: ``runtime/inputs/prefetch.py``).
    ``logical_devices=m``: a replica spans m processes (``rp.logical_device(i)`` places ops);
    ``micro_batches=M``: each batch runs as M micro-batches (a GPipe pipeline): ``layout.py``.

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
    evaluate = evaluation.evaluate  # (a data set's totals, every example once: evaluation.py)

    def __init__(self, input_fn, step_fn, *, mode: str = "graph", backend: str = "numpy",
                 replicas_per_rank: int | None = None, num_replicas: int | None = None,
                 outputs: str = "mean", options=None, comm=None,
                 check_finite: bool = False, check_sync: bool | int = True,
                 collective_timeout: float | None = None, prefetch: int = 2,
                 logical_devices: int = 1, micro_batches: int = 1):
        self.comm = comm or world()
        replicas_per_rank = per_rank(num_replicas, replicas_per_rank, self.comm.size,
                                     logical_devices)  # (R fixed: elastic, ``layout.py``)
        check_arguments(input_fn, step_fn, replicas_per_rank, outputs, check_finite, check_sync)
        if collective_timeout is not None:
            collective_timeout = watchdog.parse_timeout(collective_timeout, "collective_timeout")
        self.prefetch = parse_prefetch(prefetch)
        self.mode = check_mode(mode)
        self.backend = get_backend(backend)
        self.options = as_options(options)
        self.input_fn, self.step_fn = input_fn, checked_step_fn(step_fn)
        self.k = int(replicas_per_rank)
        self.outputs = outputs
        self.check_finite = bool(check_finite)
        self.check_sync = (bool(check_sync) if isinstance(check_sync, (bool, np.bool_))
                           else int(check_sync))
        self._check_batches = BatchChecker(input_fn)
        self.collective_timeout = collective_timeout  # (None: the process's current one)
        self.rank, self.num_ranks = self.comm.rank, self.comm.size
        self.layout = Layout(self.comm, self.k, logical_devices, micro_batches, self.mode)
        self.num_replicas, self.contexts = self.layout.num_replicas, self.layout.contexts()
        self.cache = StepCache()
        self.trace_count = self.step = 0
        self._iterators, self._prefetcher = None, None
        self._synced: dict[int, object] = {}  # the variables the steps use, by id
        self._schedules = Schedules(self.comm)  # graph mode: what the ranks compiled
        self._step_entry = None  # graph mode: (this step's signature, its compiled step or None)
        self._journal = nan_check.WriteJournal()  # eager + check_finite: values before a step
        self._stop = False  # rep.stop() was called (by a callback) on this rank
        self._pending = None  # batches drawn at the step start where the ranks agreed to stop
        self._last_step = None  # graph mode + check_finite: (graph, inputs) of the last step
        self._per_update = updates.PerUpdate(outputs)  # (the history with accumulation)
        self.settings = Settings(self.mode, self.backend, self.k, self.layout.m,
                                 self.layout.micro, outputs, self.options, self.check_finite,
                                 self.check_sync, collective_timeout)
        agree_config(self.comm, self.settings)  # every rank constructed it alike (one exchange)
        self.layout.connect()  # (model parallelism: its groups' communicators)
        self._gathering = Gathering(outputs, self.layout.outputs_comm, self.comm if (
            self.mode == "eager" and self.num_ranks > 1) else None, self.step_fn)
        if collective_timeout is not None:
            watchdog.set_timeout(collective_timeout)

    # -- the loop -------------------------------------------------------------------------------
    def run(self, steps: int | None = None, *, callbacks=(), progress: bool = False,
            metrics: str | None = None, profile: str | None = None) -> list:
        """Run ``steps`` steps (or until the input runs out); return the reduced outputs.

        ``callbacks``: objects called as ``cb(replicator, step, outputs)`` after every step on
        every rank (see ``rp.callbacks``: ``Every``, ``Checkpoint``). ``progress``: a tqdm bar on
        rank 0. ``metrics``: a JSONL file that rank 0 appends each step's scalar outputs to.
        ``profile``: a Chrome/Perfetto trace of the run, one file per rank (``rp.profile``)."""
        if profile is not None and profiling.active() is None:
            with profiling.recording(profile):
                return self.run(steps, callbacks=callbacks, progress=progress, metrics=metrics)
        if steps is not None and steps < 0:
            raise ReplicateError(f"steps must be >= 0, got {steps}")
        if self._iterators is None:
            self._iterators = [iter(self.input_fn(ctx)) for ctx in self.contexts]
        self._stop = False
        callbacks = list(callbacks)
        if metrics:
            callbacks.append(MetricsLog(metrics))
        bar = Progress(total=progress_total(
            steps, self.step, self._iterators, self._prefetcher, self._pending is not None)) \
            if progress else None
        if bar:
            callbacks.append(bar)
        self._deferred = Deferred(self._gathering) if Deferred.wanted(
            self.mode, self.check_finite, self._gathering, callbacks) else None
        history = self._per_update.start(callbacks)  # (a callback now: outputs not read)
        try:
            while steps is None or len(history) < steps:
                watchdog.set_step(self.step + 1, "input")
                batches = self._next_batches()
                if batches is None:
                    break
                watchdog.set_step(self.step + 1, "step")
                outputs = self._run_step(batches)
                history.append(outputs)
                self.step += 1
                if self._deferred and self._deferred.full():
                    self._deferred.flush(history)
                if self.check_sync is not True and self.check_sync \
                        and self.step % self.check_sync == 0:
                    self.verify_sync(f"every {self.check_sync} steps (check_sync)")
                watchdog.set_step(self.step, "callbacks")
                for cb in callbacks:
                    cb(self, self.step, outputs)
            watchdog.set_step(self.step, "the end of run")
            settle(callbacks)  # (an asynchronous checkpoint's last write)
            if self._deferred:
                self._deferred.flush(history)  # (every waiting step's outputs, one exchange)
            self.layout.gather(self.variables())  # (logical devices: every Variable everywhere)
            if self.check_sync is not False:
                self.verify_sync("at the end of run")
        except (CollectiveMismatchError, ReplicateError) as e:
            at_user_line(e)
            if getattr(e, "consistent", False) or self.num_ranks == 1:
                settle(callbacks)  # (every rank is here: the write in flight ends, or is raised)
                raise
            self._abort()
        except Exception:
            if self.num_ranks == 1:
                settle(callbacks)
                raise
            self._abort()
        finally:
            if bar:
                bar.close()
        return self._per_update.history(history)

    def stop(self) -> None:
        """End ``run`` after the current step (early stopping from a callback). Every rank stops
        at the same step even if only some call it: the request travels with the next step's
        start, which every rank exchanges anyway."""
        self._stop = True

    def restore(self, path: str, state, missing_ok: bool = False) -> int:
        """Load a checkpoint into ``state`` (a nest of Variables) on every rank and continue
        from its step: the input functions restart with ``ctx.start_step`` set to it (which
        ``rp.shard_batches`` honours). Call before ``run``; returns the step.

        ``path`` may be a ``{step}`` pattern (as given to ``rp.callbacks.Checkpoint``): the
        newest intact checkpoint is used, and each newer corrupt one is skipped with a
        warning. ``missing_ok``: if no file matches yet (a job's first attempt under ``python
        -m replicate.launch --max-restarts``), nothing is loaded and the step stays."""
        info = restore_checkpoint(path, state, comm=self.comm, missing_ok=missing_ok)
        if info is None:
            return self.step
        self.step = int(info["step"])
        warn_other_replicas(info, self.num_replicas, self.step)
        self.contexts = [replace(ctx, start_step=self.step) for ctx in self.contexts]
        self.restart_input()
        self._synced.clear()
        return self.step

    def restart_input(self) -> None:
        """The input functions start anew at the next ``run`` (their iterators made again)."""
        if self._prefetcher is not None:
            self._prefetcher.close()
        self._iterators, self._prefetcher, self._pending = None, None, None

    def variables(self) -> list:
        """The variables the steps run so far read or write (one copy on every rank)."""
        found = {id(v): v for step in self.cache.values() for v in step.graph.meta.variables}
        return list({**found, **{k: v for k, v in self._synced.items() if k not in found}}
                    .values())

    def verify_sync(self, when: str = "on request") -> None:
        """Compare the ranks' copies of the step's variables (a fingerprint each, one small
        exchange); raise ``rp.DivergenceError`` on every rank naming the first that differs.
        Call it on every rank alike (``run`` calls it itself, see ``check_sync``)."""
        sync_check.verify(self.comm, self.variables(), self.step, when)

    def _abort(self):
        """One rank failed: print its traceback (the user's frames) with its rank and step, and
        end the whole job (the other ranks would wait for this one forever)."""
        where = f"at step {watchdog.TRACKER.step} ({watchdog.TRACKER.phase})"
        hooks.abort(self.comm, 1, hooks.format_failure(
            self.rank, f"[replicate] rank {self.rank} failed {where}; aborting the job:",
            *sys.exc_info()))

    @profiling.spanned("input", "input")
    def _next_batches(self):
        """Every replica's next batch, or None where any replica on any rank has run out.

        One tagged exchange per step (``agree``): every rank sends how many of its replicas
        got a batch and, in graph mode, the fingerprint of the collective schedule compiled for
        its batch signature (0: not compiled yet). When a rank compiles anew (its batches
        changed shape) or the ranks' compiled steps differ, every rank compares schedules this
        step (``_graph_step``) instead of one rank's check meeting another's step."""
        if self._stop and self.num_ranks == 1:
            return None
        batches, self._pending = self._pending or self._draw(), None
        self._check_batches(batches, self.step + 1, self.contexts)
        have = sum(b is not None for b in batches)
        fp = 0
        if self.mode == "graph" and have == self.k:
            sig = tuple(signature(b) for b in batches)
            step = self.cache.find(sig)  # None: not compiled, or its trace's state changed
            self._step_entry = (sig, step)
            fp = self._schedules.fingerprint(step.key) if step is not None else 0
        if self.num_ranks == 1:
            counts = [have]
        else:  # (a rank asked to stop sends its count as -1 - count)
            rows = agree(self.comm, STEP, 0, -1 - have if self._stop else have, fp,
                         describe=self._describe_step_start)
            if any(row[2] < 0 for row in rows):  # someone called stop(): keep the batches
                self._pending, self._stop = batches, True
                return None
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

    def _draw(self):
        if self._prefetcher is None and self.prefetch:  # (its first batch drawn here, in the
            self._prefetcher = prefetch.start(self._iterators, self.prefetch)  # step's try)
            weakref.finalize(self, self._prefetcher.close)  # the thread ends with us
        if self._prefetcher is not None:
            return self._prefetcher.next()
        return prefetch.draw_owned(self._iterators)

    def _describe_step_start(self):
        return (f"the start of step {self.step + 1} (its input check, before step_fn) in "
                f"Replicator.run at {source_line(user_frame())}")

    @profiling.spanned("replicator step", "step")
    def _run_step(self, batches):
        """Run the step, gather its outputs; with ``check_finite`` check the outputs and the
        variables' new values (every rank's verdict travels with the outputs, so every rank
        raises alike) before the new values are written — a step that goes non-finite leaves
        the variables as they were, and no checkpoint of it is taken."""
        if self.mode == "eager":
            with self._journal.undo_on_error():  # (it journals only with check_finite)
                results = [self._eager_step(batches[0])]
            commit, updates = None, self._journal.updates()
        else:
            step, (results, values) = self._graph_step(batches)
            commit, updates = (lambda: step.commit(values)), step.updates(values)
        if self.check_finite:
            bad = self.layout.non_finite_updates(updates)
            outputs, flags = reduce_outputs(self._gathering, self._out_tree, self.step + 1,
                                            results, flag=bool(bad))
            with self._journal.undo_on_error():
                nan_check.check(outputs, self.step + 1, bad, flags, rank=self.rank,
                                world_rank=self.layout.world_rank, last_step=self._last_step)
        else:
            outputs = self._deferred.add(self._out_tree, results) if self._deferred else \
                reduce_outputs(self._gathering, self._out_tree, self.step + 1, results)
        if commit is not None:
            commit()
        return outputs

    # -- eager ----------------------------------------------------------------------------------
    def _eager_step(self, batch):
        hooks = state.hooks  # (this thread's)
        previous = getattr(hooks, "read", None), getattr(hooks, "write", None)
        hooks.read, hooks.write = self._sync_variable, self.check_finite and self._journal.remember
        self._journal.clear()
        try:
            with replica_scope(self.contexts[0]):
                out = self.step_fn(tree.tree_map(as_array, batch))
        finally:
            hooks.read, hooks.write = previous
        leaves, self._out_tree = tree.flatten(out)
        return [to_numpy(x) for x in leaves]

    def _sync_variable(self, var):
        if id(var) not in self._synced:
            self._synced[id(var)] = var
            if not var.shared:  # each process's or replica's own: not broadcast, not compared
                return
            if self.num_ranks > 1:
                what = f"{var.name!r} ({AVal(var.value.shape, var.value.dtype)})"
                agree(self.comm, SYNC, digest(what), describe=lambda: (
                    f"the first read of variable {what} (broadcast from rank 0) at "
                    f"{source_line(user_frame())}"))
            var.load(self.comm.bcast(var.value, 0))

    # -- graph ----------------------------------------------------------------------------------
    def _graph_step(self, batches):
        """Run the compiled step (compiling it first if needed): ``(step, (results, new
        values))`` — the new values are written by ``step.commit``."""
        signature, step = self._step_entry
        if step is None:
            step = self._compile(batches, signature)
            warn_many_signatures(len(self.cache), self.step + 1)
        else:  # another rank compiles now, or runs another compiled step: compare schedules
            self._schedules.reused(step.key, lambda at: self._describe_batches(batches, at))
        for var in step.graph.meta.variables:
            self._sync_variable(var)
        ran = staging.run_step(step, batches, self._prefetcher, self.check_finite)
        if self.check_finite:  # the NaN finder re-runs this step's graph on these inputs
            self._last_step = (step.graph, step.last_inputs)
        self._out_tree = step.graph.meta.out_tree
        return step, ran

    def _compile(self, batches, signature):
        """Trace and compile the step for this signature (and the Python state its trace reads:
        a module's train/eval flag); every rank compares what it will exchange."""
        self.trace_count += 1
        step, error, key = None, None, None
        try:
            step = self.layout.compile_step(self.step_fn, batches, self.contexts, self.backend,
                                            self.options, self.input_fn)
        except ReplicateError as e:
            error = e
        if step is not None:
            key = self.cache.add(signature, step)
        self._schedules.compiled(key, step.schedule if step else [], error,
                                 self._describe_batches(batches, self.step + 1), self.step + 1)
        return step

    def _describe_batches(self, batches, compiled_at):
        return describe_batches(batches, compiled_at == self.step + 1, compiled_at,
                                self.input_fn)
