"""Actor processes and learner processes: the point-to-point traffic between them.

With ``ActorLearner(..., actor_ranks=[...])`` some processes only act and the others only learn.
Each side runs one loop that owns the traffic, on a duplicate of the world communicator (so it
never mixes with the learners' collectives), and never blocks inside MPI: it polls (``iprobe``,
``Test``) and sleeps a little when there is nothing to do.

    actor -> learner   TRAJ   (trajectory, version, actor id)    uses one credit
                       NOTE   (kind, actor, report): an actor failed or finished
                       DONE   after STOP: nothing more comes from this process
    learner -> actor   CREDIT n: room for n more trajectories in this learner's queue
                       PARAMS (version, arrays): only learner 0, every ``publish_every`` steps
                       STOP   only learner 0, when the learners' run ends
                       FIN    after the actor's DONE (learner 0's carries the run's history)

**Bounded queues.** Each learner process grants the actor processes credits for its queue's
capacity and gives one back for each trajectory its steps take; an actor process sends only
with credit, to the learner with the most room. Trajectories in the learner's queue plus those
in flight never exceed its capacity; the actor threads wait on their own bounded queue.

**Publication never blocks a learner.** Learner 0's step hands the parameters to its link
thread; if an actor process has not yet received the previous copy, that process skips this
one (it gets the next) and ``stats['publications_skipped']`` counts it.

**Shutdown.** STOP, then each actor process's DONE, then each learner's FIN: by then every
message either side sent has been received (MPI keeps the order between two processes), so a
later ``run`` or the end of the job finds no stray message. Every wait is a call the stall
watchdog sees; an actor process that fails with ``on_actor_failure="abort"`` (the default) ends
the job with its report (``MPI_Abort``), as a failing rank does.
"""

from __future__ import annotations

import itertools
import queue
import threading
import time
from threading import get_ident

from ..job import hooks
from ..job.watchdog import TRACKER, Call
from .pool import LABEL, Item

TRAJ, NOTE, DONE, CREDIT, PARAMS, STOP, FIN = range(41001, 41008)
LEARNERS = "learners (from the actors)"  # the watchdog's label for an actor process's waits
_seq = itertools.count()


def _idle(count: int) -> None:
    """Sleep a little when nothing happened: 0.1 ms at first, up to 2 ms after a while."""
    time.sleep(min(0.002, 0.0001 * (1 << min(count, 5))))


def _waiting(label: str, op: str, operand=None, step=None):
    """Register this thread's wait with the stall watchdog; returns what ``_done`` takes."""
    ident = get_ident()
    TRACKER.inflight[ident] = Call(label, next(_seq), op, operand, step, "actors", ident,
                                   time.monotonic())
    return ident


def _done(ident) -> None:
    if ident is not None:
        TRACKER.inflight.pop(ident, None)


def shares(capacity: int, count: int) -> list:
    """``capacity`` credits split over ``count`` actor processes (the first get the rest)."""
    return [capacity // count + (i < capacity % count) for i in range(count)]


class LearnerLink:
    """A learner process's side: a thread that feeds the process's ``Inbox`` from the actor
    processes, returns credits, sends learner 0's publications and runs the shutdown."""

    def __init__(self, comm, actor_ranks, publisher: bool, inbox, capacity: int, stats):
        self.comm, self.actors, self.publisher = comm, list(actor_ranks), publisher
        self.inbox, self.capacity, self.stats = inbox, capacity, stats
        self._lock = threading.Lock()
        self._thread = None

    # -- called by the learner's main thread ----------------------------------------------------
    def start(self) -> None:
        self._owed = dict.fromkeys(self.actors, 0)
        self._jobs: queue.SimpleQueue = queue.SimpleQueue()
        self._finished = threading.Event()
        self.error = None
        self._thread = threading.Thread(target=self._loop, name="replicate-actor-link",
                                        daemon=True)
        self._thread.start()

    def took(self, item) -> None:
        """The steps took ``item`` from the queue: one credit back to its process."""
        if item.source is not None:
            with self._lock:
                self._owed[item.source] += 1

    def publish(self, version: int, arrays) -> None:
        self._jobs.put(("params", (int(version), arrays)))

    def finish(self, history, step) -> None:
        """Stop the actors and wait until the traffic of this run is over."""
        if self._thread is None:
            return
        self._jobs.put(("stop", history))
        ident = _waiting(LABEL, "stopping the actor processes", None, step)
        try:
            while not self._finished.wait(0.05):
                pass
        finally:
            _done(ident)
        self._thread = None
        if self.error is not None:
            raise self.error

    # -- the link thread ------------------------------------------------------------------------
    def _loop(self):
        comm, MPI = self.comm.comm, self.comm.MPI
        sends, params = [], {}  # requests in flight; the last publication per actor process
        stopping, done, history, idle = False, set(), None, 0
        try:
            for rank, credit in zip(self.actors, shares(self.capacity, len(self.actors))):
                sends.append(comm.isend(credit, dest=rank, tag=CREDIT))
            status = MPI.Status()
            while True:
                busy = False
                while True:
                    try:
                        kind, payload = self._jobs.get_nowait()
                    except queue.Empty:
                        break
                    busy = True
                    if kind == "params":
                        for rank in self.actors:
                            if rank in params and not params[rank].Test():
                                self.stats["publications_skipped"] += 1
                                continue
                            params[rank] = comm.isend(payload, dest=rank, tag=PARAMS)
                    else:  # "stop": learner 0 tells the actors (after its last publication)
                        stopping, history = True, payload
                        if self.publisher:
                            sends.extend(comm.isend(None, dest=r, tag=STOP) for r in self.actors)
                if not stopping:
                    with self._lock:
                        owed = {r: n for r, n in self._owed.items() if n}
                        self._owed = dict.fromkeys(self.actors, 0)
                    sends.extend(comm.isend(n, dest=r, tag=CREDIT) for r, n in owed.items())
                while comm.iprobe(source=MPI.ANY_SOURCE, tag=MPI.ANY_TAG, status=status):
                    source, tag = status.Get_source(), status.Get_tag()
                    message = comm.recv(source=source, tag=tag)
                    busy = True
                    if tag == TRAJ:
                        self.inbox.queue.put(Item(*message, source=source))  # (credit: room)
                    elif tag == NOTE:
                        self.inbox.ended(*message)
                    elif tag == DONE:
                        done.add(source)
                if stopping and done == set(self.actors):
                    sends.extend(comm.isend(history if self.publisher else None, dest=r,
                                            tag=FIN) for r in self.actors)
                    pending = sends + list(params.values())
                    while pending:  # (the actors receive everything before their FIN)
                        pending = [r for r in pending if not r.Test()]
                        _idle(5)
                    return
                sends = [r for r in sends if not r.Test()]
                idle = 0 if busy else idle + 1
                if not busy:
                    _idle(idle)
        except BaseException as e:  # noqa: BLE001 - raised by ``finish`` on the main thread
            self.error = e
        finally:
            self._finished.set()


class ActorLink:
    """An actor process's side, run by its main thread for one ``run``: sends the pool's
    trajectories with credit, takes publications, reports failures, and stops on STOP."""

    def __init__(self, comm, learner_ranks, world, on_failure: str):
        self.comm, self.learners, self.world = comm, list(learner_ranks), world
        self.on_failure = on_failure

    def run(self, pool, board, inbox):
        """Serve until the learners' run ends; returns learner 0's history."""
        comm, MPI = self.comm.comm, self.comm.MPI
        credits = dict.fromkeys(self.learners, 0)
        sends, fins, stopping, idle, blocked = [], {}, False, 0, None
        status = MPI.Status()
        try:
            while True:
                busy = False
                while comm.iprobe(source=MPI.ANY_SOURCE, tag=MPI.ANY_TAG, status=status):
                    source, tag = status.Get_source(), status.Get_tag()
                    message = comm.recv(source=source, tag=tag)
                    busy = True
                    if tag == CREDIT:
                        credits[source] += message
                    elif tag == PARAMS:
                        board.publish(message[0], message[1], copy=False)
                    elif tag == STOP:
                        stopping = True
                        pool.stop(grace=0.0)
                        sends.extend(comm.isend(None, dest=r, tag=DONE) for r in self.learners)
                    elif tag == FIN:
                        fins[source] = message
                if stopping:
                    if len(fins) == len(self.learners):
                        break
                else:
                    busy |= self._events(inbox, sends)
                    while max(credits.values()) > 0:
                        try:
                            item = inbox.queue.get_nowait()
                        except queue.Empty:
                            break
                        learner = max(credits, key=credits.get)  # the most room
                        credits[learner] -= 1
                        sends.append(comm.isend((item.trajectory, item.version, item.actor_id),
                                                dest=learner, tag=TRAJ))
                        busy = True
                    blocked = self._blocked(blocked, inbox.queue.full() and
                                            max(credits.values()) == 0)
                sends = [r for r in sends if not r.Test()]
                idle = 0 if busy else idle + 1
                if not busy:
                    _idle(idle)
            while sends:
                sends = [r for r in sends if not r.Test()]
                _idle(5)
        finally:
            _done(blocked)
            pool.stop(grace=1.0)
        return fins[self.learners[0]]

    def _events(self, inbox, sends) -> bool:
        """Pass the actors' failures and ends on to every learner (or end the job)."""
        busy = False
        while True:
            try:
                kind, who, report = inbox.events.get_nowait()
            except queue.Empty:
                return busy
            busy = True
            if kind == "failed" and self.on_failure == "abort":
                rank = self.world.rank
                hooks.abort(self.world, 1, f"[replicate] rank {rank}: {who} failed; aborting "
                            "the job (on_actor_failure='abort'):\n" + hooks.with_rank(rank, report))
            sends.extend(self.comm.comm.isend((kind, who, report), dest=r, tag=NOTE)
                         for r in self.learners)

    @staticmethod
    def _blocked(ident, now: bool):
        """The watchdog sees an actor process whose queue is full and that has no credit: the
        learners take nothing (a stall there is reported after the collective timeout)."""
        if now and ident is None:
            return _waiting(LEARNERS, "waiting for the learners to take trajectories")
        if not now and ident is not None:
            _done(ident)
            return None
        return ident
