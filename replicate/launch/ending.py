"""The launcher's verdict on a finished job: which rank, if any, ended it without finishing its
script, from ``mpiexec``'s exit code, the ranks' records (``runtime/job/status.py``; those of
other hosts fetched by ``remote.py``) and the order in which the launcher saw the ranks on its
own host end (``launcher.Exits``). That order says nothing about ranks on other hosts: where one
of them did not finish, only the steps can tell (the rank behind the others)."""

from __future__ import annotations

import socket

from ..runtime.job import status

PREFIX = "[replicate.launch]"


def _at(record) -> str:
    return "before its first step" if record["step"] is None else f"at step {record['step']}"


def _evidence(unfinished: dict, first, together, here):
    """(first, together, across): the exit order seen here stands only when every unfinished
    rank ran here; otherwise every unfinished rank is weighed by its step (``across``)."""
    here = socket.gethostname() if here is None else here
    if all(rec["host"] == here for rec in unfinished.values()):
        return first, together, False
    return None, list(unfinished), True


def _behind(together, unfinished: dict):
    """Of ranks seen ending at one instant, the one the others waited for: the only one at an
    earlier step than all the rest (they had gone on to the next step's collective, where they
    wait for it until mpiexec ends them). None if no one rank is behind."""
    steps = {r: unfinished[r]["step"] for r in together if r in unfinished}
    if len(steps) < 2 or any(v is None for v in steps.values()):
        return None
    low = min(steps.values())
    lowest = [r for r, v in steps.items() if v == low]
    return lowest[0] if len(lowest) == 1 else None


def verdict(returncode: int, records: dict, n: int, first=None, together=(),
            here=None) -> tuple[int, str | None]:
    """(exit code, message or None) of the whole job from ``mpiexec``'s exit code and the
    ranks' records: exit code 0 only if every rank that left a record finished its script.
    ``first``: the rank seen to end first, if one was (the others were then ended by mpiexec);
    ``together``: the ranks seen ending first at one instant, when more than one was (on a busy
    machine the launcher can wake after mpiexec ended the others): the one at an earlier step
    than the rest is named, as the one they waited for. ``here``: this host's name (default
    ``socket.gethostname()``).

    When a rank reported its own failure (it printed why and ended the job) ``mpiexec``'s exit
    code stands. Otherwise a rank that did not finish its script is named: with exit code 0 it
    left early (``os._exit(0)`` or ``exit(0)`` below Python: mpiexec ends the others silently and
    returns 0); with another code it was killed, or exited below Python, and mpiexec's own
    report names only the processes it then killed."""
    if any(rec["state"] == status.FAILED for rec in records.values()):
        return returncode, None
    unseen = [r for r in range(n) if r not in records]  # (on hosts that do not share the folder)
    if unseen and returncode != 0:
        return returncode, (f"{PREFIX} mpiexec returned {returncode}; ranks {unseen} left no "
                            "record here (their host did not answer when the job had ended, or "
                            "they ended before starting): their own lines above say which "
                            "failed and why.")
    unfinished = {r: rec for r, rec in sorted(records.items()) if rec["state"] != status.DONE}
    if not unfinished:
        return returncode, None
    first, together, across = _evidence(unfinished, first, together, here)
    if first not in unfinished and len(unfinished) == 1:
        first = next(iter(unfinished))
    why = ""
    if first not in unfinished and _behind(together, unfinished) is not None:
        first = _behind(together, unfinished)
        seen = "ended on several hosts" if across else "were seen ending together"
        why = (f" (ranks {sorted(together)} {seen}; rank {first} is the one the others waited "
               "for, at an earlier step than theirs)")
    code = returncode or 1

    def on(rec):
        return f" on {rec['host']}" if across else ""

    def who(r, rec):
        return f"rank {r}{on(rec)} {_at(rec)}"
    if first in unfinished:
        rec = unfinished[first]
        others = ", ".join(who(r, rec) for r, rec in unfinished.items() if r != first)
        others = f" (unfinished: {others})" if others else ""
        if returncode == 0:
            return code, (f"{PREFIX} rank {first}{on(rec)} exited early (code 0) {_at(rec)}: it "
                          "ended without finishing its script (os._exit, or exit() below "
                          "Python), and mpiexec then ended the other ranks silently and returned "
                          f"0; the job's work is incomplete{others}{why}.")
        return code, (f"{PREFIX} rank {first}{on(rec)} ended first, {_at(rec)}, without "
                      "finishing its script or reporting a failure (killed by a signal, or "
                      f"exit() below Python); mpiexec then ended the other ranks{others}{why}.")
    ranks = ", ".join(who(r, rec) for r, rec in unfinished.items())
    how = "exited early (code 0)" if returncode == 0 else "ended without finishing"
    return code, (f"{PREFIX} ranks {sorted(unfinished)} {how}: {ranks}; one of them ended "
                  "first without finishing its script or reporting a failure (os._exit, a "
                  "signal, or exit() below Python) and mpiexec then ended the others"
                  f"{' (which one is not known across hosts)' if across else ''}.")


def culprit(records: dict, first=None, together=(), n: int | None = None,
            here=None) -> dict | None:
    """The rank that ended a failed job, for the restart log: ``{"rank", "host", "step",
    "why"}`` (``why``: the failure's line the rank recorded, "" when it ended without one — killed,
    or exit() below Python), or None when the records do not tell (no rank left one, or several
    ended at one instant with none behind). With ranks of the ``n`` that left no record (their
    host did not answer) and no rank that said why, those ranks are named (``"rank"``: their
    list, ``"host"`` ""): a rank here that ended first was ended by mpiexec, not the cause; so
    are the unfinished ranks of other hosts when none of them is behind the others (``"host"``:
    theirs)."""
    failed = sorted(r for r, rec in records.items() if rec["state"] == status.FAILED)
    unfinished = {r: rec for r, rec in records.items() if rec["state"] != status.DONE}
    with_reason = [r for r in failed if records[r].get("why")]
    unseen = [r for r in range(n or 0) if r not in records]
    if unseen and not with_reason:
        return {"rank": unseen, "host": "", "step": None, "why": ""}
    here = socket.gethostname() if here is None else here
    first, together, across = _evidence(unfinished, first, together, here)
    if with_reason or failed:
        rank = (with_reason or failed)[0]
    elif first in unfinished:
        rank = first
    elif _behind(together, unfinished) is not None:
        rank = _behind(together, unfinished)
    elif len(unfinished) == 1:
        rank = next(iter(unfinished))
    elif across:
        away = sorted(r for r, rec in unfinished.items() if rec["host"] != here)
        return {"rank": away, "host": ", ".join(sorted({unfinished[r]["host"] for r in away})),
                "step": None, "why": ""}
    else:
        return None
    rec = records[rank]
    return {"rank": rank, "host": rec["host"], "step": rec["step"], "why": rec.get("why", "")}
