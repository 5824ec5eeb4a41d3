"""Shared pieces of the benchmark scripts: timing, thread pinning, backend probing, tables.

Every script measures replicate and its peers in the same run: warm-up calls first, then the
median of repeated timed calls. Thread counts are fixed per *process*: the parent script starts
one worker process per thread count with the BLAS / OpenMP / XLA environment set and its CPU
affinity limited to that many cores, so NumPy (OpenBLAS), PyTorch, JAX (XLA) and replicate all
see the same cores. Workers write JSON; the parent prints the markdown tables.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import statistics
import subprocess
import sys
import time
import traceback
from dataclasses import asdict, dataclass

HERE = os.path.dirname(os.path.abspath(__file__))
RESULTS_DIR = os.path.join(HERE, "results")
sys.path.insert(1, os.path.dirname(HERE))  # the checkout's replicate, when not installed
from replicate.launch import gpu_environment  # noqa: E402

gpu_environment(os.environ)  # JAX on a GPU: no preallocation, deterministic ops (unless set)
THREAD_VARS = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS",
               "VECLIB_MAXIMUM_THREADS", "NUMEXPR_NUM_THREADS")


# -- timing ---------------------------------------------------------------------------------------
@dataclass
class Timing:
    median: float  # seconds
    min: float
    max: float
    n: int

    def ms(self) -> str:
        return f"{self.median * 1e3:.2f}"


def measure(fn, *, warmup: int = 3, repeats: int = 10, sync=None, max_seconds: float = 20.0):
    """Median wall time of ``fn()`` over ``repeats`` calls after ``warmup`` calls.

    ``sync(result)`` (e.g. ``block_until_ready``) runs inside the timed region. Stops early (but
    after at least 3 timed calls) once ``max_seconds`` of timed calls have passed, so a very slow
    row cannot hold up a script."""
    for _ in range(warmup):
        r = fn()
        if sync:
            sync(r)
    times = []
    spent = 0.0
    for _ in range(repeats):
        t0 = time.perf_counter()
        r = fn()
        if sync:
            sync(r)
        dt = time.perf_counter() - t0
        times.append(dt)
        spent += dt
        if spent > max_seconds and len(times) >= 3:
            break
    return Timing(statistics.median(times), min(times), max(times), len(times))


def measure_many(builders: dict, *, warmup: int = 3, rounds: int = 10, calls: int = 1,
                 max_seconds: float = 60.0, extra_fn=None) -> list:
    """Time several implementations of the same work, interleaved.

    ``builders``: {row name: build() -> (fn, sync or None)} (or a reason string for a row that
    cannot run). Every row is built and warmed up first; then ``rounds`` rounds each time every
    row once (``calls`` calls per timing, divided back), so load from other jobs on the machine
    falls on every row alike; a row's figure is the median over rounds. A row whose build or
    warm-up raises becomes n/a with the reason. ``extra_fn(name, first_result)`` may return a
    dict stored with the row (e.g. the first loss). Rounds stop early once ``max_seconds`` are
    spent (after at least 3)."""
    ready, rows = {}, {}
    for name, build in builders.items():
        if isinstance(build, str):
            rows[name] = Row(name, None, build)
            continue
        try:
            fn, sync = build()
            first = fn()
            if sync:
                first = sync(first)
            extra = extra_fn(name, first) if extra_fn else None
            for _ in range(warmup):
                r = fn()
                if sync:
                    sync(r)
        except Exception as e:  # noqa: BLE001 - a peer that fails must not end the script
            if os.environ.get("BENCH_DEBUG"):
                traceback.print_exc()
            rows[name] = Row(name, None, _reason(e))
            continue
        ready[name] = (fn, sync)
        rows[name] = Row(name, None, "", extra)
    times = {name: [] for name in ready}
    start = time.perf_counter()
    for i in range(rounds):
        for name, (fn, sync) in ready.items():
            t0 = time.perf_counter()
            for _ in range(calls):
                r = fn()
            if sync:
                sync(r)
            times[name].append((time.perf_counter() - t0) / calls)
        if time.perf_counter() - start > max_seconds and i >= 2:
            break
    for name, ts in times.items():
        rows[name].timing = Timing(statistics.median(ts), min(ts), max(ts), len(ts))
    return [rows[name] for name in builders]


def cpu_times(builders: dict, rounds: int, want=None, skip=(), warmup: int = 2) -> dict:
    """{row: [CPU seconds of each round]}: each builder's ``(fn, finish)`` built once, warmed up,
    then timed by the process's CPU time in ``rounds`` interleaved rounds (the rows named in
    ``skip``, or not matching any of ``want``, left out). For a machine other jobs load."""
    import numpy as np

    rows = {}
    for name, build in builders.items():
        if name in skip or (want and not any(w in name for w in want)):
            continue
        fn, finish = build()
        finish = finish or np.asarray
        rows[name] = (fn, finish)
        for _ in range(warmup):
            finish(fn())
    times = {name: [] for name in rows}
    for _ in range(rounds):
        for name, (fn, finish) in rows.items():
            t0 = time.process_time()
            finish(fn())
            times[name].append(time.process_time() - t0)
    return times


def _reason(e: Exception) -> str:
    msg = str(e).strip()
    return f"{type(e).__name__}: {msg.splitlines()[0] if msg else ''}"[:160]


def quick_counts(quick: bool, warmup=3, repeats=10):
    return (1, 3) if quick else (warmup, repeats)


# -- a row that may be unavailable ----------------------------------------------------------------
@dataclass
class Row:
    name: str
    timing: Timing | None = None
    note: str = ""  # why a row is n/a, or an extra remark
    extra: dict | None = None

    def as_dict(self):
        d = asdict(self)
        return d


def try_row(name, build_and_time, verbose=False):
    """Run ``build_and_time() -> Timing | (Timing, extra dict)``; any exception becomes an n/a row
    with the reason (first line of the message)."""
    try:
        out = build_and_time()
    except Exception as e:  # noqa: BLE001 - a peer that fails must not end the script
        if verbose or os.environ.get("BENCH_DEBUG"):
            traceback.print_exc()
        return Row(name, None, _reason(e))
    if isinstance(out, tuple):
        timing, extra = out
        return Row(name, timing, extra.pop("note", "") if extra else "", extra)
    return Row(name, out)


def backend_unavailable(name: str) -> str | None:
    """None when replicate's backend ``name`` can be used here, else the reason."""
    try:
        from replicate.backends import get_backend

        get_backend(name)
    except Exception as e:  # noqa: BLE001 - ReplicateError, ImportError, a missing GPU ...
        return _reason(e)
    return None


_BUSY: list = []  # CPU busy fraction (other jobs) measured before each measurement


def cpu_busy(seconds: float = 1.0) -> float:
    """Fraction of all cores busy over ``seconds`` (from /proc/stat; 0 where unavailable)."""
    def sample():
        with open("/proc/stat") as f:
            v = [int(x) for x in f.readline().split()[1:]]
        idle = v[3] + (v[4] if len(v) > 4 else 0)
        return sum(v), idle
    try:
        t0, i0 = sample()
        time.sleep(seconds)
        t1, i1 = sample()
    except (OSError, ValueError):
        return 0.0
    return 1.0 - (i1 - i0) / max(t1 - t0, 1)


def record_load(threshold: float = 0.15) -> float:
    """Wait (up to ``BENCH_WAIT_QUIET`` seconds, default 60) until other jobs leave the cores
    nearly idle, then remember how busy they were; call before each measurement. Other
    sessions' tests share this machine; their load shows in the header of every table."""
    deadline = time.monotonic() + float(os.environ.get("BENCH_WAIT_QUIET", "60"))
    busy = cpu_busy(2.0)
    while busy > threshold and time.monotonic() < deadline:
        print(f"[bench] waiting for a quiet machine ({busy * 100:.0f} % CPU busy)",
              file=sys.stderr, flush=True)
        busy = cpu_busy(5.0)
    _BUSY.append(busy)
    return busy


def load_average() -> str:
    """How busy the cores were with other jobs just before the measurements started."""
    if not _BUSY:
        return ""
    if len(_BUSY) <= 3:
        vals = ", ".join(f"{b * 100:.0f} %" for b in _BUSY)
    else:
        vals = f"{min(_BUSY) * 100:.0f}-{max(_BUSY) * 100:.0f} % ({len(_BUSY)} samples)"
    return "other jobs' CPU load just before the measurements: " + vals


# -- threads: one worker process per thread count --------------------------------------------------
def thread_env(threads: int) -> dict:
    env = dict(os.environ)
    for var in THREAD_VARS:
        env[var] = str(threads)
    if threads == 1:
        flags = env.get("XLA_FLAGS", "")
        if "xla_cpu_multi_thread_eigen" not in flags:
            env["XLA_FLAGS"] = (flags + " --xla_cpu_multi_thread_eigen=false").strip()
    env["BENCH_THREADS"] = str(threads)
    return env


def pin_cpus(threads: int, first: int = 0) -> None:
    """Limit this process to ``threads`` cores, from its ``first`` allowed one on (wrapping;
    call before the numerical libraries start their thread pools)."""
    try:
        cpus = sorted(os.sched_getaffinity(0))
        os.sched_setaffinity(0, {cpus[(first + i) % len(cpus)] for i in range(threads)})
    except (AttributeError, OSError):
        pass


def set_torch_threads(threads: int) -> None:
    try:
        import torch

        torch.set_num_threads(threads)
        torch.set_num_interop_threads(1)
    except (ImportError, RuntimeError):
        pass


def run_workers(script: str, thread_counts, args=()) -> dict:
    """Run ``script --worker --threads N --json FILE [args]`` once per thread count (each its own
    process, pinned to N cores); return {N: the worker's JSON}."""
    out = {}
    for n in thread_counts:
        record_load()
        path = os.path.join(RESULTS_DIR, f".worker-{os.path.basename(script)}-{n}.json")
        os.makedirs(RESULTS_DIR, exist_ok=True)
        cmd = [sys.executable, script, "--worker", "--threads", str(n), "--json", path, *args]
        t0 = time.perf_counter()
        proc = subprocess.run(cmd, env=thread_env(n), preexec_fn=lambda n=n: pin_cpus(n))
        if proc.returncode != 0:
            raise SystemExit(f"worker with {n} thread(s) failed (exit {proc.returncode})")
        with open(path) as f:
            out[n] = json.load(f)
        os.remove(path)
        print(f"[bench] {os.path.basename(script)}: {n} thread(s) done in "
              f"{time.perf_counter() - t0:.0f} s", file=sys.stderr, flush=True)
    return out


def failure_reason(output: str) -> str:
    """The most telling line of a failed run's output (its last error line)."""
    lines = [ln.strip() for ln in output.splitlines() if ln.strip()]
    for ln in reversed(lines):
        if ("Error" in ln or "Exception" in ln) and not ln.startswith("File "):
            return ln[:200]
    return (lines[-1] if lines else "failed with no output")[:200]


def worker_threads() -> int:
    """In a worker: the thread count it was started with (and make torch agree)."""
    n = int(os.environ.get("BENCH_THREADS", "0") or 0) or (os.cpu_count() or 1)
    set_torch_threads(n)
    return n


# -- output ---------------------------------------------------------------------------------------
def machine() -> dict:
    model = platform.processor() or "unknown"
    try:
        lscpu = subprocess.run(["lscpu"], capture_output=True, text=True).stdout
        for line in lscpu.splitlines():
            if line.startswith("Model name:"):
                model = line.split(":", 1)[1].strip()
    except OSError:
        pass
    return {"cpu": model, "cores": os.cpu_count(), "python": platform.python_version(),
            "date": datetime.date.today().isoformat()}


def versions() -> dict:
    out = {}
    for mod in ("numpy", "jax", "torch", "mpi4py", "replicate"):
        try:
            out[mod] = __import__(mod).__version__
        except Exception:  # noqa: BLE001
            out[mod] = "n/a"
    return out


def header(title: str, command: str) -> str:
    m = machine()
    v = versions()
    vs = ", ".join(f"{k} {x}" for k, x in v.items())
    load = load_average()
    return (f"## {title}\n\n{m['cpu']}, {m['cores']} cores, Python {m['python']}, {vs}; "
            f"{m['date']}{'; ' + load if load else ''}\n\n`{command}`\n")


def table(columns, rows) -> str:
    """A markdown table (``rows``: lists of cells, converted with str)."""
    lines = ["| " + " | ".join(columns) + " |", "|" + "|".join("---" for _ in columns) + "|"]
    for r in rows:
        lines.append("| " + " | ".join(str(c) for c in r) + " |")
    return "\n".join(lines)


def ratio(a: Timing | None, b: Timing | None) -> str:
    if a is None or b is None:
        return "n/a"
    return f"{a.median / b.median:.2f}x"


def note(row) -> str:
    """A row's note, plus a warning where other jobs' load made its timings spread widely."""
    parts = [row.note] if row.note else []
    t = row.timing
    if t is not None and t.median > 1.5 * t.min:
        parts.append(f"noisy: median {t.median / t.min:.1f}x min")
    return "; ".join(parts)


def verdict(value: float | None, ok: bool) -> str:
    if value is None:
        return "n/a"
    return "met" if ok else "not met"


def save_json(name: str, data) -> str:
    os.makedirs(RESULTS_DIR, exist_ok=True)
    path = os.path.join(RESULTS_DIR, f"{name}.json")
    with open(path, "w") as f:
        json.dump(data, f, indent=1, default=_jsonable)
    return path


def _jsonable(x):
    if hasattr(x, "tolist"):
        return x.tolist()
    if hasattr(x, "__dataclass_fields__"):
        return asdict(x)
    return str(x)


def timing_from(d) -> Timing | None:
    return None if d is None else Timing(**d)


def rows_from(ds) -> list:
    return [Row(d["name"], timing_from(d["timing"]), d.get("note", ""), d.get("extra"))
            for d in ds]


def write_worker_json(path: str, data) -> None:
    with open(path, "w") as f:
        json.dump(data, f, default=_jsonable)


def threads_main(argv, script: str, doc: str, worker, report):
    """The ``main`` of a script measured once per thread count: ``--worker`` runs ``worker(args)``;
    otherwise one worker process per ``--threads`` count, then ``report(results, command,
    quick)`` (the markdown, or ``(markdown, summary)``) and, unless ``--quick``, the JSON."""
    args = common_args(argparse.ArgumentParser(description=doc.splitlines()[0])).parse_args(argv)
    if args.worker:
        return worker(args)
    name = os.path.basename(script)[:-3]
    threads = [int(t) for t in args.threads.split(",")]
    results = run_workers(os.path.abspath(script), threads, ["--quick"] if args.quick else [])
    command = f"python bench/{name}.py" + (" --quick" if args.quick else "") + (
        f" --threads {args.threads}" if args.threads != "1,2" else "")
    text = report(results, command, args.quick)
    if isinstance(text, tuple):
        text = text[0]
    if not args.quick:
        save_json(name, {"machine": machine(), "results": results, "markdown": text})
    return None


def common_args(ap):
    ap.add_argument("--quick", action="store_true", help="smoke run: tiny sizes, few repeats")
    ap.add_argument("--threads", default="1,2", help="comma-separated thread counts")
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--json", default=None, help=argparse.SUPPRESS)
    return ap
