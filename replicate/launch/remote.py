"""The records of ranks on other hosts (``runtime/job/status.py``), for the launcher's verdict
and restart log: each rank writes its record on its own host, in a folder of the same path as
the launcher's (made there, private to the user, by the first rank that needs it). When the job
has ended, the launcher runs ``python -m replicate.launch.remote FOLDER`` on every other host of
the job, with the command hydra starts its proxies with (``hosts.prober``: ssh, or
``HYDRA_LAUNCHER_EXEC``), all at once and each bounded by ``hosts.PROBE_SECONDS``; the command
prints the host's records as JSON and removes the folder. A host that does not answer (dead, or
its link cut) gives nothing: its ranks stay unseen, and the launcher says so.

The folder is removed there only when it is the user's own (``status.own_folder``) and no
launcher holds it (a launcher's own folder holds its lock file): running the command on the
launcher's host (a host file that names it by another name) reads the records and leaves them."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys

from ..runtime.job import mpi_shm, status
from . import hosts
from .folders import LOCK


def fetch(folder: str, mpi_args: list[str], environ, n: int) -> dict[int, dict]:
    """{rank: record} from every host of the job but this one; {} when no host is named, or the
    hosts are not reached the ssh way (a scheduler's launcher: then nothing is fetched)."""
    prefix = hosts.prober(environ)
    names = sorted(h for h in set(hosts.rank_hosts(n, mpi_args)) if not this_host(h))
    if prefix is None or not names:
        return {}
    cmd = [sys.executable, "-m", "replicate.launch.remote", folder]
    procs = []
    for name in names:
        try:
            procs.append(subprocess.Popen([*prefix, name, *cmd], env=environ, text=True,
                                          stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                          stderr=subprocess.DEVNULL))
        except OSError:
            continue
    found: dict[int, dict] = {}
    for proc in procs:
        try:
            out, _ = proc.communicate(timeout=hosts.PROBE_SECONDS)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.communicate()
            continue
        found.update(parse(out))
    return found


def this_host(name: str) -> bool:
    """Whether ``name`` is this machine as a host file names it (its name, short or full, or
    ``localhost`` and loopback addresses): hydra starts its ranks here without ssh, and their
    records are in the launcher's own folder."""
    here = socket.gethostname()
    return name in ("localhost", "::1", here, here.split(".")[0]) or name.startswith("127.") \
        or name.split(".")[0] == here  # (no name lookup: it can wait seconds on a DNS timeout)


def parse(text: str) -> dict[int, dict]:
    """The records in the command's output (a line ``{"rank": R, ...}`` each; others ignored:
    a login banner, say)."""
    found = {}
    for line in text.splitlines():
        try:
            rec = json.loads(line)
            rank = int(rec.pop("rank"))
            found[rank] = {"pid": int(rec["pid"]), "state": int(rec["state"]),
                           "code": int(rec["code"]), "host": str(rec["host"]),
                           "step": None if rec["step"] is None else int(rec["step"]),
                           "why": str(rec["why"])}
        except (ValueError, TypeError, KeyError, AttributeError):
            continue
    return found


def main(argv=None) -> int:
    """On a host of the job: print the records in FOLDER, one JSON line each, and remove it."""
    args = sys.argv[1:] if argv is None else list(argv)
    if len(args) != 1:
        print("usage: python -m replicate.launch.remote FOLDER", file=sys.stderr)
        return 2
    folder = args[0]
    if not status.own_folder(folder):
        return 0
    for rank, rec in sorted(status.read(folder).items()):
        print(json.dumps({"rank": rank, **rec}))
    if not os.path.lexists(os.path.join(folder, LOCK)):  # (not a live launcher's own)
        mpi_shm.remove_recorded(folder)  # MPICH's files the ranks here left, as the launcher does
        shutil.rmtree(folder, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
