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

import numpy as np

from ... import tree
from ...errors import function_location
from ...step import gather_outputs
from ..checks.entry import OUTPUT_REDUCTIONS, aval_of
from ..communication.agree import OUTPUTS, agree, digest

LIMIT = 256  # steps whose outputs may wait for one exchange


def reduce_outputs(rep, results, flag=None):
    """results: per local replica, a list of leaves -> one nest reduced over all replicas.
    With ``flag`` (a bool of this rank's), also every rank's flag: ``(outputs, flags)``,
    the flags carried in the same exchange.

    Eager mode first agrees on what is gathered (a tagged exchange): a rank still in a
    collective that the others do not call meets it as a mismatch. (Graph mode compared
    the outputs with the collective schedule when it compiled the step.)"""
    if rep.mode == "eager" and rep.num_ranks > 1:
        what = ", ".join(str(aval_of(x)) for x in results[0])
        agree(rep.comm, OUTPUTS, digest(f"{rep._out_tree}|{what}"), describe=lambda: (
            f"the end of step {rep.step + 1}: gathering the outputs ({what}) of step_fn "
            f"{function_location(rep.step_fn)}"))
    gathered = gather_outputs(rep.layout.outputs_comm, results, flag)  # one exchange
    if flag is not None:
        gathered, flags = gathered
    reduced = [OUTPUT_REDUCTIONS[rep.outputs](everyone) for everyone in gathered]
    outputs = tree.unflatten(rep._out_tree, reduced)
    return outputs if flag is None else (outputs, flags)


class Deferred:
    """The outputs of the steps not gathered yet; ``run``'s history holds a placeholder for
    each until ``flush`` puts the reduced outputs in their place."""

    def __init__(self, rep):
        self.rep = rep
        self.waiting = []  # (out_tree, results) per step, in step order

    @staticmethod
    def wanted(rep, callbacks) -> bool:
        return (rep.mode == "graph" and not callbacks and not rep.check_finite
                and rep.layout.outputs_comm.size > 1)

    def add(self, results):
        # copies, as the per-step exchange makes: an output may be an array the program was
        # given (a batch leaf an input_fn refills in place, with prefetch=0)
        self.waiting.append((self.rep._out_tree,
                             [[np.array(x, copy=True) for x in leaves] for leaves in results]))
        return None  # the placeholder

    def full(self) -> bool:
        return len(self.waiting) >= LIMIT

    def flush(self, history: list) -> None:
        """Gather every waiting step's outputs in one exchange into the last entries of
        ``history``."""
        if not self.waiting:
            return
        rep, waiting = self.rep, self.waiting
        k = len(waiting[0][1])
        every = [[leaf for _, results in waiting for leaf in results[r]] for r in range(k)]
        gathered = gather_outputs(rep.layout.outputs_comm, every)
        first, j = len(history) - len(waiting), 0
        for i, (out_tree, results) in enumerate(waiting):
            n = len(results[0])
            reduced = [OUTPUT_REDUCTIONS[rep.outputs](g) for g in gathered[j:j + n]]
            history[first + i] = tree.unflatten(out_tree, reduced)
            j += n
        self.waiting = []
