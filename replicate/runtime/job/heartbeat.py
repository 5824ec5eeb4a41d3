"""Hosts that go silent end a job across machines within ``REPLICATE_HOST_SILENCE`` seconds.

A cut link or a host that stops (power, a kernel hang) leaves the other hosts' ranks waiting in
their next collective, which the stall watchdog ends only at the collective timeout (300 s by
default: a step, a checkpoint or a first compile may legitimately keep a collective waiting that
long). So in a job over several hosts the first rank of each host (its *leader*) sends a small
message to every other host's leader every ``PERIOD`` seconds, from the watchdog's thread (it
answers while the main thread computes or waits in MPI), on the watchdog's side channel. A leader
that hears nothing from a host for ``REPLICATE_HOST_SILENCE`` seconds (default 30: fifteen beats
missed, far beyond a busy host's scheduling delays, still ten times sooner than the collective
timeout; ``0`` turns it off) prints which host went silent and its ranks, and aborts the job.
A host whose leader said goodbye (its ranks finished) is not waited for."""

from __future__ import annotations

import os
import sys
import time

from ...errors import ReplicateError

ENV = "REPLICATE_HOST_SILENCE"
DEFAULT = 30.0
PERIOD = 2.0
TAG = 30004


def env_seconds(name: str, default: float, environ=None) -> float:
    """Seconds from the environment variable ``name`` (``default`` when unset; 0: off), or a
    ``ReplicateError`` that names it."""
    text = (os.environ if environ is None else environ).get(name, "").strip()
    if not text:
        return default
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not value >= 0:  # (NaN too)
        raise ReplicateError(f"{name}={text!r}: expected a number of seconds >= 0 (0: off)")
    return value


def silence(environ=None) -> float:
    return env_seconds(ENV, DEFAULT, environ)


class Heartbeat:
    """A leader's beats to the other hosts' leaders, and what it heard (``watchdog`` owns it)."""

    def __init__(self, watchdog, hosts):
        self.dog, self.limit = watchdog, silence()
        firsts = sorted({first for first, _ in hosts or ()})
        self.names = {first: name for first, name in hosts or ()}
        self.ranks = {f: [r for r, (g, _) in enumerate(hosts) if g == f] for f in firsts}
        mine = hosts[watchdog.rank][0] if hosts else None
        self.on = bool(self.limit) and len(firsts) > 1 and watchdog.rank == mine
        self.peers = [f for f in firsts if f != mine] if self.on else []
        self.heard: dict[int, float] = {}
        self.sent = 0.0

    def beat(self, ready: bool) -> None:
        """Send a beat when one is due; end the job if a host has been silent too long."""
        if not (self.on and ready):
            return
        now = time.monotonic()
        for f in self.peers:
            self.heard.setdefault(f, now)  # (counted from when the side channel works)
        if now - self.sent >= PERIOD:
            self.sent = now
            for f in self.peers:
                self.dog._send(None, f, TAG)
        for f in self.peers:
            if f in self.dog.gone or self.dog.reported:
                continue
            quiet = now - self.heard[f]
            if quiet > self.limit:
                self.dog.reported = True
                print(f"[replicate] rank {self.dog.rank}: host {self.names.get(f, '?')} (ranks "
                      f"{self.ranks.get(f, [f])}) has been silent for {quiet:.0f} s ({ENV}="
                      f"{self.limit:g}): a cut link, or the host stopped; aborting the job "
                      "(every rank ends).", file=sys.stderr, flush=True)
                self.dog.world.abort(1)

    def heard_from(self, source: int) -> None:
        self.heard[source] = time.monotonic()


__all__ = ["DEFAULT", "ENV", "Heartbeat", "env_seconds", "silence"]
