"""``python -m replicate script.py [args]``: run a script so that no failure on one rank hangs
the others (the ``python -m mpi4py script.py`` pattern, with replicate's reports).

Under an MPI launcher (``mpiexec``, ``srun``; ``replicate.launch`` uses it for every rank) it

1. initialises MPI before anything of the script runs — a rank that fails before its own
   ``import replicate`` can still end the job (MPI's start-up waits for every rank; a rank that
   failed before it would leave the others waiting there forever);
2. creates the communicator with its hooks (``runtime/job/hooks.py``): an uncaught exception in any
   thread, or ``os._exit`` with a non-zero code, aborts the job with the rank's traceback,
   every line prefixed ``[rank R]``;
3. runs the script (``runpy``, as ``python script.py`` would: ``__name__ == "__main__"``,
   ``sys.argv[0]`` the script, its folder first on ``sys.path``), or a module with ``-m``;
4. on ``SystemExit`` with a non-zero code aborts the job too; on a normal end (or exit code 0)
   says goodbye to its peers — one still waiting for this rank in a collective reports ``rank
   R exited early (code 0) at step S`` and aborts — and records the end for the launcher
   (``runtime/job/status.py``).

Without MPI it just runs the script.
"""

from __future__ import annotations

import os
import runpy
import sys

from ..runtime.communication import comm as comm_module
from ..runtime.job import hooks, mpi_shm, status

USAGE = """usage: python -m replicate [--] script.py [args...]
       python -m replicate -m module [args...]

Run a script (or a module) on this process so that, under mpiexec/srun, a failure on any
rank at any point ends the whole job at once (see replicate/launch/bootstrap.py)."""


def rank_from_environment() -> int | None:
    """This process's rank as the launcher's environment gives it (before MPI is up)."""
    for key in ("PMI_RANK", "OMPI_COMM_WORLD_RANK", "PMIX_RANK", "SLURM_PROCID"):
        value = os.environ.get(key, "")
        if value.isdigit():
            return int(value)
    return None


def parse(argv: list[str]):
    """(script or None, module or None, args) from the command line, or a usage error."""
    if argv and argv[0] == "--":
        argv = argv[1:]
    if not argv or argv[0] in ("-h", "--help"):
        return None, None, None
    if argv[0] == "-m":
        if len(argv) < 2:
            raise SystemExit(f"python -m replicate: -m needs a module name\n{USAGE}")
        return None, argv[1], argv[2:]
    if argv[0].startswith("-"):
        raise SystemExit(f"python -m replicate: unknown option {argv[0]!r}\n{USAGE}")
    return argv[0], None, argv[1:]


def main(argv: list[str] | None = None) -> int:
    script, module, args = parse(sys.argv[1:] if argv is None else argv)
    if script is None and module is None:
        print(USAGE)
        return 0
    rank = rank_from_environment()
    if rank is not None:
        status.open_record(rank)
    comm = _start(rank)
    whole_lines()
    if os.environ.get(PREFIX_ENV) == "1":
        prefix_output(comm.rank)
    if script is not None:
        if not os.path.exists(script):
            hooks.abort(comm, 2, f"[replicate] rank {comm.rank}: cannot run {script!r}: no such "
                                 "file; aborting the job")
        sys.argv = [script, *args]
        sys.path[0] = os.path.dirname(os.path.abspath(script))
    else:
        sys.argv = [module, *args]
    try:
        if module is not None:
            runpy.run_module(module, run_name="__main__", alter_sys=True)
        else:
            runpy.run_path(script, run_name="__main__")
    except SystemExit as e:
        code = hooks.exit_code(e)
        if code != 0 and comm.size > 1:
            hooks.abort(comm, code, f"[replicate] rank {comm.rank}: exited with code {code}"
                                    f"{hooks.where()}; aborting the job")
        return hooks.finish(code)
    except BaseException:  # noqa: BLE001 - every failure ends the job, with its traceback
        kind, value, tb = sys.exc_info()
        if comm.size > 1:
            return hooks.finish(hooks.uncaught(comm, kind, value, tb))
        hooks.print_traceback(kind, value, tb)  # as Python would, without the bootstrap's frames
        return hooks.finish(130 if kind is KeyboardInterrupt else 1)
    return hooks.finish(0)


PREFIX_ENV = "REPLICATE_PREFIX_RANK"  # set by ``replicate.launch --prefix-rank``


class _Prefixed:
    """A text stream that starts every line with ``[rank] ``, writing whole lines only (one
    write each, so the ranks' lines do not interleave mid-line on a shared pipe; ``print`` writes
    its pieces one by one)."""

    def __init__(self, stream, rank):
        self._stream, self._prefix, self._partial = stream, f"[{rank}] ", ""

    def write(self, text):
        if not text:
            return 0
        lines = (self._partial + text).split("\n")
        self._partial = lines.pop()  # (after the last newline: kept for the next write)
        if lines:
            self._stream.write("".join(f"{self._prefix}{line}\n" if line else "\n"
                                       for line in lines))
            self._stream.flush()
        return len(text)

    def flush(self):
        if self._partial:
            self._stream.write(self._prefix + self._partial)
            self._partial = ""
        self._stream.flush()

    def __getattr__(self, name):
        return getattr(self._stream, name)


def whole_lines() -> None:
    """Each line reaches ``mpiexec`` in one write, so the ranks' lines do not break into each
    other on the shared terminal (``rank 0 step 7rank 1 step 7``): stdout and stderr
    line-buffered. Under ``PYTHONUNBUFFERED`` (write-through) ``print`` writes its text and the
    newline apart; a line is still written the moment it ends."""
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.reconfigure(line_buffering=True, write_through=False)
        except (AttributeError, ValueError, OSError):  # (not a TextIOWrapper: replaced by the user)
            pass


def prefix_output(rank) -> None:
    """Every line this process prints through Python (stdout and stderr) starts with
    ``[rank] `` (output written below Python, by C code, is not prefixed)."""
    sys.stdout = _Prefixed(sys.stdout, rank)
    sys.stderr = _Prefixed(sys.stderr, rank)


def _start(rank):
    """MPI up (when launched by MPI), the communicator and its hooks installed."""
    try:
        comm = comm_module.world()
    except BaseException:  # noqa: BLE001 - before MPI is up nothing can end the others
        status.set_state(status.FAILED, 1)
        kind, value, tb = sys.exc_info()
        rank = "?" if rank is None else rank
        print(hooks.format_failure(rank, f"[replicate] rank {rank}: could not start MPI; the "
                                   "other ranks may wait for this one until the launcher ends "
                                   "them", kind, value, tb),
              file=sys.stderr, flush=True)
        _abort_if_possible()
        raise SystemExit(1) from None
    status.set_state(status.RUNNING)
    mpi_shm.record(os.environ.get(status.ENV), comm.rank)  # (the launcher removes them if need be)
    return comm


def _abort_if_possible():
    try:
        from mpi4py import MPI

        if MPI.Is_initialized() and not MPI.Is_finalized():
            mpi_shm.unlink_mapped()
            MPI.COMM_WORLD.Abort(1)
    except Exception:  # noqa: BLE001, S110 - nothing more can be done here
        pass


__all__ = ["main", "parse", "rank_from_environment"]
