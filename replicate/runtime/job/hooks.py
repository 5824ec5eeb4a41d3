"""What ends the job when one rank fails or leaves: the hooks installed once MPI is up.

MPICH's ``mpiexec`` (hydra) ends a job only when a rank dies by a signal, calls ``MPI_Abort``, or
exits after ``MPI_Init`` without ``MPI_Finalize``. A Python rank that raises, or calls
``sys.exit(1)``, finalises MPI on its way out and exits; its peers then wait for it forever. So,
on every rank of a job with more than one process (``install``, called when the process's
communicator is created — by ``import replicate`` under an MPI launcher, or first thing by the
bootstrap ``python -m replicate``):

* an uncaught exception (main thread or any other) prints ``[replicate] rank R: ...; aborting
  the job`` and the traceback, each line prefixed ``[rank R]``, and calls ``MPI_Abort``; an error
  every rank raised alike (``consistent``: a mismatch found by an exchange) is printed on every
  rank, which then exit normally with code 1 once all have said it;
* ``os._exit(code)`` on the main process: a non-zero code aborts the job the same way; code 0 is
  a normal end — the rank says goodbye to its peers (a peer still waiting for it in a collective
  then reports ``rank R exited early (code 0) at step S`` and aborts) and finalises MPI, so that
  ``mpiexec`` does not end the others silently with exit code 0.

The bootstrap (``launch/bootstrap.py``) adds ``SystemExit`` with a non-zero code, which no hook
can see.
"""

from __future__ import annotations

import os
import sys
import threading
import traceback

from ...errors import user_traceback
from . import mpi_shm, status, watchdog

_real_exit = real_exit = os._exit  # (the hooks replace os._exit; the library exits with this)
_installed = {}  # "comm": the communicator the hooks abort; "pid": the process they belong to


def print_traceback(kind, value, tb) -> None:
    """The traceback as Python prints it, without the bootstrap's and ``runpy``'s frames."""
    traceback.print_exception(kind, value, user_traceback(tb), file=sys.stderr)
    sys.stderr.flush()


def with_rank(rank, text: str) -> str:
    """Every line of ``text`` prefixed ``[rank R] `` (several ranks' reports interleave)."""
    return "".join(f"[rank {rank}] {line}\n" for line in text.rstrip("\n").split("\n"))


def format_failure(rank, head: str, kind, value, tb) -> str:
    """``head`` and the traceback (the user's frames), every line prefixed with the rank."""
    text = "".join(traceback.format_exception(kind, value, user_traceback(tb)))
    return f"{head}\n" + with_rank(rank, text)


def where() -> str:
    """' at step S (phase)' where the process is in a run, else ''."""
    step, phase = watchdog.TRACKER.step, watchdog.TRACKER.phase
    if step is None:
        return ""
    return f" at step {step}" + (f" ({phase})" if phase else "")


def abort(comm, code: int, text: str):
    """Print ``text`` on stderr, mark this rank failed and end every rank of the job."""
    print(text, file=sys.stderr, flush=True)
    status.set_reason(text)  # (the launcher's restart log names it)
    watchdog.note_exit(code or 1)
    comm.abort(code or 1)  # (which marks the launcher's record failed)


def uncaught(comm, kind, value, tb) -> int:
    """Handle an exception that ends this rank's script: abort the job, or — for an error every
    rank raised alike (``consistent``) — print it, wait until every rank has come this far (at
    most 5 s, else abort) and return the exit code 1."""
    if getattr(value, "consistent", False):
        text = "".join(traceback.format_exception(kind, value, user_traceback(tb)))
        print(with_rank(comm.rank, text), end="", file=sys.stderr, flush=True)
        status.set_reason(text)
        status.set_state(status.FAILED, 1)
        watchdog.note_exit(1)
        if comm.meet(5.0):  # no rank exits (and has mpiexec end the rest) before all have said it
            return 1
        abort(comm, 1, f"[replicate] rank {comm.rank}: the other ranks did not raise it too")
    name = "KeyboardInterrupt" if kind is KeyboardInterrupt else f"uncaught {kind.__name__}"
    abort(comm, 1, format_failure(
        comm.rank, f"[replicate] rank {comm.rank}: {name}{where()}; aborting the job", kind,
        value, tb))
    return 1  # not reached


def exit_code(error: SystemExit) -> int:
    """The process exit code ``SystemExit`` stands for (Python's rules: None is 0, an int is
    itself, anything else is printed and gives 1)."""
    code = error.code
    if code is None:
        return 0
    if isinstance(code, int):
        return code & 0xFF if code >= 0 else code % 256
    print(code, file=sys.stderr, flush=True)
    return 1


def finish(code: int) -> int:
    """This rank's script is over with ``code`` (0: finished normally): record it for the
    launcher and for the goodbye the peers get."""
    status.set_state(status.DONE if code == 0 else status.FAILED, code)
    watchdog.note_exit(code)
    return code


def _os_exit(code):
    """``os._exit`` on the rank's own process (a forked child keeps the plain one)."""
    comm = _installed.get("comm")
    if comm is None or os.getpid() != _installed.get("pid"):
        _real_exit(code)
    code = int(code)
    if getattr(comm, "size", 1) == 1:  # one process: only the launcher's record
        finish(code)
        mpi_shm.unlink_mapped()  # (MPI is not finalised: its files in /dev/shm would stay)
        _real_exit(code)
    if code != 0:
        abort(comm, code, f"[replicate] rank {comm.rank}: os._exit({code}){where()}; "
                          "aborting the job")
        _real_exit(code)
    finish(0)
    sys.stdout.flush()
    sys.stderr.flush()
    watchdog.close()  # the goodbye: a peer waiting for this rank reports it and aborts
    _finalize_within(5.0)
    _real_exit(0)


def _finalize_within(seconds: float) -> None:
    """``MPI_Finalize``, so that mpiexec counts this rank as finished (not as vanished: it would
    kill the others at once and return 0); if it does not return in ``seconds`` (another thread
    is inside MPI), exit anyway."""
    try:
        from mpi4py import MPI
    except ImportError:
        return
    if not MPI.Is_initialized() or MPI.Is_finalized():
        return
    timer = threading.Timer(seconds, _real_exit, (0,))
    timer.daemon = True
    timer.start()
    MPI.Finalize()
    timer.cancel()


def install(comm) -> None:
    """Install the hooks for ``comm`` (the world of a job with more than one process; for one
    process started by the launcher only ``os._exit`` is noted, for its record; otherwise
    nothing). Once per process."""
    single = getattr(comm, "size", 1) == 1
    if _installed or (single and status.record() is None):
        return
    _installed.update(comm=comm, pid=os.getpid())
    os._exit = _os_exit
    if single:
        return
    previous_thread = threading.excepthook

    def hook(kind, value, tb):
        uncaught(comm, kind, value, tb)

    def thread_hook(args):
        if args.exc_type is SystemExit:
            return
        abort(comm, 1, format_failure(
            comm.rank, f"[replicate] rank {comm.rank}: uncaught {args.exc_type.__name__} in thread "
            f"{getattr(args.thread, 'name', '?')!r}{where()}; aborting the job",
            args.exc_type, args.exc_value, args.exc_traceback))
        previous_thread(args)

    sys.excepthook = hook
    threading.excepthook = thread_hook


__all__ = ["install", "uncaught", "exit_code", "finish", "abort", "format_failure", "with_rank"]
