"""The words of the stall watchdog's reports (``watchdog.py``): where a rank is, and what a peer
that has not arrived at a collective is doing instead."""

from __future__ import annotations


def _at_step(step, phase) -> str:
    if step is None:
        return ""
    return f" at step {step}" + (f" ({phase})" if phase else "")


def _exited_early(rank, info) -> str:
    """'rank R exited early (code C) at step S' from the goodbye of rank R."""
    code = info.get("code")
    code = "" if code is None else f" (code {code})"
    step = _at_step(info.get("step"), None) or " before its first step"
    return f"rank {rank} exited early{code}{step}"


def _describe_peer(info, call, arrived, exited) -> str:
    step = _at_step(info.get("step"), None).strip() or "before the first step"
    count = info["entered"].get(call.comm, 0)
    if exited:
        return (f"has exited, {step}, after {count} call(s) on {call.comm!r}: it will never "
                "join this collective")
    if arrived:
        return f"arrived ({step})"
    waits = [desc for _, _, desc, _ in info["inflight"]]
    if waits:
        doing = "waits in " + "; ".join(waits)
    else:
        doing = "is not in any collective"
    threads = "".join(f"\n    {line}" for line in info.get("threads", ()))
    return (f"has not arrived: {step}, it {doing}; its main thread is at {info['where']} "
            f"({count} call(s) on {call.comm!r} so far){threads}")
