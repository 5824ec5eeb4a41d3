"""The hosts of a job, as the launcher's ``mpiexec`` options name them: how many ranks each runs
(for the BLAS thread share: cores ÷ the ranks on one host, not ÷ all ranks of the job), and which
of them still answer after a failure (``--max-restarts`` with ``--min-procs M``: a host that does
not answer, or whose ranks ended two attempts, is left out of the next attempt, which runs on
the ranks the other hosts held, as long as at least M remain; ``Replicator(num_replicas=R)``
keeps the math the same on fewer processes).

Hosts come from ``-f``/``-hostfile``/``-machinefile FILE`` (lines ``name[:slots]``) or
``--hosts``/``-hosts a,b[:slots]``; ``-ppn``/``-perhost P`` ranks per host. Ranks are placed as
hydra places them: each host in turn takes its slots (1 when none is given, P with ``-ppn``)
until every rank has a place.

A host answers when the command hydra would start its proxy with runs ``true`` there within
``PROBE_SECONDS``: ``$HYDRA_LAUNCHER_EXEC`` (or ``ssh -o BatchMode=yes``) when the launcher is
``ssh`` (hydra's default on several hosts); with another launcher (slurm, pbs) no host is
probed and none is dropped: the scheduler owns the hosts there."""

from __future__ import annotations

import os
import subprocess
import tempfile

FILE_OPTIONS = ("-f", "-hostfile", "--hostfile", "-machinefile", "--machinefile")
LIST_OPTIONS = ("-hosts", "--hosts", "-host", "--host")
PPN_OPTIONS = ("-ppn", "--ppn", "-perhost", "--perhost")
PROBE_SECONDS = 10.0


def _options(mpi_args: list[str]):
    """[(index, option, value)] of mpiexec's options, ``--opt=value`` split."""
    out, i = [], 0
    while i < len(mpi_args):
        arg = mpi_args[i]
        if "=" in arg and arg.startswith("-"):
            name, value = arg.split("=", 1)
            out.append((i, name, value, 1))
            i += 1
        elif i + 1 < len(mpi_args):
            out.append((i, arg, mpi_args[i + 1], 2))
            i += 2 if arg in FILE_OPTIONS + LIST_OPTIONS + PPN_OPTIONS else 1
        else:
            i += 1
    return out


def _entry(text: str):
    name, _, slots = text.strip().partition(":")
    return name, int(slots) if slots.strip().isdigit() else None


def hosts_of(mpi_args: list[str]) -> tuple[list, int | None]:
    """([(host, slots or None)], ranks per host or None) named by ``mpi_args`` ([] if none)."""
    hosts, ppn = [], None
    for _, name, value, _ in _options(mpi_args):
        if name in FILE_OPTIONS:
            try:
                with open(value) as f:
                    lines = [ln.split("#", 1)[0].strip() for ln in f]
            except OSError:
                return [], ppn  # (mpiexec says so itself)
            hosts = [_entry(ln) for ln in lines if ln]
        elif name in LIST_OPTIONS:
            hosts = [_entry(h) for h in value.split(",") if h.strip()]
        elif name in PPN_OPTIONS and value.isdigit():
            ppn = int(value)
    return hosts, ppn


def placement(n: int, hosts: list, ppn: int | None = None) -> dict[str, int]:
    """{host: its ranks} as hydra places ``n`` ranks on ``hosts``."""
    if not hosts:
        return {}
    counts = {name: 0 for name, _ in hosts}
    left = n
    while left > 0:
        for name, slots in hosts:
            take = min(left, ppn or slots or 1)
            counts[name] += take
            left -= take
            if left == 0:
                break
    return counts


def rank_hosts(n: int, mpi_args: list[str]) -> list[str]:
    """Each rank's host as hydra places them ([] when no host is named)."""
    hosts, ppn = hosts_of(mpi_args)
    out, left = [], n
    while hosts and left > 0:
        for name, slots in hosts:
            take = min(left, ppn or slots or 1)
            out += [name] * take
            left -= take
            if left == 0:
                break
    return out


def ranks_per_host(n: int, mpi_args: list[str]) -> int:
    """The most ranks any one host of the job runs (``n`` when no host is named)."""
    hosts, ppn = hosts_of(mpi_args)
    if not hosts:
        return min(n, ppn) if ppn else n
    return max(placement(n, hosts, ppn).values())


def prober(environ) -> list[str] | None:
    """The command prefix that runs a command on a host as hydra would (None: not ssh)."""
    if environ.get("HYDRA_LAUNCHER", "ssh") != "ssh":
        return None
    program = environ.get("HYDRA_LAUNCHER_EXEC")
    return [program] if program else ["ssh", "-o", "BatchMode=yes", "-o", "ConnectTimeout=5"]


def answers(host: str, environ) -> bool:
    """Whether ``host`` runs ``true`` within ``PROBE_SECONDS`` (True when hosts are not probed)."""
    prefix = prober(environ)
    if prefix is None:
        return True
    try:
        done = subprocess.run([*prefix, host, "true"], env=environ, timeout=PROBE_SECONDS,
                              stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return done.returncode == 0


def without(mpi_args: list[str], dead: set[str], folder: str) -> list[str]:
    """``mpi_args`` with the ``dead`` hosts left out (a hostfile written anew in ``folder``)."""
    out = list(mpi_args)
    for i, name, value, width in reversed(_options(mpi_args)):
        if name in FILE_OPTIONS:
            hosts, _ = hosts_of([name, value])
            fd, path = tempfile.mkstemp(prefix="hostfile-", dir=folder, text=True)
            with os.fdopen(fd, "w") as f:
                f.write("".join(f"{h}:{s}\n" if s else f"{h}\n" for h, s in hosts
                                if h not in dead))
            new = [name, path] if width == 2 else [f"{name}={path}"]
        elif name in LIST_OPTIONS:
            kept = ",".join(h for h in value.split(",") if _entry(h)[0] not in dead)
            new = [name, kept] if width == 2 else [f"{name}={kept}"]
        else:
            continue
        out[i:i + width] = new
    return out


def shrink(n: int, mpi_args: list[str], environ, min_procs: int, folder: str, failing=()):
    """After a failed attempt: (n, mpi_args, message) for the next one with the hosts that do
    not answer left out — and the ``failing`` ones (their ranks ended two attempts) where at
    least ``min_procs`` processes remain without them — or None when none is (or no host is
    named); ``message`` says what changed, or why the job cannot go on (then n is 0)."""
    hosts, ppn = hosts_of(mpi_args)
    if len(hosts) < 2 or prober(environ) is None:
        return None
    had = placement(n, hosts, ppn)
    silent = {h for h, _ in hosts if not answers(h, environ)}
    bad = {h for h in failing if h in had} - silent
    if bad and n - sum(had[h] for h in silent | bad) < max(1, min_procs):
        bad = set()  # (kept: no fewer processes than allowed; a fault may pass)
    dead = silent | bad
    if not dead:
        return None
    left = n - sum(had[h] for h in dead)
    why = "; ".join(part for part in (
        f"host(s) {', '.join(sorted(silent))} do not answer" if silent else "",
        f"host(s) {', '.join(sorted(bad))} had ranks end two attempts" if bad else "") if part)
    if left < max(1, min_procs) or len(dead) == len(hosts):
        return 0, mpi_args, (f"{why}; {max(left, 0)} of {n} processes would remain, fewer "
                             f"than --min-procs {min_procs}: not restarting")
    return left, without(mpi_args, dead, folder), (
        f"{why}: left out; the job goes on with {left} of {n} processes (--min-procs "
        f"{min_procs})")


__all__ = ["hosts_of", "placement", "rank_hosts", "ranks_per_host", "shrink"]
