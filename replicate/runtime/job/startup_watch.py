"""The watcher of one rank's MPI start-up (``startup.py``), run as its own small process with no
package import (``python -I -S startup_watch.py PID SECONDS RANK SIZE FOLDER``): it waits for
its standard input to close — the rank is up, or gone — and if that takes ``SECONDS``, it says
which ranks never arrived on this host and ends the rank (SIGTERM, then SIGKILL)."""

import os
import select
import signal
import sys
import time


def main(argv):
    pid, seconds, rank, size, folder = int(argv[0]), float(argv[1]), argv[2], int(argv[3]), argv[4]
    ready, _, _ = select.select([sys.stdin], [], [], seconds)
    if ready:  # closed (or a byte): the rank is past MPI_Init, or has ended
        return 0
    try:
        seen = {int(n[5:]) for n in os.listdir(folder) if n[5:].isdigit()}
    except OSError:
        seen = set()
    missing = [r for r in range(size) if r not in seen]
    print(f"[replicate] rank {rank}: MPI start-up has waited {seconds:g} s for the other ranks "
          f"(REPLICATE_STARTUP_TIMEOUT); ranks {missing} never reached it on this host (a rank "
          "that fails before its `import replicate` under a plain mpiexec leaves the others "
          "waiting here; ranks on other hosts are not seen from here): ending this rank. Run "
          "the script as `mpiexec -n N python -m replicate script.py` or `python -m "
          "replicate.launch -n N script.py`: a rank that fails at any point then ends the job "
          "at once.", file=sys.stderr, flush=True)
    for remove, path in ((os.unlink, os.path.join(folder, f"rank-{rank}")), (os.rmdir, folder)):
        try:  # (this rank's mark, and the folder once empty)
            remove(path)
        except OSError:
            pass
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            return 0
        deadline = time.monotonic() + 2.0
        while time.monotonic() < deadline:
            if select.select([sys.stdin], [], [], 0.05)[0]:
                return 0
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
