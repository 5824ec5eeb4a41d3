"""Launch a script on N processes with the MPI that came with the ``mpich`` wheel.

    python -m replicate.launch -n 2 examples/classifier.py [args...]
    replicate-launch -n 2 examples/classifier.py [args...]
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys


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


def command(n: int, script: str, args: list[str]) -> list[str]:
    return [find_mpiexec(), "-n", str(n), sys.executable, script, *args]


def share_threads(environ, nprocs: int) -> None:
    """One BLAS thread per core share, no oversubscription: set the thread-count variables the
    user left unset. Every BLAS reads ``OMP_NUM_THREADS`` after its own variable, so a user's
    ``OMP_NUM_THREADS`` is their choice for every library and nothing is added; a library's own
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


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="replicate-launch", description=__doc__.splitlines()[0])
    parser.add_argument("-n", "--nprocs", type=int, default=2, help="number of processes")
    parser.add_argument("script")
    parser.add_argument("args", nargs=argparse.REMAINDER)
    opts = parser.parse_args(argv)
    if opts.nprocs < 1:
        parser.error("-n must be at least 1")
    cmd = command(opts.nprocs, opts.script, opts.args)
    share_threads(os.environ, opts.nprocs)
    os.execv(cmd[0], cmd)
    return 0  # not reached


if __name__ == "__main__":
    sys.exit(main())
