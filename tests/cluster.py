"""A simulated cluster on this machine: N hosts, each its own network, host name, IPC and
``/tmp`` and ``/dev/shm``, joined by rate-limited links, and a launcher shim so that ``mpiexec``
(hydra) starts ranks on them as it would over ssh.

Each host is

* a network namespace ``rps<pid>h<i>`` (``ip netns``: the prefix and the pid of the process
  that made it let a later run remove what a killed run left) with one veth to a bridge of its
  own, address ``10.77.0.<i+1>``, the link limited on both ends to ``rate`` with
  ``tc qdisc ... tbf rate R burst 128kb latency 10ms`` (this kernel has no ``netem``);
* a process that holds a UTS namespace (host name ``node<i>``: MPICH groups ranks into nodes by
  host name), an IPC namespace and a mount namespace with a fresh tmpfs on ``/tmp`` and on
  ``/dev/shm`` — with only distinct names, UCX still reaches another "host" through shared
  memory; the paths the jobs need (the checkout, the Python environment, a shared folder) are
  bound back in at their own paths, as a shared file system would be;
* names resolved by ``/etc/netns/<ns>/hosts`` (``ip netns exec`` and this module's entry bind it
  over ``/etc/hosts``).

``mpiexec -launcher ssh -launcher-exec SHIM`` (or ``HYDRA_LAUNCHER=ssh``,
``HYDRA_LAUNCHER_EXEC=SHIM`` in the environment, as ``env()`` gives) calls ``SHIM [opts] HOST
CMD...``; the shim runs ``CMD`` inside that host's namespaces. Only root may build this
(``why_not()`` says why not); everything is removed by ``close()``, also after a failure.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import time

PREFIX = "rps"  # every namespace, link and bridge this module makes starts with it
SUBNET = "10.77.0"
RUN = "/run/rpsim"  # where each host's original /tmp is bound before a tmpfs covers it
_TAG = re.compile(PREFIX + r"(\d+)[a-z]")  # a cluster's tag: prefix, its maker's pid, a letter
_made = [0]  # clusters made by this process


def _sh(*cmd, check=True, **kw):
    return subprocess.run(cmd, check=check, capture_output=True, text=True, **kw)


def why_not() -> str | None:
    """Why a cluster cannot be built here (None: it can)."""
    if os.geteuid() != 0:
        return "the simulated cluster needs root (ip netns, unshare, tc)"
    for tool in ("ip", "tc", "unshare", "nsenter", "mount"):
        if shutil.which(tool) is None:
            return f"the simulated cluster needs {tool!r}, not found"
    probe = f"{PREFIX}{os.getpid()}probe"
    made = _sh("ip", "netns", "add", probe, check=False)
    if made.returncode:
        return f"ip netns add is not permitted here: {made.stderr.strip()}"
    _sh("ip", "netns", "del", probe, check=False)
    return None


def _alive(pid: int) -> bool:
    return os.path.exists(f"/proc/{pid}")


def _kill_in(ns: str) -> None:
    """SIGKILL every process in network namespace ``ns``, until none is left."""
    for _ in range(50):
        pids = _sh("ip", "netns", "pids", ns, check=False).stdout.split()
        if not pids:
            return
        for pid in pids:
            try:
                os.kill(int(pid), signal.SIGKILL)
            except (ProcessLookupError, ValueError):
                pass
        time.sleep(0.05)


def _remove(tag: str, hosts: list[str]) -> None:
    for ns in hosts:
        _kill_in(ns)
        _sh("ip", "netns", "del", ns, check=False)
        shutil.rmtree(f"/etc/netns/{ns}", ignore_errors=True)
        _rmdir(f"{RUN}/{ns}")
    _sh("ip", "link", "del", f"{tag}b", check=False)


def _rmdir(path: str) -> None:
    try:
        os.rmdir(path)
    except OSError:
        pass


def clean_stale() -> list[str]:
    """Remove what earlier runs left (their maker's pid no longer runs); the names removed."""
    stale: dict[str, list[str]] = {}
    for line in _sh("ip", "netns", "list", check=False).stdout.splitlines():
        name = line.split()[0]
        found = _TAG.match(name)
        if found and not _alive(int(found.group(1))):
            stale.setdefault(found.group(0), []).append(name)
    links = _sh("ip", "-o", "link", "show", "type", "bridge", check=False).stdout
    for line in links.splitlines():
        found = _TAG.match(line.split(":")[1].strip())
        if found and not _alive(int(found.group(1))):
            stale.setdefault(found.group(0), [])
    for tag, hosts in stale.items():
        _remove(tag, hosts)
    return sorted(n for hosts in stale.values() for n in hosts)


# runs in each host's fresh UTS, IPC and mount namespaces; prints "ready" when set up
_HOLD = r"""
set -e
hostname "$1"; shift
hide="$1"; shift
mount --make-rprivate /
mount -t tmpfs -o size=512m,mode=1777 rpsim-shm /dev/shm
mount --bind /tmp "$hide"
mount -t tmpfs -o size=512m,mode=1777 rpsim-tmp /tmp
for keep in "$@"; do
  mkdir -p "$keep"
  mount --bind "$hide/${keep#/tmp/}" "$keep"
done
echo ready
exec sleep 2147483647
"""

_SHIM = """#!/bin/sh
# hydra's launcher: called as  SHIM [ssh options] HOST COMMAND...  (made by tests/cluster.py)
while [ $# -gt 0 ]; do case "$1" in -*) shift ;; *) break ;; esac; done
host="$1"; shift
case "$host" in
{cases}
  *) echo "simulated cluster: no host $host" >&2; exit 255 ;;
esac
exec nsenter -t "$pid" -n -u -i -m --wdns="$PWD" -- /bin/sh -c "$*"
"""


class Cluster:
    """``n`` simulated hosts (see the module's docstring). ``shared``: folders every host sees
    at the same path (the checkout, this Python's environment and ``folder`` always are);
    ``folder``: the shim and the hostfile are written here. Use as a context manager, or call
    ``close()``."""

    def __init__(self, n: int, folder: str, rate: str = "10gbit", shared=()):
        if n < 1:
            raise ValueError(f"a cluster needs at least one host, got {n}")
        self.n, self.folder, self.rate = n, os.path.abspath(folder), rate
        self.tag = f"{PREFIX}{os.getpid()}{chr(97 + _made[0] % 26)}"
        _made[0] += 1
        self.ns = [f"{self.tag}h{i}" for i in range(n)]
        self.names = [f"node{i}" for i in range(n)]
        self.addresses = [f"{SUBNET}.{i + 1}" for i in range(n)]
        self.links = [f"{self.tag}v{i}" for i in range(n)]  # the hosts' veths, bridge side
        self.holders: list[subprocess.Popen] = []
        keep = {self.folder, os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                sys.prefix, os.path.dirname(os.path.realpath(sys.executable)),
                *map(os.path.abspath, shared)}
        self.keep = sorted(p for p in keep if p.startswith("/tmp/"))
        self.shim = os.path.join(self.folder, "rpsim-launcher")
        clean_stale()
        try:
            self._build()
        except BaseException:
            self.close()
            raise

    # -- building ---------------------------------------------------------------------------
    def _build(self):
        os.makedirs(self.folder, exist_ok=True)
        bridge = f"{self.tag}b"
        _sh("ip", "link", "add", bridge, "type", "bridge")
        _sh("ip", "link", "set", bridge, "up")
        hosts = "".join(f"{a} {n}\n" for a, n in zip(self.addresses, self.names))
        for i, ns in enumerate(self.ns):
            _sh("ip", "netns", "add", ns)
            os.makedirs(f"/etc/netns/{ns}", exist_ok=True)
            with open(f"/etc/netns/{ns}/hosts", "w") as f:
                f.write(f"127.0.0.1 localhost\n{hosts}")
            peer = f"{self.tag}p{i}"
            _sh("ip", "link", "add", self.links[i], "type", "veth", "peer", "name", peer)
            _sh("ip", "link", "set", peer, "netns", ns)
            _sh("ip", "link", "set", self.links[i], "master", bridge, "up")
            inside = ("ip", "netns", "exec", ns)
            _sh(*inside, "ip", "link", "set", peer, "name", "eth0")
            _sh(*inside, "ip", "addr", "add", f"{self.addresses[i]}/24", "dev", "eth0")
            _sh(*inside, "ip", "link", "set", "eth0", "up")
            _sh(*inside, "ip", "link", "set", "lo", "up")
            self._limit(self.links[i], ())
            self._limit("eth0", inside)
            self.holders.append(self._hold(i))
        with open(self.shim, "w") as f:
            cases = "".join(f"  {n}|{a}) pid={h.pid} ;;\n"
                            for n, a, h in zip(self.names, self.addresses, self.holders))
            f.write(_SHIM.format(cases=cases))
        os.chmod(self.shim, 0o755)

    def _limit(self, dev: str, inside) -> None:
        _sh(*inside, "tc", "qdisc", "replace", "dev", dev, "root", "tbf", "rate", self.rate,
            "burst", "128kb", "latency", "10ms")

    def _hold(self, i: int) -> subprocess.Popen:
        hide = f"{RUN}/{self.ns[i]}"
        os.makedirs(hide, exist_ok=True)
        proc = subprocess.Popen(
            ["ip", "netns", "exec", self.ns[i], "unshare", "--uts", "--ipc", "--mount",
             "--propagation", "private", "sh", "-c", _HOLD, "hold", self.names[i], hide,
             *self.keep], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        line = proc.stdout.readline()
        if line.strip() != "ready":
            proc.kill()
            raise RuntimeError(f"simulated host {self.names[i]} did not start: "
                               f"{line}{proc.stderr.read()}")
        return proc

    # -- using ------------------------------------------------------------------------------
    def set_rate(self, rate: str) -> None:
        """Limit every link (both ends) to ``rate`` (tc's notation: ``1gbit``, ``200mbit``)."""
        self.rate = rate
        for i, ns in enumerate(self.ns):
            self._limit(self.links[i], ())
            self._limit("eth0", ("ip", "netns", "exec", ns))

    def enter(self, host: int, cwd: str | None = None) -> list[str]:
        """The command prefix that runs a command on host ``host`` in folder ``cwd`` (default
        the caller's; a path every host sees)."""
        return ["nsenter", "-t", str(self.holders[host].pid), "-n", "-u", "-i", "-m",
                f"--wdns={cwd or os.getcwd()}", "--"]

    def env(self, base=None) -> dict:
        """``base`` (default ``os.environ``) with hydra told to start its proxies through the
        shim."""
        env = dict(os.environ if base is None else base)
        env.update(HYDRA_LAUNCHER="ssh", HYDRA_LAUNCHER_EXEC=self.shim)
        return env

    def hostfile(self, ppn: int | None = None, hosts=None) -> str:
        """A hostfile of ``hosts`` (default all), ``name:ppn`` lines if ``ppn``; its path."""
        path = os.path.join(self.folder, f"hostfile{'' if ppn is None else ppn}")
        with open(path, "w") as f:
            for name in (self.names if hosts is None else hosts):
                f.write(f"{name}:{ppn}\n" if ppn else f"{name}\n")
        return path

    def link_bytes(self) -> list[int]:
        """Bytes each host's link has carried so far, both directions (bridge side counters)."""
        out = []
        for link in self.links:
            base = f"/sys/class/net/{link}/statistics"
            with open(f"{base}/rx_bytes") as rx, open(f"{base}/tx_bytes") as tx:
                out.append(int(rx.read()) + int(tx.read()))
        return out

    def kill_host(self, host: int) -> None:
        """Host ``host`` dies: every process on it (its ranks, hydra's proxy, the process that
        holds its namespaces) is killed with SIGKILL; it answers nothing from then on."""
        _kill_in(self.ns[host])

    def shell(self, host: int, script: str) -> str:
        """Run a shell ``script`` on host ``host``; its output."""
        cmd = self.enter(host) + ["sh", "-c", script]
        return subprocess.run(cmd, check=True, capture_output=True, text=True).stdout

    def close(self) -> None:
        for proc in self.holders:
            proc.kill()
        for proc in self.holders:
            proc.wait()
            for stream in (proc.stdout, proc.stderr):
                stream.close()
        self.holders = []
        _remove(self.tag, self.ns)
        if os.path.exists(self.shim):
            os.remove(self.shim)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

