"""A step's outputs: every replica's leaves gathered on every process and reduced
(``outputs="mean"``, ...).

Per step when something reads them before ``run`` returns (a callback, the progress bar, the
metrics log, ``check_finite``'s verdict travelling with them, eager mode's check of what is
gathered); otherwise — graph mode, several processes, nothing reading them — the gathering is
deferred: the local leaves of up to ``LIMIT`` steps wait, and one exchange gathers them all (at
the end of ``run``, or when ``LIMIT`` steps are waiting). Every process makes the same
exchanges at the same steps (the steps are synchronous and ``LIMIT`` is fixed), so deferring
changes no value and cannot pair exchanges wrongly; it removes one synchronisation of the
processes from every step.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ... import tree
from ...errors import function_location
from ...step import gather_outputs
from ..checks.entry import OUTPUT_REDUCTIONS, aval_of
from ..communication.agree import OUTPUTS, agree, digest

LIMIT = 256  # steps whose outputs may wait for one exchange


@dataclass(frozen=True)
class Gathering:
    """How a ``Replicator``'s step outputs are gathered, fixed at its construction."""

    how: str  # ``outputs=``: "mean", "sum" or "per_replica"
    comm: object  # the outputs' communicator (model parallelism: this device's group)
    agree_on: object  # eager mode on several processes: the communicator agreed on first
    step_fn: object  # (named where the processes disagree)


def reduce_outputs(gathering, out_tree, step, results, flag=None):
    """results: per local replica, a list of leaves of step ``step`` -> one nest (``out_tree``)
    reduced over all replicas. With ``flag`` (a bool of this rank's), also every rank's flag:
    ``(outputs, flags)``, the flags carried in the same exchange.

    Eager mode first agrees on what is gathered (a tagged exchange): a rank still in a
    collective that the others do not call meets it as a mismatch. (Graph mode compared
    the outputs with the collective schedule when it compiled the step.)"""
    if gathering.agree_on is not None:
        what = ", ".join(str(aval_of(x)) for x in results[0])
        agree(gathering.agree_on, OUTPUTS, digest(f"{out_tree}|{what}"), describe=lambda: (
            f"the end of step {step}: gathering the outputs ({what}) of step_fn "
            f"{function_location(gathering.step_fn)}"))
    gathered = gather_outputs(gathering.comm, results, flag)  # one exchange
    if flag is not None:
        gathered, flags = gathered
    reduced = [OUTPUT_REDUCTIONS[gathering.how](everyone) for everyone in gathered]
    outputs = tree.unflatten(out_tree, reduced)
    return outputs if flag is None else (outputs, flags)


class Deferred:
    """The outputs of the steps not gathered yet; ``run``'s history holds a placeholder for
    each until ``flush`` puts the reduced outputs in their place."""

    def __init__(self, gathering):
        self.gathering = gathering
        self.waiting = []  # (out_tree, results) per step, in step order

    @staticmethod
    def wanted(mode, check_finite, gathering, callbacks) -> bool:
        return mode == "graph" and not callbacks and not check_finite and gathering.comm.size > 1

    def add(self, out_tree, results):
        # copies, as the per-step exchange makes: an output may be an array the program was
        # given (a batch leaf an input_fn refills in place, with prefetch=0)
        self.waiting.append((out_tree,
                             [[np.array(x, copy=True) for x in leaves] for leaves in results]))
        return None  # the placeholder

    def full(self) -> bool:
        return len(self.waiting) >= LIMIT

    def flush(self, history: list) -> None:
        """Gather every waiting step's outputs in one exchange into the last entries of
        ``history``."""
        if not self.waiting:
            return
        gathering, waiting = self.gathering, self.waiting
        k = len(waiting[0][1])
        every = [[leaf for _, results in waiting for leaf in results[r]] for r in range(k)]
        gathered = gather_outputs(gathering.comm, every)
        first, j = len(history) - len(waiting), 0
        for i, (out_tree, results) in enumerate(waiting):
            n = len(results[0])
            reduced = [OUTPUT_REDUCTIONS[gathering.how](g) for g in gathered[j:j + n]]
            history[first + i] = tree.unflatten(out_tree, reduced)
            j += n
        self.waiting = []
