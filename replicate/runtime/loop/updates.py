"""``run``'s history with gradient accumulation (``wrap_optimizer(accumulate=n)``): one entry
per update, the outputs of its n micro-steps combined (their mean; their sum with
``outputs="sum"``). The micro-steps after the last update wait for the next ``run``, which
adds them to its first entry. Callbacks still see every micro-step."""

from __future__ import annotations

import numpy as np

from ... import tree
from ...errors import PlacementError
from ...optim import MICRO_STEPS


class PerUpdate:
    """One ``Replicator``'s: which steps of a run updated, the micro-steps carried over."""

    def __init__(self, outputs: str):
        self.combine = np.sum if outputs == "sum" else np.mean
        self.carried = []  # outputs of micro-steps from earlier runs not yet in an update
        self.flags = []  # per step of this run: the step updated
        self._counters, self._seen = [], None

    def start(self, callbacks: list) -> list:
        """A run starts: its (empty) history; this object joins its callbacks."""
        self.flags = []
        callbacks.append(self)
        return []

    def __call__(self, rep, step, outputs) -> None:
        """After each step: did it update (every accumulation counter back at 0)?"""
        seen = (rep.trace_count, len(rep._synced))
        if seen != self._seen:  # (a new compiled step, or eager mode read new Variables)
            self._seen = seen
            self._counters = [v for v in rep.variables() if MICRO_STEPS.get(id(v)) is v]
        try:
            self.flags.append(None if not self._counters else
                              all(int(v.value) == 0 for v in self._counters))
        except PlacementError:  # (model parallelism: the counter lives on another process)
            self.flags.append(None)

    def history(self, steps: list) -> list:
        """The history run returns: ``steps`` itself without accumulation."""
        if not any(f is not None for f in self.flags):
            return steps
        out, group = [], list(self.carried)
        for outputs, updated in zip(steps, self.flags):
            group.append(outputs)
            if updated:
                out.append(self._combine(group))
                group = []
        self.carried = group
        return out

    def _combine(self, group):
        leaves = [tree.flatten(g)[0] for g in group]
        combined = [np.asarray(self.combine([np.asarray(s[i]) for s in leaves], axis=0))
                    for i in range(len(leaves[0]))]
        return tree.unflatten(tree.flatten(group[0])[1], combined)
