"""Input prefetch: ``input_fn`` runs ahead of the steps on a background thread.

``Replicator(..., prefetch=n)`` keeps up to ``n`` steps' batches (one per local replica) ready,
so a step does not wait for its input while the previous step computes: a data-bound job pays
about ``max(input time, step time)`` per step instead of their sum. NumPy, BLAS, JAX, MPI and
file reads release the GIL, so the two overlap even in one Python process.

What stays as without prefetch:

* **Order.** One thread draws every local replica's next batch, in replica order, and the steps
  take them first in, first out: the same batches reach the same steps.
* **Set-up code runs on the caller's thread.** The first batch of each iterator is drawn there
  (synchronously), so whatever ``input_fn`` does before its first ``yield`` — loading a data
  set, ``rp.host.broadcast`` of it from process 0 — runs as before; only later batches come from
  the background thread.
* **Errors.** An exception in ``input_fn`` is re-raised by the step that would have used the
  batch, with ``input_fn``'s own frames in its traceback (the rank and line are named as
  before); input that runs out ends the run at the same step, on every rank (the agreement at
  each step start is unchanged).
* **Each batch as it was yielded.** A generator that refills one buffer and yields it again
  (a habit from C and PyTorch) would overwrite a batch still waiting for its step: the
  prefetcher keeps a copy of each yielded array (NumPy, or another library's, via DLPack)
  made before the generator runs on — one copy per batch, on the background thread.
* **Batches go up to the device here too** (a device backend, once its first step is
  compiled): ``runtime/inputs/staging.py``.
* **Resume.** ``restore`` (a new ``ctx.start_step``) closes the thread and starts from new
  iterators.

What changes, by design: batches are made ahead of the parameters they will be used with. An
``input_fn`` that reads ``rp.Variable`` values (a policy acting in an environment: on-policy RL)
would see values up to ``n`` updates old; it gets a warning naming the variable, and
``prefetch=0`` restores the lock-step order. An exchange between processes (``rp.host``) from
the background thread is refused (``runtime/communication/host.py``): it would run concurrently
with the steps' collectives.
"""

from __future__ import annotations

import queue
import sys
import threading
import warnings

import numpy as np

from ... import state, tree
from ...errors import ReplicateError
from ...interop import from_foreign, is_foreign
from .staging import stage

POLL = 0.1  # seconds between checks for a closed prefetcher while the queue is full
# While an input thread runs, Python hands the GIL over every SWITCH seconds (default 5 ms): a
# step is a loop of short NumPy calls, each releasing the GIL, and with the default interval
# each could wait up to 5 ms for input_fn's Python code to give it back. Measured with
# bench/prefetch.py (NumPy augmentation as long as the step, 2 cores): 0.85 of the ideal rate
# at 5 ms, 0.83-0.88 at 0.5-1 ms, 0.92-0.98 at 0.1-0.2 ms. Set while any prefetcher runs; the
# previous interval comes back after.
SWITCH = 0.0001
_active = {"count": 0, "previous": None}
_active_lock = threading.Lock()


def _switch_interval(delta: int) -> None:
    with _active_lock:
        if delta > 0 and _active["count"] == 0:
            _active["previous"] = sys.getswitchinterval()
            sys.setswitchinterval(min(SWITCH, _active["previous"]))
        _active["count"] += delta
        if delta < 0 and _active["count"] == 0 and _active["previous"] is not None:
            sys.setswitchinterval(_active["previous"])


def parse_prefetch(value) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ReplicateError(f"prefetch must be an int >= 0 (steps of input made ahead; 0: "
                             f"none), got {value!r}")
    return value


def _own(x):
    if isinstance(x, np.ndarray):
        return x.copy()
    if is_foreign(x):
        return np.array(from_foreign(x), copy=True)
    return x


def draw_owned(iterators) -> list:
    """Every iterator's next batch (None where it ran out), its NumPy arrays copied (what
    ``prefetch=0`` draws: a buffer an input_fn refills, or shares between its replicas, is
    never what a step or a Variable holds; another library's arrays stay where they are)."""
    return [None if b is None else tree.tree_map(
        lambda x: x.copy() if isinstance(x, np.ndarray) else x, b) for b in
        (next(it, None) for it in iterators)]


def _draw(iterators) -> list:
    """Every iterator's next batch (None where it ran out), its arrays copied."""
    return [None if b is None else tree.tree_map(_own, b)
            for b in (next(it, None) for it in iterators)]


class Prefetcher:
    """Draws ``[next(it, None) for it in iterators]`` ahead on a daemon thread, ``depth`` deep.

    ``next()`` returns the next list (a list holding ``None`` where an iterator ran out; after
    that list the thread stops, and ``next()`` keeps returning it) or re-raises what
    ``input_fn`` raised."""

    def __init__(self, iterators, depth: int, first: list):
        self.iterators, self.depth = iterators, depth
        self._queue: queue.Queue = queue.Queue(maxsize=depth)
        self._queue.put(("batches", first))  # drawn on the caller's thread (set-up code)
        self._closed = threading.Event()
        self._last = None  # the list that ended the input, once seen
        self._warned: set = set()
        self._lock = threading.Lock()  # drawing a list and counting it are one step
        complete = all(b is not None for b in first)
        self._made, self._taken = int(complete), 0  # lists of batches drawn, handed to the steps
        self._thread = None
        self.stager = None  # the step's backend's ``Executable.stage``, set by the steps
        if complete:
            self._thread = threading.Thread(target=self._produce, name="replicate-prefetch",
                                            daemon=True)
            self._thread.start()

    def _produce(self):
        state.hooks.input = self._variable_read
        _switch_interval(+1)
        try:
            while not self._closed.is_set():
                with self._lock:
                    batches = _draw(self.iterators)
                    self._made += all(b is not None for b in batches)
                batches = stage(batches, self.stager)
                if not self._put(("batches", batches)) or any(b is None for b in batches):
                    return
        except BaseException as e:  # noqa: BLE001 - handed to the step that needed the batch
            self._put(("error", e))
        finally:
            _switch_interval(-1)

    def _put(self, item) -> bool:
        while not self._closed.is_set():
            try:
                self._queue.put(item, timeout=POLL)
                return True
            except queue.Full:
                continue
        return False

    def _variable_read(self, var):
        if var.name in self._warned:
            return
        self._warned.add(var.name)
        warnings.warn(
            f"input_fn reads rp.Variable {var.name!r} while it runs ahead of the steps "
            f"(prefetch={self.depth}): the value it sees may be up to {self.depth} updates old. "
            "For input that must use the latest parameters (on-policy RL), pass "
            "Replicator(..., prefetch=0)", stacklevel=3)

    def next(self) -> list:
        if self._last is not None:
            return self._last
        kind, item = self._queue.get()
        if kind == "error":
            self._last = [None] * len(self.iterators)  # (a generator that raised is finished)
            raise item
        if any(b is None for b in item):
            self._last = item
        else:
            self._taken += 1
        return item

    def ahead(self, counted) -> int | None:
        """``counted(iterators)``: what the iterators have still to yield (or None); plus the
        batches made ahead and not taken yet."""
        with self._lock:
            left = counted(self.iterators)
            return None if left is None else left + self._made - self._taken

    def close(self) -> None:
        """Stop the thread (after the batch it is drawing, if any) and drop what it made."""
        self._closed.set()
        thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout=5 * POLL)


def start(iterators, depth: int) -> Prefetcher:
    """A ``Prefetcher`` over ``iterators``, ``depth`` deep (the first batches drawn here)."""
    return Prefetcher(iterators, depth, _draw(iterators))
