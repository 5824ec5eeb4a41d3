"""The communication thread (``replicate/runtime/communication/overlap.py``): buckets run in the
order they were started, and an exchange marked ``inline`` (nothing computes before its wait) runs
on the caller's thread only when that keeps the order — when every exchange started before it has
finished. Checked with a stand-in communicator that records which thread ran what, in which
order (no MPI: the order is what this module promises, whatever MPI does)."""

from __future__ import annotations

import threading

import pytest

from replicate.runtime.communication.overlap import CommThread


class Recorder:
    """A communicator stand-in: ``fn(comm, name)`` appends ``(name, thread id)``."""

    def __init__(self):
        self.calls = []


def record(comm, name, gate=None):
    if gate is not None:
        assert gate.wait(10), "the test never opened the gate"
    comm.calls.append((name, threading.get_ident()))
    return name


def test_an_inline_exchange_on_an_idle_thread_runs_on_the_callers_thread_at_once():
    t = CommThread(Recorder())
    handle = t.submit(record, "a", inline=True)
    assert handle._done.is_set() and handle.result() == "a"  # done before submit returned
    assert t.comm.calls == [("a", threading.get_ident())] and t.inlined == 1


def test_without_inline_the_thread_runs_it():
    t = CommThread(Recorder())
    assert t.submit(record, "a").result() == "a"
    assert t.comm.calls[0][1] == t.thread.ident and t.inlined == 0


@pytest.mark.parametrize("inline", [False, True])
def test_an_exchange_started_while_the_thread_is_busy_waits_its_turn(inline):
    """The thread is still reducing an earlier bucket: the inline one must not overtake it
    (the other processes run them in the started order), so it goes to the thread too."""
    t = CommThread(Recorder())
    gate = threading.Event()
    first = t.submit(record, "first", gate)
    second = t.submit(record, "second", inline=inline)
    assert not second._done.is_set() and t.inlined == 0
    gate.set()
    assert second.result() == "second" and first.result() == "first"
    assert [name for name, _ in t.comm.calls] == ["first", "second"]
    assert {ident for _, ident in t.comm.calls} == {t.thread.ident}
    # ... and once the thread is idle again, the next inline one runs here
    t.submit(record, "third", inline=True).result()
    assert t.comm.calls[-1] == ("third", threading.get_ident()) and t.inlined == 1


def test_an_inline_exchanges_error_reaches_its_wait():
    def fail(comm):
        raise RuntimeError("peer gone")

    t = CommThread(Recorder())
    handle = t.submit(fail, inline=True)
    with pytest.raises(RuntimeError, match="peer gone"):
        handle.result()
    assert t.submit(record, "after", inline=True).result() == "after"  # still usable
