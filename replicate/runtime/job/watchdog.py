"""The stall watchdog: no cross-process call waits forever.

Every call of ``comm.MPIComm`` that waits for other processes (``allreduce``, ``allgather``,
``bcast``, ``allgather_obj``, ``bcast_obj``, ``dup``; from any thread) records itself in
``TRACKER`` while it waits: the communicator, the call's sequence number on it, the op, the
operand, the step. That is a few attribute writes, so the common path stays as fast as before —
the MPI call itself is the ordinary blocking one.

A daemon thread per process (``Watchdog``) wakes every ``period`` seconds. When a call has waited
longer than the timeout (``REPLICATE_COLLECTIVE_TIMEOUT`` seconds, default 300, ``off`` or ``0``
disables; ``Replicator(collective_timeout=...)``), it asks every peer's watchdog over a side
channel (a duplicate of the world communicator, point-to-point messages) what it is doing, prints
which ranks have not arrived at that collective and what each of them is doing instead (its step
and source line), and aborts the job. A process that exits while its peers still wait for it in
a collective it will never join says goodbye on the same channel: they abort at once. Hosts that
go silent: ``heartbeat.py``.
"""

from __future__ import annotations

import atexit
import math
import os
import queue
import sys
import threading
import time

from ...errors import ReplicateError, source_line
from . import heartbeat, status
from .stall_words import _at_step, _describe_peer, _exited_early

ENV = "REPLICATE_COLLECTIVE_TIMEOUT"
DEFAULT_TIMEOUT = 300.0
GRACE = 2.0  # how long a stalled rank waits for its peers to describe themselves
_QUERY, _STATE, _BYE = 30001, 30002, 30003
_PACKAGE_DIR = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))  # replicate/
_WAITING = os.path.join(os.path.dirname(os.path.abspath(queue.__file__)), "queue.py")  # (a wait)


def parse_timeout(value, what=ENV) -> float:
    """Seconds as a float; 0 means no timeout. Accepts numbers, numeric strings and 'off'."""
    if isinstance(value, str):
        text = value.strip().lower()
        if text in ("off", "none", "inf", ""):
            return 0.0
        try:
            value = float(text)
        except ValueError:
            raise ReplicateError(f"{what}={value!r}: expected seconds (e.g. 300) or 'off'") \
                from None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0 \
            or math.isnan(value):
        raise ReplicateError(f"{what} must be a number of seconds >= 0 (0: no timeout), "
                             f"got {value!r}")
    return 0.0 if math.isinf(value) else float(value)


def timeout_from_env() -> float:
    return DEFAULT_TIMEOUT if (raw := os.environ.get(ENV)) is None else parse_timeout(raw)


class Call:
    """One cross-process call in progress."""

    __slots__ = ("comm", "seq", "op", "operand", "step", "phase", "thread", "t0")

    def __init__(self, comm, seq, op, operand, step, phase, thread, t0):
        self.comm, self.seq, self.op, self.operand = comm, seq, op, operand
        self.step, self.phase, self.thread, self.t0 = step, phase, thread, t0

    def describe(self) -> str:
        operand = self.operand
        if hasattr(operand, "shape") and hasattr(operand, "dtype"):
            operand = f"{operand.dtype}{list(operand.shape)}"
        text = f"{self.op} #{self.seq} on communicator {self.comm!r}"
        text += f" ({operand})" if operand is not None else ""
        return text + _at_step(self.step, self.phase)


class Tracker:
    """What this process is doing: the step, and every cross-process call now waiting."""

    def __init__(self):
        self.step = None  # set by the Replicator before each step
        self.phase = None  # e.g. "input check", "step", "outputs"
        self.inflight: dict[int, Call] = {}  # thread ident -> its call
        self.comms: dict[str, object] = {}  # label -> communicator (its ``seq`` counts calls)
        # label -> the world ranks that take part (a communicator of some processes, or the
        # actors a learner waits for: runtime/actors/link.py); absent: every rank
        self.members: dict[str, set] = {}
        self.describers: list = []  # () -> lines on this process's other threads (actors)
        # device collectives in flight (device_collectives.py): key -> [call, event or None]
        self.device: dict = {}

    def entered(self) -> dict:
        return {label: comm.seq for label, comm in list(self.comms.items())}


TRACKER = Tracker()


def device_calls() -> list:
    """The device collectives still running, their events not done (those done are dropped:
    the host never waits for NCCL, so they are polled; an event that fails is no stall)."""
    for key, (_call, event) in list(TRACKER.device.items()):
        try:
            done = event is not None and bool(event.done)
        except Exception:  # noqa: BLE001 - a device error: the step reports it
            done = True
        if done:
            TRACKER.device.pop(key, None)
    return [call for call, _ in list(TRACKER.device.values())]


def set_step(step, phase=None) -> None:
    TRACKER.step, TRACKER.phase = step, phase
    status.set_step(step)  # (for the launcher: where this rank was if it vanishes)


_EXIT_CODE: list = []  # this process's exit code, once known (for the goodbye)


def note_exit(code: int) -> None:
    """This process is about to exit with ``code`` (its peers are told, with its step)."""
    _EXIT_CODE[:] = [int(code)]


def user_line(frame) -> str:
    """The innermost frame of ``frame``'s stack outside this package, as 'file:line: code'."""
    inner = None
    while frame is not None:
        path = os.path.abspath(frame.f_code.co_filename)
        if not path.startswith((_PACKAGE_DIR + os.sep, _WAITING)) and "threading" not in path:
            return source_line((path, frame.f_lineno))
        inner = inner or frame
        frame = frame.f_back
    if inner is None:
        return "?"
    return source_line((inner.f_code.co_filename, inner.f_lineno))


def _feeder(frame):
    """The prefetch thread's id when ``frame`` (a thread's innermost frame) waits for a batch
    it makes (``runtime/inputs/prefetch.py``): that thread is where a stalled ``input_fn`` is."""
    while frame is not None:
        code = frame.f_code
        if code.co_name == "next" and code.co_filename.endswith("prefetch.py"):
            thread = getattr(frame.f_locals.get("self"), "_thread", None)
            return getattr(thread, "ident", None)
        frame = frame.f_back
    return None


def state(rank) -> dict:
    """This process's state, as sent to a peer that asks."""
    frames = sys._current_frames()
    main = threading.main_thread().ident
    feeder = _feeder(frames.get(main))
    where = user_line(frames.get(main))
    if feeder in frames:
        where = f"{user_line(frames[feeder])} (input_fn, on the prefetch thread)"
    return {
        "rank": rank, "step": TRACKER.step, "phase": TRACKER.phase,
        "entered": TRACKER.entered(),
        "inflight": [(c.comm, c.seq, c.describe(), c.thread) for c in
                     list(TRACKER.inflight.values())],
        "where": where,
        "threads": [line for describe in list(TRACKER.describers) for line in describe()],
    }


class Watchdog:
    """The per-process thread that finds stalled calls, reports them and aborts the job."""

    def __init__(self, world, timeout: float):
        MPI = world.MPI
        self.MPI, self.world = MPI, world
        self.rank, self.size = world.rank, world.size
        self._timeout = timeout  # None: $REPLICATE_COLLECTIVE_TIMEOUT, read when needed
        # The side channel is created without blocking (a process that never calls ``world()``
        # must not hang the others here); it is usable once every process has joined.
        self.side, self._side_req = None, None
        if MPI.Query_thread() == MPI.THREAD_MULTIPLE:  # else: report this rank's side only
            self.side, self._side_req = world.comm.Idup()
        self.gone: dict[int, dict] = {}
        self.reported = False
        self._sends: list = []
        self._stop = threading.Event()
        self.beats = heartbeat.Heartbeat(self, getattr(world, "hosts", None))  # (across hosts)
        self.thread = threading.Thread(target=self._loop, name="replicate-watchdog", daemon=True)
        self.thread.start()
        atexit.register(self.close)

    @property
    def timeout(self) -> float:
        return timeout_from_env() if self._timeout is None else self._timeout

    @timeout.setter
    def timeout(self, seconds: float) -> None:
        self._timeout = seconds

    @property
    def period(self) -> float:
        return 0.2 if not self.timeout else min(0.2, max(0.02, self.timeout / 10))

    # -- the loop -------------------------------------------------------------------------------
    def _loop(self):
        while not self._stop.wait(self.period):
            try:
                self._serve()
                self._check()
                self.beats.beat(self._ready())
            except Exception as e:  # noqa: BLE001 - the watchdog must never die silently
                print(f"[replicate] rank {self.rank}: watchdog error: {e!r}", file=sys.stderr,
                      flush=True)

    def _ready(self) -> bool:
        if self.side is None:
            return False
        if self._side_req is not None:
            if not self._side_req.Test():
                return False
            self._side_req = None
        return True

    def _serve(self, answers=None):
        """Answer peers' questions, note goodbyes; collect answers to our own question."""
        if not self._ready():
            return
        status = self.MPI.Status()
        while self.side.iprobe(source=self.MPI.ANY_SOURCE, tag=self.MPI.ANY_TAG, status=status):
            source, tag = status.Get_source(), status.Get_tag()
            message = self.side.recv(source=source, tag=tag)
            if tag == _QUERY:
                self._send(state(self.rank), source, _STATE)
            elif tag == _STATE and answers is not None:
                answers[source] = message
            elif tag == _BYE:
                self.gone[source] = message
            elif tag == heartbeat.TAG:
                self.beats.heard_from(source)
        self._sends = [r for r in self._sends if not r.Test()]

    def _send(self, message, dest, tag):
        self._sends.append(self.side.isend(message, dest=dest, tag=tag))

    def _check(self):
        now = time.monotonic()
        for call in list(TRACKER.inflight.values()) + device_calls():
            waited = now - call.t0
            members = TRACKER.members.get(call.comm)
            never = [r for r, final in self.gone.items()
                     if final["entered"].get(call.comm, 0) <= call.seq
                     and (members is None or r in members)]
            if never:
                self._report(call, waited, exited=never)
            elif self.timeout and waited > self.timeout:
                self._report(call, waited)

    # -- the report -----------------------------------------------------------------------------
    def _report(self, call, waited, exited=()):
        if self.reported:
            return
        self.reported = True
        members = TRACKER.members.get(call.comm)
        peers = [r for r in range(self.size) if r != self.rank
                 and (members is None or r in members)]
        answers = {r: self.gone[r] for r in exited}
        if self._ready():
            for r in peers:
                if r not in answers:
                    self._send(None, r, _QUERY)
            deadline = time.monotonic() + GRACE
            while time.monotonic() < deadline and len(answers) < len(peers):
                self._serve(answers)
                time.sleep(0.02)
        frames = sys._current_frames()
        where = user_line(frames.get(call.thread))
        thread = next((t.name for t in threading.enumerate() if t.ident == call.thread), "?")
        if exited:
            head = "; ".join(_exited_early(r, answers[r]) for r in exited) + (
                f"; rank {self.rank} waits for {'it' if len(exited) == 1 else 'them'} in "
                f"{call.describe()}")
        else:
            head = (f"collective timed out: rank {self.rank} waited {waited:.1f} s "
                    f"(limit {self.timeout:g} s, {ENV}) in {call.describe()}")
        lines = [f"[replicate] rank {self.rank}: {head}",
                 f"  called from {where}" + ("" if thread == "MainThread" else
                                              f" (thread {thread!r})")]
        missing, arrived = [], [self.rank]
        for r in peers:
            info = answers.get(r)
            if info is None:
                missing.append(r)
                lines.append(f"  rank {r}: did not answer within {GRACE:g} s "
                             "(hung outside Python, or gone)")
                continue
            here = info["entered"].get(call.comm, 0) > call.seq
            (arrived if here else missing).append(r)
            lines.append(f"  rank {r}: " + _describe_peer(info, call, here, r in exited))
        lines.insert(1, f"  ranks that have not arrived: {missing}; arrived: {sorted(arrived)}")
        lines.append("  aborting the job (every rank ends).")
        print("\n".join(lines), file=sys.stderr, flush=True)
        self.world.abort(1)

    # -- shutdown -------------------------------------------------------------------------------
    def close(self):
        """At exit: stop the thread; tell the peers how far this process got (a peer still
        waiting in a collective this process never entered then aborts at once)."""
        if self._stop.is_set():
            return
        self._stop.set()
        self.thread.join(timeout=5)
        deadline = time.monotonic() + 1.0
        while self.side is not None and not self._ready() and time.monotonic() < deadline:
            time.sleep(0.005)  # the side channel's creation may still need a few progress calls
        if not self._ready() or self.reported:
            return
        final = {"rank": self.rank, "step": TRACKER.step, "phase": "exited",
                 "entered": TRACKER.entered(), "inflight": [], "where": "exited",
                 "code": _EXIT_CODE[0] if _EXIT_CODE else None}
        for r in range(self.size):
            if r != self.rank:
                self._send(final, r, _BYE)
        deadline = time.monotonic() + 1.0
        while self._sends and time.monotonic() < deadline:
            self._sends = [r for r in self._sends if not r.Test()]
            time.sleep(0.005)
        for request in self._sends:  # undelivered (the peer is gone): let MPI drop it
            try:
                request.Cancel()
                request.Free()
            except Exception:  # noqa: BLE001, S110
                pass
        self._sends = []
        self._drain(1.0)
        self.side.Free()
        self.side = None

    def _drain(self, seconds: float) -> None:
        """Receive what the peers sent until each has said goodbye (at most ``seconds``): a
        message still unreceived at ``MPI_Finalize`` (a beat, a goodbye) makes UCX print
        'unexpected tag-receive descriptor ... was not matched' at the end of a job across hosts.
        A peer's goodbye is its last message here (MPI keeps one sender's order)."""
        deadline, status = time.monotonic() + seconds, self.MPI.Status()
        while len(self.gone) < self.size - 1 and time.monotonic() < deadline:
            if self.side.iprobe(source=self.MPI.ANY_SOURCE, tag=self.MPI.ANY_TAG, status=status):
                message = self.side.recv(source=status.Get_source(), tag=status.Get_tag())
                if status.Get_tag() == _BYE:
                    self.gone[status.Get_source()] = message
            else:
                time.sleep(0.002)


_WATCHDOG: Watchdog | None = None


def start(world, timeout: float | None = None) -> Watchdog | None:
    """Start the process's watchdog for ``world`` (an ``MPIComm``); once per process. Without
    ``timeout`` it follows ``$REPLICATE_COLLECTIVE_TIMEOUT`` (read when a call waits, so setting
    it after ``import replicate`` counts), until ``set_timeout``."""
    global _WATCHDOG
    if _WATCHDOG is None:
        timeout_from_env()  # a malformed value is an error now, not in the thread
        _WATCHDOG = Watchdog(world, timeout)
    return _WATCHDOG


def close() -> None:
    """Stop the watchdog now and say goodbye to the peers (as at exit)."""
    if _WATCHDOG is not None:
        _WATCHDOG.close()


def set_timeout(seconds) -> None:
    """Change this process's stall timeout (0: none); ``Replicator(collective_timeout=...)``."""
    seconds = parse_timeout(seconds, "collective_timeout")
    if _WATCHDOG is not None:
        _WATCHDOG.timeout = seconds


def current_timeout() -> float | None:
    return None if _WATCHDOG is None else _WATCHDOG.timeout
