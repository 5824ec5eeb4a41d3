"""A process manager for a job on this machine alone, with nothing listening on the network.

    python replicate/launch/forker.py -n N command [args...]

``replicate.launch`` starts a job that names no host this way (``launcher.process_manager``).
MPICH's own ``mpiexec`` (hydra) listens for its proxies on every interface of the machine until
the job ends, with no secret: anyone who can reach the port can end the job with a few bytes,
and before MPI is up nothing can close it. This one forks the ``N`` ranks itself and serves each
MPI start-up over a socket pair it inherits (PMI-1, MPICH's "simple" wire protocol, the one its
``mpiexec.gforker`` speaks: ``PMI_FD``, ``PMI_RANK``, ``PMI_SIZE``), so the job opens no port
at all. It behaves as hydra does where the launcher relies on it:

* a rank that ends by a signal, calls ``MPI_Abort``, or exits after MPI's start-up without
  ``MPI_Finalize`` ends the job: the other ranks are killed (SIGKILL) at once, each with its
  process group (what it started), and the exit code is that rank's (``128 + signal`` for a
  signal, where hydra gives the signal's number; the code given to ``MPI_Abort``; and 0 for a
  rank that left with code 0, as hydra returns it: the launcher's verdict names it); ranks
  that finish normally give the largest of their codes;
* a rank that ends without starting MPI while another started it would leave that one waiting
  in MPI's start-up forever (hydra's does): the job is ended the same way, exit code that
  rank's (1 if it was 0);
* each rank runs in a session of its own with SIGINT, SIGTERM, SIGHUP, SIGUSR1 and SIGUSR2 at
  their defaults, and this process passes each of those on to every rank's process group
  (Ctrl-C in the terminal reaches the ranks once, through it); a second SIGINT kills them; if
  this process is killed outright, so are the ranks (``PR_SET_PDEATHSIG``) — but not what they
  started (hydra's proxies would kill those too);
* MPI's name service (``MPI_Publish_name``, ``MPI_Lookup_name``) is served within the job;
  ``MPI_Comm_spawn`` is answered with an error (the caller's MPI reports it), any other request
  it does not know ends the job with a message;
* rank 0 reads the standard input, the others ``/dev/null``; every rank writes to this
  process's standard output and error directly; each rank sees ``MPI_LOCALNRANKS`` and
  ``MPI_LOCALRANKID`` as under hydra. The job's PMI name (``kvsname``), which MPICH's
  shared-memory file names derive from, is random, so another user cannot guess those names.

Nothing of the package is imported: the file runs by its path with ``python -I -S`` (the
standard library only, no site packages to scan), before any rank starts.
"""

from __future__ import annotations

import ctypes
import os
import selectors
import signal
import socket
import subprocess
import sys

PREFIX = "[replicate.launch]"
MAXES = "kvsname_max=256 keylen_max=256 vallen_max=1024"


FORWARDED = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGUSR1, signal.SIGUSR2)


def _in_child(forker: int) -> None:  # (in each rank, between fork and exec)
    for sig in FORWARDED:  # (an ignored signal stays ignored across exec)
        signal.signal(sig, signal.SIG_DFL)
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    if os.getppid() != forker:  # the forker is already gone
        os._exit(1)


class Rank:
    def __init__(self, rank: int, n: int, argv: list[str], kvsname: str):
        self.rank, self.buffer, self.mcmd = rank, b"", None
        self.started = self.finalized = False  # (PMI ``init``; ``finalize``)
        self.pmi, theirs = socket.socketpair()
        env = {k: v for k, v in os.environ.items() if k not in ("PMI_PORT", "PMI_ID")}
        env.update(PMI_FD=str(theirs.fileno()), PMI_RANK=str(rank), PMI_SIZE=str(n),
                   MPI_LOCALNRANKS=str(n), MPI_LOCALRANKID=str(rank))
        forker = os.getpid()
        self.proc = subprocess.Popen(argv, env=env, pass_fds=[theirs.fileno()],
                                     stdin=None if rank == 0 else subprocess.DEVNULL,
                                     start_new_session=True,
                                     preexec_fn=lambda: _in_child(forker))
        theirs.close()
        self.kvsname = kvsname
        try:  # (readable when the process has ended; Linux 5.3 and later)
            self.ended = os.pidfd_open(self.proc.pid)
        except (AttributeError, OSError):
            self.ended = None  # (polled instead, ten times a second)


class Job:
    def __init__(self, n: int, argv: list[str]):
        self.n, self.kvs, self.names, self.waiting = n, {}, {}, set()
        self.code, self.ending, self.interrupts = None, False, 0
        kvsname = f"kvs_{os.getpid()}_{os.urandom(8).hex()}"
        self.selector = selectors.DefaultSelector()
        self.ranks = []
        for r in range(n):
            rank = Rank(r, n, argv, kvsname)
            self.ranks.append(rank)
            self.selector.register(rank.pmi, selectors.EVENT_READ, ("pmi", rank))
            if rank.ended is not None:
                self.selector.register(rank.ended, selectors.EVENT_READ, ("ended", rank))
        self.live = set(self.ranks)

    # ---- the ranks' requests (PMI-1: one line of ``key=value`` words each)

    def multiline(self, rank: Rank, line: str) -> bool:
        """A request of several lines (``mcmd=spawn`` ... ``endcmd``): gathered, then answered
        with an error (this process manager starts no processes after the job's start) — MPI
        reports it to the caller as ``MPI_Comm_spawn``'s failure. True if ``line`` was part of
        one."""
        if rank.mcmd is None and not line.startswith("mcmd="):
            return False
        if rank.mcmd is None:
            rank.mcmd = line.split("=", 1)[1]
        elif line == "endcmd":
            cmd, rank.mcmd = rank.mcmd, None
            print(f"{PREFIX} rank {rank.rank} called MPI_Comm_spawn, which the launcher's "
                  "process manager does not serve (run the job with "
                  "REPLICATE_PROCESS_MANAGER=hydra for that)", file=sys.stderr, flush=True)
            self.reply(rank, f"cmd={cmd}_result rc=-1 msg=not_served_by_this_process_manager")
        return True

    def serve(self, rank: Rank) -> None:
        try:
            data = rank.pmi.recv(65536)
        except OSError:
            data = b""
        if not data:  # (its end closed: the process's exit decides)
            self.selector.unregister(rank.pmi)
            return
        rank.buffer += data
        while b"\n" in rank.buffer:
            line, rank.buffer = rank.buffer.split(b"\n", 1)
            text = line.decode(errors="replace")
            if not self.multiline(rank, text):
                self.request(rank, text)

    def request(self, rank: Rank, line: str) -> None:
        words = dict(w.split("=", 1) for w in line.split() if "=" in w)
        cmd = words.get("cmd")
        if cmd == "init":
            rank.started = True
            self.reply(rank, "cmd=response_to_init pmi_version=1 pmi_subversion=1 rc=0")
            self.stranded()
        elif cmd == "get_maxes":
            self.reply(rank, f"cmd=maxes {MAXES} rc=0")
        elif cmd == "get_appnum":
            self.reply(rank, "cmd=appnum appnum=0 rc=0")
        elif cmd == "get_my_kvsname":
            self.reply(rank, f"cmd=my_kvsname kvsname={rank.kvsname} rc=0")
        elif cmd == "get_universe_size":
            self.reply(rank, f"cmd=universe_size size={self.n} rc=0")
        elif cmd == "put" and "key" in words:
            self.kvs[words["key"]] = words.get("value", "")
            self.reply(rank, "cmd=put_result rc=0")
        elif cmd == "get" and "key" in words:
            value = self.value(words["key"])
            self.reply(rank, "cmd=get_result rc=-1 msg=key_not_found" if value is None
                       else f"cmd=get_result rc=0 value={value}")
        elif cmd == "barrier_in":
            self.waiting.add(rank.rank)
            self.release()
        elif cmd == "finalize":
            rank.finalized = True
            self.reply(rank, "cmd=finalize_ack rc=0")
        elif cmd == "publish_name" and "service" in words:  # (MPI's name service, this job's)
            self.names[words["service"]] = words.get("port", "")
            self.reply(rank, "cmd=publish_result rc=0")
        elif cmd == "unpublish_name" and "service" in words:
            found = self.names.pop(words["service"], None) is not None
            self.reply(rank, "cmd=unpublish_result rc=0" if found else
                       "cmd=unpublish_result rc=-1 msg=service_not_published")
        elif cmd == "lookup_name" and "service" in words:
            port = self.names.get(words["service"])
            self.reply(rank, f"cmd=lookup_result rc=0 port={port}" if port is not None else
                       "cmd=lookup_result rc=-1 msg=service_not_found")
        elif cmd == "abort":
            code = words.get("exitcode", "1")
            self.end(int(code) if code.lstrip("-").isdigit() else 1)
        else:
            print(f"{PREFIX} rank {rank.rank} asked the process manager for {line!r}, which it "
                  "does not serve; ending the job. Run it with "
                  "REPLICATE_PROCESS_MANAGER=hydra.",
                  file=sys.stderr, flush=True)
            self.end(1)

    def value(self, key: str):
        if key == "PMI_process_mapping":  # every rank on this one node
            return f"(vector,(0,1,{self.n}))"
        return self.kvs.get(key)

    def reply(self, rank: Rank, line: str) -> None:
        try:
            rank.pmi.sendall(line.encode() + b"\n")
        except OSError:
            pass  # (it is ending; its exit decides)

    def release(self) -> None:
        """Answer the barrier once every rank is in it."""
        if len(self.waiting) == self.n:
            self.waiting.clear()
            for rank in self.ranks:
                self.reply(rank, "cmd=barrier_out rc=0")

    def stranded(self) -> None:
        """End the job when a rank has ended without starting MPI while another started it:
        MPI's start-up waits for every rank, so the others would wait for it forever."""
        if any(r.started for r in self.ranks) and any(
                r not in self.live and not r.started for r in self.ranks):
            self.end(self.code or 1)

    # ---- the ranks' ends

    def reap(self, rank: Rank) -> None:
        if rank.ended is not None:
            self.selector.unregister(rank.ended)
            os.close(rank.ended)
        code = rank.proc.wait()
        self.live.discard(rank)
        if self.ending:
            return
        if code < 0:  # a signal
            self.end(128 - code)
        elif rank.started and not rank.finalized:  # left MPI without MPI_Finalize
            self.end(code)  # (0 as hydra returns it: the launcher's verdict names the rank)
        else:
            self.code = max(self.code or 0, code)
            self.stranded()

    def end(self, code: int) -> None:
        """End the job with exit code ``code`` (the first reason given stands)."""
        if self.ending:
            return
        self.ending, self.code = True, code
        self.signal(signal.SIGKILL)

    def signal(self, sig) -> None:
        """``sig`` to every rank's process group (each rank leads one: what it started too,
        as hydra signals them), the ranks that have ended included (what they left running)."""
        for rank in self.ranks:
            try:
                os.killpg(rank.proc.pid, sig)
            except OSError:  # (nothing left in that group)
                pass

    def interrupted(self, sig, _frame) -> None:
        if sig == signal.SIGINT:
            self.interrupts += 1
            if self.interrupts > 1:  # (a second Ctrl-C: no more waiting)
                self.end(128 + sig)
                return
        self.signal(sig)

    def run(self) -> int:
        for sig in FORWARDED:
            signal.signal(sig, self.interrupted)
        polled = [rank for rank in self.ranks if rank.ended is None]
        while self.live:
            for key, _ in self.selector.select(0.1 if polled else None):
                kind, rank = key.data
                if kind == "pmi":
                    self.serve(rank)
                elif rank in self.live:
                    self.reap(rank)
            for rank in polled:
                if rank in self.live and rank.proc.poll() is not None:
                    self.reap(rank)
        return self.code or 0


def main(argv: list[str]) -> int:
    if len(argv) < 3 or argv[0] != "-n" or not argv[1].isdigit() or int(argv[1]) < 1:
        print("usage: forker.py -n N command [args...]", file=sys.stderr)
        return 2
    return Job(int(argv[1]), argv[2:]).run()


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
