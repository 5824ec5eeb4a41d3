"""The profiler: where a step's time goes, as a Chrome/Perfetto trace per process.

Switched on by ``REPLICATE_PROFILE=trace.json`` for any program (``rp.function``, eager code, a
``Replicator``), or ``Replicator.run(profile="trace.json")`` for one run; the trace is written
when the run (or the program) ends. Under several processes each writes its own file, the rank
before the suffix (``trace.rank1.json``; ``{rank}`` in the name is replaced instead).

What it records, each event with its source line where it has one:

* ``step``: each call of a compiled step (and, in a ``Replicator``, each whole step);
* ``compute``: every kernel or fused group of the NumPy backend, every op in eager mode, every
  compiled program of the JAX backend (XLA runs the step as one program: its kernels are not
  seen from here), every CuPy kernel (profiling synchronises after each, so its time is its own);
* ``communication`` (kind, bytes) and ``wait`` (a bucket's result awaited: ``comm_wait``);
* ``input`` (waiting for the next batch) and ``checkpoint`` (a save), from the runtime.

``python -m replicate.profile trace.json`` prints a summary: the top kernels by time with their
lines, and per step the time in compute, communication, waiting and the rest. Open the file in
https://ui.perfetto.dev or ``chrome://tracing`` for the timeline.

>>> import numpy as np, os, tempfile, replicate as rp, replicate.numpy as rnp
>>> path = os.path.join(tempfile.mkdtemp(), "trace.json")
>>> f = rp.function(lambda x: rnp.tanh(x @ x).sum())
>>> with rp.profile.recording(path):
...     _ = f(np.ones((4, 4)))
>>> sorted({e["cat"] for e in rp.profile.load(path)})
['compute', 'step']
"""

from __future__ import annotations

import atexit
import contextlib
import functools
import json
import os
import threading
import time
from collections import defaultdict

_ACTIVE = None  # the running Profiler, or None (read by the hot loops: one global lookup)


class Profiler:
    """Collects trace events (Chrome trace-event format, complete events ``ph: X``, in µs)."""

    def __init__(self, path: str, rank: int | None = None):
        self.rank = _rank() if rank is None else rank
        self.path = _per_rank(path, self.rank)
        self.events: list = []
        self._t0 = time.perf_counter_ns()
        self._lock = threading.Lock()
        self._threads: dict = {}

    def now(self) -> int:
        return time.perf_counter_ns()

    def add(self, name: str, cat: str, start: int, end: int, **args) -> None:
        """A complete event from ``start`` to ``end`` (``perf_counter_ns``) on this thread."""
        tid = threading.get_ident()
        event = {"name": name, "cat": cat, "ph": "X", "pid": self.rank,
                 "tid": self._threads.setdefault(tid, len(self._threads)),
                 "ts": (start - self._t0) / 1e3, "dur": max(end - start, 0) / 1e3}
        if args:
            event["args"] = args
        with self._lock:
            self.events.append(event)

    @contextlib.contextmanager
    def span(self, name: str, cat: str, **args):
        start = time.perf_counter_ns()
        try:
            yield
        finally:
            self.add(name, cat, start, time.perf_counter_ns(), **args)

    def write(self) -> str:
        with self._lock:
            events = sorted(self.events, key=lambda e: e["ts"])
        meta = [{"name": "process_name", "ph": "M", "pid": self.rank,
                 "args": {"name": f"rank {self.rank}"}}]
        meta += [{"name": "thread_name", "ph": "M", "pid": self.rank, "tid": t,
                  "args": {"name": "main" if t == 0 else f"thread {t}"}}
                 for t in self._threads.values()]
        folder = os.path.dirname(os.path.abspath(self.path))
        os.makedirs(folder, exist_ok=True)
        tmp = f"{self.path}.tmp-{os.getpid()}"
        with open(tmp, "w") as f:
            json.dump({"traceEvents": meta + events, "displayTimeUnit": "ms"}, f)
        os.replace(tmp, self.path)
        return self.path


def active() -> Profiler | None:
    """The running profiler, or None."""
    return _ACTIVE


def spanned(name: str, cat: str):
    """A decorator: each call of the function is an event when a profiler runs."""
    def wrap(fn):
        @functools.wraps(fn)
        def run(*args, **kwargs):
            profiler = _ACTIVE
            if profiler is None:
                return fn(*args, **kwargs)
            with profiler.span(name, cat):
                return fn(*args, **kwargs)
        return run
    return wrap


def span(name: str, cat: str, **args):
    """A context that records an event when a profiler runs (else does nothing)."""
    profiler = _ACTIVE
    return profiler.span(name, cat, **args) if profiler is not None else contextlib.nullcontext()


@contextlib.contextmanager
def recording(path: str):
    """Profile what runs inside the block into ``path`` (one file per rank); nests nothing:
    a profiler already running (``REPLICATE_PROFILE``) keeps running and records this too."""
    global _ACTIVE
    if _ACTIVE is not None:
        yield _ACTIVE
        return
    profiler = _ACTIVE = Profiler(path)
    try:
        yield profiler
    finally:
        _ACTIVE = None
        profiler.write()


def start_from_environment() -> None:
    """``REPLICATE_PROFILE=path``: profile the whole program, written at exit."""
    global _ACTIVE
    path = os.environ.get("REPLICATE_PROFILE")
    if path and _ACTIVE is None:
        profiler = _ACTIVE = Profiler(path)
        atexit.register(profiler.write)


def load(path: str) -> list:
    """The events of a trace file (metadata events left out)."""
    with open(path) as f:
        data = json.load(f)
    events = data["traceEvents"] if isinstance(data, dict) else data
    return [e for e in events if e.get("ph") == "X"]


def summary(events: list, top: int = 15) -> str:
    """The text summary: top kernels by total time, then per step where the time went."""
    kernels: dict = defaultdict(lambda: [0.0, 0])
    for e in events:
        if e["cat"] in ("compute", "communication", "wait"):
            key = (e["cat"], e["name"], e.get("args", {}).get("line", ""))
            kernels[key][0] += e["dur"]
            kernels[key][1] += 1
    steps = sorted((e for e in events if e["cat"] == "step" and e["tid"] == 0),
                   key=lambda e: e["ts"])
    outer = [s for s in steps if not any(o is not s and o["ts"] <= s["ts"] and
                                         s["ts"] + s["dur"] <= o["ts"] + o["dur"]
                                         for o in steps)]
    total = sum(v[0] for v in kernels.values()) or 1.0
    lines = [f"{'time ms':>9} {'share':>6} {'calls':>6}  kind           name (line)"]
    for (cat, name, line), (dur, n) in sorted(kernels.items(), key=lambda kv: -kv[1][0])[:top]:
        where = f"  ({line})" if line else ""
        lines.append(f"{dur / 1e3:9.3f} {dur / total:6.1%} {n:6d}  {cat:<14} {name}{where}")
    if outer:
        lines.append("")
        lines.append(f"{len(outer)} steps; per step (ms): compute, communication, wait, "
                     "input, other")
        for i, s in enumerate(outer):
            inside = defaultdict(float)
            for e in events:
                if e["pid"] == s["pid"] and e["tid"] == s["tid"] and e is not s and \
                        e["cat"] != "step" and s["ts"] <= e["ts"] <= s["ts"] + s["dur"]:
                    inside[e["cat"]] += e["dur"]
            parts = [inside[c] for c in ("compute", "communication", "wait", "input")]
            other = s["dur"] - sum(parts)
            lines.append(f"  step {i}: {s['dur'] / 1e3:.3f} = " + ", ".join(
                f"{p / 1e3:.3f}" for p in parts + [other]))
    return "\n".join(lines)


def _rank() -> int:
    for name in ("PMI_RANK", "OMPI_COMM_WORLD_RANK", "PMIX_RANK", "MPI_LOCALRANKID"):
        if os.environ.get(name, "").isdigit():
            return int(os.environ[name])
    return 0


def _size() -> int:
    for name in ("PMI_SIZE", "OMPI_COMM_WORLD_SIZE"):
        if os.environ.get(name, "").isdigit():
            return int(os.environ[name])
    return 1


def _per_rank(path: str, rank: int) -> str:
    if "{rank}" in path:
        return path.replace("{rank}", str(rank))
    if _size() == 1 and rank == 0:
        return path
    stem, suffix = os.path.splitext(path)
    return f"{stem}.rank{rank}{suffix or '.json'}"


__all__ = ["Profiler", "active", "load", "recording", "span", "spanned", "summary"]
