"""Launch a script on N processes with the MPI that came with the ``mpich`` wheel.

    python -m replicate.launch -n 2 examples/classifier.py [args...]
    python -m replicate.launch -n 2 -m package.module [args...]
    python -m replicate.launch -n 4 -f hostfile -ppn 2 --prefix-rank train.py [args...]
    replicate-launch -n 2 examples/classifier.py [args...]

Options before the script: ``-n N``, ``-m module``, ``--prefix-rank`` (every line a rank prints
through Python starts with ``[rank] ``), ``--max-restarts N`` (run the job again after a failure,
at most N times: ``replicate/launch/restart.py``), ``--min-procs M`` (with ``--max-restarts``: a
host that no longer answers, or whose ranks ended two attempts, is left out, down to M processes:
``replicate/launch/hosts.py``); any
other option goes to ``mpiexec`` as written
(``--hosts a,b``, ``-f hostfile``, ``-ppn 2``, ``-bind-to core``), with the word after it as its
value unless it is one of MPICH's options without a value (``NO_VALUE``) or written ``--opt=v``.
A job given none of those runs on this machine under the launcher's own process manager
(``forker.py``: the ranks start MPI over inherited socket pairs, nothing listens on the
network); with them, under ``mpiexec`` (hydra); ``REPLICATE_PROCESS_MANAGER=hydra`` for hydra
always (``process_manager``).

Every rank runs the script through the bootstrap (``python -m replicate``, see
``replicate/launch/bootstrap.py``): MPI is up before the script's first line, and a rank that fails
at any point ends the job with its traceback. The launcher also knows whether every rank finished
its script (``replicate/runtime/job/status.py``): a job where ``mpiexec`` returns 0 but a rank left
early (``exit()`` below Python ends the others silently) exits 1 and says which rank and at which
step, and a rank that dies where ``mpiexec`` does not end the others (before MPI is up) ends the job
within seconds instead of leaving them waiting. When the job has ended, the launcher removes the
MPICH shared-memory files in ``/dev/shm`` its ranks recorded and left behind (a job ended by a
signal, or by mpiexec after a rank died; see ``replicate/runtime/job/mpi_shm.py``). Its folder in
``/tmp`` goes when it ends; a launcher killed outright leaves it, and the next launch by the same
user removes it (``remove_dead_folders``).
"""

from __future__ import annotations

import os
import select
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time

from ..runtime.job import mpi_shm, status
from . import hosts, remote, restart
from .ending import PREFIX, _at, culprit, verdict
from .folders import make_folder, remove_dead_folders

GRACE = 2.0  # seconds mpiexec has to end the job itself after a rank is gone


def find_mpiexec() -> str:
    """The ``mpiexec`` next to this Python (the wheel's), else the first one on PATH."""
    here = os.path.join(os.path.dirname(sys.executable), "mpiexec")
    if os.path.exists(here):
        return here
    found = shutil.which("mpiexec")
    if found:
        return found
    raise SystemExit("replicate.launch: no mpiexec found; install it with "
                     "pip install 'replicate[mpi]'")


MANAGER = "REPLICATE_PROCESS_MANAGER"  # "hydra" or "auto" (unset: "auto")
FORKER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "forker.py")


def process_manager(n: int, mpi_args=(), environ=os.environ) -> list[str]:
    """The command that starts the job's ``n`` processes. A job given none of ``mpiexec``'s
    options runs on this machine alone, and the launcher's own process manager starts it
    (``forker.py``): it forks the ranks and serves MPI's start-up over socket pairs, so nothing
    of the job listens on the network, not even before MPI is up. hydra's ``mpiexec`` — for
    several hosts, and for its own options (``-ppn``, ``-bind-to``, ``--hosts``) — listens on
    every interface for its proxies until the job ends, open to anyone until the ranks close it
    once MPI is up (``runtime/job/exposure.py``). ``REPLICATE_PROCESS_MANAGER=hydra`` uses hydra
    for every job."""
    choice = environ.get(MANAGER, "").strip().lower() or "auto"
    if choice not in ("auto", "hydra"):
        raise SystemExit(f"replicate.launch: {MANAGER} must be hydra or auto, got {choice!r}")
    if choice == "hydra" or mpi_args:
        return [find_mpiexec(), "-n", str(n), *mpi_args]
    find_mpiexec()  # (the MPI library the ranks load comes with it)
    return [sys.executable, "-I", "-S", FORKER, "-n", str(n)]  # (stdlib only: starts fast)


def command(n: int, script: str | None, args: list[str], module: str | None = None,
            mpi_args=(), environ=os.environ) -> list[str]:
    """The job's command line: every rank runs the bootstrap on the script (or module)."""
    target = ["-m", module] if module else [script]
    return [*process_manager(n, mpi_args, environ), sys.executable, "-m", "replicate", *target,
            *args]


# MPICH (hydra) options that take no value; every other unknown option takes the next word
NO_VALUE = frozenset({"-l", "-prepend-rank", "--prepend-rank", "-verbose", "--verbose", "-v",
                      "-info", "-disable-x", "-enable-x", "-print-all-exitcodes",
                      "-disable-auto-cleanup", "-genvall", "-genvnone", "-usize", "-nameserver"})


def parse(argv: list[str]):
    """(nprocs, module, prefix_rank, mpiexec's options, script, the script's args) from the
    launcher's command line: its own options and mpiexec's come before the script."""
    nprocs, prefix, mpi, i = 2, False, [], 0
    while i < len(argv):
        arg = argv[i]
        if arg in ("-h", "--help"):  # (on stdout, exit code 0)
            print(f"usage: python -m replicate.launch [-n N] [options] script.py | -m module "
                  f"[args...]\n\n{__doc__}")
            raise SystemExit(0)
        if arg in ("-n", "-np", "--nprocs") or arg.startswith(("-n=", "--nprocs=")):
            value, i = (arg.split("=", 1)[1], i + 1) if "=" in arg else (_value(argv, i), i + 2)
            if not value.isdigit() or int(value) < 1:
                raise SystemExit(f"replicate.launch: -n needs a number >= 1, got {value!r}")
            nprocs = int(value)
            continue
        if arg == "-m":
            return nprocs, _value(argv, i), prefix, mpi, None, argv[i + 2:]
        if arg == "--prefix-rank":
            prefix, i = True, i + 1
        elif arg == "--":
            i += 1
            break
        elif arg.startswith("-") and arg != "-":
            takes = "=" not in arg and arg not in NO_VALUE
            mpi += argv[i:i + 2] if takes else [arg]
            if takes:
                _value(argv, i)
            i += 2 if takes else 1
        else:
            break
    if i >= len(argv):
        raise SystemExit("replicate.launch: a script (or -m module) is required")
    return nprocs, None, prefix, mpi, argv[i], argv[i + 1:]


def _value(argv, i):
    if i + 1 >= len(argv):
        raise SystemExit(f"replicate.launch: {argv[i]} needs a value")
    return argv[i + 1]


def share_threads(environ, nprocs: int) -> None:
    """One BLAS thread per core share, no oversubscription: set the thread-count variables the
    user left unset (``nprocs``: the ranks on one host, ``hosts.ranks_per_host``). Every BLAS
    reads ``OMP_NUM_THREADS`` after its own variable, so a user's ``OMP_NUM_THREADS`` is their
    choice for every library and nothing is added; a library's own
    variable the user set (``MKL_NUM_THREADS=1``) is kept, and the others get the share.

    >>> env = {"MKL_NUM_THREADS": "1"}
    >>> share_threads(env, os.cpu_count() or 1)  # one process per core: one thread each
    >>> env["MKL_NUM_THREADS"], env["OPENBLAS_NUM_THREADS"], env["OMP_NUM_THREADS"]
    ('1', '1', '1')
    """
    if environ.get("OMP_NUM_THREADS", "").strip():
        return
    threads = str(max(1, (os.cpu_count() or 1) // nprocs))
    for var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "BLIS_NUM_THREADS"):
        if not environ.get(var, "").strip():
            environ[var] = threads


XLA_MEMORY_VARIABLES = ("XLA_PYTHON_CLIENT_PREALLOCATE", "XLA_PYTHON_CLIENT_MEM_FRACTION",
                        "XLA_PYTHON_CLIENT_ALLOCATOR")


def gpu_environment(environ) -> None:
    """JAX on a GPU, as the launcher, the tests and the benchmarks start it: XLA takes memory as
    it needs it instead of 75 % of the GPU up front (``XLA_PYTHON_CLIENT_PREALLOCATE=false``:
    two ranks on one GPU, or JAX beside CuPy, would run out), and its GPU ops are deterministic
    (``--xla_gpu_deterministic_ops=true``: a scatter-add without atomics, so results are bitwise
    the same run to run). Each is left as the user set it: any of ``XLA_MEMORY_VARIABLES``, or
    the flag named in ``XLA_FLAGS``. Must run before JAX makes its first array.

    >>> env = {"XLA_PYTHON_CLIENT_MEM_FRACTION": ".5"}
    >>> gpu_environment(env)
    >>> "XLA_PYTHON_CLIENT_PREALLOCATE" in env, env["XLA_FLAGS"]
    (False, '--xla_gpu_deterministic_ops=true')
    """
    if not any(environ.get(v, "").strip() for v in XLA_MEMORY_VARIABLES):
        environ["XLA_PYTHON_CLIENT_PREALLOCATE"] = "false"
    flags = environ.get("XLA_FLAGS", "")
    if "xla_gpu_deterministic_ops" not in flags:
        environ["XLA_FLAGS"] = (flags + " --xla_gpu_deterministic_ops=true").strip()


class Exits:
    """The order in which the ranks on this machine end, to tell the rank that left from the
    ranks mpiexec then ended: each rank's bootstrap connects to this socket and never writes;
    the kernel closes the connection when the rank's process ends. A rank that leaves closes
    its connection before mpiexec even learns of it, so before the ranks mpiexec then kills
    close theirs."""

    def __init__(self, folder: str):
        self.server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.server.bind(os.path.join(folder, status.SOCKET))
        self.server.listen(1024)
        self.server.setblocking(False)
        self.conns: dict = {}  # connection -> rank (None until it said which)
        self.order: list[list[int]] = []  # batches of ranks seen ending together
        self.ended: set[int] = set()

    def wait(self, seconds: float) -> None:
        """Wait up to ``seconds`` for ranks to connect, say their rank, or end."""
        ready, _, _ = select.select([self.server, *self.conns], [], [], seconds)
        batch = []
        for sock in ready:
            if sock is self.server:
                try:
                    conn, _ = self.server.accept()
                except (BlockingIOError, InterruptedError):
                    continue
                self.conns[conn] = None
                continue
            try:
                data = sock.recv(64)
            except OSError:
                data = b""
            if data and self.conns[sock] is None and data.strip().isdigit():
                self.conns[sock] = int(data.strip())
                continue
            if not data:  # the process has ended
                rank = self.conns.pop(sock)
                sock.close()
                if rank is not None:
                    batch.append(rank)
                    self.ended.add(rank)
        if batch:
            self.order.append(sorted(batch))

    def first(self):
        """The rank that ended first, if it ended alone."""
        return self.order[0][0] if self.order and len(self.order[0]) == 1 else None

    def together(self) -> list:
        """The ranks seen ending first, at one instant ([] if none ended)."""
        return self.order[0] if self.order else []

    def close(self):
        for conn in self.conns:
            conn.close()
        self.conns.clear()
        self.server.close()


def supervise(proc, folder: str, n: int, exits: Exits, poll: float = 0.1,
              stopped=None, others=dict) -> tuple:
    """Wait for ``mpiexec``; end it if a rank is gone and it has not ended the job within
    ``GRACE`` seconds (a rank that failed before MPI was up leaves the others waiting in MPI's
    start-up). Returns the job's exit code and, for a failed job, the rank that ended it
    (``ending.culprit``). ``others()``: the records of ranks on other hosts, fetched once the
    job has ended (``remote.fetch``)."""
    gone_since = []
    while True:
        try:  # (a Ctrl-C may land anywhere in here: mpiexec got it too and ends the ranks)
            if proc.poll() is not None:
                break
            ended = _watch(proc, folder, exits, poll, gone_since)
        except KeyboardInterrupt:
            if stopped is not None:
                stopped.append(True)  # (the user's: not restarted)
            continue
        if ended is not None:
            return ended
    exits.wait(0)
    records = {**others(), **status.read(folder)}
    code, message = verdict(proc.returncode, records, n, exits.first(), exits.together())
    if message:
        print(message, file=sys.stderr, flush=True)
    return code, (culprit(records, exits.first(), exits.together(), n) if code else None)


def _watch(proc, folder, exits, poll, gone_since):
    """One look at the job: ``(1, cause)`` once it has been ended here (a rank gone for
    ``GRACE`` seconds and mpiexec has not ended the job), else None. ``gone_since``: when a
    rank was first seen gone (kept between calls)."""
    exits.wait(poll)
    if not exits.ended:
        return None
    records = status.read(folder)
    gone = {r: records[r] for r in exits.ended
            if r in records and records[r]["state"] != status.DONE}
    if not gone:
        return None
    if not gone_since:
        gone_since.append(time.monotonic())
    if time.monotonic() - gone_since[0] <= GRACE or proc.poll() is not None:
        return None
    first = exits.first()
    r = first if first in gone else min(gone)  # (the rank seen to end first, if one was)
    rec = gone[r]
    print(f"{PREFIX} rank {r} ({status.STATE_NAMES.get(rec['state'], '?')}, "
          f"{_at(rec)}) is gone and mpiexec did not end the job in {GRACE:g} s; "
          "ending it", file=sys.stderr, flush=True)
    _end(proc)
    return 1, {"rank": r, "host": rec["host"], "step": rec["step"], "why": rec["why"]
               or "gone, and mpiexec did not end the job"}


def _end(proc):
    for sig, wait in ((signal.SIGTERM, 3.0), (signal.SIGKILL, 3.0)):
        proc.send_signal(sig)
        try:
            proc.wait(timeout=wait)
            return
        except subprocess.TimeoutExpired:
            continue


def main(argv=None) -> int:
    """``python -m replicate.launch [-n N] script.py args...``: the job under ``mpiexec``, watched
    until it ends; returns its exit status."""
    nprocs, module, prefix, mpi_args, script, args = parse(
        sys.argv[1:] if argv is None else list(argv))
    max_restarts, mpi_args = restart.take_options(mpi_args)
    min_procs, mpi_args = restart.take_number(mpi_args, "--min-procs", nprocs, 1)
    env = dict(os.environ)
    share_threads(env, hosts.ranks_per_host(nprocs, mpi_args))
    gpu_environment(env)
    if prefix:
        env["REPLICATE_PREFIX_RANK"] = "1"
    stopped = []  # the user ended the job (SIGTERM, Ctrl-C): no restart
    job = {"n": nprocs, "mpi": mpi_args, "failed": {}, "cause": None}

    def attempt(number):
        if number:  # a host that does not answer, or failed twice, is left out (``hosts.py``)
            twice = [h for h, count in job["failed"].items() if count >= 2]
            changed = hosts.shrink(job["n"], job["mpi"], env, min_procs, spare, twice)
            if changed is not None:
                job["n"], job["mpi"], message = changed
                print(f"{PREFIX} {message}", file=sys.stderr, flush=True)
                if not job["n"]:
                    return 1, None
        cmd = command(job["n"], script, args, module, job["mpi"], env)
        code, cause = _attempt(cmd, {**env, restart.ENV: str(number)}, job["n"], stopped,
                               job["mpi"])
        placed = hosts.rank_hosts(job["n"], job["mpi"])
        ranks = cause["rank"] if cause and isinstance(cause["rank"], list) else [
            cause["rank"]] if cause else []
        where = {placed[r] for r in ranks if r < len(placed)}
        if cause and cause["host"] in placed:  # (where it really ran, from its record)
            where = {cause["host"]}
        for host in where:
            job["failed"][host] = job["failed"].get(host, 0) + 1
        return code, cause
    with tempfile.TemporaryDirectory(prefix="replicate-hosts-") as spare:
        return restart.run(attempt, max_restarts, lambda: bool(stopped))


def _attempt(cmd, env, nprocs, stopped, mpi_args=()) -> tuple:
    """Run the job once: (exit code, the rank that ended it or None)."""
    remove_dead_folders()
    folder, lock = make_folder()
    try:
        env[status.ENV] = folder
        exits = Exits(folder)
        proc = subprocess.Popen(cmd, env=env)

        def forward(*_):
            stopped.append(True)
            proc.send_signal(signal.SIGTERM)
        previous = signal.signal(signal.SIGTERM, forward)
        try:
            return supervise(proc, folder, nprocs, exits, stopped=stopped,
                             others=lambda: remote.fetch(folder, mpi_args, env, nprocs))
        finally:
            signal.signal(signal.SIGTERM, previous)
            exits.close()
            if proc.poll() is not None:  # the job's ranks are gone: MPICH's files they left
                mpi_shm.remove_recorded(folder)
    finally:
        shutil.rmtree(folder, ignore_errors=True)
        os.close(lock)

