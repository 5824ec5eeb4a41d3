"""``ActorLearner``: asynchronous actor-learner training — TF-Replicator's other regime, IMPALA's
shape — built from a ``Replicator`` for the learners and actor threads that feed it.

Actors run ``actor_fn(ctx)``, a generator of trajectories (nests of arrays), in threads, with a
copy of the parameters (``params``) that may be a few updates old; the learners are an ordinary
``Replicator`` (graph or eager mode, several replicas per process, its collectives and checks)
whose input is the queue: each replica's batch is ``batch_size`` trajectories stacked, and
``step_fn(trajectories, lag)`` also gets each trajectory's *policy lag* (learner updates between
the parameters that made it and those the step reads). Every ``publish_every`` learner steps
the parameters are published to the actors, never waiting for one.

Where the actors run: by default ``actors`` threads in every process, beside its learner (on 2
cores this keeps both busy: environment stepping and the step's NumPy calls overlap); with
``actor_ranks=[...]`` those processes only act (``actors`` threads each) and the others only
learn — their trajectories and the publications travel point to point (``runtime/actors/link.py``).

>>> import numpy as np, replicate as rp, replicate.numpy as rnp
>>> w = rp.Variable(np.zeros(2), name="w")
>>> def actor_fn(ctx):                      # acts with a published copy of w
...     while True:
...         yield {"obs": np.ones(2), "target": w.numpy() + 1.0}
>>> def step_fn(traj, lag):                 # traj leaves: (batch_size, ...)
...     loss = ((traj["obs"] * w - traj["target"]) ** 2).mean()
...     w.assign(w - 0.5 * rp.grad(loss, w))
...     return {"loss": loss, "lag": rnp.max(lag)}
>>> al = rp.ActorLearner(actor_fn, step_fn, params=[w], actors=1, batch_size=2)
>>> history = al.run(steps=3)
>>> len(history), al.stats["trajectories"]
(3, 6)
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import os
import sys

import numpy as np
from threadpoolctl import threadpool_info, threadpool_limits

from ... import tree
from ...errors import ConfigMismatchError, ReplicateError, source_line, user_frame
from ...function import check_mode
from ...state import Variable
from ..communication.agree import CONFIG, agree, digest
from ..communication.comm import SelfComm, blas_thread_limits, replicas_on, world
from ..job import hooks, watchdog
from ..job.watchdog import TRACKER
from ..loop.replicator import Replicator
from .link import LEARNERS, ActorLink, LearnerLink
from .pool import LABEL, ActorContext, ActorPool, Board, Feed, Inbox, stack

FAILURE_POLICIES = ("abort", "continue")


class ActorLearner:
    """Asynchronous actors feeding synchronous learners (see the module's docstring).

    ``actor_fn(ctx)`` (``rp.ActorContext``: ``actor_id``, ``num_actors``, ``rank``,
    ``local_id``, ``run``) yields trajectories; it reads ``params`` as the published copy (its
    own thread's view: eager reads, ``w.numpy()`` and ``rp.function`` calls alike). Build the
    environments inside it; each ``run`` starts the actors anew and stops them at its end.

    ``step_fn(trajectories, lag)``: one learner replica's step on ``batch_size`` trajectories
    stacked along a new first axis; ``lag`` is ``int64[batch_size]``. Options as for
    ``Replicator`` (``mode``, ``backend``, ``replicas_per_rank``, ``outputs``, ``options``,
    ``check_finite``, ``check_sync``, ``collective_timeout``; input prefetch is off: the queue is
    the prefetch). ``params``: the Variables the actors act with (``model.parameters()``).
    ``queue_size``: trajectories a learner process holds (default ``2 * batch_size *
    replicas_per_rank``); actors wait when it is full. ``max_lag``: trajectories older than
    this many updates are dropped (``stats['dropped']``). ``on_actor_failure``: ``"abort"``
    (an actor that raises ends the job with its traceback) or ``"continue"`` (a warning; the
    learners go on with the other actors; ``rp.ActorError`` once none is left).

    ``run(steps)`` on every process returns the learners' history (the same everywhere);
    ``stats`` counts trajectories, lags, drops and publications (this process's view).
    """

    def __init__(self, actor_fn, step_fn, *, params, actors: int = 1, actor_ranks=(),
                 batch_size: int = 1, publish_every: int = 1, queue_size: int | None = None,
                 max_lag: int | None = None, on_actor_failure: str = "abort",
                 mode: str = "graph", backend: str = "numpy", replicas_per_rank: int = 1,
                 outputs: str = "mean", options=None, check_finite: bool = False,
                 check_sync: bool | int = True, collective_timeout: float | None = None):
        self.world = world()
        rank, size = self.world.rank, self.world.size
        self.actor_fn, self.user_step_fn = actor_fn, step_fn
        self.params = _check_params(params)
        self.actors = _positive(actors, "actors")
        self.batch_size = _positive(batch_size, "batch_size")
        self.publish_every = _positive(publish_every, "publish_every")
        self.actor_ranks = _check_ranks(actor_ranks, size)
        self.learner_ranks = [r for r in range(size) if r not in self.actor_ranks]
        self.k = _positive(replicas_per_rank, "replicas_per_rank")
        self.capacity = _positive(max(2 * self.batch_size * self.k, len(self.actor_ranks))
                                  if queue_size is None else queue_size, "queue_size")
        if self.capacity < len(self.actor_ranks):
            raise ReplicateError(f"queue_size={queue_size} is less than the {len(self.actor_ranks)}"
                                 " actor processes: each needs room for one trajectory")
        if max_lag is not None and (isinstance(max_lag, bool) or
                                    not isinstance(max_lag, (int, np.integer)) or max_lag < 0):
            raise ReplicateError(f"max_lag must be None or an int >= 0, got {max_lag!r}")
        self.max_lag = max_lag
        if on_actor_failure not in FAILURE_POLICIES:
            raise ReplicateError(f"on_actor_failure must be one of {FAILURE_POLICIES}, got "
                                 f"{on_actor_failure!r}")
        self.on_failure = on_actor_failure
        _check_functions(actor_fn, step_fn)
        # (checked on every process: an actor process builds no Replicator that would say it)
        if check_mode(mode) == "eager" and self.k != 1:
            raise ReplicateError("eager mode runs one replica per process; use "
                                 "replicas_per_rank=1")
        if collective_timeout is not None:  # (the actor processes' watchdogs too)
            collective_timeout = watchdog.parse_timeout(collective_timeout, "collective_timeout")
            watchdog.set_timeout(collective_timeout)
        self.timeout = collective_timeout
        acting = self.actor_ranks or list(range(size))
        self.num_actors = self.actors * len(acting)
        self.is_learner = rank in self.learner_ranks
        self._agree(dict(mode=mode, backend=backend, replicas_per_rank=self.k, outputs=outputs))
        self.link_comm, learners = None, self.world
        if self.actor_ranks:  # two groups: the learners' collectives leave the actors out
            learners = self.world.split(0 if self.is_learner else 1,
                                        "learners" if self.is_learner else "actor processes")
            self.link_comm = self.world.dup()
            TRACKER.members[LABEL] = set(self.actor_ranks)
            TRACKER.members[LEARNERS] = set(self.learner_ranks)
            if learners.size == 1:
                learners = SelfComm()
        else:
            TRACKER.members[LABEL] = set()  # (the actors are this process's threads)
        self.learner_comm = learners
        first = acting.index(rank) * self.actors if rank in acting else 0
        self._local_ids = list(range(first, first + self.actors)) if rank in acting else []
        self.stats = {"trajectories": 0, "dropped": 0, "lags": {}, "publications": 0,
                      "publications_skipped": 0, "failed": []}
        self.runs, self.replicator, self._link = 0, None, None
        if self.is_learner:
            step = functools.wraps(step_fn)(lambda batch: step_fn(batch[0], batch[1]))
            source = functools.wraps(actor_fn)(lambda ctx: self._input_fn(ctx))
            self.replicator = Replicator(
                source, step, mode=mode, backend=backend, replicas_per_rank=self.k,
                outputs=outputs, options=options, comm=learners, check_finite=check_finite,
                check_sync=check_sync, collective_timeout=collective_timeout, prefetch=0)
            if self.actor_ranks:
                self._link = LearnerLink(self.link_comm, self.actor_ranks,
                                         rank == self.learner_ranks[0], None, self.capacity,
                                         self.stats)

    # -- the loop -------------------------------------------------------------------------------
    def run(self, steps: int | None = None, *, callbacks=(), progress: bool = False,
            metrics: str | None = None) -> list:
        """Start the actors, run ``steps`` learner steps (``callbacks``, ``progress``,
        ``metrics`` as for ``Replicator.run``), stop the actors; return the history, on every
        process. Call it on every process alike."""
        contexts = [ActorContext(a, self.num_actors, self.world.rank, i, self.runs)
                    for i, a in enumerate(self._local_ids)]
        self.runs += 1
        self.board = Board(self.params)
        remote = self.actors * len(self.actor_ranks) if self.is_learner else 0
        # (an actor process keeps one trajectory per thread: the rest wait at the learners)
        self.inbox = Inbox(self.capacity if self.is_learner else len(contexts),
                           len(contexts) + remote)
        pool = ActorPool(self.actor_fn, contexts, self.board, self.inbox) if contexts else None
        with _blas_share(len(contexts)):
            if not self.is_learner:
                pool.start()
                link = ActorLink(self.link_comm, self.learner_ranks, self.world, self.on_failure)
                return link.run(pool, self.board, self.inbox)
            return self._learn(pool, steps, callbacks, progress, metrics)

    def _learn(self, pool, steps, callbacks, progress, metrics) -> list:
        rep = self.replicator
        rep.restart_input()  # (the input restarts with the actors: its replicas' generators)
        took = None
        if self._link is not None:
            self._link.inbox = self.inbox
            self._link.start()
            took = self._link.took
        self._feed = Feed(self.inbox, self.on_failure, self._timeout, self._describe, took)
        if self.runs == 1 and self.learner_comm.size > 1:  # learner 0's values, everywhere
            for var in self.params:
                var.load(self.learner_comm.bcast(var.value, 0))
        history = []
        try:
            self._publish(rep.step)
            if pool is not None:
                pool.start()
            with replicas_on(self.learner_comm):
                history = rep.run(steps, callbacks=[*callbacks, self._after_step],
                                  progress=progress, metrics=metrics)
        except BaseException as e:
            if not self.actor_ranks or isinstance(e, KeyboardInterrupt):
                raise
            where = f"at step {rep.step + 1}"
            hooks.abort(self.world, 1, hooks.format_failure(
                self.world.rank, f"[replicate] rank {self.world.rank} (a learner) failed "
                f"{where}; aborting the job:", *sys.exc_info()))
        finally:
            if pool is not None:
                pool.stop()
            self.stats["failed"] = list(self._feed.failed)
        if self._link is not None:
            self._link.finish(history, rep.step)
        return history

    def _input_fn(self, ctx):
        """One learner replica's input: ``batch_size`` trajectories stacked, and their lags."""
        rep, stats = self.replicator, self.stats
        keep = None
        if self.max_lag is not None:
            def keep(item):
                fresh = rep.step - item.version <= self.max_lag
                stats["dropped"] += not fresh
                return fresh
        while True:
            items = self._feed.take(self.batch_size, rep.step + 1, keep)
            if items is None:
                return
            lag = np.array([rep.step - item.version for item in items], np.int64)
            stats["trajectories"] += len(items)
            for value in lag.tolist():
                stats["lags"][value] = stats["lags"].get(value, 0) + 1
            yield stack(items, self.actor_fn), lag

    def _after_step(self, rep, step, outputs):
        if step % self.publish_every == 0:
            self._publish(step)

    def _publish(self, version: int) -> None:
        """The parameters after ``version`` updates, to this process's actors (a copy swapped
        in at once) or, from learner 0, to the actor processes (never waiting)."""
        if self._link is None:
            self.board.publish(version, [var.value for var in self.params])
        elif self._link.publisher:
            self._link.publish(version, [np.array(var.value, copy=True) for var in self.params])
        else:
            return
        self.stats["publications"] += 1

    def _timeout(self) -> float:
        return watchdog.timeout_from_env() if self.timeout is None else self.timeout

    def _describe(self) -> list:
        return [line for describe in list(TRACKER.describers) for line in describe()]

    # -- every process alike --------------------------------------------------------------------
    def _agree(self, options: dict) -> None:
        """Every process constructs it alike (one small exchange; the fields on a difference)."""
        if self.world.size == 1:
            return
        mine = dict(options, actors=self.actors, actor_ranks=self.actor_ranks,
                    batch_size=self.batch_size, publish_every=self.publish_every,
                    queue_size=self.capacity, max_lag=self.max_lag,
                    on_actor_failure=self.on_failure,
                    params=[(tuple(v.shape), str(v.dtype)) for v in self.params])
        where = source_line(user_frame())
        agree(self.world, CONFIG, digest(repr(mine)),
              describe=lambda: f"constructing an ActorLearner at {where}",
              differ=lambda: _differ(self.world, mine, where))


def _differ(comm, mine: dict, where: str) -> None:
    everyone = comm.allgather_obj(mine)
    lines = [f"  {name}: " + ", ".join(f"rank {r}: {f[name]!r}" for r, f in enumerate(everyone))
             for name in mine if len({repr(f[name]) for f in everyone}) > 1]
    error = ConfigMismatchError(f"the processes constructed their ActorLearner differently (at "
                                f"{where}):\n" + "\n".join(lines) + "\nEvery process must "
                                "construct it with the same arguments and the same params.")
    error.consistent = True  # every rank raises it
    raise error


def _blas_share(actor_threads: int):
    """While actor threads run beside a process's own work, its BLAS gets the process's share
    of the cores less one per actor thread (at least 1) — each BLAS whose variables the user
    left unset. (OpenBLAS threads that wait by spinning on cores the actors need made a
    learner step with one actor thread beside it 4-12x slower here.)"""
    if not actor_threads:
        return contextlib.nullcontext()
    local = int(os.environ.get("MPI_LOCALNRANKS", "0") or 0) or world().size
    share = max(1, (os.cpu_count() or 1) // local - actor_threads)
    limits = blas_thread_limits(threadpool_info(), os.environ, share)
    return threadpool_limits(limits=limits) if limits else contextlib.nullcontext()


def _positive(value, name: str) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
        raise ReplicateError(f"{name} must be a positive int, got {value!r}")
    return int(value)


def _check_params(params) -> list:
    leaves, _ = tree.flatten(params)
    found = {}
    for leaf in leaves:
        if not isinstance(leaf, Variable):
            raise ReplicateError(
                f"params must be the rp.Variables the actors act with (a dict, list or nest of "
                f"them, e.g. model.parameters()), got a {type(leaf).__name__} among them")
        if not leaf.shared:
            raise ReplicateError(f"params: Variable {leaf.name!r} is "
                                 f"{'local' if leaf.local else 'per_replica'}; the published "
                                 "parameters are one value on every learner")
        found.setdefault(id(leaf), leaf)
    if not found:
        raise ReplicateError("params is empty: pass the Variables the actors act with "
                             "(e.g. model.parameters())")
    return list(found.values())


def _check_ranks(actor_ranks, size: int) -> list:
    try:
        ranks = sorted({int(r) for r in actor_ranks})
    except (TypeError, ValueError):
        raise ReplicateError(f"actor_ranks must be a list of process indices, got "
                             f"{actor_ranks!r}") from None
    if any(not 0 <= r < size for r in ranks):
        raise ReplicateError(f"actor_ranks {ranks}: this job has processes 0..{size - 1} "
                             f"(launch more with mpiexec -n N)")
    if ranks and len(ranks) == size:
        raise ReplicateError(f"actor_ranks {ranks} leaves no process to learn")
    return ranks


def _check_functions(actor_fn, step_fn) -> None:
    if not callable(actor_fn) or not callable(step_fn):
        raise ReplicateError("ActorLearner(actor_fn, step_fn, ...): both must be callables")
    try:
        inspect.signature(step_fn).bind(None, None)
    except TypeError:
        raise ReplicateError(
            "step_fn is called as step_fn(trajectories, lag): the stacked trajectories and "
            "their policy lag (int64[batch_size]); it must take two arguments") from None
    except ValueError:  # (no signature to inspect: a builtin)
        pass
