"""Actors: threads that run ``actor_fn`` with a published copy of the policy's parameters and
push its trajectories into a bounded queue; the learners' side takes them out (``Feed``).

* **A copy of the parameters, a few updates old.** The learners publish the parameters — a
  read-only copy and its *version*, the number of learner updates behind it — on the process's
  ``Board`` every N steps. Before each trajectory an actor takes the newest copy, and on its
  thread the policy's Variables read as that copy (``state.hooks.values``: eager reads and
  compiled calls alike) while the learner goes on updating the Variables themselves. A whole
  trajectory is made with one copy, so its version says exactly which parameters made it.
* **Back-pressure.** The queue (``Inbox``) holds at most ``capacity`` trajectories: an actor that
  is ahead waits (it polls for the stop), so actors never run further ahead of the learners.
* **Failures.** What ``actor_fn`` raises is kept with the actor's id, process, thread and
  traceback (the user's frames); ``Feed`` raises it as an ``rp.ActorError`` or, with
  ``on_actor_failure="continue"``, warns once and goes on with the actors left.
* **Nothing hangs.** A learner waiting for trajectories is a call the stall watchdog sees (label
  ``"actors"``, members: the actor processes it waits for; ``runtime/job/watchdog.py``): an actor
  process that leaves is noticed at once, a stall after the collective timeout, and the report
  names what each actor thread is doing. In one process (no watchdog) ``Feed`` raises itself.
"""

from __future__ import annotations

import itertools
import os
import queue
import sys
import threading
import time
import traceback
import warnings
from dataclasses import dataclass
from threading import get_ident

import numpy as np

from ... import state, tree
from ...errors import ActorError, InputError, function_location, user_traceback
from ...interop import from_foreign, is_foreign
from ..checks.entry import aval_of, first_problem, leaf_paths
from ..job import watchdog
from ..job.watchdog import TRACKER, Call

POLL = 0.05  # seconds between checks for a stop, a failure or a stall while waiting
PACKAGE = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..")) + os.sep
LABEL = "actors"  # the watchdog's name for the learners' waits for trajectories
_waits = itertools.count()


@dataclass(frozen=True)
class ActorContext:
    """What ``actor_fn(ctx)`` receives: ``actor_id`` (0 .. ``num_actors`` - 1 over every
    process), ``num_actors``, ``rank`` (its process), ``local_id`` (its index among the
    process's actors) and ``run`` (0 in the first ``run``, 1 in the next: each ``run`` starts
    the actors anew; seed environments from ``actor_id`` and ``run``)."""

    actor_id: int
    num_actors: int
    rank: int = 0
    local_id: int = 0
    run: int = 0


@dataclass(frozen=True)
class Snapshot:
    version: int  # the learner updates behind these values
    values: dict  # id(variable) -> read-only array


class Item:
    """One trajectory in a queue: what ``actor_fn`` yielded, the version of the parameters that
    made it, the actor, and the process it came from (None: this one)."""

    __slots__ = ("trajectory", "version", "actor_id", "source")

    def __init__(self, trajectory, version, actor_id, source=None):
        self.trajectory, self.version, self.actor_id = trajectory, version, actor_id
        self.source = source


class Board:
    """The newest parameters published in this process; ``publish`` replaces them at once."""

    def __init__(self, params):
        self.params = list(params)
        self.latest: Snapshot | None = None
        self._ready = threading.Event()

    def publish(self, version: int, arrays, copy: bool = True) -> None:
        values = {}
        for var, value in zip(self.params, arrays):
            value = np.array(value, copy=True) if copy else np.asarray(value)
            value.setflags(write=False)  # (an actor cannot change what the others act with)
            values[id(var)] = value
        self.latest = Snapshot(int(version), values)
        self._ready.set()

    def wait(self, stop: threading.Event) -> Snapshot | None:
        """The first publication (None if ``stop`` is set first)."""
        while not self._ready.wait(POLL):
            if stop.is_set():
                return None
        return self.latest


def owned(trajectory):
    """The trajectory with its arrays copied: a generator that refills one buffer and yields it
    again must not change a trajectory still waiting in the queue."""
    def own(x):
        if isinstance(x, np.ndarray):
            return x.copy()
        return np.array(from_foreign(x), copy=True) if is_foreign(x) else x
    return tree.tree_map(own, trajectory)


class Inbox:
    """The trajectories waiting for a process's learners (at most ``capacity``), the actors'
    failures and ends (``events``), and how many actors still run."""

    def __init__(self, capacity: int, actors: int):
        self.queue: queue.Queue = queue.Queue(maxsize=capacity)
        self.events: queue.SimpleQueue = queue.SimpleQueue()  # (kind, actor text, report)
        self.alive = actors
        self._lock = threading.Lock()

    def ended(self, kind: str, who: str, report: str | None = None, count: int = 1) -> None:
        """``count`` actors stopped: ``kind`` "failed" (with its report) or "finished"."""
        with self._lock:
            self.alive -= count
        self.events.put((kind, who, report))


class ActorPool:
    """This process's actor threads, one per context, feeding ``inbox``."""

    def __init__(self, actor_fn, contexts, board: Board, inbox: Inbox):
        self.actor_fn, self.contexts, self.board, self.inbox = actor_fn, contexts, board, inbox
        self._stop = threading.Event()
        self.threads = [threading.Thread(target=self._run, args=(ctx,), daemon=True,
                                         name=f"replicate-actor-{ctx.actor_id}")
                        for ctx in contexts]

    def start(self) -> None:
        TRACKER.describers.append(self.describe)
        for thread in self.threads:
            thread.start()

    def stop(self, grace: float = 1.0) -> None:
        """Stop the actors: each ends when it next yields (or waits on a full queue). A thread
        still busy after ``grace`` seconds finishes its trajectory in the background; it is
        dropped."""
        self._stop.set()
        deadline = time.monotonic() + grace
        for thread in self.threads:
            if thread.ident is not None and thread is not threading.current_thread():
                thread.join(max(0.0, deadline - time.monotonic()))
        if self.describe in TRACKER.describers:
            TRACKER.describers.remove(self.describe)

    def who(self, ctx: ActorContext) -> str:
        return f"actor {ctx.actor_id} (rank {ctx.rank}, thread 'replicate-actor-{ctx.actor_id}')"

    def describe(self) -> list:
        """A line per live actor thread: where in the user's code it is (for stall reports)."""
        frames = sys._current_frames()
        return [f"{self.who(ctx)}: at {watchdog.user_line(frames.get(t.ident))}"
                for ctx, t in zip(self.contexts, self.threads) if t.is_alive()]

    def _run(self, ctx: ActorContext) -> None:
        hooks, made = state.hooks, 0
        try:
            snapshot = self.board.wait(self._stop)
            if snapshot is None:
                return
            hooks.values = snapshot.values
            iterator = iter(self.actor_fn(ctx))
            while not self._stop.is_set():
                snapshot = self.board.latest  # one copy of the parameters per trajectory
                hooks.values = snapshot.values
                trajectory = next(iterator, _END)
                if trajectory is _END:
                    self.inbox.ended("finished", self.who(ctx))
                    return
                made += 1
                if not self._put(Item(owned(trajectory), snapshot.version, ctx.actor_id)):
                    return
        except BaseException as e:  # noqa: BLE001 - reported for the learners (Feed)
            head = (f"{self.who(ctx)} failed making trajectory {made + 1} in actor_fn "
                    f"{function_location(self.actor_fn)}:")
            text = "".join(traceback.format_exception(type(e), e,
                                                      user_traceback(e.__traceback__)))
            self.inbox.ended("failed", self.who(ctx), f"{head}\n{text}")
        finally:
            hooks.values = None

    def _put(self, item: Item) -> bool:
        while not self._stop.is_set():
            try:
                self.inbox.queue.put(item, timeout=POLL)
                return True
            except queue.Full:  # (back-pressure: the learners are behind)
                continue
        return False


_END = object()


class Feed:
    """The learners' side of an ``Inbox``: ``take(n)`` gives the next ``n`` trajectories,
    reporting the actors' failures as ``on_failure`` says ("abort": raise ``ActorError``;
    "continue": warn and go on while any actor runs); None when every actor has finished."""

    def __init__(self, inbox: Inbox, on_failure: str, timeout, describe, took=None):
        self.inbox, self.on_failure = inbox, on_failure
        self.timeout = timeout  # () -> seconds (0: none), used only without a watchdog
        self.describe = describe  # () -> lines on the actors (for a stall)
        self.took = took  # called with each item taken (credits for a remote actor)
        self.failed: list[str] = []

    def take(self, count: int, step: int, keep=None) -> list | None:
        """``count`` items (those ``keep(item)`` refuses are dropped: too old), or None."""
        items, t0, ident = [], None, None
        try:
            while len(items) < count:
                self._events()
                try:
                    item = self.inbox.queue.get(timeout=POLL) if t0 is not None \
                        else self.inbox.queue.get_nowait()
                except queue.Empty:
                    item = None
                if item is not None:
                    if self.took is not None:
                        self.took(item)
                    if keep is None or keep(item):
                        items.append(item)
                    continue
                if t0 is None:  # about to wait: the watchdog sees it from here on
                    t0, ident = time.monotonic(), get_ident()
                    TRACKER.inflight[ident] = Call(
                        LABEL, next(_waits), "waiting for trajectories",
                        f"{count - len(items)} of {count}", step, "input", ident, t0)
                if self.inbox.alive <= 0 and self.inbox.queue.empty():
                    self._events()
                    if self.failed:
                        raise ActorError(f"every actor has stopped ({len(self.failed)} failed; "
                                         "the first failure:)\n" + self.failed[0])
                    return None
                self._stalled(t0, step)
        finally:
            if ident is not None:
                TRACKER.inflight.pop(ident, None)
        return items

    def _events(self) -> None:
        while True:
            try:
                kind, who, report = self.inbox.events.get_nowait()
            except queue.Empty:
                return
            if kind != "failed":
                continue
            self.failed.append(report)
            if self.on_failure == "abort":
                raise ActorError(report.rstrip() + "\n(on_actor_failure='abort'; pass "
                                 "on_actor_failure='continue' to go on with the other actors)")
            warnings.warn(f"{report.rstrip()}\nthe learners carry on with the remaining "
                          f"{max(self.inbox.alive, 0)} actor(s) (on_actor_failure='continue')",
                          stacklevel=_user_level())

    def _stalled(self, t0: float, step: int) -> None:
        if watchdog.current_timeout() is not None:  # the watchdog reports and aborts
            return
        limit = self.timeout()
        waited = time.monotonic() - t0
        if limit and waited > limit:
            lines = "".join(f"\n  {line}" for line in self.describe()) or \
                "\n  (no actor thread is running)"
            raise ActorError(
                f"the learner waited {waited:.1f} s (limit {limit:g} s, "
                f"collective_timeout / {watchdog.ENV}) for trajectories at step {step}; "
                f"{max(self.inbox.alive, 0)} actor(s) running:{lines}")


def _user_level() -> int:
    """The ``stacklevel`` of the innermost caller outside this package (a warning names the
    user's line, ``al.run(...)``)."""
    frame, level = sys._getframe(2), 2
    while frame is not None and frame.f_code.co_filename.startswith(PACKAGE):
        frame, level = frame.f_back, level + 1
    return level


def stack(items: list, actor_fn) -> object:
    """The trajectories of ``items`` stacked leaf by leaf (a new leading axis)."""
    for item in items:
        check_leaves(item, actor_fn)
    first, tdef = tree.flatten(items[0].trajectory)
    leaves = [first]
    for item in items[1:]:
        mine, mdef = tree.flatten(item.trajectory)
        shapes = [(np.shape(x), np.asarray(x).dtype) for x in mine]
        if mdef != tdef or shapes != [(np.shape(x), np.asarray(x).dtype) for x in first]:
            raise InputError(
                f"actor {items[0].actor_id} and actor {item.actor_id} yielded trajectories of "
                f"another structure, shape or dtype ({_describe(first, tdef)} vs "
                f"{_describe(mine, mdef)}): the learner stacks them into one batch, so every "
                f"trajectory of actor_fn {function_location(actor_fn)} must be alike")
        leaves.append(mine)
    try:
        stacked = [np.stack([np.asarray(x[j]) for x in leaves]) for j in range(len(first))]
    except (TypeError, ValueError) as e:
        raise InputError(f"trajectories of actor_fn {function_location(actor_fn)} cannot be "
                         f"stacked into a batch: {e}") from None
    return tree.unflatten(tdef, stacked)


def _describe(leaves, treedef) -> str:
    paths = leaf_paths(treedef) if len(leaves) > 1 else [""]
    return ", ".join(f"trajectory{p} {aval_of(x)}" for p, x in zip(paths, leaves))


def check_leaves(item: Item, actor_fn) -> None:
    """Every leaf of a trajectory is a numeric or boolean array (else an ``InputError``)."""
    found = first_problem(*tree.flatten(item.trajectory))
    if found:
        raise InputError(f"actor {item.actor_id}'s actor_fn {function_location(actor_fn)} "
                         f"yielded {found[0]} at trajectory{found[1]}: trajectories must be "
                         "nests (dict, list, tuple) of numeric or boolean arrays")
