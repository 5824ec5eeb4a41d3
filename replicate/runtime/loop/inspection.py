"""What a ``Replicator`` compiled, for inspection and printing."""

from __future__ import annotations

from ...errors import ReplicateError


class Inspection:
    """``Replicator``'s views of its compiled steps (``self.cache``: its ``StepCache``)."""

    def compiled_graph(self):
        """The most recently compiled step graph (for inspection and printing)."""
        return self._last_compiled().graph

    def executable(self):
        """The last compiled step as the backend runs it (``.graph``, ``.kernels``)."""
        return self._last_compiled().executable

    def _last_compiled(self):
        if not self.cache:
            raise ReplicateError("nothing compiled yet: run at least one step in graph mode")
        return self.cache.values()[-1]
